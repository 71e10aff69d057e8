"""Overhead of the text-to-SQL path: a spreadsheet question answered by the `sql` route versus retrieval.

    .venv/bin/python -m bench.sql_overhead [--rows 10000] [--turns 30]

Generates a deterministic spreadsheet (CSV, `--rows` rows of admissions: ward, date, cost, resident). Its first
500 rows are uploaded to the real worker (so the index has chunks and the table exists); then the full sheet is
loaded as the same table in-process into the worker's store (read, detect, type, write Parquet; timed), since
chunking and embedding a 100k-row upload would take the bench's time, not the query's. The worker runs against a
zero-latency fake Ollama whose utility model answers the SQL prompt with a fixed GROUP BY query. Each turn is
forced to a route: `sql` (write the query, validate, run it in DuckDB) and, as the baseline in the same run,
`rag` (search, evaluate, expand) on the same questions, interleaved. Printed: the worker-side overhead to the first
token (first_token_ms - llm_first_token_ms) per route and the sql stage's own time.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import httpx

from rag_worker.pipeline.prompts import DEFAULTS
from tests.ollama_server import OLLAMA_ENV, FakeOllama, default_responder
from tests.servers import worker_process
from tests.sse import parse_lines

QUERY = "SELECT ward, COUNT(*) AS admissions, AVG(cost) AS average_cost FROM admissions GROUP BY ward ORDER BY ward"
QUESTIONS = [
    "How many residents were admitted per ward?",
    "What is the average cost per ward?",
    "Which ward had the most admissions?",
]


def make_csv(path: Path, rows: int) -> None:
    rng = random.Random(7)
    wards = ["North", "South", "East", "West", "Garden", "River"]
    lines = ["Ward,Admitted,Cost,Resident"]
    for i in range(rows):
        lines.append(
            f"{rng.choice(wards)},2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d},"
            f'"${rng.randint(100, 5000):,}.{rng.randint(0, 99):02d}",Resident {i}'
        )
    path.write_text("\n".join(lines) + "\n")


def load_in_process(path: Path, store: Path, index: str) -> float:
    from rag_worker import tables

    t0 = time.perf_counter()
    sheets = tables.read_sheets(path, "csv", max_cells=10_000_000)
    tables.replace_tables(SimpleNamespace(index_store=store), index, "default", path.name, sheets)
    return time.perf_counter() - t0


def responder(model, messages, request):
    if messages and messages[0].get("content") == DEFAULTS["sql"]:
        return QUERY
    return default_responder(model, messages, request)


def turn(url: str, prompt: str, route: str) -> dict:
    body = {"prompt": prompt, "index": "sqlbench", "options": {"route": route}}
    with httpx.Client(timeout=300) as c, c.stream("POST", url + "/chat_stream", json=body) as r:
        for event, data in parse_lines(r.iter_lines()):
            if event == "done":
                return {**data["timings"], "route": data["route"]}
            if event == "error":
                raise RuntimeError(data)
    raise RuntimeError("stream ended without done")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--turns", type=int, default=30)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        sheet = tmp / "admissions.csv"
        make_csv(sheet, args.rows)
        sheet_mb = sheet.stat().st_size / 1e6
        head = "\n".join(sheet.read_text().splitlines()[:501]) + "\n"
        with (
            FakeOllama() as fake,
            worker_process(
                tmp,
                env={
                    "OLLAMA_HOST": fake.url,
                    **OLLAMA_ENV,
                    "OVERVIEW_SUMMARIES": "off",
                },
            ) as worker,
        ):
            fake.responder = responder
            with httpx.Client(base_url=worker.url, timeout=600) as c:
                t0 = time.perf_counter()
                resp = c.post(
                    "/add_document",
                    data={"index": "sqlbench"},
                    files={"file": (sheet.name, head.encode())},
                )
                upload_s = time.perf_counter() - t0
                resp.raise_for_status()
            load_s = load_in_process(sheet, tmp / "index_store", "sqlbench")
            for route in ("sql", "rag"):
                turn(worker.url, QUESTIONS[0], route)  # warm up
            results: dict[str, list[dict]] = {"sql": [], "rag": []}
            for i in range(args.turns):
                for route in ("sql", "rag") if i % 2 == 0 else ("rag", "sql"):
                    results[route].append(turn(worker.url, QUESTIONS[i % len(QUESTIONS)], route))
    print(f"\nspreadsheet: {args.rows} rows x 4 columns ({sheet_mb:.1f} MB CSV)")
    print(f"table load in-process (read, detect, type, write Parquet): {load_s * 1000:.0f} ms")
    print(
        f"upload of the first 500 rows through the worker: {upload_s:.1f} s ({resp.json()['chunks']} chunks)"
    )
    print(
        f"\n{'route':6} {'overhead p50':>13} {'p95':>8} {'sql stage p50':>14}  (fake Ollama, zero latency; {args.turns} turns each)"
    )
    for route, rows in results.items():
        assert all(r["route"] == route for r in rows), f"{route} turns fell back: {rows[:1]}"
        over = sorted(r["first_token_ms"] - r["llm_first_token_ms"] for r in rows)
        sql_ms = statistics.median([r.get("sql_ms", 0) for r in rows])
        p95 = over[min(len(over) - 1, round(0.95 * (len(over) - 1)))]
        print(f"{route:6} {statistics.median(over):>10.0f} ms {p95:>5.0f} ms {sql_ms:>11.0f} ms")


if __name__ == "__main__":
    main()
