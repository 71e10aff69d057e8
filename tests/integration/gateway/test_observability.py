"""What an operator sees, on one boot of everything: the real worker and gateway with JSON logs and OTLP export,
Debian's real Prometheus scraping both, and a small OTLP receiver (tests/otlp_receiver.py) for the traces.

One scenario runs once (log in, a failed login, an upload, two document turns and a small-talk turn) and each
test checks what one tool shows of it: Prometheus's HTTP API (the turn counter, a stage histogram, the queue
gauge), the trace of a turn (gateway request → turn → worker request → stages → model call), and the logs
(every line JSON with its request's context, no secret and no document text in any of them).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
import urllib.parse

import httpx
import pytest

from tests.integration.gateway.helpers import DUCK, register, stream_turn
from tests.ollama_server import OLLAMA_ENV, FakeOllama
from tests.otlp_receiver import OtlpReceiver
from tests.servers import ServerProcess, free_port, gateway_process, worker_process

# One boot of five servers (a minute on the loaded 2-core box): in the slow tier, started first.
pytestmark = pytest.mark.slow

PROMETHEUS = shutil.which("prometheus")
JWT_SECRET = "obs-jwt-secret-4f0c2a9e7d1b"
WORKER_KEY = "obs-worker-key-8e3d5c1a2b7f"
PASSWORD = "obs passphrase 3b9f1e long enough"
USER_PASSWORD = "another passphrase 7c2d long"
# A sentence of the uploaded document: it reaches the model and the answer, never a log line.
DOC_TEXT = "first lay down in a water and try not to drown"
SLOTS = 3
STREAM_ROUTE = "/api/chats/{id:int}/messages/stream"


def prometheus_config(path, worker_port: int, gateway_port: int) -> None:
    path.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n"
        f"  - job_name: rag_worker\n    static_configs:\n      - targets: ['127.0.0.1:{worker_port}']\n"
        f"  - job_name: gateway\n    static_configs:\n      - targets: ['127.0.0.1:{gateway_port}']\n"
    )


@pytest.fixture(scope="module")
def observed(tmp_path_factory):
    """The stack, its tools, and what the scenario did."""
    if PROMETHEUS is None:
        pytest.skip("Debian's prometheus is not installed (scripts/setup.sh --dev installs it)")
    tmp = tmp_path_factory.mktemp("observability")
    with contextlib.ExitStack() as stack:
        ollama = stack.enter_context(FakeOllama())
        otlp = stack.enter_context(OtlpReceiver())
        common = {
            "LOG_FORMAT": "json",
            "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url,
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "WORKER_API_KEY": WORKER_KEY,
            "SSE_KEEPALIVE_S": "1",
        }
        worker = stack.enter_context(
            worker_process(
                tmp,
                env={
                    **common,
                    "OLLAMA_HOST": ollama.url,
                    "TORCH_THREADS": "1",
                    "RAG_CONCURRENCY": str(SLOTS),
                    # Two gunicorn processes: the scrape must add up both (prometheus_client's multi-process
                    # mode, in a folder the worker makes itself).
                    "WORKER_WORKERS": "2",
                    **OLLAMA_ENV,
                },
            )
        )
        gateway = stack.enter_context(
            gateway_process(
                tmp,
                worker_url=worker.url,
                env={**common, "JWT_SECRET": JWT_SECRET, "OLLAMA_HOST": ollama.url},
            )
        )
        prom_port = free_port()
        config = tmp / "prometheus.yml"
        prometheus_config(config, worker.port, gateway.port)
        prom = stack.enter_context(
            ServerProcess(
                [
                    PROMETHEUS,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                ],
                prom_port,
                {},
                tmp / "logs" / "prometheus.log",
                health_path="/-/ready",
            )
        )
        api = stack.enter_context(httpx.Client(base_url=gateway.url, timeout=300))
        yield {
            "worker": worker,
            "gateway": gateway,
            "prometheus": prom,
            "otlp": otlp,
            "api": api,
            **scenario(api),
        }


def scenario(api: httpx.Client) -> dict:
    admin = register(api, "obs_admin", PASSWORD)  # the first account: the administrator
    user = register(api, "obs_user", USER_PASSWORD)
    login = api.post("/api/auth/login", json={"username": "obs_admin", "password": PASSWORD})
    assert login.status_code == 200
    wrong = api.post("/api/auth/login", json={"username": "obs_user", "password": "not the password at all"})
    assert wrong.status_code == 401
    index = api.post("/api/indexes", json={"name": "Ducks"}, headers=admin).json()
    r = api.post(
        f"/api/indexes/{index['id']}/documents?wait=1",
        headers=admin,
        data={"dataset": "animals"},
        files={"file": ("duck.md", DUCK.read_bytes(), "text/markdown")},
    )
    assert r.status_code == 201, r.text
    turns = []
    for question in ("What do ducks eat?", "How do I get started with swimming?", "Thanks!"):
        chat = api.post("/api/chats", json={"index_ids": [index["id"]]}, headers=admin).json()
        turns.append(dict(stream_turn(api, chat["id"], admin, message=question)))
    assert [t["done"]["route"] for t in turns] == ["rag", "rag", "direct"]
    tokens = [admin["Authorization"].split()[1], user["Authorization"].split()[1], login.json()["token"]]
    return {"admin": admin, "user": user, "turns": turns, "chunks": r.json()["chunks"], "tokens": tokens}


def prom_value(prom: ServerProcess, query: str, want, timeout: float = 20.0) -> float | None:
    """The query's single value once it is `want` (or `want(value)` holds; scrapes come every second), else the
    last one seen."""
    deadline, value = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        r = httpx.get(f"{prom.url}/api/v1/query", params={"query": query}, timeout=5)
        assert r.status_code == 200, r.text
        result = r.json()["data"]["result"]
        value = float(result[0]["value"][1]) if result else None
        if (want(value) if callable(want) else value == want) or (value is None and want is None):
            return value
        time.sleep(0.5)
    return value


def test_prometheus_scrapes_both_services_and_counts_what_happened(observed) -> None:
    prom = observed["prometheus"]
    up = httpx.get(f"{prom.url}/api/v1/query", params={"query": "up"}).json()["data"]["result"]
    assert {(s["metric"]["job"], s["value"][1]) for s in up} == {("rag_worker", "1"), ("gateway", "1")}
    # The turn counters of both services: two document answers and one small-talk answer.
    assert prom_value(prom, 'sum(gateway_turns_total{outcome="answered",route="rag"})', 2) == 2
    assert prom_value(prom, 'sum(gateway_turns_total{outcome="answered",route="direct"})', 1) == 1
    assert prom_value(prom, 'sum(rag_worker_turns_total{outcome="answered",route="rag"})', 2) == 2
    assert prom_value(prom, "sum(rag_worker_turns_total)", 3) == 3
    # A stage histogram: each document turn searched once, in as long as its done event said.
    assert prom_value(prom, 'sum(rag_worker_stage_duration_seconds_count{stage="retrieve"})', 2) == 2
    said = sum(t["done"]["timings"]["retrieve_ms"] for t in observed["turns"][:2]) / 1000
    summed = prom_value(prom, 'sum(rag_worker_stage_duration_seconds_sum{stage="retrieve"})', said)
    assert summed == pytest.approx(said, abs=0.002)
    # The queue gauges: its slots as configured, nothing waiting or running once the turns are over, and each
    # document turn passed through it at least once.
    assert prom_value(prom, "max(rag_worker_queue_slots)", SLOTS) == SLOTS  # per process
    assert prom_value(prom, "rag_worker_queue_waiting", 0) == 0
    assert prom_value(prom, "rag_worker_queue_busy", 0) == 0
    assert prom_value(prom, "rag_worker_queue_wait_seconds_count", lambda v: v is not None and v >= 2) >= 2
    # The upload, the model calls and the requests, by route template.
    assert prom_value(prom, 'rag_worker_ingest_files_total{format="md",outcome="indexed"}', 1) == 1
    chunks = observed["chunks"]
    assert prom_value(prom, 'rag_worker_ingest_chunks_total{format="md"}', chunks) == chunks
    assert prom_value(prom, 'sum(rag_worker_llm_calls_total{backend="ollama",kind="stream"})', 3) == 3
    assert prom_value(prom, "sum(rag_worker_llm_errors_total)", None) is None  # no series: none failed
    stream_query = f'gateway_http_requests_total{{route="{STREAM_ROUTE}",status="200"}}'
    assert prom_value(prom, stream_query, 3) == 3
    assert prom_value(prom, 'gateway_http_requests_total{route="/api/auth/login",status="401"}', 1) == 1
    assert prom_value(prom, 'gateway_turn_first_token_seconds_count{route="rag"}', 2) == 2
    assert prom_value(prom, "sum(gateway_db_session_seconds_count) > bool 0", 1) == 1
    # Labels are templates and fixed words, never a raw path, a user or a text.
    series = httpx.get(
        f"{prom.url}/api/v1/series", params={"match[]": '{__name__=~"gateway_.*|rag_worker_.*"}'}
    )
    labels = {v for s in series.json()["data"] for k, v in s.items() if k not in ("__name__", "instance")}
    assert not any("/api/chats/1" in v or "obs_" in v or "ducks" in v.lower() for v in labels), labels


def test_metrics_are_for_this_machine_or_an_administrator(observed) -> None:
    api, worker = observed["api"], observed["worker"]
    assert api.get("/metrics").status_code == 200  # loopback
    proxied = {"X-Forwarded-For": "203.0.113.9"}  # as if through the proxy in front of the gateway
    r = httpx.get(f"{observed['gateway'].url}/metrics", headers=proxied)  # no cookie, no token
    assert r.status_code == 401 and r.json()["error"]
    r = api.get("/metrics", headers={**proxied, **observed["user"]})
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    r = api.get("/metrics", headers={**proxied, **observed["admin"]})
    assert r.status_code == 200 and "gateway_turns_total" in r.text
    # The worker's key opens both services' metrics (one credential for a Prometheus beside them).
    r = httpx.get(
        f"{observed['gateway'].url}/metrics", headers={**proxied, "Authorization": f"Bearer {WORKER_KEY}"}
    )
    assert r.status_code == 200 and "gateway_http_requests_total" in r.text
    r = httpx.get(
        f"{observed['gateway'].url}/metrics", headers={**proxied, "Authorization": f"Bearer {WORKER_KEY}x"}
    )
    assert r.status_code == 401
    assert httpx.get(f"{worker.url}/metrics").status_code == 200  # loopback, no key
    r = httpx.get(f"{worker.url}/metrics", headers=proxied)
    assert r.status_code == 401 and r.json()["code"] == "unauthorized"
    r = httpx.get(f"{worker.url}/metrics", headers={**proxied, "Authorization": f"Bearer {WORKER_KEY}"})
    assert r.status_code == 200 and "rag_worker_stage_duration_seconds_bucket" in r.text


def wait_spans(otlp: OtlpReceiver, trace_id: str, names: set[str], timeout: float = 20.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        spans = [s for s in otlp.spans() if s["trace_id"] == trace_id]
        if names <= {s["name"] for s in spans}:
            return spans
        time.sleep(0.2)
    return [s for s in otlp.spans() if s["trace_id"] == trace_id]


def test_a_turn_is_one_trace_from_the_gateway_through_the_worker_to_the_model(observed) -> None:
    done = observed["turns"][0]["done"]
    trace_id = done["timings"]["trace_id"]
    assert len(trace_id) == 32 and int(trace_id, 16)
    want = {f"POST {STREAM_ROUTE}", "turn", "stage retrieve", "stage generate", "llm stream"}
    spans = wait_spans(observed["otlp"], trace_id, want)
    names = {s["name"] for s in spans}
    assert want <= names, names
    by_id = {s["span_id"]: s for s in spans}
    [root] = [s for s in spans if s["parent_id"] is None]
    assert root["service"] == "gateway" and root["name"] == f"POST {STREAM_ROUTE}"

    def ancestors(span: dict) -> list[dict]:
        chain = []
        while span["parent_id"] is not None:
            span = by_id[span["parent_id"]]  # every parent is in the same trace
            chain.append(span)
        return chain

    [worker_request] = [
        s for s in spans if s["service"] == "rag_worker" and s["name"].endswith("/chat_stream")
    ]
    assert by_id[worker_request["parent_id"]]["name"] == "turn"  # the worker's request joined the turn's span
    [model] = [s for s in spans if s["name"] == "llm stream"]
    assert model["attributes"]["gen_ai.system"] == "ollama"
    chain = [s["name"] for s in ancestors(model)]
    assert chain[0] == "stage generate" and worker_request["name"] in chain and chain[-1] == root["name"]
    assert worker_request in ancestors(
        by_id[next(s["span_id"] for s in spans if s["name"] == "stage retrieve")]
    )
    # Each turn is a trace of its own.
    assert len({t["done"]["timings"]["trace_id"] for t in observed["turns"]}) == 3


def log_lines(proc: ServerProcess) -> list[str]:
    return [line for line in proc.log_path.read_text(errors="replace").splitlines() if line.strip()]


def test_json_logs_carry_the_request_and_never_a_secret_or_the_documents(observed) -> None:
    worker_lines, gateway_lines = log_lines(observed["worker"]), log_lines(observed["gateway"])
    records = {}
    for service, lines in (("rag_worker", worker_lines), ("gateway", gateway_lines)):
        parsed = []
        for line in lines:
            record = json.loads(line)  # every line is one JSON object
            assert {"timestamp", "level", "service", "message"} <= set(record), record
            assert record["service"] == service
            parsed.append(record)
        records[service] = parsed
    everything = "\n".join(worker_lines + gateway_lines)
    for secret in (JWT_SECRET, WORKER_KEY, PASSWORD, USER_PASSWORD, *observed["tokens"], DOC_TEXT):
        assert secret not in everything, secret
    assert urllib.parse.quote(PASSWORD) not in everything

    trace_id = observed["turns"][0]["done"]["timings"]["trace_id"]
    # The turn's lines on both sides carry its trace; the gateway's its user and request id as well.
    gateway_turn = [r for r in records["gateway"] if r.get("trace_id") == trace_id]
    worker_turn = [r for r in records["rag_worker"] if r.get("trace_id") == trace_id]
    assert gateway_turn and worker_turn
    [access] = [r for r in gateway_turn if r.get("route") == STREAM_ROUTE]
    assert access["status"] == 200 and access["duration_ms"] > 0 and access["user_id"] == 1
    assert access["request_id"] and any(r.get("request_id") == access["request_id"] for r in worker_turn)
    [stored] = [r for r in gateway_turn if r.get("chat_id") is not None]
    assert stored["outcome"] == "complete" and stored["user_id"] == 1 and stored["index"]
    assert any(r.get("route") == "/chat_stream" and r.get("index") for r in worker_turn)
    failed = [r for r in records["gateway"] if r.get("route") == "/api/auth/login" and r.get("status") == 401]
    assert len(failed) == 1 and "user_id" not in failed[0]


def test_the_step_log_feeds_the_admin_statistics_and_nobody_else_reads_them(observed) -> None:
    url = f"{observed['gateway'].url}/api/admin/turn-stats"
    r = httpx.get(url, headers=observed["admin"])
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["hours"] == 24
    stages = {s["step"]: s for s in data["stages"]}
    turns = [t["done"] for t in observed["turns"]]
    # Both document turns searched, all three wrote an answer; each median is the one of what the turns said.
    assert stages["retrieving"]["turns"] == 2 and stages["generating"]["turns"] == 3
    said = sorted(t["timings"]["retrieve_ms"] for t in turns[:2])
    assert stages["retrieving"]["median_ms"] == pytest.approx(sum(said) / 2)
    firsts = sorted(t["timings"]["first_token_ms"] for t in turns)
    assert stages["first_token"]["median_ms"] == firsts[1]
    assert sorted(p["ms"] for p in data["first_tokens"]) == firsts
    assert [p["route"] for p in data["first_tokens"]] == ["rag", "rag", "direct"]

    assert httpx.get(url, headers=observed["user"]).status_code == 404  # not an administrator: no such route
    assert httpx.get(url).status_code == 401
    for query in (
        "hours=abc",
        "hours=0",
        "hours=745",
        "hours=-1",
        "hours=1.5",
        "hours=",
        "hours=1&hours=2",
        "hour=3",
        "hours=" + "9" * 5000,
        "hours=%EF%BC%91",  # a full-width digit one
        "hours=%00",
    ):
        r = httpx.get(f"{url}?{query}", headers=observed["admin"])
        assert r.status_code == 400, (query, r.status_code)
        body = r.json()
        assert body["code"] == "invalid" and body["error"] and body["field"] in ("hours", "hour"), query
