"""A chat turn's stream read without httpx (gateway/leanhttp.py), through the gateway's own WorkerClient, against
real servers on loopback, on asyncio and uvloop: the request the worker gets (its JSON, its credentials, its ids),
frames that arrive whole and in order however the body is framed, the worker's refusals with its words, and every
way a connection fails reported as httpx reports it (so the browser gets the same typed errors): refused,
closed before an answer (never sent twice), silent (ReadTimeout), cut midway, not HTTP. Connections are reused
after a whole answer and only then, the number at once is bounded, and a stream stopped midway closes its
connection (the worker stops generating)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest

from gateway.errors import WorkerFailed
from gateway.settings import Settings
from gateway.streams import WorkerRefused, WorkerStreamBroken, WorkerUnavailable
from gateway.worker_client import WorkerClient
from tests.unit.test_gateway_netio import RawServer, chunked, loops

PAYLOAD = {"prompt": "Qu'est-ce qu'un canard ? ✓", "history": [], "options": {"route": "rag"}}
FRAMES = [b'event: step\ndata: {"step": "search"}\n\n', b'event: token\ndata: {"token": "Duck"}\n\n']
DONE = b'event: done\ndata: {"answer": "Duck", "sources": []}\n\n'


@pytest.fixture(params=loops())
def run(request):
    def runner(coro):
        with asyncio.Runner(loop_factory=request.param) as r:
            return r.run(coro)

    return runner


def read_whole(conn: socket.socket) -> tuple[bytes, bytes] | None:
    """One request: its head and its body (None: the client closed first)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(v)
        for k, _, v in (h.partition(b":") for h in head.split(b"\r\n"))
        if k.lower() == b"content-length"
    )
    while len(body) < length:
        body += conn.recv(65536)
    return head, body


def headers_of(head: bytes) -> dict[str, str]:
    lines = head.decode("latin-1").split("\r\n")[1:]
    return {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}


def worker_for(port: int, tmp_path, **settings) -> WorkerClient:
    return WorkerClient(Settings(WORKER_URL=f"http://127.0.0.1:{port}", INDEX_STORE=tmp_path, **settings))


async def turn(worker: WorkerClient) -> list[tuple[str | None, object]]:
    async with await worker.chat_stream(PAYLOAD) as stream:
        return [(f.event, f.data) async for f in stream.frames()]


def test_the_turn_is_the_json_and_credentials_httpx_sent_and_its_frames_arrive_whole(run, tmp_path) -> None:
    seen: list[tuple[bytes, bytes]] = []

    def handle(conn: socket.socket) -> None:
        while (request := read_whole(conn)) is not None:
            seen.append(request)
            # The frames split at awkward places: inside a frame, inside a UTF-8 character.
            body = b"".join(FRAMES) + 'event: token\ndata: {"token": "é"}\n\n'.encode() + DONE
            chunked(conn, [body[:7], body[7:40], body[40:-30], body[-30:-29], body[-29:]], pause_s=0.01)

    server = RawServer(handle)

    async def go():
        worker = worker_for(server.port, tmp_path, WORKER_API_KEY="k-123")
        assert worker.lean is not None  # a plain-HTTP worker: the turn skips httpx
        try:
            return await turn(worker)
        finally:
            await worker.aclose()

    frames = run(go())
    server.close()
    assert [e for e, _ in frames] == ["step", "token", "token", "done"]
    assert frames[2][1] == {"token": "é"} and frames[3][1]["answer"] == "Duck"
    head, body = seen[0]
    assert head.startswith(b"POST /chat_stream HTTP/1.1\r\n")
    h = headers_of(head)
    assert h["host"] == f"127.0.0.1:{server.port}" and h["authorization"] == "Bearer k-123"
    assert h["content-type"] == "application/json" and h["accept-encoding"] == "identity"
    assert json.loads(body) == PAYLOAD and "✓".encode() in body  # UTF-8, not \\u escapes, as httpx sends


def test_a_password_in_the_worker_url_goes_as_basic_auth_under_a_path_prefix(run, tmp_path) -> None:
    seen: list[bytes] = []

    def handle(conn: socket.socket) -> None:
        request = read_whole(conn)
        assert request is not None
        seen.append(request[0])
        chunked(conn, [DONE])

    server = RawServer(handle)

    async def go():
        settings = Settings(
            WORKER_URL=f"http://svc:s3cret@127.0.0.1:{server.port}/rag/", INDEX_STORE=tmp_path
        )
        worker = WorkerClient(settings)
        try:
            return await turn(worker)
        finally:
            await worker.aclose()

    assert [e for e, _ in run(go())] == ["done"]
    server.close()
    assert seen[0].startswith(b"POST /rag/chat_stream HTTP/1.1\r\n")
    assert headers_of(seen[0])["authorization"] == "Basic c3ZjOnMzY3JldA=="  # svc:s3cret


@pytest.mark.parametrize("framing", ["content-length", "close"])
def test_an_answer_with_a_length_or_ended_by_closing_is_read_to_its_end(run, tmp_path, framing) -> None:
    body = b"".join(FRAMES) + DONE

    def handle(conn: socket.socket) -> None:
        assert read_whole(conn) is not None
        length = (
            f"Content-Length: {len(body)}\r\n" if framing == "content-length" else "Connection: close\r\n"
        )
        conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n{length}\r\n".encode())
        conn.sendall(body[:20])
        time.sleep(0.02)
        conn.sendall(body[20:])

    server = RawServer(handle)

    async def go():
        worker = worker_for(server.port, tmp_path)
        try:
            return await turn(worker)
        finally:
            await worker.aclose()

    assert [e for e, _ in run(go())] == ["step", "token", "done"]
    server.close()


def test_a_connection_is_reused_after_a_whole_answer_and_closed_after_a_stop(run, tmp_path) -> None:
    closed = threading.Event()

    def handle(conn: socket.socket) -> None:
        while (request := read_whole(conn)) is not None:
            if json.loads(request[1])["prompt"] == "long":
                conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                try:
                    for _ in range(200):  # a long answer, until the gateway hangs up
                        conn.sendall(b"%x\r\n%s\r\n" % (len(FRAMES[1]), FRAMES[1]))
                        time.sleep(0.01)
                    if not conn.recv(1):
                        closed.set()
                except OSError:  # the write after the gateway's close fails
                    closed.set()
                return
            chunked(conn, FRAMES + [DONE])

    server = RawServer(handle)

    async def go():
        worker = worker_for(server.port, tmp_path)
        try:
            await turn(worker)
            await turn(worker)
            first_two = server.connections
            async with await worker.chat_stream({**PAYLOAD, "prompt": "long"}) as stream:
                async for _frame in stream.frames():
                    break  # the browser pressed Stop: the stream is closed midway
            await asyncio.sleep(0.05)
            await turn(worker)  # on a new connection: the stopped one was not given back
            return first_two, server.connections
        finally:
            await worker.aclose()

    first_two, total = run(go())
    assert first_two == 1  # the second turn went on the first turn's connection
    assert closed.wait(5)  # the worker saw the stopped stream's connection close
    assert total == 2
    server.close()


def test_an_idle_connection_the_worker_closed_is_not_used(run, tmp_path) -> None:
    def handle(conn: socket.socket) -> None:
        assert read_whole(conn) is not None
        chunked(conn, [DONE])
        # the worker's keep-alive ends: it closes the idle connection

    server = RawServer(handle)

    async def go():
        worker = worker_for(server.port, tmp_path)
        try:
            await turn(worker)
            await asyncio.sleep(0.1)  # the close has arrived
            return await turn(worker)
        finally:
            await worker.aclose()

    assert [e for e, _ in run(go())] == ["done"]
    assert server.connections == 2
    server.close()


def test_the_workers_refusal_keeps_its_status_and_words(run, tmp_path) -> None:
    def handle(conn: socket.socket) -> None:
        while (request := read_whole(conn)) is not None:
            if b"busy" in request[1]:
                body = b'{"error": "the worker is at capacity", "code": "busy"}'
                conn.sendall(
                    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 3\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                )
            else:
                body = b'{"error": "index \'x\' has no table", "code": "index_not_found", "field": "index"}'
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    server = RawServer(handle)

    async def go():
        worker = worker_for(server.port, tmp_path)
        out = []
        try:
            for payload in (PAYLOAD, {**PAYLOAD, "prompt": "busy"}):
                try:
                    await worker.chat_stream(payload)
                except Exception as exc:  # noqa: BLE001 (the kind is what is tested)
                    out.append(exc)
            return out
        finally:
            await worker.aclose()

    refused, busy = run(go())
    server.close()
    assert isinstance(refused, WorkerRefused) and refused.status == 400
    assert (refused.code, refused.message, refused.field) == (
        "index_not_found",
        "index 'x' has no table",
        "index",
    )
    assert isinstance(busy, WorkerFailed) and busy.status == 503 and busy.code == "busy"
    assert busy.headers == {"Retry-After": "3"}
    assert server.connections == 1  # an error answer read whole leaves its connection usable


def test_a_refused_connection_is_a_503_naming_the_worker(run, tmp_path) -> None:
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now

    async def go():
        worker = worker_for(port, tmp_path)
        try:
            await worker.chat_stream(PAYLOAD)
        except WorkerUnavailable as exc:
            return exc
        finally:
            await worker.aclose()

    err = run(go())
    assert err is not None and err.status == 503
    assert f"127.0.0.1:{port}" in err.message and "ConnectError" in err.message


def test_a_turn_is_not_sent_twice_when_the_connection_closes_before_an_answer(run, tmp_path) -> None:
    requests = []

    def handle(conn: socket.socket) -> None:
        if read_whole(conn) is not None:
            requests.append(1)  # and closes without answering

    server = RawServer(handle)

    async def go():
        worker = worker_for(server.port, tmp_path)
        try:
            await worker.chat_stream(PAYLOAD)
        except WorkerUnavailable as exc:
            return exc
        finally:
            await worker.aclose()

    err = run(go())
    server.close()
    assert err is not None and "RemoteProtocolError" in err.message
    assert requests == [1] and server.connections == 1


def test_a_silent_worker_is_a_read_timeout_before_and_after_the_answer_began(run, tmp_path) -> None:
    release = threading.Event()

    def handle(conn: socket.socket) -> None:
        request = read_whole(conn)
        assert request is not None
        if b"later" in request[1]:
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            conn.sendall(b"%x\r\n%s\r\n" % (len(FRAMES[0]), FRAMES[0]))
        release.wait(10)

    server = RawServer(handle)

    async def go():
        worker = worker_for(server.port, tmp_path, WORKER_READ_TIMEOUT_S=0.3)
        out = []
        try:
            try:
                await worker.chat_stream(PAYLOAD)
            except WorkerUnavailable as exc:
                out.append(exc)
            events = []
            try:
                async with await worker.chat_stream({**PAYLOAD, "prompt": "later"}) as stream:
                    async for f in stream.frames():
                        events.append(f.event)
            except WorkerStreamBroken as exc:
                out.append((events, exc))
            return out
        finally:
            await worker.aclose()

    before, (events, after) = run(go())
    release.set()
    server.close()
    assert before.status == 503 and "ReadTimeout" in before.message
    assert events == ["step"] and after.message == "the worker stream broke (ReadTimeout)"


@pytest.mark.parametrize("cut", ["midway", "garbage"])
def test_a_stream_cut_midway_or_not_http_is_a_typed_error(run, tmp_path, cut) -> None:
    def handle(conn: socket.socket) -> None:
        assert read_whole(conn) is not None
        if cut == "garbage":
            conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
            return
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        conn.sendall(b"%x\r\n%s\r\n" % (len(FRAMES[0]), FRAMES[0]))
        conn.sendall(b"40\r\nevent: tok")  # and the connection drops inside a chunk

    server = RawServer(handle)

    async def go():
        worker = worker_for(server.port, tmp_path)
        events: list = []
        try:
            async with await worker.chat_stream(PAYLOAD) as stream:
                async for f in stream.frames():
                    events.append(f.event)
        except (WorkerStreamBroken, WorkerUnavailable) as exc:
            return events, exc
        finally:
            await worker.aclose()
        return events, None

    events, err = run(go())
    server.close()
    if cut == "midway":
        assert events == ["step"] and isinstance(err, WorkerStreamBroken)
        assert err.message == "the worker stream broke (RemoteProtocolError)"
    else:
        assert events == [] and isinstance(err, WorkerUnavailable) and "RemoteProtocolError" in err.message


def test_no_more_connections_than_allowed_and_a_wait_for_one_ends(run, tmp_path) -> None:
    release = threading.Event()

    def handle(conn: socket.socket) -> None:
        while read_whole(conn) is not None:
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            conn.sendall(b"%x\r\n%s\r\n" % (len(FRAMES[0]), FRAMES[0]))
            release.wait(10)
            conn.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(DONE), DONE))

    server = RawServer(handle)

    async def go():
        worker = worker_for(server.port, tmp_path, WORKER_MAX_CONNECTIONS=1)
        assert worker.lean is not None
        worker.lean.pool_timeout = 0.3
        try:
            first = await worker.chat_stream(PAYLOAD)
            try:
                await worker.chat_stream(PAYLOAD)  # the only connection is taken: waits, then gives up
            except WorkerUnavailable as exc:
                timed_out = exc
            second = asyncio.ensure_future(turn(worker))  # waits for the first to end
            await asyncio.sleep(0.1)
            assert not second.done()
            release.set()
            async with first:
                events = [f.event async for f in first.frames()]
            return timed_out, events, await second
        finally:
            await worker.aclose()

    timed_out, events, second = run(go())
    server.close()
    assert timed_out.status == 503 and "PoolTimeout" in timed_out.message
    assert events == ["step", "done"] and [e for e, _ in second] == ["step", "done"]
    assert server.connections == 1


def test_a_large_answer_read_slowly_arrives_whole(run, tmp_path) -> None:
    big = b"event: token\ndata: " + json.dumps({"token": "x" * 4000}).encode() + b"\n\n"

    def handle(conn: socket.socket) -> None:
        assert read_whole(conn) is not None
        chunked(conn, [big] * 600 + [DONE])  # 2.4 MB, well past the buffer's high-water mark

    server = RawServer(handle)

    async def go():
        worker = worker_for(server.port, tmp_path)
        n = 0
        try:
            async with await worker.chat_stream(PAYLOAD) as stream:
                async for f in stream.frames():
                    if f.event == "token":
                        assert f.data == {"token": "x" * 4000}
                        n += 1
                        if n % 50 == 0:
                            await asyncio.sleep(
                                0.01
                            )  # a slow reader: the socket's reading is paused meanwhile
                    else:
                        assert f.event == "done"
            return n
        finally:
            await worker.aclose()

    assert run(go()) == 600
    server.close()


def test_an_answer_with_a_content_encoding_not_asked_for_is_a_502_and_frees_its_connection(
    run, tmp_path
) -> None:
    def handle(conn: socket.socket) -> None:
        while (request := read_whole(conn)) is not None:
            if b"gzip" in request[1]:  # what a misconfigured proxy in front of the worker may do
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 4\r\n\r\nabcd")
            else:
                chunked(conn, [DONE])

    server = RawServer(handle)

    async def go():
        worker = worker_for(server.port, tmp_path, WORKER_MAX_CONNECTIONS=1)
        try:
            try:
                await worker.chat_stream({**PAYLOAD, "prompt": "gzip"})
            except WorkerFailed as exc:
                refused = exc
            assert worker.lean is not None and worker.lean.busy == 0  # its one slot given back, once
            return refused, await turn(worker), worker.lean.busy
        finally:
            await worker.aclose()

    refused, after, busy = run(go())
    server.close()
    assert refused.status == 502 and "could not be read" in refused.message
    assert [e for e, _ in after] == ["done"] and busy == 0


def test_idle_connections_past_their_expiry_are_closed_not_left_open(run, tmp_path) -> None:
    closes: list[int] = []

    def handle(conn: socket.socket) -> None:
        while read_whole(conn) is not None:
            chunked(conn, [DONE], pause_s=0.05)
        closes.append(1)  # the gateway closed it

    server = RawServer(handle)

    async def go():
        worker = worker_for(server.port, tmp_path)
        assert worker.lean is not None
        worker.lean.keepalive_expiry = 0.2
        try:
            await asyncio.gather(turn(worker), turn(worker), turn(worker))  # three connections, then idle
            await asyncio.sleep(0.4)
            await turn(worker)  # all three expired: closed, and this one on a new connection
            await asyncio.sleep(0.1)
            return len(closes), server.connections
        finally:
            await worker.aclose()

    closed, connections = run(go())
    server.close()
    assert closed == 3 and connections == 4
