"""Concurrency benchmark (issue 12): N streamed turns at once, each path beside a floor measured in the same run.

    .venv/bin/python -m bench.concurrency [--turns 100] [--chunks 40,10000] [--tokens-per-second 20]
                                          [--rate 20 --seconds 30] [--paths floor,worker-direct,...]
                                          [--variant NAME:KEY=VALUE,...] [--profile-with PY_SPY]

Starts the fake Ollama (tests/ollama_server.py, its own process, pacing tokens at 1/tokens-per-second), the real
worker (gunicorn + gevent, 1 process) and the real gateway (uvicorn) on loopback, plus the floor: a bare gevent
relay of the same fake stream (bench/floor_relay.py, Flask on gunicorn+gevent, no RAG, no database). For each
index size (SciFact sentences, the index bench.pipeline_overhead builds and caches) it fires N turns at once at:

  floor            the bare relay
  worker-direct    the worker's /chat_stream, route direct
  worker-rag       the worker's /chat_stream, route rag on the index
  gateway-direct   the gateway's /api/chats/{id}/messages/stream in a chat without an index
  gateway-rag      the same in a chat on the index (force_rag)

and prints first-token p50/p95, token-gap p95 (and max) and wall time for all N, each beside the floor's. With
--rate R --seconds T it then runs the sustained mode: RAG turns arriving at R per second for T seconds (worker and
gateway), on the largest index. Every turn asks a different question about one of the index's sentences, so RAG turns
retrieve, generate and cite (rather than abstain); each path gets its own questions, so the worker's caches (query
embeddings, sentence vectors) never carry one path's work into another's figures. Each row also says how many
milliseconds of CPU each server spent per turn (from /proc, over the burst), and for the gateway paths how many
answers were seen in SQLite with their partial text saved while still running (the write-ahead turns at work).

    --chunks 40 --paths floor,worker-rag          a quick check (about a minute)
    --chunks 10000 --rate 20 --seconds 5           the 10k index and a short sustained run
    --profile-with /tmp/pyspy/bin/py-spy           also where the worker's and gateway's CPU went (py-spy)

Prints its figures; never pass/fail. The gateway's index record is pointed at the pre-built worker table (the
bench writes the gateway's SQLite row), so a 10k-chunk index needs no upload through the gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.gateway_relay import new_chat, pct, read_stream, setup_user
from bench.pipeline_overhead import SENTENCE, build_index
from bench.pyspy import Spy
from bench.pyspy import summarise as profile_summary
from tests.ollama_server import OLLAMA_ENV
from tests.servers import ROOT, SHARED, ServerProcess, free_port, gateway_process, worker_process


def chunk_questions(chunks: int, n: int) -> list[str]:
    """n distinct questions about the index's own sentences (the walk build_index makes), so RAG turns find their
    passage and answer instead of abstaining; numbered so that none repeats and the query cache never helps."""
    import json

    sentences: list[str] = []
    with open(SHARED / "eval" / "scifact" / "corpus.jsonl", encoding="utf-8") as fh:
        for line in fh:
            doc = json.loads(line)
            sentences += [s for s in SENTENCE.split(doc["text"]) if len(s) > 20][: chunks - len(sentences)]
            if len(sentences) >= chunks:
                break
    step = max(1, len(sentences) // n)
    picked = sentences[::step]
    return [
        f"Question {i + 1}: what is known about {' '.join(picked[i % len(picked)].split()[:12])}?"
        for i in range(n)
    ]


PATHS = ("floor", "worker-direct", "worker-rag", "gateway-direct", "gateway-rag")


class Questions:
    """Hands each path (and variant, and the sustained mode) its own questions, so that no path finds another's
    query embedding or answer sentences in the worker's caches."""

    def __init__(self, pool: list[str]):
        self.pool, self.used = pool, 0

    def take(self, n: int) -> list[str]:
        out = self.pool[self.used : self.used + n]
        self.used += n
        return out or self.pool[:n]


def group_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by the process group led by `pid` (a server and its forks)."""
    import psutil

    total = 0.0
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pid:
                t = proc.cpu_times()
                total += t.user + t.system
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
    return total


def loop_cpu_s(pid: int) -> float:
    """CPU seconds of the main threads alone of the process group led by `pid`: each process's event loop (the
    gateway's), without its thread pool's database work."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != pid:
                continue
            stat = (entry / "task" / entry.name / "stat").read_text()
        except (OSError, ProcessLookupError):
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


async def timed_turn(client: httpx.AsyncClient, url: str, body: dict, headers: dict | None = None) -> dict:
    start = time.perf_counter()
    async with client.stream("POST", url, json=body, headers=headers) as resp:
        if resp.status_code != 200:
            await resp.aread()
            return {"error": f"HTTP {resp.status_code}", "busy": resp.status_code == 503}
        frames = await read_stream(resp)
    names = [e for _, e, _ in frames]
    tokens = [t for t, e, _ in frames if e == "token"]
    done = next((t for t, e, _ in frames if e == "done"), None)
    errors = [d for _, e, d in frames if e == "error"]
    queued = [d for _, e, d in frames if e == "step" and isinstance(d, dict) and d.get("step") == "queued"]
    return {
        "error": None if done and not errors else f"no done ({errors[:1] or names[-3:]})",
        "busy": any(isinstance(d, dict) and d.get("code") == "busy" for d in errors),
        "ttft": tokens[0] - start if tokens else None,
        "done": done - start if done else None,
        "gaps": [b - a for a, b in zip(tokens, tokens[1:], strict=False)],
        "queued": bool(queued),
        "max_position": max((d.get("detail", {}).get("position", 0) for d in queued), default=0),
    }


def summarise(results: list, wall: float) -> dict:
    ok = [r for r in results if isinstance(r, dict) and not r["error"]]
    failed = [r for r in results if not isinstance(r, dict) or r["error"]]
    gaps = [g for r in ok for g in r["gaps"]]
    return {
        "n": len(results),
        "errors": len(failed),
        "busy": sum(1 for r in failed if isinstance(r, dict) and r.get("busy")),
        "samples": [str(r if not isinstance(r, dict) else r["error"])[:120] for r in failed[:2]],
        "ttft_p50": pct([r["ttft"] for r in ok], 0.5) * 1000,
        "ttft_p95": pct([r["ttft"] for r in ok], 0.95) * 1000,
        "gap_p95": pct(gaps, 0.95) * 1000,
        "gap_max": max(gaps, default=float("nan")) * 1000,
        "done_p95": pct([r["done"] for r in ok], 0.95) * 1000,
        "wall": wall,
        "queued": sum(1 for r in ok if r["queued"]),
        "max_position": max((r["max_position"] for r in ok), default=0),
    }


class Target:
    """One path under test: how to make the i-th turn's request."""

    def __init__(self, name: str, base: str, qs: list[str], headers: dict | None = None):
        self.name, self.base, self.qs, self.headers = name, base, qs, headers
        self.chats: list[int] = []

    async def prepare(self, client: httpx.AsyncClient, n: int, chat_body: dict | None) -> None:
        if chat_body is not None:
            self.chats = []
            for _ in range(n):
                r = await client.post(self.base + "/api/chats", json=chat_body, headers=self.headers)
                self.chats.append(r.json()["id"])

    def request(self, i: int) -> tuple[str, dict]:
        q = self.qs[i % len(self.qs)]
        if self.name == "floor":
            return self.base + "/chat_stream", {"prompt": q}
        if self.name == "worker-direct":
            return self.base + "/chat_stream", {"prompt": q, "options": {"route": "direct"}}
        if self.name == "worker-rag":
            return self.base + "/chat_stream", {"prompt": q, "index": "bench", "options": {"route": "rag"}}
        url = f"{self.base}/api/chats/{self.chats[i]}/messages/stream"
        return url, {"message": q, **({"force_rag": True} if self.name == "gateway-rag" else {})}


async def watch_saves(db_path: Path, seen: dict) -> None:
    """While a gateway burst runs: how many running answers already have partial text (or steps) in SQLite,
    i.e. the write-ahead turn's periodic saves happened under this load (max over the burst)."""

    def count() -> tuple[int, int]:
        with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5) as db:
            running = "FROM messages WHERE role='assistant' AND status='running'"
            text = db.execute(f"SELECT COUNT(*) {running} AND content != ''").fetchone()[0]
            steps = db.execute(
                f"SELECT COUNT(*) {running} AND steps IS NOT NULL AND steps != '[]'"
            ).fetchone()[0]
            return text, steps

    while True:
        with contextlib.suppress(sqlite3.Error):
            text, steps = await asyncio.to_thread(count)
            seen["partial_text"] = max(seen.get("partial_text", 0), text)
            seen["partial_steps"] = max(seen.get("partial_steps", 0), steps)
        await asyncio.sleep(0.25)


async def burst(
    target: Target, n: int, chat_body: dict | None, cpu_of: dict | None = None, db: Path | None = None
) -> dict:
    """n turns at once; `cpu_of` {label: pid}: also the CPU those servers spent per turn during the burst;
    `db`: the gateway's SQLite file, watched for the write-ahead turns' saves."""
    limits = httpx.Limits(max_connections=n * 2, max_keepalive_connections=n)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        await target.prepare(client, n, chat_body)
        reqs = [target.request(i) for i in range(n)]
        cpu0 = {k: group_cpu_s(pid) for k, pid in (cpu_of or {}).items()}
        loop0 = loop_cpu_s(cpu_of["gateway"]) if cpu_of and "gateway" in cpu_of else None
        saves: dict = {}
        watcher = asyncio.create_task(watch_saves(db, saves)) if db is not None else None
        start = time.perf_counter()
        results = await asyncio.gather(
            *(timed_turn(client, url, body, target.headers) for url, body in reqs), return_exceptions=True
        )
        out = summarise(list(results), time.perf_counter() - start)
        if watcher is not None:
            watcher.cancel()
            out["saves"] = saves
        out["cpu_ms"] = {k: (group_cpu_s(pid) - cpu0[k]) * 1000 / n for k, pid in (cpu_of or {}).items()}
        if loop0 is not None:  # of the gateway's: its event loop's share (the rest is its database threads)
            out["cpu_ms"]["gw-loop"] = (loop_cpu_s(cpu_of["gateway"]) - loop0) * 1000 / n
        return out


async def sustained(
    target: Target, rate: float, seconds: float, chat_body: dict | None, cpu_of: dict | None = None
) -> dict:
    n = int(rate * seconds)
    limits = httpx.Limits(max_connections=n * 2, max_keepalive_connections=200)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        await target.prepare(client, n, chat_body)
        cpu0 = {k: group_cpu_s(pid) for k, pid in (cpu_of or {}).items()}
        start = time.perf_counter()

        async def one(i: int):
            await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
            url, body = target.request(i)
            return await timed_turn(client, url, body, target.headers)

        results = await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)
        out = summarise(list(results), time.perf_counter() - start)
        out["cpu_ms"] = {k: (group_cpu_s(pid) - cpu0[k]) * 1000 / n for k, pid in (cpu_of or {}).items()}
        return out


def point_gateway_index(gateway_store: Path, index_id: int, chunks: int) -> None:
    """Make the gateway's index record name the pre-built worker table `bench` (a bench-only shortcut)."""
    with sqlite3.connect(gateway_store / "gateway.db") as db:
        db.execute(
            "UPDATE indexes SET worker_name='bench', status='ready', document_count=1, chunk_count=? WHERE id=?",
            (chunks, index_id),
        )


def row(name: str, s: dict, floor: dict | None) -> str:
    def beside(key: str, fmt: str = "{:.0f}") -> str:
        mine = fmt.format(s[key])
        return mine if floor is None or name == "floor" else f"{mine} ({fmt.format(floor[key])})"

    extra = f" errors={s['errors']}" if s["errors"] else ""
    if s["busy"]:
        extra += f" busy(503)={s['busy']}"
    if s["queued"]:
        extra += f" queued={s['queued']} max_pos={s['max_position']}"
    if "saves" in s:  # write-ahead turns: answers seen running with their partial text already saved
        extra += f" saved-while-running={s['saves'].get('partial_text', 0)}"
    cpu = " ".join(f"{k}={v:.0f}" for k, v in s.get("cpu_ms", {}).items() if v > 0.5)
    return (
        f"{name:15} {beside('ttft_p50'):>12} {beside('ttft_p95'):>13} {beside('gap_p95'):>11} "
        f"{s['gap_max']:>7.0f} {beside('wall', '{:.1f}'):>12}  {cpu:24}{extra}"
    )


HEADER = (
    f"{'path':15} {'TTFT p50 ms':>12} {'TTFT p95 ms':>13} {'gap p95 ms':>11} {'gap max':>7} {'wall s':>12}"
    f"  {'CPU ms per turn':24}(floor's figure in brackets)"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=100)
    ap.add_argument("--chunks", default="40,10000", help="comma-separated index sizes")
    ap.add_argument("--tokens-per-second", type=float, default=20.0)
    ap.add_argument("--paths", default=",".join(PATHS))
    ap.add_argument("--rate", type=float, default=0.0, help="sustained mode: RAG turns per second (0: skip)")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--worker-env", action="append", default=[], help="KEY=VALUE for the worker, repeatable")
    ap.add_argument(
        "--gateway-env", action="append", default=[], help="KEY=VALUE for the gateway, repeatable"
    )
    ap.add_argument(
        "--warm",
        type=int,
        default=2,
        help="warm-up turns at once per path before it is measured (several worker processes: enough to reach "
        "each, so none loads its models inside a burst)",
    )
    ap.add_argument(
        "--profile-with",
        default="",
        help="path of a py-spy executable: sample the worker (and the gateway) during the RAG bursts and the "
        "gateway during its direct burst, and print where their CPU went",
    )
    ap.add_argument("--profile-rate", type=int, default=100, help="py-spy samples per second")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME:KEY=VALUE,KEY=VALUE: one more worker-rag row from a worker with these settings (same run), "
        "e.g. 'no-queue:RAG_CONCURRENCY=10000,QUERY_BATCHING=false'",
    )
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    paths = [p for p in args.paths.split(",") if p]
    sizes = [int(c) for c in args.chunks.split(",") if c]
    tmp = Path(tempfile.mkdtemp(prefix="concurrency-bench-"))
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, python {platform.python_version()}")
    print(
        f"{args.turns} concurrent streamed turns, fake Ollama at {args.tokens_per_second:g} tokens/s per stream"
    )
    op = free_port()
    ollama = ServerProcess(
        [sys.executable, "-m", "tests.ollama_server", "--port", str(op)]
        + ["--tokens-per-second", str(args.tokens_per_second)],
        op,
        {},
        tmp / "logs" / "ollama.log",
        health_path="/",
    )
    fp = free_port()
    floor_proc = ServerProcess(
        [sys.executable, "-m", "gunicorn", "-k", "gevent", "-w", "1", "-b", f"127.0.0.1:{fp}"]
        + ["--worker-connections", "2000", "bench.floor_relay:app"],
        fp,
        {"OLLAMA_HOST": f"http://127.0.0.1:{op}"},
        tmp / "logs" / "floor.log",
    )
    worker_env = {
        "OLLAMA_HOST": f"http://127.0.0.1:{op}",
        **OLLAMA_ENV,
        **dict(kv.split("=", 1) for kv in args.worker_env),
    }
    with ollama, floor_proc:
        for size in sizes:
            base = ROOT / ".cache" / "bench" / f"pipeline_overhead_{size}"
            n_chunks = build_index(base / "index_store", size)
            n_sustained = int(args.rate * args.seconds) if size == max(sizes) else 0
            qs = Questions(
                chunk_questions(
                    n_chunks, args.turns * (len(paths) + len(args.variant)) + 3 * n_sustained + args.turns
                )
            )
            gw_tmp = tmp / f"gateway-{size}"
            with (
                worker_process(base, env=worker_env) as worker,
                gateway_process(
                    gw_tmp,
                    worker_url=worker.url,
                    env={"MAX_TURNS_PER_USER": "100000", **dict(kv.split("=", 1) for kv in args.gateway_env)},
                ) as gw,
            ):
                spies = {
                    "worker-rag": [("worker", worker.proc.pid)],
                    "gateway-direct": [("gateway", gw.proc.pid)],
                    "gateway-rag": [("worker", worker.proc.pid), ("gateway", gw.proc.pid)],
                }
                pids = {
                    "floor": floor_proc.proc.pid,
                    "fake": ollama.proc.pid,
                    "worker": worker.proc.pid,
                    "gateway": gw.proc.pid,
                }
                results = asyncio.run(
                    run_size(
                        args, paths, qs, worker.url, gw.url, gw_tmp, n_chunks, floor_proc, spies, tmp, pids
                    )
                )
                print(f"\nindex of {n_chunks} chunks, {args.turns} turns at once per path:")
                print(HEADER)
                floor = results.get("floor")
                for name, s in results.items():
                    print(row(name, s, floor))
                    for sample in s["samples"]:
                        print(f"{'':15} e.g. {sample}")
                for variant in args.variant:
                    label, _, settings = variant.partition(":")
                    extra = dict(kv.split("=", 1) for kv in settings.split(",") if kv)
                    with worker_process(base, env={**worker_env, **extra}) as other:
                        t = Target("worker-rag", other.url, qs.take(args.turns))
                        s = asyncio.run(
                            _warm_then_burst(
                                t, args.turns, {"worker": other.proc.pid, "fake": ollama.proc.pid}
                            )
                        )
                    print(row(f"rag[{label}]"[:15], s, floor))
                if args.rate and size == max(sizes):
                    sus = asyncio.run(
                        run_sustained(args, paths, qs, worker.url, gw.url, gw_tmp, n_chunks, floor_proc, pids)
                    )
                    print(
                        f"\nsustained: turns arriving at {args.rate:g}/s for {args.seconds:g} s "
                        f"({int(args.rate * args.seconds)} turns), index of {n_chunks} chunks:"
                    )
                    print(HEADER)
                    for name, s in sus.items():
                        print(row(name, s, sus.get("floor")))
                        for sample in s["samples"]:
                            print(f"{'':15} e.g. {sample}")


_GATEWAY_SETUP: dict[str, tuple[dict, dict]] = {}


async def _targets(paths, qs, worker_url, gw_url, gw_tmp, n_chunks, floor_proc, n):
    out: dict[str, tuple[Target, dict | None]] = {}
    headers, index = None, None
    if any(p.startswith("gateway") for p in paths):
        if gw_url not in _GATEWAY_SETUP:  # one user and one index record per gateway
            async with httpx.AsyncClient(base_url=gw_url, timeout=60) as g:
                headers = await setup_user(g)
                index = (await g.post("/api/indexes", json={"name": "bench"}, headers=headers)).json()
                point_gateway_index(gw_tmp / "index_store", index["id"], n_chunks)
                await new_chat(g, headers)
            _GATEWAY_SETUP[gw_url] = (headers, index)
        headers, index = _GATEWAY_SETUP[gw_url]
    for p in paths:
        if p == "floor":
            out[p] = (Target(p, floor_proc.url, qs.take(n)), None)
        elif p.startswith("worker"):
            out[p] = (Target(p, worker_url, qs.take(n)), None)
        elif p == "gateway-direct":
            out[p] = (Target(p, gw_url, qs.take(n), headers), {"title": "bench"})
        elif p == "gateway-rag":
            out[p] = (Target(p, gw_url, qs.take(n), headers), {"title": "bench", "index_ids": [index["id"]]})
    return out


def cpu_pids(path: str, pids: dict | None) -> dict:
    """The servers a path's turns run through, whose CPU per turn the bench reports."""
    if not pids:
        return {}
    names = {"floor": ("floor", "fake"), "worker": ("worker", "fake")}.get(
        path.split("-")[0], ("gateway", "worker", "fake")
    )
    return {k: pids[k] for k in names if k in pids}


async def run_size(
    args, paths, qs, worker_url, gw_url, gw_tmp, n_chunks, floor_proc, spies=None, tmp=None, pids=None
) -> dict:
    targets = await _targets(paths, qs, worker_url, gw_url, gw_tmp, n_chunks, floor_proc, args.turns)
    # Warm every path once (models loaded, tables open), with questions the measured turns don't ask.
    warm = [f"warm up the store {i}" for i in range(args.warm)]
    for _name, (t, chat_body) in targets.items():
        await burst(Target(t.name, t.base, warm, t.headers), args.warm, chat_body)
    out = {}
    for name, (t, chat_body) in targets.items():
        watched = (spies or {}).get(name, []) if args.profile_with else []
        files = {label: tmp / "profiles" / f"{name}-{n_chunks}-{label}.txt" for label, _ in watched}
        with contextlib.ExitStack() as stack:
            for label, pid in watched:
                stack.enter_context(Spy(args.profile_with, pid, files[label], rate=args.profile_rate))
            db = gw_tmp / "index_store" / "gateway.db" if name.startswith("gateway") else None
            out[name] = await burst(t, args.turns, chat_body, cpu_pids(name, pids), db)
        for label, f in files.items():
            print(f"\nprofile of the {label} during {name} ({n_chunks} chunks), {f}:")
            print(profile_summary(f))
    return out


async def _warm_then_burst(target: Target, n: int, pids: dict | None = None) -> dict:
    await burst(Target(target.name, target.base, ["warm up the store"]), 2, None)
    return await burst(target, n, None, pids)


async def run_sustained(args, paths, qs, worker_url, gw_url, gw_tmp, n_chunks, floor_proc, pids=None) -> dict:
    keep_paths = [p for p in paths if p in ("floor", "worker-rag", "gateway-rag")]
    n = int(args.rate * args.seconds)
    targets = await _targets(keep_paths, qs, worker_url, gw_url, gw_tmp, n_chunks, floor_proc, n)
    keep = [p for p in ("floor", "worker-rag", "gateway-rag") if p in targets]
    return {
        p: await sustained(targets[p][0], args.rate, args.seconds, targets[p][1], cpu_pids(p, pids))
        for p in keep
    }


if __name__ == "__main__":
    main()
