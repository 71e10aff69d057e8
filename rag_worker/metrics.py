"""The worker's Prometheus metrics (`GET /metrics`), recorded where the work is already measured.

Names follow Prometheus conventions: counters end in `_total`, durations are `_seconds`; labels take a small
fixed set of values (a route template, a stage name, a backend, a file format), never a user, a question or
a file name. Stage durations come from the same clocks that fill the `done` event's `timings` (Turn.timed):
nothing is timed twice.

Several gunicorn processes (WORKER_WORKERS > 1) share one view through prometheus_client's multi-process mode:
PROMETHEUS_MULTIPROC_DIR names a folder each process writes its values to (`python -m rag_worker serve` makes
one when it starts several processes and none is given), gunicorn's `child_exit` hook drops a dead process's
gauges (deploy/gunicorn.conf.py), and whichever process answers a scrape sums every process's files.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from prometheus_client import Counter, Gauge, Histogram

from contract.metrics import HTTP_BUCKETS, LATENCY_BUCKETS, metric

STAGE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

HTTP_REQUESTS = metric(
    Counter,
    "rag_worker_http_requests_total",
    "HTTP requests answered, by route template (never the raw path) and status",
    ["method", "route", "status"],
)
HTTP_DURATION = metric(
    Histogram,
    "rag_worker_http_request_duration_seconds",
    "Time from a request's arrival to the end of its answer (a stream's last byte)",
    ["method", "route"],
    buckets=HTTP_BUCKETS,
)
TURNS = metric(
    Counter,
    "rag_worker_turns_total",
    "Chat turns by the route they took (rag, sql, direct; auto before triage) and how they ended: answered, "
    "abstained, stopped (the client left), failed, refused (503, the queue was full)",
    ["route", "outcome"],
)
FIRST_TOKEN = metric(
    Histogram,
    "rag_worker_turn_first_token_seconds",
    "From a turn's start to its first answer token",
    ["route"],
    buckets=LATENCY_BUCKETS,
)
TURN_DURATION = metric(
    Histogram,
    "rag_worker_turn_duration_seconds",
    "From a turn's start to its done event",
    ["route"],
    buckets=LATENCY_BUCKETS,
)
STAGE_DURATION = metric(
    Histogram,
    "rag_worker_stage_duration_seconds",
    "Time a pipeline stage took in one turn (the `<stage>_ms` of the done event's timings): rewrite, triage, "
    "fetch_check, hyde, retrieve, rerank, evaluate (the relevance check), retry, expand, sql, generate, "
    "grounding, provenance",
    ["stage"],
    buckets=STAGE_BUCKETS,
)
QUEUE_WAIT = metric(
    Histogram,
    "rag_worker_queue_wait_seconds",
    "Time a turn waited for a slot of the CPU queue (each pass: search, expansion, a retry's search, HyDE, "
    "grounding, provenance)",
    buckets=STAGE_BUCKETS,
)
QUEUE_WAITING = metric(
    Gauge,
    "rag_worker_queue_waiting",
    "Turns waiting for a slot of the CPU queue",
    multiprocess_mode="livesum",
)
QUEUE_BUSY = metric(
    Gauge, "rag_worker_queue_busy", "Slots of the CPU queue held by a turn now", multiprocess_mode="livesum"
)
QUEUE_SLOTS = metric(
    Gauge,
    "rag_worker_queue_slots",
    "Slots of the CPU queue of one process (RAG_CONCURRENCY, or its CPUs)",
    multiprocess_mode="livemax",
)
TOKENS = metric(Counter, "rag_worker_tokens_streamed_total", "Answer tokens streamed to clients", ["route"])
LLM_CALLS = metric(
    Counter,
    "rag_worker_llm_calls_total",
    "Calls to a language model, by backend (ollama, openai, local) and kind (chat: a short utility call; "
    "stream: an answer)",
    ["backend", "kind"],
)
LLM_ERRORS = metric(
    Counter, "rag_worker_llm_errors_total", "Calls to a language model that failed", ["backend", "kind"]
)
LLM_DURATION = metric(
    Histogram,
    "rag_worker_llm_call_seconds",
    "A language-model call, from the request to its last token",
    ["backend", "kind"],
    buckets=LATENCY_BUCKETS,
)
GROUNDING = metric(
    Counter,
    "rag_worker_grounding_outcomes_total",
    "What the grounding check did with a draft (its `action`: kept, flagged, removed, refused, ...)",
    ["action"],
)
INGEST_FILES = metric(
    Counter,
    "rag_worker_ingest_files_total",
    "Files ingested, by format and outcome (indexed, unchanged, failed)",
    ["format", "outcome"],
)
INGEST_CHUNKS = metric(Counter, "rag_worker_ingest_chunks_total", "Chunks written to an index", ["format"])
INGEST_BYTES = metric(Counter, "rag_worker_ingest_bytes_total", "Bytes of the files indexed", ["format"])
INGEST_FAILURES = metric(
    Counter,
    "rag_worker_ingest_failures_total",
    "Files that could not be ingested, by format and error code",
    ["format", "code"],
)

# Timings that are not stages of their own: the turn's clocks, and the queue (its own histogram).
NOT_STAGES = {"total_ms", "first_token_ms", "llm_first_token_ms", "queued_ms"}
OUTCOMES = ("answered", "abstained", "stopped", "failed", "refused")


def observe_turn(route: str, outcome: str, timings: dict, tokens: int, grounding: dict | None) -> None:
    """Everything a finished turn tells: its outcome, its clocks and stages (from `timings`), its tokens."""
    TURNS.labels(route, outcome).inc()
    for key, value in timings.items():
        if not key.endswith("_ms") or not isinstance(value, int) or key in NOT_STAGES:
            continue
        STAGE_DURATION.labels(key[:-3]).observe(value / 1000)
    if "first_token_ms" in timings:
        FIRST_TOKEN.labels(route).observe(timings["first_token_ms"] / 1000)
    if outcome in ("answered", "abstained") and "total_ms" in timings:
        TURN_DURATION.labels(route).observe(timings["total_ms"] / 1000)
    if tokens:
        TOKENS.labels(route).inc(tokens)
    if grounding and grounding.get("action"):
        GROUNDING.labels(str(grounding["action"])).inc()


def turn_refused(route: str) -> None:
    TURNS.labels(route, "refused").inc()


def ingest_format(filename: str | None) -> str:
    """A file's format as a label: one of the kinds the worker reads, or `unsupported` (never the name)."""
    from .ingest.formats import EXTENSIONS

    return EXTENSIONS.get(Path(filename or "").suffix.lower(), "unsupported")


def ingested(kind: str, chunks: int, path: Path) -> None:
    """A file written to an index: its chunks and its size."""
    INGEST_FILES.labels(kind, "indexed").inc()
    INGEST_CHUNKS.labels(kind).inc(chunks)
    with contextlib.suppress(OSError):
        INGEST_BYTES.labels(kind).inc(path.stat().st_size)


def ingest_failed(filename: str | None, code: str) -> None:
    fmt = ingest_format(filename)
    INGEST_FILES.labels(fmt, "failed").inc()
    # Error codes are the worker's own fixed words (unsupported_type, empty, too_large, ...).
    INGEST_FAILURES.labels(
        fmt, code if code.replace("_", "").isalnum() and len(code) <= 40 else "other"
    ).inc()
