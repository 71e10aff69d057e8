"""Pipeline overhead of a chat turn: time to first token minus the LLM's own time to first token.

    .venv/bin/python -m bench.pipeline_overhead [--chunks 10000] [--queries 40]
    .venv/bin/python -m bench.pipeline_overhead --observability [--chunks 2000] [--queries 60]

Builds (once, cached under .cache/bench/) an index of SciFact sentences, starts the real worker against a
zero-latency fake Ollama, and streams SciFact test queries through /chat_stream. It prints, per route, the
worker-side overhead (first_token_ms - llm_first_token_ms from the `done` timings), the client-side time to first
token, and the stage timings. The baseline in the same run is the direct route (no retrieval): the difference is
what retrieval, the checks and expansion cost.

`--observability` instead compares the worker with metrics off, on, and on with tracing exported (bench/
observability.py): three workers at once, the same rag-route queries interleaved between them, and the worker's
CPU time per turn side by side.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

from tests.ollama_server import OLLAMA_ENV, FakeOllama
from tests.servers import ROOT, SHARED, worker_process
from tests.sse import parse_lines

SENTENCE = re.compile(r"(?<=[.!?])\s+")


def build_index(index_store: Path, chunks: int) -> int:
    from rag_worker.services import Services
    from rag_worker.settings import Settings

    services = Services(Settings(INDEX_STORE=str(index_store)))
    if services.store.exists("bench") and services.store.count("bench") >= chunks:
        return services.store.count("bench")
    rows, now = [], datetime.now(UTC).isoformat()
    with open(SHARED / "eval" / "scifact" / "corpus.jsonl", encoding="utf-8") as fh:
        for line in fh:
            doc = json.loads(line)
            for i, sent in enumerate(s for s in SENTENCE.split(doc["text"]) if len(s) > 20):
                rows.append(
                    {
                        "id": hashlib.sha256(f"{doc['_id']}/{i}".encode()).hexdigest()[:32],
                        "document_id": doc["_id"],
                        "filename": f"{doc['_id']}.txt",
                        "dataset": "scifact",
                        "page": None,
                        "chunk_index": i,
                        "text": sent,
                        "metadata": {},
                        "file_bytes": 0,
                        "indexed_at": now,
                    }
                )
                if len(rows) >= chunks:
                    break
            if len(rows) >= chunks:
                break
    t0 = time.monotonic()
    for start in range(0, len(rows), 2000):
        services.store.add_chunks("bench", rows[start : start + 2000])
    print(f"indexed {len(rows)} chunks in {time.monotonic() - t0:.0f} s")
    return len(rows)


def queries(n: int) -> list[str]:
    out = []
    with open(SHARED / "eval" / "scifact" / "queries.jsonl", encoding="utf-8") as fh:
        for line in fh:
            out.append(json.loads(line)["text"])
            if len(out) >= n:
                break
    return out


def turn(url: str, prompt: str, route: str) -> dict:
    body = {"prompt": prompt, "index": "bench", "options": {"route": route}}
    t0 = time.monotonic()
    first = None
    asked_llm = False
    with httpx.Client(timeout=300) as c, c.stream("POST", url + "/chat_stream", json=body) as r:
        for event, data in parse_lines(r.iter_lines()):
            if event == "step" and data.get("method") == "llm":
                asked_llm = True
            if event == "token" and first is None:
                first = (time.monotonic() - t0) * 1000
            if event == "done":
                return {
                    "client_first_token_ms": first,
                    **data["timings"],
                    "abstained": data["abstained"],
                    "asked_llm": asked_llm,
                }
            if event == "error":
                raise RuntimeError(data)
    raise RuntimeError("stream ended without done")


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def observability_cost(base: Path, n: int, qs: list[str]) -> None:
    import contextlib
    import shutil

    from bench.observability import CONFIGS, config_env, group_cpu_s, table
    from tests.otlp_receiver import OtlpReceiver

    with contextlib.ExitStack() as stack:
        fake = stack.enter_context(FakeOllama())
        otlp = stack.enter_context(OtlpReceiver())
        workers = {}
        for name in CONFIGS:
            # Each worker its own copy of the index (LanceDB files; one writer each), the same data.
            home = base / f"observe-{name.replace('+', '-')}"
            if not (home / "index_store").exists():
                shutil.copytree(base / "index_store", home / "index_store")
            env = {"OLLAMA_HOST": fake.url, **OLLAMA_ENV, **config_env(name, otlp.url)}
            workers[name] = stack.enter_context(worker_process(home, env=env))
        for worker in workers.values():
            for warm in ("warm up the store", "warm up the full-text index", qs[-1]):
                turn(worker.url, warm, "rag")
        cpu = {name: 0.0 for name in CONFIGS}
        over: dict[str, list[float]] = {name: [] for name in CONFIGS}
        for i, q in enumerate(qs[:-1]):
            order = CONFIGS if i % 2 == 0 else tuple(reversed(CONFIGS))
            for name in order:
                worker = workers[name]
                assert worker.proc is not None
                before = group_cpu_s(worker.proc.pid)
                r = turn(worker.url, q, "rag")
                cpu[name] += group_cpu_s(worker.proc.pid) - before
                over[name].append(r["first_token_ms"] - r["llm_first_token_ms"])
        spans = len(otlp.spans())
    turns = len(qs) - 1
    rows = {
        name: {"cpu_ms": cpu[name] * 1000 / turns, "overhead_p50": statistics.median(over[name])}
        for name in CONFIGS
    }
    print(f"\nindex: {n} chunks; {turns} SciFact queries on the rag route through each worker, interleaved")
    print(table(rows, "cpu_ms", "worker CPU / turn"))
    print(
        "overhead p50 (first token - model's first token): "
        + ", ".join(f"{name} {rows[name]['overhead_p50']:.0f} ms" for name in CONFIGS)
    )
    print(f"spans received by the OTLP receiver: {spans}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=10_000)
    ap.add_argument("--queries", type=int, default=120)
    ap.add_argument(
        "--observability", action="store_true", help="CPU per turn with metrics off / on / on with tracing"
    )
    args = ap.parse_args()
    base = ROOT / ".cache" / "bench" / f"pipeline_overhead_{args.chunks}"
    n = build_index(base / "index_store", args.chunks)
    qs = queries(args.queries)
    if args.observability:
        observability_cost(base, n, qs)
        return
    with (
        FakeOllama() as fake,
        worker_process(
            base,
            env={
                "OLLAMA_HOST": fake.url,
                **OLLAMA_ENV,
            },
        ) as worker,
    ):
        for warm in ("warm up the store", "warm up the full-text index"):
            turn(worker.url, warm, "rag")
        # Interleaved, and each route gets its own queries: the query-embedding cache must not favour a route.
        routes = ("direct", "rag", "auto")
        results: dict[str, list[dict]] = {r: [] for r in routes}
        for i, q in enumerate(qs):
            route = routes[i % len(routes)]
            results[route].append(turn(worker.url, q, route))
    print(
        f"\nindex: {n} chunks; {len(qs)} SciFact queries split over the routes; fake Ollama with zero latency\n"
    )
    print(f"{'route':8} {'overhead p50':>13} {'p95':>7} {'client TTFT p50':>16} {'p95':>7}  stage p50 (ms)")
    for route, rows in results.items():
        over = [r["first_token_ms"] - r["llm_first_token_ms"] for r in rows]
        client = [r["client_first_token_ms"] for r in rows]
        stages = {
            k: statistics.median([r.get(k, 0) for r in rows])
            for k in ("triage_ms", "retrieve_ms", "evaluate_ms", "retry_ms", "expand_ms")
        }
        stage_txt = " ".join(f"{k[:-3]}={v:.0f}" for k, v in stages.items() if v)
        print(
            f"{route:8} {pct(over, 0.5):>10.0f} ms {pct(over, 0.95):>5.0f} ms {pct(client, 0.5):>13.0f} ms "
            f"{pct(client, 0.95):>5.0f} ms  {stage_txt}"
        )
        abst = sum(r["abstained"] for r in rows)
        asked = sum(r["asked_llm"] for r in rows)
        print(
            f"{'':8} ({abst} of {len(rows)} turns abstained; {asked} asked the utility model in a decision step)"
        )


if __name__ == "__main__":
    main()
