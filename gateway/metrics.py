"""The gateway's Prometheus metrics and `GET /metrics`.

Names follow Prometheus conventions (`_total` counters, `_seconds` durations); labels take a small fixed set of
values (route templates such as `/api/chats/{id:int}/messages/stream`, never a raw path; outcomes; statuses),
never a user, a chat or any text. The gateway is one process (uvicorn); should several share a folder named by
PROMETHEUS_MULTIPROC_DIR (`python -m gateway serve` names one when GATEWAY_WORKERS > 1), the scrape sums them as
the worker's does.

`/metrics` answers a client on this machine (not relayed by a proxy), the worker's key (WORKER_API_KEY, so one
Prometheus credential scrapes both services) or an administrator's token (Bearer or the session cookie). Another caller without a valid token gets the usual 401; a signed-in non-administrator the 404
of an unknown route.
"""

from __future__ import annotations

import hmac

from prometheus_client import Counter, Gauge, Histogram
from starlette.requests import Request
from starlette.responses import Response

from contract.metrics import ENABLED, HTTP_BUCKETS, LATENCY_BUCKETS, metric, render
from contract.observe import is_loopback_client

from .errors import NotFound
from .routing import ApiRoute, Operation

DB_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)

HTTP_REQUESTS = metric(
    Counter,
    "gateway_http_requests_total",
    "HTTP requests answered, by route template (never the raw path) and status",
    ["method", "route", "status"],
)
HTTP_DURATION = metric(
    Histogram,
    "gateway_http_request_duration_seconds",
    "From a request's arrival to the end of its answer (a stream's last byte)",
    ["method", "route"],
    buckets=HTTP_BUCKETS,
)
TURNS = metric(
    Counter,
    "gateway_turns_total",
    "Turns by the route the gate chose (rag, direct, sql, auto) and how they ended: answered, abstained, "
    "stopped, failed, refused (the worker's queue was full: 503), interrupted (the stream ended early)",
    ["route", "outcome"],
)
FIRST_TOKEN = metric(
    Histogram,
    "gateway_turn_first_token_seconds",
    "From the turn's start on the gateway to the first answer token relayed",
    ["route"],
    buckets=LATENCY_BUCKETS,
)
TURN_DURATION = metric(
    Histogram,
    "gateway_turn_duration_seconds",
    "From the turn's start on the gateway to its outcome stored",
    ["route"],
    buckets=LATENCY_BUCKETS,
)
TURNS_RUNNING = metric(Gauge, "gateway_turns_running", "Turns being relayed now", multiprocess_mode="livesum")
TOKENS = metric(Counter, "gateway_tokens_streamed_total", "Answer tokens relayed from the worker", ["route"])
DB_SESSION = metric(
    Histogram,
    "gateway_db_session_seconds",
    "Time a database session was held (open to close)",
    buckets=DB_BUCKETS,
)
BUILDS = metric(
    Counter,
    "gateway_index_builds_total",
    "Index (re)builds by how they ended (done, failed, stopped)",
    ["outcome"],
)
BUILDS_RUNNING = metric(
    Gauge, "gateway_index_builds_running", "Index builds this gateway runs now", multiprocess_mode="livesum"
)


def turn_outcome(status: str, stopped: bool, error: dict | None, abstained: bool) -> str:
    """A stored turn's outcome as a label."""
    if status == "complete":
        return "abstained" if abstained else "answered"
    if stopped:
        return "stopped"
    if status == "interrupted":
        return "interrupted"
    if error and error.get("code") == "busy":
        return "refused"
    return "failed"


def observe_turn(route: str, outcome: str, seconds: float, first_token_s: float | None, tokens: int) -> None:
    TURNS.labels(route, outcome).inc()
    if outcome in ("answered", "abstained"):
        TURN_DURATION.labels(route).observe(seconds)
    if first_token_s is not None:
        FIRST_TOKEN.labels(route).observe(first_token_s)
    if tokens:
        TOKENS.labels(route).inc(tokens)


def sends_worker_key(request: Request) -> bool:
    """`Authorization: Bearer <WORKER_API_KEY>`: the one secret a Prometheus beside both services holds."""
    from .context import ctx

    key = ctx(request).settings.worker_api_key
    if key is None or not key.get_secret_value().strip():
        return False
    sent = request.headers.get("authorization", "")
    return hmac.compare_digest(sent.encode(), f"Bearer {key.get_secret_value()}".encode())


async def metrics_route(request: Request) -> Response:
    from .context import current_user

    if not ENABLED:  # METRICS=off: as if there were no such route
        raise NotFound("no such API route: /metrics", code="not_found")
    client = request.scope.get("client")
    forwarded = "x-forwarded-for" in request.headers or "forwarded" in request.headers
    if not is_loopback_client(client[0] if client else None, forwarded) and not sends_worker_key(request):
        user = await current_user(request)  # no valid token: 401, as on every signed-in route
        if not user.is_admin:
            raise NotFound("no such API route: /metrics", code="not_found")
    body, content_type = render()
    return Response(body, media_type=content_type)


METRICS_CONTENT = {"text/plain": {"schema": {"type": "string", "description": "Prometheus text exposition"}}}

routes = [
    ApiRoute(
        "GET",
        "/metrics",
        metrics_route,
        Operation(
            "Prometheus metrics: to a client on the gateway's machine, or with WORKER_API_KEY or an "
            "administrator's token (no valid token: 401; a non-administrator: 404)",
            answer=METRICS_CONTENT,
            errors=(404,),
            tag="operations",
            sign_in_optional=True,
        ),
    ),
]


def process_ended() -> None:
    """Multi-process mode: this process's live gauges stop counting (uvicorn has no hook like gunicorn's)."""
    from contract.metrics import is_multiprocess

    if is_multiprocess():
        import os

        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(os.getpid())
