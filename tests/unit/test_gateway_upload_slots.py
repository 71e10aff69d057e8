"""Uploads one account may have being indexed at once (MAX_UPLOADS_PER_USER: its unfinished upload jobs): one past
the limit is a 429 that says so, with Retry-After, and loses nothing; the slot comes back when the indexing
ends, streamed or not, when the worker fails, and when the browser has gone before the answer even started
(issue 27's first attempt lost the slot there; since issue 30 the upload is indexed all the same); another
account is never held up by it.

The gateway is the real application (real SQLite); only the worker is stood in for by httpx's MockTransport, so a
test can hold an upload at the worker and watch what the gateway does meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import threading
import time

import httpx
import pytest
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.settings import Settings


class Frames(httpx.AsyncByteStream):
    """The worker's event stream for one upload (stages, then `done`), which notes when the gateway closes it."""

    def __init__(self, added: dict, closed: list[str]):
        self.added, self.closed = added, closed

    async def __aiter__(self):
        yield b'event: progress\ndata: {"stage": "converting"}\n\n'
        yield f"event: done\ndata: {json.dumps(self.added)}\n\n".encode()

    async def aclose(self) -> None:
        self.closed.append(self.added["filename"])


class Original(httpx.AsyncByteStream):
    """The worker's answer to a download, which notes when the gateway closes it."""

    def __init__(self, closed: list[str]):
        self.closed = closed

    async def __aiter__(self):
        yield b"# a.md\n\nText of a.md."

    async def aclose(self) -> None:
        self.closed.append("download")


class SlowWorker:
    """Indexes each upload, the first one only once `release` is set (a long conversion, say); `fail` makes it
    answer 500 instead."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.hold_first = True
        self.fail = False
        self.seen = 0
        self.closed: list[str] = []  # the event streams the gateway closed, by file name

    async def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/get_documents":
            return httpx.Response(200, json=[])
        if request.url.path == "/get_document":
            return httpx.Response(
                200, stream=Original(self.closed), headers={"content-type": "text/markdown"}
            )
        if request.url.path != "/add_document":
            return httpx.Response(404, json={"error": "no", "code": "not_found"})
        self.seen += 1
        if self.seen == 1 and self.hold_first:
            self.started.set()
            while not self.release.is_set():
                await asyncio.sleep(0.01)
        if self.fail:
            return httpx.Response(500, json={"error": "the converter crashed", "code": "internal"})
        body = request.read()
        name = body.split(b'filename="', 1)[1].split(b'"', 1)[0].decode()
        digest = hashlib.sha256(body).hexdigest()
        added = {"filename": name, "dataset": "default", "document_id": digest, "chunks": 1}
        if "text/event-stream" in request.headers.get("accept", ""):
            return httpx.Response(
                200, stream=Frames(added, self.closed), headers={"content-type": "text/event-stream"}
            )
        return httpx.Response(200, json=added)


def register(client, name: str) -> dict:
    r = client.post("/api/auth/register", json={"username": name, "password": "a long enough passphrase"})
    return {"Authorization": f"Bearer {r.json()['token']}"}


@pytest.fixture
def gateway(tmp_path):
    settings = Settings(
        INDEX_STORE=tmp_path / "store",
        UPLOADS_DIR=tmp_path / "uploads",
        WORKER_URL="http://w",
        GATEWAY_ALLOWED_HOSTS="testserver",  # Starlette's test client's Host
        MAX_UPLOADS_PER_USER=1,
    )
    worker = SlowWorker()
    with TestClient(create_app(settings)) as client:
        client.app.state.ctx.worker.http = httpx.AsyncClient(
            base_url="http://w", transport=httpx.MockTransport(worker.handler)
        )
        yield client, worker


def new_index(client, user, name: str) -> int:
    return client.post("/api/indexes", json={"name": name}, headers=user).json()["id"]


def upload(client, user, index_id, name: str, **headers) -> httpx.Response:
    return client.post(
        f"/api/indexes/{index_id}/documents?wait=1",
        headers={**user, **headers},
        files={"file": (name, f"# {name}\n\nText of {name}.".encode(), "text/markdown")},
    )


def listed(client, user, index_id) -> list[str]:
    return sorted(
        d["filename"] for d in client.get(f"/api/indexes/{index_id}", headers=user).json()["documents"]
    )


def job_states(client, user, index_id) -> list[str]:
    return [j["state"] for j in client.get(f"/api/jobs?index={index_id}", headers=user).json()["jobs"]]


def upload_again(client, user, index_id, name: str, timeout: float = 5.0) -> httpx.Response:
    """An upload once the account's one slot is back; its last answer if it never comes back within `timeout`."""
    deadline = time.monotonic() + timeout
    while (r := upload(client, user, index_id, name)).status_code == 429 and time.monotonic() < deadline:
        time.sleep(0.05)
    return r


@pytest.mark.parametrize("accept", ["application/json", "text/event-stream"])
def test_an_upload_past_the_users_limit_is_a_429_and_the_slot_comes_back(gateway, accept):
    client, worker = gateway
    ann, bob = register(client, "ann"), register(client, "bob")
    ann_index, bob_index = new_index(client, ann, "Ann"), new_index(client, bob, "Bob")
    first: list[httpx.Response] = []
    runner = threading.Thread(
        target=lambda: first.append(upload(client, ann, ann_index, "a.md", accept=accept))
    )
    runner.start()
    try:
        assert worker.started.wait(10), "the first upload never reached the worker"
        refused = upload(client, ann, ann_index, "b.md")
        bobs = upload(client, bob, bob_index, "c.md")  # another account is not held up by ann's upload
    finally:
        worker.release.set()
        runner.join(10)
    assert refused.status_code == 429, refused.text
    assert refused.json()["code"] == "too_many_uploads"
    assert "1 files being indexed" in refused.json()["error"]
    assert refused.headers["retry-after"] == "5"
    assert bobs.status_code == 201, bobs.text
    assert first and first[0].status_code in (200, 201), first
    again = upload_again(client, ann, ann_index, "d.md")
    assert again.status_code == 201, again.text
    assert listed(client, ann, ann_index) == ["a.md", "d.md"]  # the refused upload recorded nothing


@pytest.mark.parametrize("accept", ["application/json", "text/event-stream"])
def test_an_upload_the_worker_fails_gives_its_slot_back(gateway, accept):
    client, worker = gateway
    worker.hold_first, worker.fail = False, True
    ann = register(client, "ann")
    index = new_index(client, ann, "Ann")
    failed = upload(client, ann, index, "a.md", accept=accept)
    if accept == "text/event-stream":  # the stream starts as the job is queued: the failure is its end
        assert failed.status_code == 200, failed.text
        assert "event: error" in failed.text and "the converter crashed" in failed.text
    else:
        assert failed.status_code == 502, failed.text
        assert "the converter crashed" in failed.json()["error"]
    worker.fail = False
    again = upload(client, ann, index, "b.md")  # at once: the failure gave the slot back before answering
    assert again.status_code == 201, again.text
    assert listed(client, ann, index) == ["b.md"]


def asgi_request(request: httpx.Request) -> tuple[dict, list]:
    """A request as the ASGI server hands it over: its scope, and the messages `receive` gives before the
    browser's disconnect."""
    body = request.read()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": "http",
        "path": request.url.path,
        "raw_path": request.url.raw_path,
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower(), v) for k, v in request.headers.raw],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
    return scope, [{"type": "http.request", "body": body, "more_body": False}]


def gone_before_the_answer(client, request: httpx.Request, spec_version: str) -> list[dict]:
    """Run `request` through the app for a browser that has already gone: under ASGI spec 2.4 `send` fails at
    the first message, as a server does for a closed connection; under 2.3 (uvicorn's) `receive` answers
    `http.disconnect` once the body has been read, and what is sent is dropped. Returns what was sent."""
    scope, messages = asgi_request(request)
    scope["asgi"]["spec_version"] = spec_version
    sent: list[dict] = []

    async def receive() -> dict:
        if messages:
            return messages.pop(0)
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if spec_version == "2.4":
            raise OSError("the browser closed the connection")
        sent.append(message)  # 2.3: uvicorn drops what it cannot send to a closed connection

    async def call() -> None:
        # The server sees the disconnect (ClientDisconnect, OSError) and ends the request.
        with contextlib.suppress(Exception):
            await client.app(scope, receive, send)

    client.portal.call(call)
    return sent


def eventually(check, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("spec_version", ["2.4", "2.3"])
def test_an_upload_whose_browser_went_before_the_answer_is_indexed_and_gives_its_slot_back(
    gateway, spec_version
):
    client, worker = gateway
    worker.hold_first = False
    ann = register(client, "ann")
    index = new_index(client, ann, "Ann")
    request = httpx.Request(
        "POST",
        f"http://testserver/api/indexes/{index}/documents",
        headers={**ann, "accept": "text/event-stream"},
        files={"file": ("gone.md", b"# gone.md\n\nText of gone.md.", "text/markdown")},
    )
    gone_before_the_answer(client, request, spec_version)
    # The upload was stored and queued before any answer: its job indexes it all the same (issue 30), and
    # closes the worker's stream when it is done with it.
    assert eventually(lambda: listed(client, ann, index) == ["gone.md"]), listed(client, ann, index)
    assert worker.seen == 1 and "gone.md" in worker.closed
    # The document is listed as soon as the worker has it; its job ends (and gives the slot back) on its next
    # write. Once it has ended, the account may upload again at once.
    assert eventually(lambda: job_states(client, ann, index) == ["done"]), job_states(client, ann, index)
    again = upload(client, ann, index, "again.md", accept="text/event-stream")
    assert again.status_code == 200, again.text
    assert "event: done" in again.text


@pytest.mark.parametrize("spec_version", ["2.4", "2.3"])
def test_a_download_whose_answer_never_starts_gives_the_worker_stream_back(gateway, spec_version):
    client, worker = gateway
    worker.hold_first = False
    ann = register(client, "ann")
    index = new_index(client, ann, "Ann")
    doc = upload(client, ann, index, "a.md").json()["id"]
    request = httpx.Request(
        "GET", f"http://testserver/api/indexes/{index}/documents/{doc}/download", headers=ann
    )
    gone_before_the_answer(client, request, spec_version)
    # The upload's job closed its stream when it had the result; the download's is closed all the same.
    assert worker.closed == ["a.md", "download"]
