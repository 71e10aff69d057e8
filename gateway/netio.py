"""The gateway's connections to the worker on asyncio's own transports: an httpcore network backend.

httpx reads a streamed answer through httpcore, and httpcore's default backend on asyncio is anyio's: every
read of the socket runs inside a fresh cancel scope (`anyio.fail_after`) over anyio's stream wrappers, and a
RAG turn's answer is a hundred reads or more. The gateway reads every worker stream it relays this way, so that
wrapping was a large share of its event loop's CPU per turn (docs/benchmarks.md, "Seventh round").

This backend gives httpcore the same streams on an `asyncio.Protocol`: bytes the loop receives are kept in a
buffer, a read takes what is there and waits (with one timer, only when the buffer is empty) otherwise. The
timeouts, the errors (httpcore's ReadTimeout, ReadError, ConnectError, ...), TLS (`loop.start_tls`) and the
pool's check of an idle connection ("is_readable") keep httpcore's meaning, so httpx behaves as before: its
timeouts, its error types and its pool. Proxies are untouched (httpx mounts its own transports for them).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx

# The most bytes held unread before the socket stops being read (TCP then slows the worker down).
HIGH_WATER = 256 * 1024


class _Protocol(asyncio.Protocol):
    """Receives for one connection: a byte buffer, the end of the stream, and who waits for either."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.eof = False
        self.error: BaseException | None = None
        self.reader: asyncio.Future | None = None  # a read waiting for bytes
        self.writable: asyncio.Future | None = None  # a write waiting for the send buffer to drain
        self.paused_writing = False
        self.paused_reading = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) > HIGH_WATER and not self.paused_reading and self.transport is not None:
            self.paused_reading = True
            self.transport.pause_reading()
        self._wake_reader()

    def eof_received(self) -> bool | None:
        self.eof = True
        self._wake_reader()
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        if exc is not None:
            self.error = exc
        self._wake_reader()
        self.paused_writing = False
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)

    def pause_writing(self) -> None:
        self.paused_writing = True

    def resume_writing(self) -> None:
        self.paused_writing = False
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)

    def _wake_reader(self) -> None:
        if self.reader is not None and not self.reader.done():
            self.reader.set_result(None)

    def take(self, max_bytes: int) -> bytes:
        data = bytes(self.buffer[:max_bytes])
        del self.buffer[:max_bytes]
        if self.paused_reading and len(self.buffer) <= HIGH_WATER // 4 and self.transport is not None:
            self.paused_reading = False
            self.transport.resume_reading()
        return data

    async def wait(self, slot: str, timeout: float | None, timed_out: type[Exception], message: str) -> None:
        """Wait until the loop sets the future kept in `slot` ("reader" or "writable"), at most `timeout`
        seconds (None: no limit; one timer), else raise `timed_out(message)`."""
        if timeout is not None and timeout <= 0:
            raise timed_out(message)
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


class AsyncioStream(httpcore.AsyncNetworkStream):
    """One connection as httpcore reads and writes it."""

    def __init__(self, transport: asyncio.Transport, protocol: _Protocol):
        self._transport = transport
        self._protocol = protocol

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        p = self._protocol
        if not p.buffer and not p.eof:
            await p.wait("reader", timeout, httpcore.ReadTimeout, "timed out reading from the worker")
        if p.buffer:
            return p.take(max_bytes)
        if p.error is not None:
            raise httpcore.ReadError(f"{type(p.error).__name__}: {p.error}")
        return b""  # the peer closed its side: httpcore reads this as the end

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        p = self._protocol
        if self._transport.is_closing():
            raise httpcore.WriteError("the connection to the worker is closed")
        self._transport.write(buffer)
        if p.paused_writing:
            await p.wait("writable", timeout, httpcore.WriteTimeout, "timed out writing to the worker")
            if p.error is not None or self._transport.is_closing():
                raise httpcore.WriteError("the connection to the worker was lost while writing")

    async def aclose(self) -> None:
        self._transport.close()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            transport = await loop.start_tls(
                self._transport,
                self._protocol,
                ssl_context,
                server_hostname=server_hostname,
                ssl_handshake_timeout=timeout,
            )
        except TimeoutError as exc:
            self._transport.close()
            raise httpcore.ConnectTimeout(str(exc) or "TLS handshake timed out") from exc
        except (OSError, ssl.SSLError, ConnectionError) as exc:
            self._transport.close()
            raise httpcore.ConnectError(f"{type(exc).__name__}: {exc}") from exc
        if transport is None:  # pragma: no cover - start_tls returns the new transport or raises
            raise httpcore.ConnectError("TLS could not be started")
        return AsyncioStream(transport, self._protocol)

    def get_extra_info(self, info: str) -> Any:
        if info == "ssl_object":
            return self._transport.get_extra_info("ssl_object")
        if info == "client_addr":
            return self._transport.get_extra_info("sockname")
        if info == "server_addr":
            return self._transport.get_extra_info("peername")
        if info == "socket":
            return self._transport.get_extra_info("socket")
        if info == "is_readable":
            # An idle pooled connection with bytes or an end already received was closed (or broken) by the
            # worker: httpcore then drops it instead of sending a request on it. The loop has read the socket
            # already, so the answer is in the buffer, not in the socket.
            p = self._protocol
            return bool(p.buffer) or p.eof or self._transport.is_closing()
        return None


async def _connected(
    connecting, where: str, timeout: float | None, options: Iterable[httpcore.SOCKET_OPTION] | None
) -> AsyncioStream:
    """The stream of a connection being made (`loop.create_connection` or `create_unix_connection`), within
    `timeout`, with the socket options httpcore asks for; httpcore's errors when it fails."""
    try:
        async with asyncio.timeout(timeout):
            transport, protocol = await connecting
    except TimeoutError as exc:
        raise httpcore.ConnectTimeout(f"connecting to {where} timed out") from exc
    except OSError as exc:  # socket.gaierror among them
        raise httpcore.ConnectError(f"{type(exc).__name__}: {exc}") from exc
    sock = transport.get_extra_info("socket")
    for option in options or ():
        sock.setsockopt(*option)
    return AsyncioStream(transport, protocol)


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend on asyncio transports (TCP_NODELAY set by asyncio, as anyio's was)."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        local = (local_address, 0) if local_address else None
        loop = asyncio.get_running_loop()
        return await _connected(
            loop.create_connection(_Protocol, host, port, local_addr=local),
            f"{host}:{port}",
            timeout,
            socket_options,
        )

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        return await _connected(loop.create_unix_connection(_Protocol, path), path, timeout, socket_options)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class AsyncioTransport(httpx.AsyncHTTPTransport):
    """httpx's own HTTP transport (its request and error mapping, its pool settings) over `AsyncioBackend`."""

    def __init__(self, *, limits: httpx.Limits, verify: ssl.SSLContext | bool = True, retries: int = 0):
        super().__init__(verify=verify, limits=limits, retries=retries)
        # The same pool as httpx's (TLS context made as httpx makes it), on this module's backend; the one
        # httpx just built has no connection yet and is dropped.
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(verify=verify),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            http1=True,
            http2=False,
            retries=retries,
            network_backend=AsyncioBackend(),
        )
