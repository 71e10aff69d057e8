"""The small parts of the observability layer, without servers: who counts as a loopback scraper, which request
ids are kept, the JSON log line, a turn's metrics read from its timings, and METRICS=off."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

from prometheus_client import REGISTRY

from contract import observe
from gateway import metrics as gateway_metrics
from rag_worker import metrics as worker_metrics
from tests.servers import ROOT


def test_only_an_unproxied_local_client_is_loopback() -> None:
    assert observe.is_loopback_client("127.0.0.1", forwarded=False)
    assert observe.is_loopback_client("::1", forwarded=False)
    assert not observe.is_loopback_client("127.0.0.1", forwarded=True)  # a proxy on this machine relays it
    for address in ("10.0.0.5", "", None, "localhost", "not an address"):
        assert not observe.is_loopback_client(address, forwarded=False), address


def test_a_callers_request_id_is_kept_only_when_it_is_a_plain_token() -> None:
    assert observe.new_request_id("abc-123_X.y:z") == "abc-123_X.y:z"
    # A trailing line feed too: `$` alone would match before it, and the id would break the log line it is on.
    for hostile in ("a" * 65, "has space", "new\nline", "<script>", "", "abc\n", "abc\r\n"):
        fresh = observe.new_request_id(hostile)
        assert fresh != hostile and len(fresh) == 32 and int(fresh, 16) >= 0


def test_a_json_line_carries_the_request_context_and_the_extras() -> None:
    record = logging.LogRecord("gateway.access", logging.INFO, __file__, 1, "GET %s %s", ("/x", 200), None)
    record.duration_ms = 12.5
    token = observe.request_id.set("req-1")
    user = observe.user_id.set(7)
    try:
        observe.ContextFilter("gateway").filter(record)
    finally:
        observe.request_id.reset(token)
        observe.user_id.reset(user)
    line = json.loads(observe.JsonFormatter().format(record))
    assert line["service"] == "gateway" and line["level"] == "info" and line["message"] == "GET /x 200"
    assert line["request_id"] == "req-1" and line["user_id"] == 7 and line["duration_ms"] == 12.5
    assert line["timestamp"].endswith("+00:00") and "trace_id" not in line  # tracing is off here


def sample(name: str, labels: dict) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_turn_is_counted_once_with_its_stages_from_its_timings() -> None:
    before = {
        "turns": sample("rag_worker_turns_total", {"route": "sql", "outcome": "answered"}),
        "sql": sample("rag_worker_stage_duration_seconds_count", {"stage": "sql"}),
        "queued": sample("rag_worker_stage_duration_seconds_count", {"stage": "queued"}),
        "tokens": sample("rag_worker_tokens_streamed_total", {"route": "sql"}),
    }
    timings = {"sql_ms": 250, "queued_ms": 5, "total_ms": 900, "first_token_ms": 400, "trace_id": "ab" * 16}
    worker_metrics.observe_turn("sql", "answered", timings, 7, {"action": "none"})
    assert sample("rag_worker_turns_total", {"route": "sql", "outcome": "answered"}) == before["turns"] + 1
    assert sample("rag_worker_stage_duration_seconds_count", {"stage": "sql"}) == before["sql"] + 1
    # The queue has its own histogram; the turn's clocks and the trace id are no stages.
    assert sample("rag_worker_stage_duration_seconds_count", {"stage": "queued"}) == before["queued"]
    assert sample("rag_worker_tokens_streamed_total", {"route": "sql"}) == before["tokens"] + 7
    assert worker_metrics.ingest_format("report.PDF") == "pdf"
    assert worker_metrics.ingest_format("secret-plans.exe") == "unsupported"  # never the name


def test_a_stored_turns_outcome_label() -> None:
    outcome = gateway_metrics.turn_outcome
    assert outcome("complete", False, None, False) == "answered"
    assert outcome("complete", False, None, True) == "abstained"
    assert outcome("interrupted", True, {"code": "stopped"}, False) == "stopped"
    assert outcome("interrupted", False, {"code": "interrupted"}, False) == "interrupted"
    assert outcome("failed", False, {"code": "busy"}, False) == "refused"
    assert outcome("failed", False, {"code": "llm_unavailable"}, False) == "failed"


def test_metrics_off_records_nothing_and_costs_no_registry() -> None:
    script = (
        "from rag_worker import metrics as w; from gateway import metrics as g\n"
        "from contract.metrics import ENABLED; assert not ENABLED\n"
        "w.observe_turn('rag', 'answered', {'retrieve_ms': 3, 'total_ms': 9}, 2, {'action': 'none'})\n"
        "g.observe_turn('rag', 'answered', 1.0, 0.5, 3); w.QUEUE_WAITING.set(4)\n"
        "from prometheus_client import REGISTRY\n"
        "names = {m.name for m in REGISTRY.collect()}\n"
        "assert not any(n.startswith(('rag_worker_', 'gateway_')) for n in names), names\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env={"METRICS": "off", "PATH": ""}, capture_output=True
    )
    assert run.returncode == 0, run.stderr.decode()
