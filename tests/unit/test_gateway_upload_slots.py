"""Uploads one account may have being indexed at once (MAX_UPLOADS_PER_USER): one past the limit is a 429 that
says so, with Retry-After, and loses nothing; the slot comes back when the indexing ends, streamed or not, and
another account is never held up by it."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time

import httpx
import pytest
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.settings import Settings


class SlowWorker:
    """Indexes each upload, the first one only once `release` is set (a long conversion, say)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.seen = 0

    async def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path != "/add_document":
            return httpx.Response(404, json={"error": "no", "code": "not_found"})
        self.seen += 1
        if self.seen == 1:
            self.started.set()
            while not self.release.is_set():
                await asyncio.sleep(0.01)
        digest = hashlib.sha256(request.read()).hexdigest()
        added = {"filename": f"f{self.seen}.md", "dataset": "default", "document_id": digest, "chunks": 1}
        if "text/event-stream" in request.headers.get("accept", ""):  # the worker's stream: stages, then done
            frames = (
                'event: progress\ndata: {"stage": "converting"}\n\n'
                + f"event: done\ndata: {json.dumps(added)}\n\n"
            )
            return httpx.Response(200, content=frames.encode(), headers={"content-type": "text/event-stream"})
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
        GATEWAY_ALLOWED_HOSTS="testserver",
        MAX_UPLOADS_PER_USER=1,
    )
    worker = SlowWorker()
    with TestClient(create_app(settings)) as client:
        client.app.state.ctx.worker.http = httpx.AsyncClient(
            base_url="http://w", transport=httpx.MockTransport(worker.handler)
        )
        yield client, worker


def upload(client, user, index_id, name: str, **headers) -> httpx.Response:
    return client.post(
        f"/api/indexes/{index_id}/documents",
        headers={**user, **headers},
        files={"file": (name, f"# {name}\n\nText of {name}.".encode(), "text/markdown")},
    )


@pytest.mark.parametrize("accept", ["application/json", "text/event-stream"])
def test_an_upload_past_the_users_limit_is_a_429_and_the_slot_comes_back(gateway, accept):
    client, worker = gateway
    ann, bob = register(client, "ann"), register(client, "bob")
    ann_index = client.post("/api/indexes", json={"name": "Ann"}, headers=ann).json()["id"]
    bob_index = client.post("/api/indexes", json={"name": "Bob"}, headers=bob).json()["id"]
    first: list[httpx.Response] = []
    runner = threading.Thread(
        target=lambda: first.append(upload(client, ann, ann_index, "a.md", accept=accept))
    )
    runner.start()
    try:
        assert worker.started.wait(10), "the first upload never reached the worker"
        refused = upload(client, ann, ann_index, "b.md")
        # Another account is not held up by ann's upload.
        bobs = upload(client, bob, bob_index, "c.md")
    finally:
        worker.release.set()
        runner.join(10)
    assert refused.status_code == 429, refused.text
    assert refused.json()["code"] == "too_many_uploads"
    assert "1 files being indexed" in refused.json()["error"]
    assert refused.headers["retry-after"] == "5"
    assert bobs.status_code == 201, bobs.text
    assert first and first[0].status_code in (200, 201), first
    deadline = time.monotonic() + 5
    while (
        again := upload(client, ann, ann_index, "d.md")
    ).status_code == 429 and time.monotonic() < deadline:
        time.sleep(0.05)  # a streamed upload gives its slot back as its body ends
    assert again.status_code == 201, again.text
    names = [d["filename"] for d in client.get(f"/api/indexes/{ann_index}", headers=ann).json()["documents"]]
    assert len(names) == 2  # the first upload and the last; the refused one recorded nothing
