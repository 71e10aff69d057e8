"""The gateway's side of the worker: every answer, plain or streamed, that goes wrong reaches the routes as one of
the gateway's typed errors (a JSON error for the browser), never as an httpx exception (an internal error)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from gateway.errors import WorkerFailed
from gateway.settings import Settings
from gateway.streams import WorkerNotFound, WorkerStreamBroken
from gateway.worker_client import WorkerClient


def client_for(handler, tmp_path) -> WorkerClient:
    settings = Settings(WORKER_URL="http://worker.test", INDEX_STORE=tmp_path)
    return WorkerClient(settings, transport=httpx.MockTransport(handler))


def run(coro):
    return asyncio.run(coro)


def test_a_worker_answer_that_cannot_be_decoded_is_a_502_not_an_internal_error(tmp_path) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        # Says gzip, is not: the kind of answer a misconfigured proxy in front of the worker gives.
        return httpx.Response(200, headers={"Content-Encoding": "gzip"}, content=b"not gzip at all")

    async def ask() -> Exception:
        worker = client_for(handler, tmp_path)
        try:
            await worker.get_documents("notes")
        except Exception as exc:  # noqa: BLE001 (the kind of exception is what is tested)
            return exc
        finally:
            await worker.aclose()
        raise AssertionError("a garbled answer was taken for a list")

    err = run(ask())
    assert isinstance(err, WorkerFailed) and err.status == 502
    assert "could not be read" in err.message


class Breaking(httpx.AsyncByteStream):
    """Two frames, then the connection drops."""

    def __init__(self) -> None:
        self.closed = False

    async def __aiter__(self):
        yield b"event: progress\ndata: {}\n\n"
        raise httpx.ReadError("connection reset")

    async def aclose(self) -> None:
        self.closed = True


def test_a_stream_that_breaks_midway_is_a_typed_error_and_is_closed(tmp_path) -> None:
    body = Breaking()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"Content-Type": "text/event-stream"}, stream=body)

    async def read() -> tuple[list[str], Exception | None]:
        worker = client_for(handler, tmp_path)
        events: list[str] = []
        try:
            async with await worker.build_index("notes", rebuild=False, prune=False) as stream:
                async for f in stream.frames():
                    events.append(str(f.event))
        except WorkerStreamBroken as exc:
            return events, exc
        finally:
            await worker.aclose()
        return events, None

    events, err = run(read())
    assert events == ["progress"]
    assert err is not None and err.message == "the worker stream broke (ReadError)"
    assert body.closed


def test_a_refusal_before_the_body_is_raised_with_the_workers_words_and_the_connection_closed(
    tmp_path,
) -> None:
    body = httpx.ByteStream(b'{"error": "no such document", "code": "document_not_found"}')
    closed = []

    class Tracked(httpx.AsyncByteStream):
        async def __aiter__(self):
            async for chunk in body:
                yield chunk

        async def aclose(self) -> None:
            closed.append(True)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, headers={"Content-Type": "application/json"}, stream=Tracked())

    async def fetch() -> None:
        worker = client_for(handler, tmp_path)
        try:
            await worker.get_document("notes", "default", "a.md")
        finally:
            await worker.aclose()

    with pytest.raises(WorkerNotFound) as caught:
        run(fetch())
    assert (caught.value.status, caught.value.code) == (404, "document_not_found")
    assert caught.value.message == "no such document" and closed


def dropping_first(answer: httpx.Response):
    """A worker whose first connection is closed before any answer (a keep-alive connection it had just closed
    when the gateway reused it), then answers `answer`; `seen` holds each request's body as it arrived."""
    seen: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.read())
        if len(seen) == 1:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        return answer

    return handler, seen


def test_an_upload_on_a_connection_closed_before_any_answer_is_sent_once_more_whole(tmp_path) -> None:
    added = {"filename": "a.md", "dataset": "default", "document_id": "x", "chunks": 1, "replaced": False}
    handler, seen = dropping_first(httpx.Response(200, json=added))

    async def upload() -> dict:
        worker = client_for(handler, tmp_path)
        try:
            return await worker.add_document("notes", "default", "a.md", b"# A\n\nsome text", "text/markdown")
        finally:
            await worker.aclose()

    assert run(upload()) == added
    assert len(seen) == 2 and seen[0] == seen[1] and b"some text" in seen[1]


def test_a_streamed_upload_on_a_connection_closed_before_any_answer_is_sent_once_more(tmp_path) -> None:
    handler, seen = dropping_first(httpx.Response(200, content=b"event: done\ndata: {}\n\n"))

    async def upload() -> list[str]:
        worker = client_for(handler, tmp_path)
        try:
            stream = await worker.add_document_stream("notes", "default", "a.md", b"# A\n\ntext", None)
            async with stream:
                return [f.event async for f in stream.frames()]
        finally:
            await worker.aclose()

    assert run(upload()) == ["done"]
    assert len(seen) == 2


def test_a_chat_turn_is_not_sent_twice_on_a_broken_connection(tmp_path) -> None:
    handler, seen = dropping_first(httpx.Response(200, content=b"event: done\ndata: {}\n\n"))

    async def chat() -> Exception:
        worker = client_for(handler, tmp_path)
        try:
            await worker.chat_stream({"question": "hi"})
        except Exception as exc:  # noqa: BLE001 (the kind of exception is what is tested)
            return exc
        finally:
            await worker.aclose()
        raise AssertionError("a chat turn was sent again")

    err = run(chat())
    assert err.status == 503 and "RemoteProtocolError" in err.message
    assert len(seen) == 1
