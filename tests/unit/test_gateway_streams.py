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
