"""Upload-burst benchmark: rounds of concurrent uploads from one account through the gateway to a worker of two
gunicorn processes, beside the same bursts sent straight to the worker (the baseline, same run, same machine).

    .venv/bin/python -m bench.upload_burst [--rounds 10] [--burst 20] [--workers 2]

Issue 27 found one upload in 40 failing under load with 503 "the worker at ... is unreachable
(RemoteProtocolError)"; the gateway now sends a request the worker never answered once more, and records an
upload the worker indexed although its answer was lost. The suite proves one such burst
(tests/integration/gateway/test_index_writes.py::test_twenty_concurrent_uploads_through_two_worker_processes_all_land_once:
every upload 201, each file listed exactly once by the gateway and by the worker); this is the many-round
version, which took minutes of the suite's time as a test.

It starts the fake Ollama (the only stand-in), the real worker (gunicorn + gevent) and the real gateway (uvicorn)
on loopback, then for each round:

1. baseline: BURST concurrent uploads straight to the worker's /add_document, into a fresh table;
2. gateway: BURST concurrent uploads from one account to a fresh gateway index.

A warm-up burst straight to the worker comes first and is not counted (each process loads its embedder then).

It reports, for each side: uploads that failed (and how), wall time per round, uploads per second, the latency
of one upload (p50 / p95 / max), files listed other than exactly once (by the gateway and by the worker), and
for the gateway the retries it logged ("sending it once more") and the uploads it recovered after a lost answer.

Prints its figures; never pass/fail.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sqlite3
import statistics
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.ollama_server import OLLAMA_ENV, FakeOllama
from tests.servers import gateway_process, worker_process

PASSWORD = "bench upload passphrase"


def note(side: str, round_no: int, i: int) -> bytes:
    return f"# Note {side} {round_no}-{i}\n\nThe heron number {round_no * 100 + i} stands in the reeds.\n".encode()


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def timed(fn) -> tuple[float, httpx.Response | Exception]:
    start = time.perf_counter()
    try:
        out: httpx.Response | Exception = fn()
    except httpx.HTTPError as exc:
        out = exc
    return time.perf_counter() - start, out


def outcome(r: httpx.Response | Exception) -> str:
    if isinstance(r, Exception):
        return type(r).__name__
    if r.status_code in (200, 201):
        return "ok"
    try:
        return f"{r.status_code} {r.json().get('code')}"
    except ValueError:
        return str(r.status_code)


def listed_once(names: list[str], expected: list[str]) -> int:
    """Files not listed exactly once (missing, doubled or unknown)."""
    counts = Counter(names)
    return sum(1 for n in expected if counts[n] != 1) + sum(1 for n in counts if n not in expected)


def worker_names(worker_url: str, table: str) -> list[str]:
    r = httpx.get(worker_url + "/get_documents", params={"index": table}, timeout=120)
    return [d["filename"] for d in r.json()] if r.status_code == 200 else []


def worker_table(store: Path, index_id: int) -> str:
    with sqlite3.connect(store / "index_store" / "gateway.db") as db:
        return db.execute("SELECT worker_name FROM indexes WHERE id = ?", (index_id,)).fetchone()[0]


def log_lines(path: Path, needle: str) -> list[str]:
    try:
        return [line for line in path.read_text(errors="replace").splitlines() if needle in line]
    except FileNotFoundError:
        return []


def summarise(rows: list[dict]) -> dict:
    latencies = [t for r in rows for t in r["latencies"]]
    outcomes = Counter(o for r in rows for o in r["outcomes"])
    uploads = sum(outcomes.values())
    walls = [r["wall"] for r in rows]
    return {
        "uploads": uploads,
        "failed": uploads - outcomes.get("ok", 0),
        "how": ", ".join(f"{k} x{v}" for k, v in sorted(outcomes.items()) if k != "ok") or "-",
        "wall_p50": statistics.median(walls),
        "wall_max": max(walls),
        "per_s": uploads / sum(walls),
        "p50": pct(latencies, 0.5),
        "p95": pct(latencies, 0.95),
        "max": max(latencies),
        "not_once": sum(r["not_once"] for r in rows),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--burst", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2, help="the worker's gunicorn processes (WORKER_WORKERS)")
    args = ap.parse_args()
    burst = args.burst
    expected = sorted(f"note-{i:02d}.md" for i in range(burst))

    with tempfile.TemporaryDirectory(prefix="bench-upload-burst-") as tmp_name, contextlib.ExitStack() as es:
        tmp = Path(tmp_name)
        ollama = es.enter_context(FakeOllama())
        worker_env = {
            "WORKER_WORKERS": str(args.workers),
            "OLLAMA_HOST": ollama.url,
            "TORCH_THREADS": "1",
            "OVERVIEW_SUMMARIES": "off",
            **OLLAMA_ENV,
        }
        worker = es.enter_context(worker_process(tmp, env=worker_env))
        gateway_env = {"OLLAMA_HOST": ollama.url, "MAX_UPLOADS_PER_USER": str(burst)}
        gateway = es.enter_context(gateway_process(tmp, worker_url=worker.url, env=gateway_env))
        api = es.enter_context(httpx.Client(base_url=gateway.url, timeout=600))
        r = api.post("/api/auth/register", json={"username": "burster", "password": PASSWORD})
        user = {"Authorization": f"Bearer {r.json()['token']}"}
        pool = es.enter_context(ThreadPoolExecutor(burst))

        def to_worker(table: str, round_no: int, i: int) -> tuple[float, httpx.Response | Exception]:
            def send() -> httpx.Response:
                with httpx.Client(base_url=worker.url, timeout=600) as one:
                    return one.post(
                        "/add_document",
                        data={"index": table, "dataset": "default"},
                        files={"file": (f"note-{i:02d}.md", note("w", round_no, i), "text/markdown")},
                    )

            return timed(send)

        def to_gateway(index_id: int, round_no: int, i: int) -> tuple[float, httpx.Response | Exception]:
            def send() -> httpx.Response:
                with httpx.Client(base_url=gateway.url, timeout=600) as one:
                    return one.post(
                        f"/api/indexes/{index_id}/documents?wait=1",
                        headers=user,
                        data={"dataset": "default"},
                        files={"file": (f"note-{i:02d}.md", note("g", round_no, i), "text/markdown")},
                    )

            return timed(send)

        # Warm-up, not counted: each worker process loads its embedder on its first upload.
        list(pool.map(to_worker, ["bench_burst_warmup"] * burst, [-1] * burst, range(burst)))
        baseline, through = [], []
        for round_no in range(args.rounds):
            table = f"bench_burst_{round_no}"
            start = time.perf_counter()
            answers = list(pool.map(to_worker, [table] * burst, [round_no] * burst, range(burst)))
            wall = time.perf_counter() - start
            baseline.append(
                {
                    "wall": wall,
                    "latencies": [t for t, _ in answers],
                    "outcomes": [outcome(a) for _, a in answers],
                    "not_once": listed_once(worker_names(worker.url, table), expected),
                }
            )

            index = api.post("/api/indexes", json={"name": f"Burst {round_no}"}, headers=user).json()
            start = time.perf_counter()
            answers = list(pool.map(to_gateway, [index["id"]] * burst, [round_no] * burst, range(burst)))
            wall = time.perf_counter() - start
            listed = api.get(f"/api/indexes/{index['id']}", headers=user).json()["documents"]
            on_worker = worker_names(worker.url, worker_table(tmp, index["id"]))
            through.append(
                {
                    "wall": wall,
                    "latencies": [t for t, _ in answers],
                    "outcomes": [outcome(a) for _, a in answers],
                    "not_once": listed_once([d["filename"] for d in listed], expected)
                    + listed_once(on_worker, expected),
                }
            )
            print(
                f"round {round_no + 1}/{args.rounds}: worker {baseline[-1]['wall']:.1f} s "
                f"({burst - baseline[-1]['outcomes'].count('ok')} failed), gateway {wall:.1f} s "
                f"({burst - through[-1]['outcomes'].count('ok')} failed)",
                flush=True,
            )
        retries = log_lines(gateway.log_path, "sending it once more")
        recovered = log_lines(gateway.log_path, "but the worker indexed it")

    try:
        load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        load = "n/a"
    print(
        f"\n{args.rounds} rounds of {burst} concurrent uploads, worker with {args.workers} gunicorn processes; "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, load average at the end {load}\n"
    )
    print(
        "| path | uploads | failed (how) | round wall p50 / max | uploads/s | one upload p50 / p95 / max "
        "| files not listed exactly once |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, rows in (("straight to the worker (baseline)", baseline), ("through the gateway", through)):
        s = summarise(rows)
        print(
            f"| {name} | {s['uploads']} | {s['failed']} ({s['how']}) | {s['wall_p50']:.1f} / {s['wall_max']:.1f} s "
            f"| {s['per_s']:.1f} | {s['p50']:.2f} / {s['p95']:.2f} / {s['max']:.2f} s | {s['not_once']} |"
        )
    print(
        f"\ngateway: {len(retries)} requests sent once more after a connection failed before any answer; "
        f"{len(recovered)} uploads recorded after a lost answer"
    )
    for line in retries + recovered:  # what failed, as the gateway logged it
        print("  " + line.strip()[-300:])


if __name__ == "__main__":
    main()
