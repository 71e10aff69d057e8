"""A chat turn's stream from the worker, read without httpx: HTTP/1.1 on an `asyncio.Protocol`, answers parsed by
httptools (the C parser uvicorn serves the gateway with).

A RAG turn's answer is a hundred or more body chunks. Through httpx each went through httpx's, httpcore's and
h11's layers (h11 checks every chunk header with a regular expression) before the relay saw it: a third of the
gateway's event-loop CPU per turn (docs/benchmarks.md, "Twelfth round"). Here the loop's `data_received` feeds
the parser, which appends the body's bytes to a list; the relay takes them all at each wake-up.

What the gateway relies on is kept:

- the errors are httpx's own (ConnectError, ConnectTimeout, ReadTimeout, ReadError, RemoteProtocolError,
  WriteError, WriteTimeout, PoolTimeout), raised where httpx raises them, so `streams.py` maps them as before;
- the timeouts are httpx's (connect, write, read between two chunks, pool) from the same settings;
- idle connections are kept for `keepalive_expiry` seconds and one the worker has closed (bytes or an end
  received while idle) is never used; a connection is given back only after a complete answer;
- at most `max_connections` at once (a wait for a free one times out as PoolTimeout);
- reading stops above HIGH_WATER unread bytes, so a slow relay slows the worker down (TCP's flow control).

Used for plain `http://` worker URLs (`WorkerClient.lean`); TLS and everything else stay on httpx. The response
object answers what `streams.WorkerStream` and `streams.worker_error` ask of an httpx response.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from types import SimpleNamespace

import httptools
import httpx

HIGH_WATER = 256 * 1024


class _Connection(asyncio.Protocol):
    """One keep-alive connection to the worker and the answer being received on it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser: httptools.HttpResponseParser | None = None  # None while idle
        self.eof = False
        self.error: BaseException | None = None
        self.waiter: asyncio.Future | None = None
        self.writable: asyncio.Future | None = None
        self.paused_writing = False
        self.paused_reading = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.chunks: list[bytes] = []
        self.size = 0

    # asyncio's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        parser = self.parser
        if parser is None or self.complete:  # bytes on an idle connection: it cannot be used again
            self.eof = True
            self._close()
            return
        try:
            parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.error = httpx.RemoteProtocolError(f"the worker's answer is not valid HTTP ({exc})")
            self._close()
        if self.size > HIGH_WATER and not self.paused_reading and self.transport is not None:
            self.paused_reading = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool | None:
        self.eof = True
        self._wake()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        if exc is not None and self.error is None:
            self.error = exc
        self._wake()
        self.paused_writing = False
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)

    def pause_writing(self) -> None:
        self.paused_writing = True

    def resume_writing(self) -> None:
        self.paused_writing = False
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)

    # httptools' side

    def on_header(self, name: bytes, value: bytes) -> None:
        self.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self.parser is not None
        self.status = self.parser.get_status_code()
        if 100 <= self.status < 200:  # an interim answer (100 Continue): the real one follows
            self.raw_headers = []
            return
        self.headers_done = True
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.size += len(body)

    def on_message_complete(self) -> None:
        if self.headers_done:
            self.complete = True

    # the gateway's side

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    @property
    def reusable(self) -> bool:
        return (
            not self.eof
            and self.error is None
            and self.transport is not None
            and not self.transport.is_closing()
        )

    async def wait(self, slot: str, timeout: float | None, timed_out: type[Exception], message: str) -> None:
        """Until the loop sets the future kept in `slot` ("waiter" or "writable"), at most `timeout` seconds."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        setattr(self, slot, future)
        timer = None
        if timeout is not None:
            timer = loop.call_later(timeout, lambda: future.done() or future.set_result("timeout"))
        try:
            if await future == "timeout":
                raise timed_out(message)
        finally:
            setattr(self, slot, None)
            if timer is not None:
                timer.cancel()

    def take(self) -> bytes:
        data = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
        self.chunks, self.size = [], 0
        if self.paused_reading and self.transport is not None:
            self.paused_reading = False
            self.transport.resume_reading()
        return data


class LeanResponse:
    """An answer being received: what `streams.WorkerStream` and `streams.worker_error` read of an httpx
    response (status_code, headers, request.method and request.url.path, aiter_bytes, aiter_raw, aread,
    aclose)."""

    def __init__(self, pool: LeanPool, conn: _Connection, method: str, path: str):
        self._pool, self._conn = pool, conn
        self.status_code = conn.status
        self.headers = httpx.Headers(conn.raw_headers)
        self.request = SimpleNamespace(method=method, url=SimpleNamespace(path=path))
        # Without a length or chunks, the body ends when the worker closes the connection.
        self._ends_at_close = "content-length" not in self.headers and "chunked" not in self.headers.get(
            "transfer-encoding", ""
        )
        self._closed = False

    async def _next(self) -> bytes | None:
        """The body bytes received since the last call (waiting for some), or None at its end."""
        conn = self._conn
        while True:
            if conn.chunks:
                return conn.take()
            if conn.complete:
                return None
            if conn.error is not None:
                if isinstance(conn.error, httpx.HTTPError):
                    raise conn.error
                raise httpx.ReadError(f"{type(conn.error).__name__}: {conn.error}")
            if conn.eof:
                if self._ends_at_close:
                    conn.complete = True
                    return None
                raise httpx.RemoteProtocolError(
                    "peer closed connection without sending complete message body"
                )
            await conn.wait(
                "waiter", self._pool.read_timeout, httpx.ReadTimeout, "timed out reading from the worker"
            )

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        while (chunk := await self._next()) is not None:
            yield chunk

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        # No content encoding to undo: the request asks for none (Accept-Encoding: identity) and an answer with
        # one is refused before its body is read (LeanPool.send).
        async for chunk in self.aiter_raw():
            yield chunk

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self.aiter_raw()])

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool.give_back(self._conn)


class LeanPool:
    """Keep-alive connections to one worker (`host:port`, plain HTTP) and the sending of requests on them."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        timeout: httpx.Timeout,
        max_connections: int,
        keepalive_expiry: float,
        headers: dict[str, str],
        auth: httpx.BasicAuth | None = None,
    ):
        self.host, self.port = host, port
        self.connect_timeout, self.read_timeout = timeout.connect, timeout.read
        self.write_timeout, self.pool_timeout = timeout.write, timeout.pool
        self.keepalive_expiry = keepalive_expiry
        self.max_connections = max_connections
        self.idle: deque[_Connection] = deque()  # oldest first
        self.busy = 0
        self.waiting: list[asyncio.Future] = []
        host_header = host if port == 80 else f"{host}:{port}"
        if ":" in host and not host.startswith("["):  # an IPv6 address
            host_header = f"[{host}]" if port == 80 else f"[{host}]:{port}"
        fixed = {"Host": host_header, "Accept-Encoding": "identity", "User-Agent": "rag-gateway", **headers}
        if auth is not None:  # as httpx's BasicAuth: it replaces any Authorization header
            fixed["Authorization"] = _basic(auth)
        self._fixed = _header_lines(fixed)

    async def _slot(self) -> None:
        """One of the max_connections, waited for (PoolTimeout after pool_timeout)."""
        if self.busy < self.max_connections and not self.waiting:
            self.busy += 1
            return
        future = asyncio.get_running_loop().create_future()
        self.waiting.append(future)
        try:
            async with asyncio.timeout(self.pool_timeout):
                await future  # given the slot by whoever released it (busy stays counted)
        except TimeoutError:
            raise httpx.PoolTimeout("no connection to the worker was free in time") from None
        except BaseException:
            if future.done() and not future.cancelled():  # given the slot just as this wait ended
                self._release()
            raise
        finally:
            if future in self.waiting:
                self.waiting.remove(future)

    def _release(self) -> None:
        while self.waiting:
            future = self.waiting.pop(0)
            if not future.done():
                future.set_result(None)
                return
        self.busy -= 1

    def _idle_connection(self) -> _Connection | None:
        """The connection given back last, if one is usable. Those idle past keepalive_expiry (the oldest, at
        the front) are closed first, as httpcore's pool does at every request, so none lingers open."""
        now = time.monotonic()
        while self.idle and now - self.idle[0].idle_since >= self.keepalive_expiry:
            self.idle.popleft()._close()
        while self.idle:
            conn = self.idle.pop()
            if conn.reusable:
                return conn
            conn._close()
        return None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _transport, conn = await loop.create_connection(_Connection, self.host, self.port)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {self.host}:{self.port} timed out") from None
        except OSError as exc:
            raise httpx.ConnectError(f"{type(exc).__name__}: {exc}") from None
        return conn

    async def send(
        self, method: str, path: str, body: bytes, headers: dict[str, str] | None = None
    ) -> LeanResponse:
        """Send the request and wait for its answer's status and headers; the body is read from the answer."""
        await self._slot()
        conn: _Connection | None = None
        try:
            conn = self._idle_connection() or await self._connect()
            conn._reset()
            conn.parser = httptools.HttpResponseParser(conn)
            extra = _header_lines(headers or {})
            head = f"{method} {path} HTTP/1.1\r\n".encode("latin-1") + self._fixed + extra
            head += b"Content-Length: %d\r\n\r\n" % len(body)
            assert conn.transport is not None
            if conn.transport.is_closing():
                raise httpx.WriteError("the connection to the worker is closed")
            conn.transport.write(head + body)
            if conn.paused_writing:
                await conn.wait(
                    "writable", self.write_timeout, httpx.WriteTimeout, "timed out writing to the worker"
                )
            while not conn.headers_done:
                if conn.error is not None:
                    if isinstance(conn.error, httpx.HTTPError):
                        raise conn.error
                    raise httpx.ReadError(f"{type(conn.error).__name__}: {conn.error}")
                if conn.eof:
                    raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
                await conn.wait(
                    "waiter",
                    self.read_timeout,
                    httpx.ReadTimeout,
                    "timed out waiting for the worker's answer",
                )
            resp = LeanResponse(self, conn, method, path)
            if resp.headers.get("content-encoding", "identity").lower() != "identity":
                # closed below, with its slot given back once
                raise httpx.DecodingError("the worker's answer has a content encoding that was not asked for")
            return resp
        except BaseException:
            if conn is not None:
                conn.parser = None
                conn._close()
            self._release()
            raise

    def give_back(self, conn: _Connection) -> None:
        """After an answer: its connection kept for the next request if the answer was read whole and both sides
        keep it alive, closed otherwise (a stream stopped midway: the worker sees the close and stops)."""
        reuse = conn.complete and conn.keep_alive and conn.reusable and not conn.chunks
        conn.parser = None
        if reuse:
            conn.idle_since = time.monotonic()
            self.idle.append(conn)
        else:
            conn._close()
        self._release()

    async def aclose(self) -> None:
        for conn in self.idle:
            conn._close()
        self.idle.clear()


def _header_lines(headers: dict[str, str]) -> bytes:
    """`Name: value` lines; a line end inside one would split the request (h11 refuses it too)."""
    text = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    if text.count("\n") != len(headers) or text.count("\r") != len(headers):
        raise httpx.LocalProtocolError("a header of the request to the worker holds a line end")
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        raise httpx.LocalProtocolError("a header of the request to the worker is not Latin-1 text") from None


def _basic(auth: httpx.BasicAuth) -> str:
    """The Authorization header httpx's BasicAuth sends."""
    request = httpx.Request("GET", "http://worker/")
    flow = auth.auth_flow(request)
    next(flow)
    return request.headers["Authorization"]
