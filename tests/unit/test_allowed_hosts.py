"""Issue 27, in-process: the `Host` allow-list of both services (DNS rebinding), contract/hosts.py."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from contract.hosts import AllowedHosts
from gateway.app import create_app as create_gateway
from gateway.settings import Settings as GatewaySettings
from rag_worker.app import create_app as create_worker
from rag_worker.settings import Settings as WorkerSettings
from tests.servers import free_port


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("localhost", True),
        ("LOCALHOST:8001", True),
        ("localhost.:8001", True),
        ("127.0.0.1:8001", True),
        ("[::1]:8000", True),
        ("10.0.0.5:8000", True),  # an address literal: no rebinding without a name
        ("worker:8001", True),
        ("Chat.Example.org", True),
        ("eu.corp.example", True),
        ("corp.example", True),
        (None, True),  # HTTP/1.0 without Host: no browser
        ("evil.example", False),
        ("localhost.evil.example", False),
        ("worker.evil.example", False),
        ("notcorp.example", False),
        ("127.0.0.1.nip.io", False),
    ],
)
def test_loopback_names_addresses_and_listed_names_pass(host, allowed):
    rule = AllowedHosts.parse("worker, chat.example.org:443 .corp.example")
    assert rule.allows(host) is allowed


def test_a_star_turns_the_check_off():
    assert AllowedHosts.parse("*").allows("anything.example")
    assert not AllowedHosts.parse("").allows("anything.example")


def test_the_worker_refuses_a_foreign_host_with_a_421_naming_the_setting(tmp_path):
    settings = WorkerSettings(INDEX_STORE=tmp_path / "store", UPLOADS_DIR=tmp_path / "uploads")
    client = create_worker(settings).test_client()
    for path in ("/config", "/health", "/v1/models"):
        resp = client.get(path, headers={"Host": "evil.example"})
        assert resp.status_code == 421, (path, resp.status_code)
        text = resp.get_data(as_text=True)
        assert "WORKER_ALLOWED_HOSTS" in text and "host_not_allowed" in text, text
    assert client.get("/config", headers={"Host": "localhost:8001"}).status_code == 200
    listed = WorkerSettings(
        INDEX_STORE=tmp_path / "store", UPLOADS_DIR=tmp_path / "uploads", WORKER_ALLOWED_HOSTS="worker"
    )
    assert (
        create_worker(listed).test_client().get("/config", headers={"Host": "worker:8001"}).status_code == 200
    )


def test_the_gateway_refuses_a_foreign_host_with_a_421_naming_the_setting(tmp_path):
    settings = GatewaySettings(
        INDEX_STORE=tmp_path / "store",
        UPLOADS_DIR=tmp_path / "uploads",
        WORKER_URL=f"http://127.0.0.1:{free_port()}",
        GATEWAY_ALLOWED_HOSTS="chat.example.org",
    )
    with TestClient(create_gateway(settings), base_url="http://chat.example.org") as client:
        assert client.get("/api/openapi.json").status_code == 200
        for host in ("evil.example", "testserver"):
            resp = client.get("/api/openapi.json", headers={"Host": host})
            assert resp.status_code == 421, resp.text
            body = resp.json()
            assert body["code"] == "host_not_allowed" and "GATEWAY_ALLOWED_HOSTS" in body["error"], body
            assert resp.headers["x-content-type-options"] == "nosniff"  # security headers still on it
        assert client.get("/api/openapi.json", headers={"Host": "127.0.0.1:8000"}).status_code == 200


def test_run_system_on_a_named_host_lets_both_services_answer_to_that_name():
    from launcher.start import with_host_allowed

    env = with_host_allowed({"WORKER_ALLOWED_HOSTS": "api.example"}, "box.lan")
    assert env["WORKER_ALLOWED_HOSTS"] == "api.example,box.lan" and env["GATEWAY_ALLOWED_HOSTS"] == "box.lan"
    assert with_host_allowed({}, "127.0.0.1") == {} and with_host_allowed({}, "localhost") == {}
