"""The worker's request hooks and traces: request ids, HTTP metrics, one access line per request, and
OpenTelemetry spans (a span per request from the official Flask instrumentation, one per pipeline stage and one
per language-model call), exported over OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT is set.

Tracing off (no endpoint) costs nothing on the hot path: no SDK is loaded, `stage_span` hands back one shared
no-op context manager and the language-model wrapper only counts. The gateway's `traceparent` header makes the
worker's spans children of the gateway's, so a turn is one trace.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any

from contract import observe
from contract.observe import shutdown_tracer_provider, start_tracer_provider, tracing_configured

from . import metrics

log = logging.getLogger("rag_worker.access")

SERVICE = "rag_worker"
_NOOP = contextlib.nullcontext()
_tracer = None  # set by setup_tracing when an endpoint is configured


def setup_tracing(app=None) -> bool:
    """Install the SDK's tracer provider with the OTLP/HTTP exporter (once per process) and instrument `app`
    (Flask). Without an endpoint nothing is loaded and False is returned."""
    global _tracer
    if not tracing_configured():
        return False
    if _tracer is None:
        _tracer = start_tracer_provider(SERVICE)
    if app is not None:
        from opentelemetry.instrumentation.flask import FlaskInstrumentor

        # /health and /metrics are polled all day: spans for them would only be noise.
        FlaskInstrumentor().instrument_app(app, excluded_urls="/health,/metrics")
    return True


def shutdown_tracing() -> None:
    """Flush the spans still queued (a process about to exit)."""
    if _tracer is not None:
        shutdown_tracer_provider()


def stage_span(stage: str):
    """A child span for one pipeline stage, or a shared no-op when tracing is off."""
    if _tracer is None:
        return _NOOP
    return _tracer.start_as_current_span(f"stage {stage}", attributes={"rag.stage": stage})


def trace_id() -> str | None:
    return observe.trace_ids()[0] if _tracer is not None else None


# -- the request's context, carried into the pipeline's own greenlet -----------------------------------------


class Carried:
    """The context a request's log lines and spans need, captured in the request's greenlet and restored in
    the one that runs its pipeline (greenlets do not inherit context variables)."""

    __slots__ = ("request_id", "index", "route", "otel")

    def __init__(self) -> None:
        self.request_id = observe.request_id.get()
        self.index = observe.index_name.get()
        self.route = observe.route.get()
        self.otel = None
        if _tracer is not None:
            from opentelemetry import context

            self.otel = context.get_current()

    @contextlib.contextmanager
    def restored(self) -> Iterator[None]:
        tokens = [
            (observe.request_id, observe.request_id.set(self.request_id)),
            (observe.index_name, observe.index_name.set(self.index)),
            (observe.route, observe.route.set(self.route)),
        ]
        otel_token = None
        if self.otel is not None:
            from opentelemetry import context

            otel_token = context.attach(self.otel)
        try:
            yield
        finally:
            if otel_token is not None:
                from opentelemetry import context

                with contextlib.suppress(Exception):
                    context.detach(otel_token)
            for var, token in reversed(tokens):
                with contextlib.suppress(ValueError):
                    var.reset(token)


# -- language-model calls ------------------------------------------------------------------------------------


class InstrumentedBackend:
    """A language-model backend whose `chat` and `stream` are counted (calls, errors, seconds by backend) and,
    with tracing on, each a span. Everything else is the backend's own."""

    def __init__(self, inner: Any):
        object.__setattr__(self, "_inner", inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)

    def _span(self, kind: str, model: str):
        if _tracer is None:
            return None
        return _tracer.start_span(
            f"llm {kind}",
            attributes={
                "gen_ai.system": self._inner.backend,
                "gen_ai.request.model": model,
                "llm.kind": kind,
            },
        )

    def chat(self, messages: list[dict], *, model: str, **kwargs: Any) -> str:
        backend = self._inner.backend
        metrics.LLM_CALLS.labels(backend, "chat").inc()
        span = self._span("chat", model)
        t0 = time.monotonic()
        try:
            return self._inner.chat(messages, model=model, **kwargs)
        except Exception as exc:
            metrics.LLM_ERRORS.labels(backend, "chat").inc()
            if span is not None:
                span.record_exception(exc)
                _set_error(span, exc)
            raise
        finally:
            metrics.LLM_DURATION.labels(backend, "chat").observe(time.monotonic() - t0)
            if span is not None:
                span.end()

    def stream(self, messages: list[dict], *, model: str, **kwargs: Any) -> Iterator[str]:
        backend = self._inner.backend
        metrics.LLM_CALLS.labels(backend, "stream").inc()
        span = self._span("stream", model)
        t0 = time.monotonic()
        try:
            inner = self._inner.stream(messages, model=model, **kwargs)
        except Exception as exc:
            self._failed(span, exc)
            raise
        return self._relay(inner, span, t0)

    def _relay(self, inner: Iterator[str], span, t0: float) -> Iterator[str]:
        failed = False
        try:
            yield from inner  # closing this generator closes the backend's (the model stops)
        except Exception as exc:
            failed = True
            self._failed(span, exc)
            raise
        finally:
            metrics.LLM_DURATION.labels(self._inner.backend, "stream").observe(time.monotonic() - t0)
            if span is not None and not failed:
                span.end()

    def _failed(self, span, exc: Exception) -> None:
        metrics.LLM_ERRORS.labels(self._inner.backend, "stream").inc()
        if span is not None:
            span.record_exception(exc)
            _set_error(span, exc)
            span.end()


def _set_error(span, exc: Exception) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_status(Status(StatusCode.ERROR, type(exc).__name__))


def instrumented(backend: Any) -> Any:
    return InstrumentedBackend(backend)


# -- the Flask hooks -----------------------------------------------------------------------------------------


def install(app) -> None:
    """Request ids, HTTP metrics by route template and one access line per request (at the end of its answer,
    a stream's last byte included); the span per request when tracing is configured."""
    from flask import g, request

    setup_tracing(app)
    # JSON logs replace gunicorn's access line (raw paths) with this one (route template, request id).
    access_lines = observe.log_format() == "json"

    def start() -> None:
        g.request_started = time.monotonic()
        rid = observe.new_request_id(request.headers.get(observe.REQUEST_ID_HEADER))
        g.request_id = rid
        observe.request_id.set(rid)
        rule = request.url_rule.rule if request.url_rule is not None else "unmatched"
        observe.route.set(rule)
        index = request.args.get("index") or request.view_args and request.view_args.get("index")
        observe.index_name.set(str(index)[:100] if index else None)

    # First of all the hooks, so a request refused by another (a wrong key, a foreign host) is counted too.
    app.before_request_funcs.setdefault(None, []).insert(0, start)

    @app.after_request
    def finish(response):
        started = g.get("request_started")
        if started is None:
            return response
        rule = request.url_rule.rule if request.url_rule is not None else "unmatched"
        method, status, rid = request.method, response.status_code, g.get("request_id")
        response.headers[observe.REQUEST_ID_HEADER] = rid or ""

        def done() -> None:
            elapsed = time.monotonic() - started
            metrics.HTTP_REQUESTS.labels(method, rule, str(status)).inc()
            metrics.HTTP_DURATION.labels(method, rule).observe(elapsed)
            if not access_lines or (rule in ("/health", "/metrics") and status < 400):
                return  # text logs keep gunicorn's access line; probes and scrapes: counted, not logged
            log.info(
                "%s %s %s in %.0f ms",
                method,
                rule,
                status,
                elapsed * 1000,
                extra={
                    "duration_ms": round(elapsed * 1000, 1),
                    "status": status,
                    "method": method,
                    "route": rule,
                },
            )

        response.call_on_close(done)
        return response
