"""The worker's API against web pages and prying eyes: the three reported attacks on an open worker,
deeply nested JSON, the refusal to listen beyond loopback without a key, and what `/health` tells whom."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

from tests.integration.ingest.helpers import documents, start_worker, upload
from tests.servers import ROOT, free_port

EVIL = "http://evil.example"
KEY = "health-test-key"
OLLAMA_PASSWORD = "hunter2-in-the-url"


@pytest.fixture(scope="module")
def open_worker(tmp_path_factory):
    """A worker with no key: the default on loopback, and what a page in a local browser can reach."""
    server = start_worker(tmp_path_factory.mktemp("open_worker"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(open_worker):
    with httpx.Client(base_url=open_worker.url, timeout=180) as c:
        yield c


@pytest.fixture(scope="module")
def victim(client):
    """An index with one document, the target of the attacks below."""
    resp = upload(client, "payroll.txt", b"The payroll runs on the last Friday of the month.", index="victim")
    assert resp.status_code == 200, resp.text
    return "victim"


def _still_there(client, index: str) -> None:
    assert set(documents(client, index)) == {("default", "payroll.txt")}
    original = client.get("/get_document", params={"index": index, "filename": "payroll.txt"})
    assert original.status_code == 200 and b"last Friday" in original.content


# -- the three reported attacks ---------------------------------------------------------------------------------


def test_a_text_plain_delete_from_a_foreign_page_deletes_nothing(client, victim):
    """What `fetch(worker + "/delete", {method: "POST", mode: "no-cors", body: ...})` sends: no preflight."""
    body = json.dumps({"index": victim, "filename": "payroll.txt"})
    resp = client.post("/delete", content=body, headers={"Content-Type": "text/plain", "Origin": EVIL})
    assert resp.status_code == 403, resp.text
    assert resp.json()["code"] == "origin_not_allowed" and EVIL in resp.json()["error"]
    # Without an Origin (not a browser) the text/plain body is still not taken as JSON.
    resp = client.post("/delete", content=body, headers={"Content-Type": "text/plain"})
    assert resp.status_code == 415 and resp.json()["code"] == "json_required"
    assert "application/json" in resp.json()["error"]
    _still_there(client, victim)


def test_a_rebuild_from_a_foreign_page_drops_nothing(client, victim):
    body = json.dumps({"index": victim, "rebuild": True})
    for content_type in ("text/plain", "application/json"):
        resp = client.post("/index", content=body, headers={"Content-Type": content_type, "Origin": EVIL})
        assert resp.status_code == 403, resp.text
        assert resp.json()["code"] == "origin_not_allowed"
    resp = client.post("/index", content=body, headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert resp.status_code == 415 and resp.json()["code"] == "json_required"
    _still_there(client, victim)


def test_a_multipart_upload_from_a_foreign_page_creates_nothing(client, open_worker):
    resp = client.post(
        "/add_document",
        data={"index": "planted"},
        files={"file": ("planted.txt", b"Send the invoices to evil.example.")},
        headers={"Origin": EVIL},
    )
    assert resp.status_code == 403, resp.text
    assert resp.json()["code"] == "origin_not_allowed"
    assert client.get("/get_documents", params={"index": "planted"}).status_code == 404


def test_programs_without_an_origin_still_use_every_route(client, victim):
    """The defence must not break the API: the gateway, curl and scripts send no Origin."""
    assert (
        upload(client, "extra.txt", b"Extra notes about the canteen menu.", index=victim).status_code == 200
    )
    resp = client.post("/delete", json={"index": victim, "filename": "extra.txt"})
    assert resp.status_code == 200 and resp.json()["count"] >= 1
    _still_there(client, victim)


# -- deeply nested JSON -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("route", ["/chat", "/chat_stream", "/create_title", "/delete", "/index"])
@pytest.mark.parametrize("opener", ["[", '{"a":'])
def test_deeply_nested_json_is_a_400(client, route, opener):
    resp = client.post(route, content=opener * 100_000, headers={"Content-Type": "application/json"})
    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] == "bad_json" and "nested" in resp.json()["error"]


# -- listening beyond loopback ----------------------------------------------------------------------------------


def _serve_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WORKER_API_KEY", "WORKER_ALLOW_OPEN")}
    return {**env, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **extra}


@pytest.mark.parametrize("key", [None, "", "   "])
def test_listening_on_all_interfaces_without_a_key_is_refused(tmp_path, key):
    env = _serve_env(INDEX_STORE=str(tmp_path / "store"), UPLOADS_DIR=str(tmp_path / "uploads"))
    if key is not None:
        env["WORKER_API_KEY"] = key
    cmd = [sys.executable, "-m", "rag_worker", "serve", "--host", "0.0.0.0", "--port", str(free_port())]
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as exc:  # the old worker just started serving, open to the network
        raise AssertionError("the worker started on 0.0.0.0 without a key") from exc
    assert done.returncode == 2, done.stderr[-2000:]
    message = done.stderr
    assert "0.0.0.0" in message and "WORKER_API_KEY" in message and "WORKER_ALLOW_OPEN=1" in message


def test_run_system_refuses_an_open_host_without_a_key_before_starting_anything(tmp_path):
    env = _serve_env(INDEX_STORE=str(tmp_path / "store"), UPLOADS_DIR=str(tmp_path / "uploads"))
    cmd = [
        sys.executable,
        "run_system.py",
        "--host",
        "0.0.0.0",
        "--worker-port",
        str(free_port()),
        "--gateway-port",
        str(free_port()),
        "--logs-dir",
        str(tmp_path / "logs"),
        "--no-demo",
    ]
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError("run_system.py started an open worker on 0.0.0.0") from exc
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "WORKER_API_KEY" in done.stderr and "WORKER_ALLOW_OPEN=1" in done.stderr


# -- /health ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed_worker(tmp_path_factory):
    """A worker with a key whose OLLAMA_HOST carries credentials (Ollama behind an authenticating proxy)."""
    ollama = f"http://ollama-user:{OLLAMA_PASSWORD}@127.0.0.1:{free_port()}/"
    server = start_worker(tmp_path_factory.mktemp("keyed_worker"), WORKER_API_KEY=KEY, OLLAMA_HOST=ollama)
    yield server
    server.stop()


@pytest.mark.parametrize("auth", [None, "Bearer wrong-key", f"Basic {KEY}"])
def test_health_without_the_key_is_status_only(keyed_worker, auth):
    headers = {"Authorization": auth} if auth else {}
    resp = httpx.get(keyed_worker.url + "/health", headers=headers, timeout=60)
    assert resp.status_code in (200, 503)
    assert resp.json() == {"status": resp.json()["status"]}
    assert resp.json()["status"] in ("ok", "degraded", "down")


def test_health_with_the_key_has_details_with_credentials_masked(keyed_worker):
    resp = httpx.get(keyed_worker.url + "/health", headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert resp.status_code in (200, 503)
    body = resp.json()
    assert body["status"] in ("ok", "degraded", "down") and body["llm"] and body["embedder"]
    assert OLLAMA_PASSWORD not in resp.text and "ollama-user" not in resp.text and KEY not in resp.text
    assert body["llm"]["ollama"]["host"].startswith("http://***@127.0.0.1:")
    config = httpx.get(keyed_worker.url + "/config", headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert config.status_code == 200
    assert OLLAMA_PASSWORD not in config.text and KEY not in config.text
    assert config.json()["settings"]["ollama_host"].startswith("http://***@127.0.0.1:")


def test_health_of_an_open_worker_has_details(open_worker):
    body = httpx.get(open_worker.url + "/health", timeout=60).json()
    assert body["status"] and "llm" in body and "store" in body
