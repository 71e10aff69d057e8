"""Indexing throughput of the Ray engine on one and on two Ray nodes, beside the local engine, in one run.

    .venv/bin/python -m bench.ingest_ray [--docs 1000] [--cpus-per-node 1]

Writes the first N SciFact abstracts as .txt files, then indexes them four times into fresh indexes of one
temporary store, each run the real CLI (`python -m rag_worker index`) in its own process:
  local  the local engine, torch limited to `--cpus-per-node` threads (one node's worth of CPU)
  ray-1  `--engine ray` on a cluster of one node with `--cpus-per-node` CPUs
  ray-2  `--engine ray` on a cluster of two such nodes (both on this machine, so they share its cores: the
         two-node figure only shows scaling while the machine has a free core per node)
Reported: wall time of each CLI run (model loading and, for Ray, actor start-up included), files/s, and each
run's speed against `local`. Ray's token authentication is on, as a real cluster should run it.
"""

from __future__ import annotations

import argparse
import os
import platform
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.ingest_throughput import write_corpus

RAY = str(Path(sys.executable).parent / "ray")


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "INDEX_STORE": str(tmp / "store"),
        "UPLOADS_DIR": str(tmp / "uploads"),
        "LLM_BACKEND": "local",
        "OVERVIEW_SUMMARIES": "off",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    env.pop("RAY_ADDRESS", None)
    env.update(extra)
    return env


def _cluster(env: dict[str, str], nodes: int, cpus: int) -> str:
    from tests.servers import free_port

    port = free_port()
    common = [f"--num-cpus={cpus}", "--disable-usage-stats", "--node-ip-address=127.0.0.1"]
    subprocess.run(
        [RAY, "start", "--head", f"--port={port}", "--include-dashboard=false", *common],
        env=env,
        check=True,
        capture_output=True,
    )
    for _ in range(nodes - 1):
        subprocess.run(
            [RAY, "start", f"--address=127.0.0.1:{port}", *common], env=env, check=True, capture_output=True
        )
    return f"127.0.0.1:{port}"


def _run(folder: Path, index: str, env: dict[str, str], *args: str) -> tuple[float, str]:
    cmd = [sys.executable, "-m", "rag_worker", "index", str(folder), "--index", index, "--quiet", *args]
    started = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise SystemExit(f"{index} failed: {done.stderr[-2000:]}")
    return seconds, done.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=1000)
    parser.add_argument("--cpus-per-node", type=int, default=1)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        folder = tmp_path / "corpus"
        folder.mkdir()
        n = write_corpus(folder, args.docs)
        token = secrets.token_hex(32)
        base = _env(tmp_path, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
        results: list[tuple[str, float, str]] = []
        seconds, out = _run(folder, "local", {**base, "TORCH_THREADS": str(args.cpus_per_node)})
        results.append(("local", seconds, out))
        for nodes in (1, 2):
            try:
                address = _cluster(base, nodes, args.cpus_per_node)
                seconds, out = _run(
                    folder,
                    f"ray{nodes}",
                    {**base, "RAY_ADDRESS": address},
                    "--engine",
                    "ray",
                    "--ray-cpus-per-worker",
                    str(args.cpus_per_node),
                )
                results.append((f"ray-{nodes}", seconds, out))
            finally:
                subprocess.run([RAY, "stop", "--force"], env=base, capture_output=True)

    print(
        f"# {n} SciFact abstracts, {args.cpus_per_node} CPU per node, {platform.processor() or platform.machine()}"
    )
    print(f"# machine: {os.cpu_count()} cores")
    print("| run | wall s | files/s | vs local |")
    print("|---|---|---|---|")
    local = results[0][1]
    for name, seconds, _ in results:
        print(f"| {name} | {seconds:.1f} | {n / seconds:.1f} | {local / seconds:.2f}x |")
    for name, _, out in results:
        print(f"# {name}: {out}")


if __name__ == "__main__":
    main()
