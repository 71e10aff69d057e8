"""The gateway's request hooks and traces: a request id on every request (and on to the worker), HTTP metrics
by route template, one access line per request, and OpenTelemetry spans exported over OTLP/HTTP when
OTEL_EXPORTER_OTLP_ENDPOINT is set (the official ASGI instrumentation makes the span per request; a turn gets a
span of its own, and the worker's request joins the same trace through `traceparent`).

Tracing off costs nothing per request: the SDK is never imported, no middleware of it is installed, and
`outgoing_headers` only adds the request id.
"""

from __future__ import annotations

import contextlib
import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from contract import observe
from contract.observe import shutdown_tracer_provider, start_tracer_provider, tracing_configured

from . import metrics

log = logging.getLogger("gateway.access")

SERVICE = "gateway"
_tracer = None
_NOOP = contextlib.nullcontext()
QUIET = {"/health", "/metrics", "/api/health"}


def setup_tracing() -> bool:
    """The SDK's tracer provider with the OTLP/HTTP exporter, once per process; False when not configured."""
    global _tracer
    if not tracing_configured():
        return False
    if _tracer is None:
        _tracer = start_tracer_provider(SERVICE)
    return True


def shutdown_tracing() -> None:
    """Flush the spans still queued (a process about to exit)."""
    if _tracer is not None:
        shutdown_tracer_provider()


def tracing_middleware() -> list:
    """The ASGI instrumentation's middleware (first of all) when tracing is on, else nothing."""
    if not setup_tracing():
        return []
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
    from starlette.middleware import Middleware

    # One span per request; none per ASGI message (an answer streams hundreds of them).
    return [
        Middleware(
            OpenTelemetryMiddleware, excluded_urls=",".join(sorted(QUIET)), exclude_spans=["receive", "send"]
        )
    ]


def span(name: str, **attributes) -> contextlib.AbstractContextManager:
    """A span of the gateway's own (a turn), current for the block; a shared no-op when tracing is off."""
    if _tracer is None:
        return _NOOP
    return _tracer.start_as_current_span(name, attributes=attributes)


def outgoing_headers() -> dict[str, str]:
    """What a request to the worker carries for its logs and its trace: X-Request-ID and, with tracing on,
    `traceparent` (W3C trace context) of the current span."""
    headers: dict[str, str] = {}
    rid = observe.request_id.get()
    if rid:
        headers[observe.REQUEST_ID_HEADER] = rid
    if _tracer is not None:
        from opentelemetry.propagate import inject

        inject(headers)
    return headers


class RequestObserver:
    """Outermost of the gateway's own middleware: the request id (X-Request-ID, the caller's when it is a plain
    token), the HTTP metrics by route template, and one access line when the answer ends."""

    def __init__(self, app: ASGIApp):
        self.app = app
        # JSON logs replace uvicorn's access line (raw paths) with this one; text logs keep uvicorn's.
        self.access_lines = observe.log_format() == "json"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        sent = None
        for name, value in scope.get("headers", []):
            if name == b"x-request-id":
                sent = value.decode("latin-1")
                break
        rid = observe.new_request_id(sent)
        observe.request_id.set(rid)
        observe.user_id.set(None)
        observe.route.set(None)
        # Shared through the shallow copies of the scope that middleware make; RouteNote fills it in.
        note: dict = {}
        scope = {**scope, "observe": note}
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {
                    **message,
                    "headers": [*message.get("headers", []), (b"x-request-id", rid.encode())],
                }
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            elapsed = time.monotonic() - started
            route = note.get("route") or "unmatched"
            method = scope["method"]
            metrics.HTTP_REQUESTS.labels(method, route, str(status)).inc()
            metrics.HTTP_DURATION.labels(method, route).observe(elapsed)
            if self.access_lines and (route not in QUIET or status >= 400):
                log.info(
                    "%s %s %s in %.0f ms",
                    method,
                    route,
                    status,
                    elapsed * 1000,
                    extra={
                        "duration_ms": round(elapsed * 1000, 1),
                        "status": status,
                        "method": method,
                        "route": route,
                    },
                )


class RouteNote:
    """Innermost middleware: notes the matched route's template for RequestObserver (and names the request's
    span after it), as soon as the answer starts."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        note = scope.get("observe")
        if note is None:
            await self.app(scope, receive, send)
            return

        def remember() -> None:
            if "route" in note:
                return
            matched = scope.get("route")
            path = getattr(matched, "path", None)
            if path is None:
                return
            template = path or "/"
            if template == "/":  # the web files' mount: one label for all of them
                template = "web"
            note["route"] = template
            observe.route.set(template)
            if _tracer is not None:
                from opentelemetry import trace

                current = trace.get_current_span()
                current.update_name(f"{scope['method']} {template}")
                current.set_attribute("http.route", template)

        async def send_noting(message: Message) -> None:
            if message["type"] == "http.response.start":
                remember()
            await send(message)

        try:
            await self.app(scope, receive, send_noting)
        finally:
            remember()
