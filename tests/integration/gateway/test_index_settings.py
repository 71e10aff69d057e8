"""Each index's embedder and full-text language as the gateway stores them (migration 12): set at create and
returned by the index APIs (never another user's), and filled in for rows from before the gateway stored them
from what the worker's table marker says, when the gateway starts.

One worker, and one gateway on its SQLite file that is stopped, given old-style rows, and started again."""

from __future__ import annotations

import sqlite3

import httpx
import pytest

from gateway.db import SCHEMA_VERSION
from tests.integration.gateway.helpers import register
from tests.ollama_server import OLLAMA_ENV
from tests.servers import gateway_process, worker_process


@pytest.fixture(scope="module")
def worker(tmp_path_factory, ollama_server):
    tmp = tmp_path_factory.mktemp("index-settings")
    env = {"OLLAMA_HOST": ollama_server.url, "TORCH_THREADS": "1", **OLLAMA_ENV}
    with worker_process(tmp, env=env) as w:
        yield w, tmp


def test_create_stores_them_and_the_apis_return_them(worker):
    w, tmp = worker
    with gateway_process(tmp, worker_url=w.url) as gw, httpx.Client(base_url=gw.url, timeout=120) as api:
        owner = register(api, "settings_owner")
        stranger = register(api, "settings_stranger")
        plain = api.post("/api/indexes", json={"name": "plain"}, headers=owner)
        korean = api.post("/api/indexes", json={"name": "hangul", "language": "ko"}, headers=owner)
        assert plain.status_code == korean.status_code == 201, (plain.text, korean.text)
        assert (plain.json()["embedder"], plain.json()["language"]) == ("default", "en")
        assert (korean.json()["embedder"], korean.json()["language"]) == ("default", "ko")

        listed = {i["name"]: i for i in api.get("/api/indexes", headers=owner).json()}
        assert (listed["hangul"]["embedder"], listed["hangul"]["language"]) == ("default", "ko")
        assert (listed["plain"]["embedder"], listed["plain"]["language"]) == ("default", "en")
        one = api.get(f"/api/indexes/{korean.json()['id']}", headers=owner).json()
        assert one["language"] == "ko" and one["embedder"] == "default"
        # The worker's table says the same.
        table = httpx.get(f"{w.url}/indexes/{_worker_name(tmp, korean.json()['id'])}", timeout=30).json()
        assert (table["embedder"], table["language"]) == ("default", "ko")

        # Another user sees neither the index nor its settings.
        r = api.get(f"/api/indexes/{korean.json()['id']}", headers=stranger)
        assert r.status_code == 404 and "language" not in r.text
        assert api.get("/api/indexes", headers=stranger).json() == []


def test_rows_from_before_migration_12_are_filled_from_the_worker_when_the_gateway_starts(worker):
    w, tmp = worker
    # An index whose table the worker made in French, and one the worker has no table for yet.
    r = httpx.put(f"{w.url}/indexes/u1_legacy_fr_0001", json={"language": "fr"}, timeout=120)
    assert r.status_code == 201, r.text
    with gateway_process(tmp, worker_url=w.url) as gw, httpx.Client(base_url=gw.url, timeout=120) as api:
        owner = api.post(
            "/api/auth/login", json={"username": "settings_owner", "password": "a long enough passphrase"}
        ).json()
        owner_id = owner["user"]["id"]
    # While the gateway is down, rows as a gateway before migration 12 left them: no embedder, no language.
    db = sqlite3.connect(tmp / "index_store" / "gateway.db")
    with db:
        for name, table in (("legacy_fr", "u1_legacy_fr_0001"), ("legacy_empty", "u1_legacy_empty_0002")):
            db.execute(
                "INSERT INTO indexes (owner_id, name, description, worker_name, status, document_count,"
                " chunk_count, embedder, language, created_at, updated_at)"
                " VALUES (?, ?, '', ?, 'empty', 0, 0, NULL, NULL, datetime('now'), datetime('now'))",
                (owner_id, name, table),
            )
    db.close()

    with gateway_process(tmp, worker_url=w.url) as gw, httpx.Client(base_url=gw.url, timeout=120) as api:
        headers = {"Authorization": f"Bearer {owner['token']}"}
        listed = _wait_filled(api, headers, {"legacy_fr", "legacy_empty"})
        assert (listed["legacy_fr"]["embedder"], listed["legacy_fr"]["language"]) == ("default", "fr")
        # No table yet: the worker makes it with its defaults on the first upload.
        assert (listed["legacy_empty"]["embedder"], listed["legacy_empty"]["language"]) == ("default", "en")
        # The rows made at create are untouched.
        assert listed["hangul"]["language"] == "ko"
    db = sqlite3.connect(tmp / "index_store" / "gateway.db")
    assert max(v for (v,) in db.execute("SELECT version FROM schema_migrations")) == SCHEMA_VERSION
    db.close()


def _wait_filled(api: httpx.Client, headers: dict, names: set[str]) -> dict:
    import time

    deadline = time.monotonic() + 60
    while True:
        listed = {i["name"]: i for i in api.get("/api/indexes", headers=headers).json()}
        if all(listed[n]["embedder"] is not None for n in names) or time.monotonic() > deadline:
            return listed
        time.sleep(0.2)


def _worker_name(tmp, index_id: int) -> str:
    db = sqlite3.connect(tmp / "index_store" / "gateway.db")
    try:
        return db.execute("SELECT worker_name FROM indexes WHERE id = ?", (index_id,)).fetchone()[0]
    finally:
        db.close()
