"""Issue 27, in-process: text that is no text (lone surrogates) and bidi controls in file names refused at both
services' doors, ids past the database's integers, the worker's password kept out of messages, private logs."""

from __future__ import annotations

import os
import stat

import pytest
from starlette.testclient import TestClient

from contract.text import lone_surrogate_at
from gateway.app import create_app as create_gateway
from gateway.errors import ApiError as GatewayError
from gateway.indexes.names import check_filename as gateway_filename
from gateway.streams import shown_url, unreachable
from rag_worker.app import create_app as create_worker
from rag_worker.errors import ApiError as WorkerError
from rag_worker.names import check_filename as worker_filename
from rag_worker.settings import Settings as WorkerSettings
from tests.unit.test_gateway_api import make_settings

BIDI = ["\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069"]
BIDI += ["\u200e", "\u200f", "\u061c"]


@pytest.mark.parametrize("control", BIDI)
def test_a_file_name_with_a_bidi_control_is_refused_by_both_checks(control):
    name = f"invoice{control}fdp.txt"
    with pytest.raises(WorkerError) as worker:
        worker_filename(name)
    with pytest.raises(GatewayError) as gateway:
        gateway_filename(name)
    for err in (worker.value, gateway.value):
        assert err.status == 400 and err.code == "bad_filename" and f"U+{ord(control):04X}" in err.message
    assert worker_filename("résumé (final).txt") == gateway_filename("résumé (final).txt")


def test_a_lone_surrogate_is_found_wherever_it_is():
    assert lone_surrogate_at({"a": ["ok", {"b": "x\udfff"}]}) == "a[1].b"
    assert lone_surrogate_at({"k\ud800": 1}) == "k?"
    assert lone_surrogate_at({"emoji": "\U0001f986 duck", "n": 2**70}) is None


RAW = '{"prompt": "hi \\udfff", "options": {"prompts": {"system": "x"}}}'


def test_the_worker_refuses_a_lone_surrogate_with_a_400(tmp_path):
    client = create_worker(
        WorkerSettings(INDEX_STORE=tmp_path / "s", UPLOADS_DIR=tmp_path / "u")
    ).test_client()
    resp = client.post("/chat", data=RAW, content_type="application/json")
    assert resp.status_code == 400 and resp.json["code"] == "invalid_text" and resp.json["field"] == "prompt"


def test_the_gateway_refuses_surrogates_and_out_of_range_ids_with_a_400(tmp_path):
    with TestClient(create_gateway(make_settings(tmp_path))) as client:
        resp = client.post(
            "/api/auth/register",
            content='{"username": "duck", "password": "password123\\udfff"}',
            headers={"Content-Type": "application/json"},
        )
        assert resp.status_code == 400 and resp.json()["code"] == "invalid_text", resp.text
        assert resp.json()["field"] == "password"
        token = client.post("/api/auth/register", json={"username": "duck", "password": "password123"})
        headers = {"Authorization": f"Bearer {token.json()['token']}"}
        client.cookies.clear()
        for value in (2**63, -(2**64), 0):
            resp = client.post("/api/chats", json={"index_ids": [value]}, headers=headers)
            assert resp.status_code == 400, resp.text
        resp = client.post("/api/chats", json={"index_ids": [2**63 - 1]}, headers=headers)
        assert resp.status_code == 404 and resp.json()["code"] == "index_not_found", resp.text


def test_the_workers_password_is_masked_where_its_url_is_shown():
    url = "http://svc:s3cret@worker:8001"
    assert shown_url(url) == "http://***@worker:8001"
    assert shown_url("http://worker:8001") == "http://worker:8001"
    assert "s3cret" not in unreachable(url, OSError()).message


def test_launcher_logs_are_private_whatever_the_umask(tmp_path):
    from launcher.paths import open_log, write_pid_file

    old = os.umask(0o022)
    try:
        logs = tmp_path / "logs"
        with open_log(logs / "worker.log") as log:
            log.write(b"one\n")
        (logs / "gateway.log").write_text("left by an older start\n")
        os.chmod(logs / "gateway.log", 0o644)
        with open_log(logs / "gateway.log") as log:
            log.write(b"two\n")
        write_pid_file(logs, {"children": []})
    finally:
        os.umask(old)
    assert stat.S_IMODE(logs.stat().st_mode) == 0o700
    for name in ("worker.log", "gateway.log", "run_system.json"):
        assert stat.S_IMODE((logs / name).stat().st_mode) == 0o600, name
    assert (logs / "gateway.log").read_text() == "left by an older start\ntwo\n"


def test_the_workers_password_travels_in_a_header_never_in_a_logged_url(tmp_path, caplog):
    import asyncio
    import logging

    import httpx

    from gateway.settings import Settings
    from gateway.worker_client import WorkerClient

    seen = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"status": "ok"})

    settings = Settings(INDEX_STORE=tmp_path, WORKER_URL="http://svc:s3cret@worker:8001")
    client = WorkerClient(settings, transport=httpx.MockTransport(answer))
    with caplog.at_level(logging.INFO, logger="httpx"):
        assert asyncio.run(client.health())[0] == 200
    assert seen[0].headers["authorization"].startswith("Basic ")  # svc:s3cret, as before
    assert "s3cret" not in str(seen[0].url) and "s3cret" not in caplog.text
