"""What both services share for operators: the log line's fields and formats, the request id, and who may
read `/metrics`.

Logs: `LOG_FORMAT=text` (the default, for a terminal) or `json` (one object a line, for a log pipeline). Every
line carries the context of the request it belongs to (request id, trace id, and what the service adds: the
user id on the gateway, the index and the route template) from context variables that each service sets once
per request; nothing is passed by hand. Messages never carry secrets or document text: the services log ids,
names, codes and durations.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import re
import uuid
from contextvars import ContextVar
from datetime import UTC, datetime

REQUEST_ID_HEADER = "X-Request-ID"
REQUEST_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,64}")  # whole: fullmatch (a `$` matches before a final \n)

# The request a line belongs to; set by each service's request hook (and restored where work moves to another
# thread or greenlet, e.g. the worker's pipeline).
request_id: ContextVar[str | None] = ContextVar("request_id", default=None)
user_id: ContextVar[int | None] = ContextVar("user_id", default=None)
index_name: ContextVar[str | None] = ContextVar("index_name", default=None)
route: ContextVar[str | None] = ContextVar("route", default=None)

FIELDS = (request_id, user_id, index_name, route)


def new_request_id(sent: str | None) -> str:
    """The caller's X-Request-ID when it is a plain token (a proxy's or the gateway's), else a fresh one."""
    if sent and REQUEST_ID_RE.fullmatch(sent):
        return sent
    return uuid.uuid4().hex


def trace_ids() -> tuple[str | None, str | None]:
    """(trace id, span id) of the current OpenTelemetry span, hex; (None, None) when tracing is off."""
    try:
        from opentelemetry import trace
    except ImportError:  # pragma: no cover - installed with the requirements
        return None, None
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None, None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


class ContextFilter(logging.Filter):
    """Puts the request's context on every record (request_id, trace_id, span_id, user_id, index, route)."""

    def __init__(self, service: str):
        super().__init__()
        self.service = service

    def filter(self, record: logging.LogRecord) -> bool:
        record.service = self.service
        record.request_id = request_id.get()
        record.user_id = user_id.get()
        if getattr(record, "index", None) is None:
            record.index = index_name.get()
        if not hasattr(record, "route") or record.route is None:
            record.route = route.get()
        record.trace_id, record.span_id = trace_ids()
        return True


# Extra fields a log call may pass (`log.info(..., extra={"duration_ms": 12})`), written when present.
EXTRAS = ("duration_ms", "status", "method", "error_code", "outcome", "chat_id", "stage")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "service": getattr(record, "service", None),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in ("request_id", "trace_id", "span_id", "user_id", "index", "route", *EXTRAS):
            value = getattr(record, name, None)
            if value is not None:
                out[name] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """The plain line, with the request id (and trace id) at the end when the line belongs to a request."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        rid, tid = getattr(record, "request_id", None), getattr(record, "trace_id", None)
        if rid or tid:
            tags = " ".join(f"{k}={v}" for k, v in (("request", rid), ("trace", tid)) if v)
            first, nl, rest = line.partition("\n")
            line = f"{first} [{tags}]{nl}{rest}"
        return line


def log_format() -> str:
    value = os.environ.get("LOG_FORMAT", "text").strip().lower()
    return value if value in ("text", "json") else "text"


def configure(service: str, level: str | None = None) -> logging.Handler:
    """The root logger writes to stderr in LOG_FORMAT, every record carrying its request's context."""
    level = (level or os.environ.get("LOG_LEVEL", "INFO")).upper()
    handler = logging.StreamHandler()
    handler.addFilter(ContextFilter(service))
    handler.setFormatter(JsonFormatter() if log_format() == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    logging.captureWarnings(True)  # a library's warning is a log line too (JSON when the lines are)
    root.setLevel(level)
    return handler


def is_loopback_client(address: str | None, forwarded: bool) -> bool:
    """A client on this machine itself, not relayed by a proxy (a proxy on this machine would make every client
    look local; its forwarding headers give it away)."""
    if forwarded:
        return False
    try:
        return ipaddress.ip_address((address or "").split("%", 1)[0]).is_loopback
    except ValueError:
        return False


# -- traces: the OpenTelemetry SDK, loaded only when an OTLP endpoint is configured ------------------------------


def tracing_configured() -> bool:
    """An OTLP endpoint is named (OTEL_EXPORTER_OTLP_ENDPOINT or its traces-only form) and the SDK not disabled."""
    return (
        bool(
            os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
            or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        )
        and os.environ.get("OTEL_SDK_DISABLED", "").lower() != "true"
    )


def start_tracer_provider(service: str):
    """Install the SDK's tracer provider exporting over OTLP/HTTP in batches (call once per process) and return
    the service's tracer; the resource's service.name is OTEL_SERVICE_NAME or `service`."""
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    name = os.environ.get("OTEL_SERVICE_NAME") or service
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return trace.get_tracer(service)


def shutdown_tracer_provider() -> None:
    """Flush the spans still queued (a process about to exit); never raises."""
    import contextlib

    from opentelemetry import trace

    with contextlib.suppress(Exception):
        trace.get_tracer_provider().shutdown()  # type: ignore[attr-defined]
