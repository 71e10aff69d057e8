"""An upload whose answer from the worker was lost (the connection broke after the worker had indexed the file)
is recorded when the worker lists these bytes under that name, and stays failed, recording nothing, when it does
not: either way the gateway lists what the worker holds (issue 27's burst left one side with a file the other
lacked)."""

from __future__ import annotations

import hashlib
import json

import httpx
import pytest
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.settings import Settings

CONTENT = b"# Herons\n\nHerons stand still in the reeds."


class LosingWorker:
    """Indexes every upload (when `indexes`), then drops the connection before answering, twice in a row (so the
    gateway's one retry fails too)."""

    def __init__(self) -> None:
        self.indexes = True
        self.held: list[dict] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/add_document":
            if self.indexes and not self.held:
                digest = hashlib.sha256(CONTENT).hexdigest()
                self.held.append(
                    {"filename": "herons.md", "dataset": "default", "document_id": digest, "chunks": 1}
                )
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        if request.url.path == "/get_documents":
            return httpx.Response(200, content=json.dumps(self.held).encode())
        return httpx.Response(404, json={"error": "no", "code": "not_found"})


@pytest.fixture
def gateway(tmp_path):
    settings = Settings(
        INDEX_STORE=tmp_path / "store",
        UPLOADS_DIR=tmp_path / "uploads",
        WORKER_URL="http://w",
        GATEWAY_ALLOWED_HOSTS="testserver",  # Starlette's test client's Host
    )
    worker = LosingWorker()
    with TestClient(create_app(settings)) as client:
        ctx = client.app.state.ctx
        ctx.worker.http = httpx.AsyncClient(
            base_url="http://w", transport=httpx.MockTransport(worker.handler)
        )
        r = client.post(
            "/api/auth/register", json={"username": "ann", "password": "a long enough passphrase"}
        )
        user = {"Authorization": f"Bearer {r.json()['token']}"}
        index = client.post("/api/indexes", json={"name": "Birds"}, headers=user).json()
        yield client, worker, user, index["id"]


def upload(client, user, index_id, **headers) -> httpx.Response:
    return client.post(
        f"/api/indexes/{index_id}/documents?wait=1",
        headers={**user, **headers},
        files={"file": ("herons.md", CONTENT, "text/markdown")},
    )


def listed(client, user, index_id) -> list[str]:
    return [d["filename"] for d in client.get(f"/api/indexes/{index_id}", headers=user).json()["documents"]]


def test_an_upload_the_worker_indexed_but_whose_answer_was_lost_is_recorded(gateway):
    client, worker, user, index_id = gateway
    r = upload(client, user, index_id)
    assert r.status_code == 201, r.text
    assert r.json()["filename"] == "herons.md"
    assert listed(client, user, index_id) == ["herons.md"] == [d["filename"] for d in worker.held]


def test_a_streamed_upload_the_worker_indexed_but_whose_answer_was_lost_ends_done(gateway):
    client, worker, user, index_id = gateway
    r = upload(client, user, index_id, Accept="text/event-stream")
    assert r.status_code == 201 or "event: done" in r.text, r.text
    assert listed(client, user, index_id) == ["herons.md"]


def test_an_upload_the_worker_did_not_index_stays_failed_and_is_not_recorded(gateway):
    client, worker, user, index_id = gateway
    worker.indexes = False
    r = upload(client, user, index_id)
    assert r.status_code == 503 and "unreachable" in r.json()["error"], r.text
    assert listed(client, user, index_id) == [] == worker.held
