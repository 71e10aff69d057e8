"""Issue 27, the SQL route: the time limit under the served worker (gunicorn + gevent), a bound on the size of
a result, no spilling into `<cwd>/.tmp`, and the CTE-scoping trick that got a file read past the checker.

The query reaches the worker the way the report's user sent it: a prompt override (`options.prompts.sql`) that
the worker hands the model as its system prompt; the fake model answers it with a fixed query.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.integration.hardening.helpers import NUMBERS_CSV, SQL_PROMPT, sql_requests, worker_in, writes_sql

WARDS_CSV = "ward,cost\nNorth,1200.5\nSouth,800\nEast,410\n"
ENDLESS = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) AS n FROM r"
# DISTINCT over a billion generated keys: the hash table passes DuckDB's 512 MB limit within seconds.
SPILLS = (
    "SELECT count(*) AS n FROM (SELECT DISTINCT a.n * 1000000 + b.n * 1000 + c.n AS k "
    "FROM numbers AS a, numbers AS b, numbers AS c)"
)


def upload_tables(worker, index: str = "hosp") -> None:
    with httpx.Client(base_url=worker.url, timeout=180) as client:
        for name, text in (("wards.csv", WARDS_CSV), ("numbers.csv", NUMBERS_CSV)):
            resp = client.post("/add_document", data={"index": index}, files={"file": (name, text.encode())})
            assert resp.status_code == 200, resp.text


def chat(worker, question: str, timeout: float = 60) -> httpx.Response:
    body = {"prompt": question, "index": "hosp", "options": {"route": "sql", "prompts": {"sql": SQL_PROMPT}}}
    return httpx.post(worker.url + "/chat", json=body, timeout=timeout)


def chat_within(worker, question: str, seconds: float) -> httpx.Response:
    """`chat`, failing (not hanging) when no answer comes within `seconds` of wall time."""
    outcome: dict = {}

    def ask():
        try:
            outcome["response"] = chat(worker, question, timeout=seconds)
        except httpx.HTTPError as exc:
            outcome["error"] = repr(exc)

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    asker.join(timeout=seconds)
    assert "response" in outcome, f"no answer within {seconds:g} s: {outcome.get('error', 'still running')}"
    return outcome["response"]


@pytest.fixture(scope="module")
def sql_worker(tmp_path_factory, fake_ollama_server):
    """One worker for the module, with a 2 s query limit. The endless query runs first: were the limit not to
    stop it, the worker would stay busy and every later test would fail too, as it should."""
    proc = worker_in(tmp_path_factory.mktemp("sql_limits"), fake_ollama_server.url, SQL_TIMEOUT_S="2")
    with proc:
        upload_tables(proc)
        yield proc


def test_health_answers_during_an_endless_query_and_the_query_stops_at_the_limit(sql_worker, fake_ollama):
    fake_ollama.responder = writes_sql(ENDLESS)
    outcome: dict = {}

    def ask():
        started = time.monotonic()
        try:
            outcome["response"] = chat(sql_worker, "How many numbers are there in total?", timeout=30)
        except httpx.HTTPError as exc:
            outcome["error"] = repr(exc)
        outcome["seconds"] = time.monotonic() - started

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    deadline = time.monotonic() + 30
    while not sql_requests(fake_ollama) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sql_requests(fake_ollama), "the worker never asked the model for SQL"
    time.sleep(0.5)  # the query is running now
    started = time.monotonic()
    try:
        probe = httpx.get(sql_worker.url + "/health", timeout=5)
        health = (probe.status_code, time.monotonic() - started)
    except httpx.HTTPError as exc:
        health = (repr(exc), time.monotonic() - started)
    assert isinstance(health[0], int) and health[1] < 1.0, f"/health during the query: {health}"
    asker.join(timeout=20)
    assert "response" in outcome, f"the turn did not end: {outcome}"
    done = outcome["response"].json()
    assert outcome["response"].status_code == 200, done
    assert "longer than 2 s" in done["flags"].get("sql_fallback", ""), done["flags"]
    assert outcome["seconds"] < 12, outcome["seconds"]


@pytest.mark.parametrize(
    "sql",
    [
        # A CTE named like a file in an inner scope: the outer reference is not the CTE but a file read.
        'SELECT * FROM (WITH "/etc/hostname.csv" AS (SELECT 1 AS a) SELECT a FROM "/etc/hostname.csv") '
        'UNION ALL SELECT * FROM "/etc/hostname.csv"',
        'SELECT * FROM "/etc/hostname.csv" WHERE EXISTS (WITH "/etc/hostname.csv" AS (SELECT 1) '
        'SELECT 1 FROM "/etc/hostname.csv")',
    ],
    ids=["union", "exists"],
)
def test_a_cte_in_an_inner_scope_does_not_let_a_file_name_past_the_checker(sql_worker, fake_ollama, sql):
    """Only DuckDB's external-access setting stopped these; the checker itself must refuse them (both layers)."""
    fake_ollama.responder = writes_sql(sql)
    resp = chat_within(sql_worker, "How many wards are there?", seconds=60)
    assert resp.status_code == 200, resp.text[:500]
    fallback = resp.json()["flags"].get("sql_fallback", "")
    assert fallback.startswith("query refused") and "unknown table" in fallback, fallback


def test_a_huge_one_row_result_is_bounded_in_bytes(sql_worker, fake_ollama):
    """`SELECT range(n)` is one row, inside the row limit: the reply must not carry megabytes of it."""
    fake_ollama.responder = writes_sql("SELECT range(200000) AS r")
    resp = chat_within(sql_worker, "How many numbers are in the range?", seconds=90)
    assert resp.status_code == 200, resp.text[:500]
    size = len(resp.content)
    done = resp.json()
    tables = [d for d in done["documents"] if d.get("kind") == "table"]
    said = done["flags"].get("sql_fallback", "") + " ".join(str(d.get("truncated")) for d in tables)
    assert size < 1_000_000, f"a {size:,}-byte reply for one row ({said[:200]})"
    # Refused (falls back, saying why) or truncated (the document says so): never silently cut.
    assert done["flags"].get("sql_fallback") or all(d["truncated"] for d in tables), done["flags"]


@pytest.mark.slow
def test_a_query_that_passes_the_memory_limit_writes_nothing_under_the_working_directory(
    sql_worker, fake_ollama
):
    spill = sql_worker.cwd / ".tmp"
    fake_ollama.responder = writes_sql(SPILLS)
    outcome: dict = {}

    def ask():
        try:
            outcome["response"] = chat(sql_worker, "How many distinct keys are there in total?", timeout=40)
        except httpx.HTTPError as exc:
            outcome["error"] = repr(exc)

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    deadline = time.monotonic() + 40
    while asker.is_alive() and time.monotonic() < deadline and not spill.exists():
        time.sleep(0.1)
    leftovers = sorted(p.name for p in spill.rglob("*")) if spill.exists() else []
    assert not spill.exists(), f"DuckDB spilled into {spill}: {leftovers[:5]}"
    assert "response" in outcome, outcome
