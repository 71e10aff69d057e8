"""The gateway's connections to the worker on asyncio's transports (gateway/netio.py), through the real httpx
client the gateway uses, against real servers on loopback: answers arrive whole and in order, a silent server is
httpx's ReadTimeout, a refused connection httpx's ConnectError, a pooled connection the server closed is not
reused, a large answer read slowly is not lost, a stream closed early closes the connection, and TLS works. On
asyncio's own loop and on uvloop (what uvicorn runs the gateway on)."""

from __future__ import annotations

import asyncio
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable

import httpx
import pytest

from gateway.netio import AsyncioTransport
from gateway.settings import Settings
from gateway.worker_client import WorkerClient


def loops():
    out = [pytest.param(asyncio.new_event_loop, id="asyncio")]
    try:
        import uvloop

        out.append(pytest.param(uvloop.new_event_loop, id="uvloop"))
    except ImportError:  # pragma: no cover - uvicorn[standard] brings it
        pass
    return out


@pytest.fixture(params=loops())
def run(request):
    def runner(coro):
        with asyncio.Runner(loop_factory=request.param) as r:
            return r.run(coro)

    return runner


class RawServer:
    """A TCP server on loopback whose every connection is handled by `handle(conn)` in a thread."""

    def __init__(self, handle: Callable[[socket.socket], None], wrap: ssl.SSLContext | None = None):
        self.handle, self.wrap = handle, wrap
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.closed_by_client = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            if self.wrap is not None:
                try:
                    conn = self.wrap.wrap_socket(conn, server_side=True)
                except (ssl.SSLError, OSError):
                    conn.close()
                    continue
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        try:
            self.handle(conn)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.sock.close()


def read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        ),
        0,
    )
    while len(body) < length:
        body += conn.recv(65536)
    return head


def chunked(conn: socket.socket, pieces: list[bytes], pause_s: float = 0.0) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
    for piece in pieces:
        conn.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        if pause_s:
            time.sleep(pause_s)
    conn.sendall(b"0\r\n\r\n")


def client(port: int, scheme: str = "http", **kwargs) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=10, max_keepalive_connections=10, keepalive_expiry=30)
    return httpx.AsyncClient(
        base_url=f"{scheme}://127.0.0.1:{port}",
        transport=AsyncioTransport(limits=limits, **kwargs),
        timeout=5.0,
    )


def test_the_worker_client_reads_the_worker_through_asyncio_transports(tmp_path) -> None:
    worker = WorkerClient(Settings(WORKER_URL="http://127.0.0.1:9", INDEX_STORE=tmp_path))
    assert isinstance(worker.http._transport, AsyncioTransport)


def test_a_streamed_answer_arrives_whole_in_order_as_it_is_sent(run) -> None:
    frames = [f'event: token\ndata: {{"token": "t{i}"}}\n\n'.encode() for i in range(40)]

    def handle(conn):
        read_request(conn)
        chunked(conn, frames, pause_s=0.005)

    server = RawServer(handle)

    async def go():
        async with client(server.port) as c, c.stream("POST", "/chat_stream", json={"prompt": "x"}) as r:
            got = [chunk async for chunk in r.aiter_bytes()]
            return b"".join(got), len(got)

    body, reads = run(go())
    server.close()
    assert body == b"".join(frames)
    assert reads > 5  # relayed as it came, not gathered at the end


def test_a_silent_worker_is_a_read_timeout(run) -> None:
    def handle(conn):
        read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        time.sleep(3)

    server = RawServer(handle)

    async def go():
        async with (
            httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{server.port}",
                transport=AsyncioTransport(limits=httpx.Limits()),
                timeout=httpx.Timeout(5.0, read=0.3),
            ) as c,
            c.stream("GET", "/") as r,
        ):
            started = time.monotonic()
            with pytest.raises(httpx.ReadTimeout):
                async for _ in r.aiter_bytes():
                    pass
            return time.monotonic() - started

    waited = run(go())
    server.close()
    assert waited < 2.5


def test_a_refused_connection_is_a_connect_error(run) -> None:
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now

    async def go():
        async with client(port) as c:
            with pytest.raises(httpx.ConnectError):
                await c.get("/health")

    run(go())


def test_a_pooled_connection_the_worker_closed_is_not_reused(run) -> None:
    """The worker closes an idle keep-alive connection (its keep-alive timeout): the next request goes out on a new
    connection and is answered, with no failure to retry."""

    def handle(conn):
        read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        time.sleep(0.05)  # then closes it, idle

    server = RawServer(handle)

    async def go():
        async with client(server.port) as c:
            first = await c.get("/one")
            await asyncio.sleep(0.3)
            second = await c.get("/two")
            return first.text, second.text

    assert run(go()) == ("ok", "ok")
    assert server.connections == 2
    server.close()


def test_a_large_answer_read_slowly_arrives_whole(run) -> None:
    """More than the transport holds unread (HIGH_WATER): reading pauses and resumes, nothing is dropped."""
    blob = bytes(range(256)) * (4 * 1024 * 3)  # 3 MB

    def handle(conn):
        read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(blob))
        conn.sendall(blob)

    server = RawServer(handle)

    async def go():
        async with client(server.port) as c, c.stream("GET", "/big") as r:
            parts = []
            async for chunk in r.aiter_raw():
                parts.append(chunk)
                if len(parts) % 8 == 0:
                    await asyncio.sleep(0.01)  # a slow reader: the server gets ahead of it
            return b"".join(parts)

    assert run(go()) == blob
    server.close()


def test_closing_a_stream_early_closes_the_connection(run) -> None:
    """A Stop closes the worker's stream mid-answer: the worker must see its connection end (and stop the model)."""
    seen_end = threading.Event()

    def handle(conn):
        read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(200):
            try:
                conn.sendall(b"5\r\nhello\r\n")
            except OSError:
                seen_end.set()
                return
            time.sleep(0.02)

    server = RawServer(handle)

    async def go():
        async with client(server.port) as c, c.stream("POST", "/chat_stream", json={}) as r:
            async for _ in r.aiter_bytes():
                break  # the first bytes, then the stream is closed

    run(go())
    assert seen_end.wait(5)
    server.close()


def test_a_request_body_larger_than_the_send_buffer_is_sent_whole(run) -> None:
    body = b"x" * (8 * 1024 * 1024)
    received = {}

    def handle(conn):
        head = b""
        while b"\r\n\r\n" not in head:
            head += conn.recv(65536)
        head, _, rest = head.partition(b"\r\n\r\n")
        while len(rest) < len(body):
            time.sleep(0.001)
            rest += conn.recv(65536)
        received["body"] = rest
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    server = RawServer(handle)

    async def go():
        async with client(server.port) as c:
            return (await c.post("/upload", content=body)).text

    assert run(go()) == "ok"
    assert received["body"] == body
    server.close()


def test_tls_to_the_worker(run, tmp_path) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    made = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        capture_output=True,
    )
    if made.returncode != 0:
        pytest.skip(f"openssl could not make a certificate: {made.stderr[-200:]!r}")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)

    def handle(conn):
        read_request(conn)
        chunked(conn, [b"event: done\ndata: {}\n\n"])

    server = RawServer(handle, wrap=server_ctx)
    trusted = ssl.create_default_context(cafile=str(cert))

    async def go():
        async with client(server.port, scheme="https", verify=trusted) as c:
            r = await c.post("/chat_stream", json={})
            return r.status_code, r.text, r.extensions.get("network_stream").get_extra_info("ssl_object")

    status, text, ssl_object = run(go())
    assert (status, text) == (200, "event: done\ndata: {}\n\n")
    assert ssl_object is not None

    async def untrusted():
        async with client(server.port, scheme="https") as c:  # the system's roots: the self-signed cert fails
            with pytest.raises(httpx.ConnectError):
                await c.get("/")

    run(untrusted())
    server.close()
