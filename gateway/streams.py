"""Every stream the gateway reads from the worker, owned here: opened (`send(request, stream=True)`), its httpx
errors translated into the gateway's typed errors, and closed once, by whoever holds the `WorkerStream` (an
`async with` around the reading, or a `RelayedResponse` for a response relayed to the browser, which closes it and
gives back whatever else the relay held however that answer ends).

The worker's own error answers become typed errors too (`worker_error`), for streamed and plain requests alike.
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import AsyncIterator, Callable
from urllib.parse import urlsplit, urlunsplit

import anyio
import httpx
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from .errors import ApiError, WorkerFailed
from .sse import Frame, read_frames
from .telemetry import outgoing_headers

log = logging.getLogger("gateway.worker")


class WorkerUnavailable(ApiError):
    """The worker could not be reached at all."""

    status, code = 503, "worker_unavailable"


class WorkerRefused(ApiError):
    """The worker refused the request itself (a 4xx about it): the browser gets the worker's status and words."""

    status, code = 400, "worker_error"


class WorkerNotFound(WorkerRefused):
    """The worker has no such table or document."""

    status = 404


class WorkerStreamBroken(WorkerFailed):
    """The worker's stream broke after it had started: a read timeout, a dropped connection."""

    code = "worker_unavailable"

    def __init__(self, cause: Exception):
        self.cause = type(cause).__name__
        super().__init__(f"the worker stream broke ({self.cause})")


REFUSALS = (400, 404, 409, 413, 415, 422)


def worker_error(resp: httpx.Response, body: bytes) -> ApiError:
    """The worker's own error, kept for the browser when it is about the request (4xx), a 502 otherwise."""
    try:
        data = json.loads(body)
    except ValueError:
        data = {}
    message = data.get("error") if isinstance(data, dict) else None
    code = data.get("code") if isinstance(data, dict) else None
    field = data.get("field") if isinstance(data, dict) else None
    if not message:
        # Not the worker's own JSON error: something in front of the app (gunicorn refusing the request, a proxy)
        # answered. The browser gets a generic message; the operator's log keeps what was said.
        log.warning(
            "the worker answered HTTP %s to %s %s without a JSON error: %r",
            resp.status_code,
            resp.request.method,
            resp.request.url.path,
            body[:300],
        )
        message = f"the worker answered HTTP {resp.status_code}"
    if resp.status_code == 404:
        return WorkerNotFound(message, code=code or "worker_error", field=field)
    if resp.status_code in REFUSALS:
        return WorkerRefused(message, code=code or "worker_error", field=field, status=resp.status_code)
    if resp.status_code == 503:
        # The worker's queue is full (code "busy") or a model is down: a 503 for the browser too, with the
        # worker's Retry-After passed on.
        retry = resp.headers.get("Retry-After")
        headers = {"Retry-After": retry} if retry and retry.isdigit() else None
        return WorkerFailed(message, code=code or "worker_unavailable", status=503, headers=headers)
    return WorkerFailed(message, code=code or "worker_error")


def event_error(data: dict) -> WorkerFailed:
    """The worker's `error` event (a failure after its stream began): a 503 when the worker names a part that is
    unavailable (`llm_unavailable`, `embedder_unavailable`), a 502 otherwise."""
    message = str(data.get("error") or "the worker failed")
    code = str(data.get("code") or "worker_error")
    return WorkerFailed(message, code=code, status=503 if "unavailable" in code else 502)


def shown_url(url: str) -> str:
    """A URL as messages may show it (the public /health among them): any `user:password@` masked."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))


def unreachable(worker_url: str, exc: Exception) -> WorkerUnavailable:
    return WorkerUnavailable(f"the worker at {shown_url(worker_url)} is unreachable ({type(exc).__name__})")


class WorkerStream:
    """An open 2xx streaming answer of the worker. Read it as SSE frames or raw bytes; close it once."""

    def __init__(self, resp: httpx.Response):
        self._resp = resp

    @property
    def headers(self) -> httpx.Headers:
        return self._resp.headers

    @property
    def status_code(self) -> int:
        return self._resp.status_code

    async def frames(self) -> AsyncIterator[Frame]:
        try:
            # Bytes, split into frames by read_frames: httpx's text and line decoding cost the relay per frame.
            async for f in read_frames(self._resp.aiter_bytes()):
                yield f
        except httpx.HTTPError as exc:
            raise WorkerStreamBroken(exc) from None

    async def raw(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._resp.aiter_raw():
                yield chunk
        except httpx.HTTPError as exc:
            raise WorkerStreamBroken(exc) from None

    async def aclose(self) -> None:
        await self._resp.aclose()

    async def __aenter__(self) -> WorkerStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


# Failures of a connection before the worker's answer began. A pooled keep-alive connection that the worker
# closed at the moment it was reused fails so (RemoteProtocolError "Server disconnected without sending a
# response", or a reset); a timeout is not among them: the worker may still be at work on the request.
BEFORE_ANSWER = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


async def send_once_more(http: httpx.AsyncClient, request: httpx.Request, *, retry: bool) -> httpx.Response:
    """`http.send(request, stream=True)`; with `retry` (a request that may be sent twice), a connection that
    failed before any answer is tried once more, on a new connection. Every request carries the request id and,
    with tracing on, `traceparent`, so the worker's logs and spans join the gateway's."""
    request.headers.update(outgoing_headers())
    try:
        return await http.send(request, stream=True)
    except BEFORE_ANSWER as exc:
        if not retry:
            raise
        log.warning(
            "%s %s: the connection failed before any answer (%s: %s); sending it once more",
            request.method,
            request.url.path,
            type(exc).__name__,
            exc,
        )
    return await http.send(request, stream=True)


async def open_stream(
    http: httpx.AsyncClient, request: httpx.Request, worker_url: str, *, retry: bool = False
) -> WorkerStream:
    """Send `request` and return its open answer; a refusal or failure before the body is raised as ApiError
    (the connection closed first). `retry` as for `send_once_more`."""
    try:
        resp = await send_once_more(http, request, retry=retry)
        if resp.status_code >= 400:
            try:
                body = await resp.aread()
            finally:
                await resp.aclose()
            raise worker_error(resp, body)
    except httpx.TransportError as exc:
        raise unreachable(worker_url, exc) from None
    return WorkerStream(resp)


class RelayedResponse(StreamingResponse):
    """A streamed answer relayed to the browser that holds something until it ends (an open worker stream, an
    upload slot): `on_end` runs once the answer is over, whichever way it ends.

    A `BackgroundTask` or a `finally` in the body is not enough: when the browser has gone before the first byte
    (ASGI 2.4's failed `send`, or 2.3's disconnect cancelling the body before it starts) the body generator never
    runs, and Starlette skips the background task on a ClientDisconnect or a cancellation. The body is closed
    first (a generator left at a `yield` runs its `finally` now, not whenever it is collected).
    """

    def __init__(self, body: AsyncIterator[str | bytes], *, on_end: list[Callable[[], object]], **kwargs):
        super().__init__(body, **kwargs)
        self.on_end = on_end

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):  # a cancelled request still gives everything back
                closing = getattr(self.body_iterator, "aclose", None)
                for end in [closing, *self.on_end] if closing else self.on_end:
                    try:
                        out = end()
                        if inspect.isawaitable(out):
                            await out
                    except Exception:  # one failing clean-up must not keep the others from running
                        log.exception("cleaning up after a relayed answer failed")
