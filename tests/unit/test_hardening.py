"""Issue 11, in-process: empty keys, Origin and Content-Type checks, open binds, masking, nested JSON on both
services (real apps: the worker's Flask app, the gateway's Starlette app on real SQLite)."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient

from gateway.app import create_app as create_gateway
from gateway.settings import Settings as GatewaySettings
from gateway.worker_client import WorkerClient
from rag_worker.app import create_app as create_worker
from rag_worker.security import is_loopback, mask_credentials, mask_url, open_bind_refusal
from rag_worker.settings import Settings as WorkerSettings
from tests.servers import free_port

NESTED = ["[" * 100_000, '{"a":' * 100_000, "[" * 5_000 + "]" * 5_000]


def worker_settings(tmp: Path, **extra) -> WorkerSettings:
    return WorkerSettings(INDEX_STORE=tmp / "store", UPLOADS_DIR=tmp / "uploads", **extra)


# -- an empty WORKER_API_KEY means no key, on both sides --------------------------------------------------------


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_key_is_no_key_on_the_worker_and_the_gateway(tmp_path, value):
    assert worker_settings(tmp_path, WORKER_API_KEY=value).worker_api_key is None
    gateway = GatewaySettings(WORKER_API_KEY=value, INDEX_STORE=tmp_path)
    assert gateway.worker_api_key is None
    assert "authorization" not in WorkerClient(gateway).http.headers
    app = create_worker(worker_settings(tmp_path, WORKER_API_KEY=value))
    # Past the key check: the body check answers (on the old worker: 401 demanding "Bearer ").
    resp = app.test_client().post("/delete", data="x", content_type="text/plain")
    assert resp.status_code == 415


def test_a_real_key_still_locks_the_worker(tmp_path):
    app = create_worker(worker_settings(tmp_path, WORKER_API_KEY="k1"))
    client = app.test_client()
    assert client.post("/delete", json={"filename": "a.txt"}).status_code == 401
    assert (
        client.post("/delete", json={"filename": "a.txt"}, headers={"Authorization": "Bearer "}).status_code
        == 401
    )
    assert (
        "authorization"
        in WorkerClient(GatewaySettings(WORKER_API_KEY="k1", INDEX_STORE=tmp_path)).http.headers
    )


# -- Origin and Content-Type -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("origin", "status", "code"),
    [
        (None, 415, "json_required"),  # no Origin: not a browser; on to the Content-Type check
        ("https://chat.example", 415, "json_required"),  # listed
        ("HTTPS://Chat.Example/", 415, "json_required"),  # same origin, other spelling
        ("https://chat.example:8443", 403, "origin_not_allowed"),
        ("http://evil.example", 403, "origin_not_allowed"),
        ("null", 403, "origin_not_allowed"),  # sandboxed frames and file:// pages
    ],
)
def test_only_listed_origins_pass(tmp_path, origin, status, code):
    app = create_worker(
        worker_settings(tmp_path, WORKER_ALLOWED_ORIGINS="https://chat.example, https://b.example")
    )
    headers = {"Origin": origin} if origin else {}
    resp = app.test_client().post(
        "/delete", data='{"filename": "a.txt"}', content_type="text/plain", headers=headers
    )
    assert resp.status_code == status and resp.json["code"] == code


def test_no_origin_is_allowed_by_default(tmp_path):
    client = create_worker(worker_settings(tmp_path)).test_client()
    resp = client.get("/openapi.json", headers={"Origin": "http://localhost:8000"})
    assert resp.status_code == 403 and resp.json["code"] == "origin_not_allowed"
    assert client.get("/openapi.json").status_code == 200


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
)
@pytest.mark.parametrize("route", ["/chat", "/chat_stream", "/create_title", "/delete", "/index"])
def test_json_routes_need_the_json_content_type(tmp_path, route, content_type):
    client = create_worker(worker_settings(tmp_path)).test_client()
    resp = client.post(route, data='{"prompt": "hi", "filename": "a.txt"}', content_type=content_type)
    assert resp.status_code == 415 and resp.json["code"] == "json_required"


def test_nested_json_is_a_400_on_the_worker(tmp_path):
    client = create_worker(worker_settings(tmp_path)).test_client()
    for raw in NESTED:
        resp = client.post("/chat", data=raw, content_type="application/json")
        assert resp.status_code == 400 and resp.json["code"] == "bad_json", raw[:10]


# -- nested JSON on the gateway ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gw_hardening")
    settings = GatewaySettings(
        INDEX_STORE=tmp / "store",
        UPLOADS_DIR=tmp / "uploads",
        WORKER_URL=f"http://127.0.0.1:{free_port()}",
        GATEWAY_ALLOWED_HOSTS="testserver",  # the host Starlette's test client asks for
    )
    with TestClient(create_gateway(settings), raise_server_exceptions=False) as client:
        yield client


@pytest.mark.parametrize("raw", NESTED[:2])
def test_nested_json_is_a_400_on_the_gateway(gateway, raw):
    resp = gateway.post("/api/auth/register", content=raw, headers={"Content-Type": "application/json"})
    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] == "invalid_json" and "nested" in resp.json()["error"]
    token = gateway.post("/api/auth/register", json={"username": "nest", "password": "password123"})
    headers = {"Authorization": f"Bearer {token.json()['token']}"} if token.status_code == 201 else {}
    if not headers:
        login = gateway.post("/api/auth/login", json={"username": "nest", "password": "password123"})
        headers = {"Authorization": f"Bearer {login.json()['token']}"}
    resp = gateway.post("/api/chats", content=raw, headers={**headers, "Content-Type": "application/json"})
    assert resp.status_code == 400 and resp.json()["code"] == "invalid_json"


# -- binding and masking ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("unix:/run/worker.sock", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.5", False),
        ("worker.internal", False),
    ],
)
def test_loopback_hosts(host, loopback):
    assert is_loopback(host) is loopback


def test_open_binds_need_a_key_or_an_explicit_allowance():
    assert open_bind_refusal(["127.0.0.1:8001"], has_key=False, allow_open=False) is None
    assert open_bind_refusal(["[::1]:8001"], has_key=False, allow_open=False) is None
    refusal = open_bind_refusal(["0.0.0.0:8001"], has_key=False, allow_open=False)
    assert (
        refusal
        and "0.0.0.0:8001" in refusal
        and "WORKER_API_KEY" in refusal
        and "WORKER_ALLOW_OPEN=1" in refusal
    )
    assert open_bind_refusal(["0.0.0.0:8001"], has_key=True, allow_open=False) is None
    assert open_bind_refusal(["0.0.0.0:8001"], has_key=False, allow_open=True) is None


def test_credentials_in_urls_are_masked():
    assert mask_url("http://user:pa55@ollama:11434") == "http://***@ollama:11434"
    assert mask_url("https://token@host/api?key=abc") == "https://***@host/api?***"
    assert mask_url("http://localhost:11434") == "http://localhost:11434"
    nested = {"a": ["failed to reach http://u:p@h:1/x", {"b": "ftp://x:y@z"}], "n": 3}
    assert mask_credentials(nested) == {
        "a": ["failed to reach http://***@h:1/x", {"b": "ftp://***@z"}],
        "n": 3,
    }


def test_a_listed_origin_gets_cors_answers_and_others_none(tmp_path):
    app = create_worker(
        worker_settings(tmp_path, WORKER_API_KEY="k2", WORKER_ALLOWED_ORIGINS="https://chat.example")
    )
    client = app.test_client()
    listed = {"Origin": "https://chat.example", "Access-Control-Request-Method": "POST"}
    preflight = client.options("/chat", headers=listed)
    assert preflight.status_code == 204
    assert preflight.headers["Access-Control-Allow-Origin"] == "https://chat.example"
    assert "Authorization" in preflight.headers["Access-Control-Allow-Headers"]
    foreign = client.options("/chat", headers={**listed, "Origin": "http://evil.example"})
    assert foreign.status_code == 403 and "Access-Control-Allow-Origin" not in foreign.headers
    resp = client.get(
        "/openapi.json", headers={"Origin": "https://chat.example", "Authorization": "Bearer k2"}
    )
    assert resp.status_code == 200 and resp.headers["Access-Control-Allow-Origin"] == "https://chat.example"


# -- an error the worker's app did not write ---------------------------------------------------------------------


def test_a_non_json_error_from_in_front_of_the_worker_is_logged_for_the_operator(tmp_path, caplog):
    """gunicorn refuses a request it cannot parse with an HTML 400 before the app sees it. The browser gets the
    status and a generic message; the gateway's log keeps what was answered, or nobody can tell why."""
    import asyncio
    import http.server
    import threading

    from gateway.errors import ApiError

    page = b"<html><head><title>Bad Request</title></head><body>Invalid HTTP Version 'HTTP/9'</body></html>"

    class Refusing(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's naming)
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(400)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    settings = GatewaySettings(WORKER_URL=f"http://127.0.0.1:{server.server_port}", INDEX_STORE=tmp_path)

    async def upload() -> ApiError:
        client = WorkerClient(settings)
        try:
            await client.add_document("notes", "default", "a.md", b"# A", "text/markdown")
        except ApiError as exc:
            return exc
        finally:
            await client.aclose()
        raise AssertionError("the refusal was taken for a success")

    try:
        with caplog.at_level("WARNING", logger="gateway.worker"):
            err = asyncio.run(upload())
    finally:
        server.shutdown()
        server.server_close()
    assert err.status == 400 and err.message == "the worker answered HTTP 400"
    logged = [r.getMessage() for r in caplog.records if r.name == "gateway.worker"]
    assert len(logged) == 1 and "/add_document" in logged[0] and "Invalid HTTP Version" in logged[0]
