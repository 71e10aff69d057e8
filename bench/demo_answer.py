"""The README's demo question on the embedded default: how long until the first token and the whole answer.

    .venv/bin/python -m bench.demo_answer [--runs 5] [--store .cache/bench/demo]

What a newcomer without Ollama gets: the `demo` index that `run_system.py` builds from README.md and docs/
(built once with `run_system.build_demo_index`, kept under --store), the real worker (`python -m rag_worker
serve`, gunicorn + gevent) with LLM_BACKEND=auto and an Ollama address where nothing listens, so it falls back to
the embedded SmolLM2 model. One warm-up turn loads (on a fresh cache: converts) the model; then each run asks
"How do I back up the data?" on /chat_stream and records, client side, the time to the first token and to the
`done` event, the worker's stage timings, the load average at the start of the turn, and whether the answer
names `index_store` and `shared_uploads`, cites README.md and has grounding.supported_share >= 0.8 (the
issue-16 goal: within 15 s of asking).

Baseline in the same run: the same question with `options.answer_mode: "extractive"` (no generation: retrieval,
quotes and checks only), so the generator's share of the time is the difference. The last run's answer is
printed verbatim (what README.md's "What you see" quotes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import httpx

from launcher.demo import build_demo_index
from tests.servers import ROOT, free_port, worker_process
from tests.sse import parse_lines

QUESTION = "How do I back up the data?"


def ensure_index(store: Path) -> None:
    index_store = store / "index_store"
    if (index_store / "lancedb" / "demo.lance").exists():
        return
    (store / "logs").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "INDEX_STORE": str(index_store), "HF_HUB_OFFLINE": "1"}
    started = time.monotonic()
    if not build_demo_index(env, store / "logs", timeout=3600):
        raise SystemExit(f"building the demo index failed; see {store / 'logs' / 'demo-index.log'}")
    print(f"demo index built in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the worker's process tree (gunicorn master and its worker)."""
    import psutil

    total = 0.0
    root = psutil.Process(pid)
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def ask(url: str, options: dict, pid: int, question: str = QUESTION) -> dict:
    """One streamed turn: client-side first token / done times and the done payload."""
    body = {"prompt": question, "index": "demo", "options": options}
    load = os.getloadavg()[0]
    cpu0 = cpu_seconds(pid)
    started = time.monotonic()
    first = None
    streamed: list[str] = []
    steps: list[tuple[str, float]] = []
    done: dict = {}
    with httpx.Client(timeout=3600) as client, client.stream("POST", url, json=body) as resp:
        resp.raise_for_status()
        for event, data in parse_lines(resp.iter_lines()):
            now = time.monotonic() - started
            if event == "token":
                first = now if first is None else first
                streamed.append(data["token"])
            elif event == "step":
                steps.append((data["step"], now))
            elif event == "done":
                done = data
            elif event == "error":
                raise SystemExit(f"the turn failed: {data}")
    took = time.monotonic() - started
    cpu = cpu_seconds(pid) - cpu0
    cited = {c.get("filename") for c in done.get("citations", [])}
    reply = done.get("reply", "")
    g = done.get("grounding") or {}
    return {
        "load": load,
        "first_token_s": first,
        "done_s": took,
        "cpu_s": cpu,
        "timings": done.get("timings", {}),
        "flags": done.get("flags", {}),
        "model": done.get("model"),
        "reply": reply,
        "streamed": "".join(streamed),
        "grounding": g,
        "ok": "index_store" in reply
        and "shared_uploads" in reply
        and "README.md" in cited
        and g.get("supported_share", 0) >= 0.8,
        "steps": steps,
    }


def describe(r: dict) -> str:
    g = r["grounding"]
    return (
        f"load {r['load']:5.2f} | first token {r['first_token_s'] or 0:6.1f} s | done {r['done_s']:6.1f} s | "
        f"worker CPU {r['cpu_s']:6.1f} s | "
        f"grounding {g.get('supported', 0)}/{g.get('checked', 0)} ({g.get('action')}) | "
        f"goal met: {'yes' if r['ok'] else 'NO'}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--store", type=Path, default=ROOT / ".cache" / "bench" / "demo")
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for the worker (repeatable)")
    parser.add_argument("--json", type=Path, default=None, help="write every run's figures here")
    args = parser.parse_args(argv)
    store = args.store.resolve()
    ensure_index(store)
    (store / "logs").mkdir(parents=True, exist_ok=True)
    env = {
        "LLM_BACKEND": "auto",
        "OLLAMA_HOST": f"http://127.0.0.1:{free_port()}",  # nothing listens: the embedded fallback
        "MODEL_CACHE_DIR": os.environ.get("MODEL_CACHE_DIR", str(ROOT / ".cache" / "models")),
        **dict(kv.split("=", 1) for kv in args.env),
    }
    print(f"CPUs: {os.cpu_count()}; worker env: {env}", flush=True)
    results: dict[str, list[dict]] = {"auto (default)": [], "extractive (baseline)": []}
    with worker_process(store, env=env) as proc:
        url = proc.url + "/chat_stream"
        warm = ask(url, {}, proc.proc.pid)
        print(f"warm-up (model load/convert): {describe(warm)}", flush=True)
        for i in range(args.runs):
            for name, options in (
                ("auto (default)", {}),
                ("extractive (baseline)", {"answer_mode": "extractive"}),
            ):
                r = ask(url, options, proc.proc.pid)
                results[name].append(r)
                print(f"run {i + 1} {name:22s} {describe(r)}", flush=True)
                print(f"    timings {json.dumps(r['timings'])}", flush=True)
    print(
        "\n| mode | runs | load avg (1 min) | first token p50 / max | done p50 / max | worker CPU p50 "
        "| answer goal met |"
    )
    print("|---|---:|---|---|---|---:|---:|")
    for name, rs in results.items():
        if not rs:
            continue
        ft = [r["first_token_s"] or 0.0 for r in rs]
        dn = [r["done_s"] for r in rs]
        loads = [r["load"] for r in rs]
        print(
            f"| {name} | {len(rs)} | {min(loads):.1f}-{max(loads):.1f} | "
            f"{statistics.median(ft):.1f} / {max(ft):.1f} s | {statistics.median(dn):.1f} / {max(dn):.1f} s | "
            f"{statistics.median(r['cpu_s'] for r in rs):.1f} s | {sum(r['ok'] for r in rs)}/{len(rs)} |"
        )
    last = results["auto (default)"][-1] if results["auto (default)"] else warm
    print(f"\nLast default answer ({last['model']}), verbatim:\n\n{last['reply']}\n")
    if last["streamed"].strip() != last["reply"].strip():
        print(f"(streamed before the check replaced it: {last['streamed'].strip()!r})\n")
    print(f"grounding: {json.dumps({k: v for k, v in last['grounding'].items() if k != 'sentences'})}")
    print(f"flags: {json.dumps(last['flags'])}")
    if args.json:
        args.json.write_text(json.dumps({"warm": warm, **results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
