"""The `sql` route end to end: spreadsheets uploaded to the real worker become tables, the fake Ollama writes a
fixed query for a fixed question, the worker validates and runs it, and the answer carries the computed figure."""

from __future__ import annotations

import io
import json

import httpx
import pytest

from rag_worker.pipeline.prompts import DEFAULTS
from tests.ollama_server import OLLAMA_ENV, default_responder
from tests.servers import worker_process
from tests.sse import post_events

WARDS_CSV = (
    "Ward admissions 2024\n"
    "\n"
    "Ward,Admitted,Cost,Resident\n"
    'North,2024-03-02,"$1,200.50",Ann Abbott\n'
    "South,2024-03-15,$800,Bob Brand\n"
    "North,2024-04-01,$950,Cy Cole\n"
    "East,2024-03-20,$410,Di Dale\n"
    "East,2024-05-02,$390,Ed Eld\n"
    "South,2024-05-09,$700,Flo Fenn\n"
)
TOTALS = "SELECT ward, SUM(cost) AS total_cost FROM wards GROUP BY ward ORDER BY ward"


def staff_xlsx() -> bytes:
    import openpyxl

    book = openpyxl.Workbook()
    ws = book.active
    ws.title = "Nurses"
    ws.append(["Name", "Ward", "Salary"])
    for row in (["Gus", "North", 41000], ["Hal", "South", 39000], ["Ivy", "North", 45500]):
        ws.append(row)
    shifts = book.create_sheet("Shifts")
    shifts.append(["Name", "Hours"])
    shifts.append(["Gus", 38])
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("sql_route")


@pytest.fixture(scope="module")
def worker(tmp, fake_ollama_server):
    env = {
        "OLLAMA_HOST": fake_ollama_server.url,
        "OVERVIEW_SUMMARIES": "off",
        "SQL_MAX_ROWS": "4",
        **OLLAMA_ENV,
    }
    proc = worker_process(tmp, env=env)
    with proc:
        with httpx.Client(base_url=proc.url, timeout=180) as client:
            for name, data in (("wards.csv", WARDS_CSV.encode()), ("staff.xlsx", staff_xlsx())):
                resp = client.post("/add_document", data={"index": "hosp"}, files={"file": (name, data)})
                assert resp.status_code == 200, resp.text
        yield proc


def writes_sql(question: str, sql: str):
    """A responder that answers the SQL prompt for `question` with `sql`, and behaves as the default otherwise."""

    def respond(model, messages, request):
        if messages and messages[0].get("content") == DEFAULTS["sql"]:
            if f"Question: {question}\n" in messages[-1]["content"]:
                return sql
            return "NONE"
        return default_responder(model, messages, request)

    return respond


def turn(worker, prompt: str, **options) -> list[tuple[str, dict]]:
    body = {"prompt": prompt, "index": "hosp", "options": options}
    status, events = post_events(worker.url + "/chat_stream", body)
    assert status == 200, events
    events = [(e, d) for e, d in events if e != ":"]
    assert events[-1][0] == "done", events[-1]
    return events


def sql_steps(events) -> list[dict]:
    return [d for e, d in events if e == "step" and d["step"] == "sql"]


def test_an_aggregate_question_is_answered_from_the_computed_table(worker, fake_ollama):
    question = "What is the total cost per ward?"
    fake_ollama.responder = writes_sql(question, TOTALS)
    events = turn(worker, question)
    triage = [d for e, d in events if e == "step" and d["step"] == "triage"][-1]
    assert triage["detail"]["route"] == "sql"
    steps = sql_steps(events)
    assert any(s.get("detail", {}).get("query") == TOTALS for s in steps)
    docs = dict(events)["documents"]["documents"]
    assert len(docs) == 1 and docs[0]["kind"] == "table" and docs[0]["query"] == TOTALS
    assert docs[0]["columns"] == ["ward", "total_cost"]
    assert docs[0]["rows"] == [["East", 800.0], ["North", 2150.5], ["South", 1500.0]]
    assert docs[0]["filename"] == "wards.csv"
    done = events[-1][1]
    assert done["route"] == "sql" and done["flags"]["sql"] == TOTALS
    # 2150.5 is in no cell of the file (1,200.50 + 950): only the query computed it.
    assert "2150.5" in done["reply"] and done["citations"][0]["ref"] == "S1"


def test_a_sheet_of_a_workbook_is_its_own_table(worker, fake_ollama):
    question = "What is the average salary of nurses on the North ward?"
    sql = "SELECT AVG(salary) AS average_salary FROM staff_nurses WHERE ward = 'North'"
    fake_ollama.responder = writes_sql(question, sql)
    done = turn(worker, question)[-1][1]
    assert done["route"] == "sql" and done["documents"][0]["rows"] == [[43250.0]]
    assert "43250" in done["reply"]


def test_forced_sql_route_and_row_limit(worker, fake_ollama):
    question = "List the residents"
    fake_ollama.responder = writes_sql(question, "SELECT resident FROM wards ORDER BY resident")
    done = turn(worker, question, route="sql")[-1][1]
    doc = done["documents"][0]
    assert done["route"] == "sql" and doc["truncated"] is True and len(doc["rows"]) == 4


@pytest.mark.parametrize(
    ("sql", "why"),
    [
        ("DROP TABLE wards", "only SELECT"),
        ("SELECT * FROM wards; DROP TABLE wards", "one statement"),
        ("SELECT * FROM residents", "unknown table"),
        ("SELECT * FROM read_csv('/etc/passwd')", "table functions"),
        ("SELECT getenv('HOME') AS h FROM wards", "not allowed"),
    ],
)
def test_a_refused_query_falls_back_to_retrieval_and_says_so(worker, fake_ollama, sql, why):
    question = "How many residents were admitted per ward?"
    fake_ollama.responder = writes_sql(question, sql)
    events = turn(worker, question)
    last = sql_steps(events)[-1]
    assert (
        last["method"] == "fallback" and why in last["label"] and "searching the documents" in last["label"]
    )
    done = events[-1][1]
    assert done["route"] == "rag" and done["flags"]["sql_fallback"].startswith("query refused")
    assert all(d.get("kind") != "table" for d in done["documents"])
    # Nothing was dropped: the table still answers.
    fake_ollama.responder = writes_sql(question, "SELECT count(*) AS n FROM wards")
    assert turn(worker, question)[-1][1]["documents"][0]["rows"] == [[6]]


def test_the_overview_describes_the_tables(worker, tmp):
    lines = (tmp / "index_store" / "overviews" / "hosp.jsonl").read_text().splitlines()
    overviews = {e["filename"]: e["overview"] for e in map(json.loads, lines)}
    assert "table wards" in overviews["wards.csv"] and "cost DOUBLE" in overviews["wards.csv"]
    assert "staff_nurses" in overviews["staff.xlsx"] and "staff_shifts" in overviews["staff.xlsx"]


def test_bad_route_is_a_400(worker):
    resp = httpx.post(
        worker.url + "/chat", json={"prompt": "x", "index": "hosp", "options": {"route": "SQL;"}}
    )
    assert resp.status_code == 400 and "route" in resp.text


def test_deleting_the_spreadsheet_removes_its_table(worker, fake_ollama, tmp):
    with httpx.Client(base_url=worker.url, timeout=60) as client:
        resp = client.post(
            "/add_document", data={"index": "gone"}, files={"file": ("beds.csv", b"ward,beds\nA,3\n")}
        )
        assert resp.status_code == 200, resp.text
        question = "How many beds are there in total?"
        fake_ollama.responder = writes_sql(question, "SELECT SUM(beds) AS beds FROM beds")
        body = {"prompt": question, "index": "gone"}
        assert client.post("/chat", json=body).json()["route"] == "sql"
        resp = client.post("/delete", json={"index": "gone", "dataset": "default", "filename": "beds.csv"})
        assert resp.status_code == 200, resp.text
    assert list((tmp / "index_store" / "tables" / "gone").iterdir()) == []
