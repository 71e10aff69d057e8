"""The gateway's own routes in-process (real app, real SQLite, no worker): accounts, tokens, bodies, ownership."""

from __future__ import annotations

import time
from pathlib import Path

import jwt
import pytest
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.auth import issue_token
from gateway.db import MIGRATIONS, SCHEMA_VERSION, Chat, Database, SchemaMigration, utcnow
from gateway.settings import Settings
from tests.servers import free_port


def make_settings(tmp: Path, **extra) -> Settings:
    # A worker that is not there: these tests never reach it (health and turns say so, see below).
    return Settings(
        INDEX_STORE=tmp / "store",
        UPLOADS_DIR=tmp / "uploads",
        WORKER_URL=f"http://127.0.0.1:{free_port()}",
        MAX_UPLOAD_BYTES=4096,
        # Starlette's test client asks for the host `testserver`: the name this gateway is published as.
        GATEWAY_ALLOWED_HOSTS="testserver",
        **extra,
    )


@pytest.fixture(scope="module")
def client(tmp_path_factory) -> TestClient:
    with TestClient(create_app(make_settings(tmp_path_factory.mktemp("gw")))) as c:
        yield c


def register(client: TestClient, name: str, password: str = "password123") -> dict:
    r = client.post("/api/auth/register", json={"username": name, "password": password})
    assert r.status_code == 201, r.text
    client.cookies.clear()  # these tests sign in as scripts do, with the Bearer token (cookies: test_sessions)
    return {"Authorization": f"Bearer {r.json()['token']}", "_user": r.json()["user"]}


def auth(headers: dict) -> dict:
    return {"Authorization": headers["Authorization"]}


@pytest.fixture(scope="module")
def alice(client) -> dict:
    return register(client, "alice")


@pytest.fixture(scope="module")
def bob(client, alice) -> dict:
    return register(client, "bob")


def test_the_first_user_is_admin_and_the_next_is_not(alice, bob) -> None:
    assert alice["_user"]["is_admin"] is True
    assert bob["_user"]["is_admin"] is False


def test_me_answers_with_the_signed_in_user(client, alice) -> None:
    r = client.get("/api/auth/me", headers=auth(alice))
    assert r.status_code == 200
    assert r.json() == {"id": alice["_user"]["id"], "username": "alice", "is_admin": True}


def test_a_taken_username_is_a_409_whatever_its_case(client, alice) -> None:
    r = client.post("/api/auth/register", json={"username": "ALICE", "password": "password123"})
    assert r.status_code == 409
    assert r.json()["field"] == "username"


def test_login_gives_a_working_token(client, alice) -> None:
    r = client.post("/api/auth/login", json={"username": "alice", "password": "password123"})
    assert r.status_code == 200
    assert (
        client.get("/api/auth/me", headers={"Authorization": f"Bearer {r.json()['token']}"}).status_code
        == 200
    )


def test_unknown_user_and_wrong_password_get_the_same_401(client, alice) -> None:
    wrong = client.post("/api/auth/login", json={"username": "alice", "password": "nope-nope"})
    unknown = client.post("/api/auth/login", json={"username": "nobody", "password": "nope-nope"})
    assert wrong.status_code == unknown.status_code == 401
    assert wrong.json() == unknown.json()


@pytest.mark.parametrize(
    "body",
    [
        {"username": "al", "password": "password123"},
        {"username": "ok_name", "password": "short"},
        {"username": "bad name!", "password": "password123"},
        {"password": "password123"},
    ],
)
def test_bad_registrations_are_400_naming_the_field(client, body) -> None:
    r = client.post("/api/auth/register", json=body)
    assert r.status_code == 400
    assert r.json()["field"] in ("username", "password")


def _forged(client, alice) -> dict[str, str]:
    uid = str(alice["_user"]["id"])
    secret = client.app.state.ctx.jwt_secret
    expired = issue_token(int(uid), "alice", secret, ttl_s=60, now=time.time() - 7200)
    wrong_key = jwt.encode({"sub": uid, "exp": int(time.time()) + 600}, "x" * 64, algorithm="HS256")
    header = "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0"  # {"alg":"none","typ":"JWT"}
    none = (
        header
        + "."
        + jwt.utils.base64url_encode(f'{{"sub":"{uid}","exp":{int(time.time()) + 600}}}'.encode()).decode()
        + "."
    )
    return {"expired": expired, "wrong_signature": wrong_key, "alg_none": none, "garbage": "not.a.token"}


@pytest.mark.parametrize("kind", ["expired", "wrong_signature", "alg_none", "garbage"])
@pytest.mark.parametrize(
    "route",
    [
        ("GET", "/api/auth/me"),
        ("GET", "/api/chats"),
        ("POST", "/api/chats"),
        ("GET", "/api/indexes"),
        ("GET", "/api/settings"),
    ],
)
def test_bad_tokens_get_a_clear_401(client, alice, kind, route) -> None:
    token = _forged(client, alice)[kind]
    r = client.request(route[0], route[1], headers={"Authorization": f"Bearer {token}"}, json={})
    assert r.status_code == 401
    body = r.json()
    assert body["code"] == ("token_expired" if kind == "expired" else "token_invalid")
    assert "log in" in body["error"]


def test_no_token_is_a_401(client) -> None:
    client.cookies.clear()
    for method, path in [
        ("GET", "/api/chats"),
        ("POST", "/api/chats/1/messages/stream"),
        ("GET", "/api/indexes/1"),
    ]:
        r = client.request(method, path)
        assert r.status_code == 401, path
        assert r.json()["code"] == "unauthorized"


@pytest.mark.parametrize(
    ("content", "code"),
    [(b"{not json", "invalid_json"), (b"[1, 2]", "invalid_json"), (b'"text"', "invalid_json")],
)
def test_malformed_bodies_are_400(client, alice, content, code) -> None:
    r = client.post(
        "/api/chats", content=content, headers={**auth(alice), "Content-Type": "application/json"}
    )
    assert r.status_code == 400
    assert r.json()["code"] == code


def test_wrong_field_types_name_the_field(client, alice) -> None:
    chat = client.post("/api/chats", json={}, headers=auth(alice)).json()
    cases = [
        (f"/api/chats/{chat['id']}/messages", {"message": 5}, "message"),
        (f"/api/chats/{chat['id']}/messages", {}, "message"),
        (f"/api/chats/{chat['id']}/messages", {"message": "   "}, "message"),
        (
            f"/api/chats/{chat['id']}/messages",
            {"message": "hi", "options": {"top_k": "many"}},
            "options.top_k",
        ),
        (f"/api/chats/{chat['id']}/messages/stream", {"message": "hi", "datasets": ["../etc"]}, "datasets"),
        ("/api/chats", {"index_ids": "all"}, "index_ids"),
        ("/api/indexes", {"name": ""}, "name"),
    ]
    for path, body, field in cases:
        r = client.post(path, json=body, headers=auth(alice))
        assert r.status_code == 400, (path, body, r.text)
        assert r.json()["field"] == field


def test_an_overlong_message_is_a_400(client, alice) -> None:
    chat = client.post("/api/chats", json={}, headers=auth(alice)).json()
    r = client.post(f"/api/chats/{chat['id']}/messages", json={"message": "x" * 8001}, headers=auth(alice))
    assert r.status_code == 400
    assert r.json()["field"] == "message"


def test_an_oversized_json_body_is_a_413(client, alice) -> None:
    r = client.post(
        "/api/chats",
        content=b" " * (2 * 1024 * 1024),
        headers={**auth(alice), "Content-Type": "application/json"},
    )
    assert r.status_code == 413
    assert r.json()["code"] == "too_large"


def test_an_oversized_upload_is_a_413(client, alice) -> None:
    index = client.post("/api/indexes", json={"name": "big"}, headers=auth(alice)).json()
    r = client.post(
        f"/api/indexes/{index['id']}/documents?wait=1",
        headers=auth(alice),
        files={"file": ("big.md", b"# x\n" * 5000, "text/markdown")},
        data={"dataset": "d"},
    )
    assert r.status_code == 413
    assert r.json()["code"] == "too_large"


def test_upload_checks_dataset_and_file_name(client, alice) -> None:
    index = client.post("/api/indexes", json={"name": "names"}, headers=auth(alice)).json()
    url = f"/api/indexes/{index['id']}/documents?wait=1"
    r = client.post(
        url,
        headers=auth(alice),
        files={"file": ("a.md", b"# a", "text/markdown")},
        data={"dataset": "no spaces allowed"},
    )
    assert (r.status_code, r.json()["field"]) == (400, "dataset")
    r = client.post(url, headers=auth(alice), files={"file": ("../a.md", b"# a", "text/markdown")})
    assert (r.status_code, r.json()["field"]) == (400, "file")
    r = client.post(url, headers=auth(alice), json={"file": "a.md"})
    assert r.status_code == 400


def test_chats_and_indexes_of_another_user_are_404(client, alice, bob) -> None:
    index = client.post("/api/indexes", json={"name": "alice-only"}, headers=auth(alice)).json()
    chat = client.post(
        "/api/chats", json={"title": "mine", "index_ids": [index["id"]]}, headers=auth(alice)
    ).json()
    c, i = chat["id"], index["id"]
    attempts = [
        ("GET", f"/api/chats/{c}", None),
        ("PATCH", f"/api/chats/{c}", {"title": "x"}),
        ("DELETE", f"/api/chats/{c}", None),
        ("POST", f"/api/chats/{c}/messages", {"message": "hi"}),
        ("POST", f"/api/chats/{c}/messages/stream", {"message": "hi"}),
        ("GET", f"/api/indexes/{i}", None),
        ("PATCH", f"/api/indexes/{i}", {"name": "x"}),
        ("DELETE", f"/api/indexes/{i}", None),
        ("GET", f"/api/indexes/{i}/datasets", None),
        ("POST", f"/api/indexes/{i}/build", {}),
        ("GET", f"/api/indexes/{i}/documents/1/download", None),
        ("DELETE", f"/api/indexes/{i}/documents/1", None),
        ("POST", "/api/chats", {"index_ids": [i]}),
    ]
    for method, path, body in attempts:
        r = client.request(method, path, json=body, headers=auth(bob))
        assert r.status_code == 404, (method, path, r.text)
    r = client.post(f"/api/indexes/{i}/documents?wait=1", headers=auth(bob), files={"file": ("a.md", b"# a")})
    assert r.status_code == 404
    assert client.get("/api/chats", headers=auth(bob)).json() == []
    assert client.get("/api/indexes", headers=auth(bob)).json() == []
    # ...and alice's things are untouched.
    assert client.get(f"/api/chats/{c}", headers=auth(alice)).json()["title"] == "mine"


def test_chat_crud_round_trip(client, alice) -> None:
    a = client.post("/api/indexes", json={"name": "crud-a"}, headers=auth(alice)).json()
    b = client.post("/api/indexes", json={"name": "crud-b"}, headers=auth(alice)).json()
    chat = client.post("/api/chats", json={"index_ids": [a["id"]]}, headers=auth(alice)).json()
    assert chat["title"] is None and chat["index_ids"] == [a["id"]] and chat["messages"] == []
    r = client.patch(
        f"/api/chats/{chat['id']}",
        json={"title": "Renamed", "index_ids": [a["id"], b["id"]], "datasets": ["hr"]},
        headers=auth(alice),
    )
    assert r.status_code == 200
    assert (r.json()["title"], r.json()["index_ids"], r.json()["state"]["datasets"]) == (
        "Renamed",
        [a["id"], b["id"]],
        ["hr"],
    )
    listed = client.get("/api/chats", headers=auth(alice)).json()
    assert listed[0]["id"] == chat["id"]  # the most recently changed comes first
    assert client.delete(f"/api/chats/{chat['id']}", headers=auth(alice)).status_code == 204
    assert client.get(f"/api/chats/{chat['id']}", headers=auth(alice)).status_code == 404


def test_index_names_are_per_owner(client, alice, bob) -> None:
    assert client.post("/api/indexes", json={"name": "shared name"}, headers=auth(alice)).status_code == 201
    assert client.post("/api/indexes", json={"name": "shared name"}, headers=auth(bob)).status_code == 201
    r = client.post("/api/indexes", json={"name": "shared name"}, headers=auth(alice))
    assert (r.status_code, r.json()["code"]) == (409, "index_exists")


def test_settings_are_read_by_all_and_changed_by_the_admin_only(client, alice, bob) -> None:
    r = client.put("/api/settings", json={"options": {"top_k": 3, "rerank": False}}, headers=auth(bob))
    assert r.status_code == 403
    r = client.put("/api/settings", json={"options": {"top_k": 3, "rerank": False}}, headers=auth(alice))
    assert r.status_code == 200
    assert client.get("/api/settings", headers=auth(bob)).json()["options"] == {"top_k": 3, "rerank": False}
    r = client.put("/api/settings", json={"options": {"provenance": "magic"}}, headers=auth(alice))
    assert (r.status_code, r.json()["field"]) == (400, "options.provenance")


def test_a_turn_while_another_runs_in_the_same_chat_is_a_409(client, alice) -> None:
    chat = client.post("/api/chats", json={}, headers=auth(alice)).json()
    db: Database = client.app.state.ctx.db
    with (
        db.session() as s
    ):  # as a turn in flight leaves it (the end-to-end version is in the integration suite)
        row = s.get(Chat, chat["id"])
        row.turn_started_at = utcnow()
        s.add(row)
        s.commit()
    r = client.post(
        f"/api/chats/{chat['id']}/messages/stream", json={"message": "hello"}, headers=auth(alice)
    )
    assert (r.status_code, r.json()["code"]) == (409, "turn_in_progress")


def test_a_turn_with_the_worker_down_is_stored_as_failed_and_keeps_the_state(client, alice) -> None:
    chat = client.post("/api/chats", json={}, headers=auth(alice)).json()
    with client.stream(
        "POST", f"/api/chats/{chat['id']}/messages/stream", json={"message": "hello"}, headers=auth(alice)
    ) as r:
        text = r.read().decode()
    assert text.startswith('event: route\ndata: {"layer":1,"route":"direct","reason":"no_index"}')
    assert "event: error" in text and "worker_unavailable" in text
    stored = client.get(f"/api/chats/{chat['id']}", headers=auth(alice)).json()
    assert [(m["role"], m["status"]) for m in stored["messages"]] == [("user", "failed")]
    assert "unreachable" in stored["messages"][0]["error"]
    assert stored["state"]["history"] == [] and stored["busy"] is False
    r = client.post(f"/api/chats/{chat['id']}/messages", json={"message": "hello"}, headers=auth(alice))
    assert r.status_code == 503
    assert r.json()["code"] == "worker_unavailable"


def test_force_rag_without_an_index_is_a_409_naming_the_field(client, alice) -> None:
    chat = client.post("/api/chats", json={}, headers=auth(alice)).json()
    r = client.post(
        f"/api/chats/{chat['id']}/messages", json={"message": "hi", "force_rag": True}, headers=auth(alice)
    )
    # Well-formed (the OpenAPI schema accepts it); the chat's state is what refuses it.
    assert (r.status_code, r.json()["field"], r.json()["code"]) == (409, "force_rag", "no_index")


def test_health_names_the_worker_when_it_is_down(client) -> None:
    r = client.get("/health")
    assert r.status_code == 503
    assert r.json()["database"] == "ok" and r.json()["worker"] == "down" and "worker" in r.json()["down"]


def test_unknown_api_paths_are_json_404(client) -> None:
    r = client.get("/api/nothing-here")
    assert r.status_code == 404


def test_registration_can_be_closed(tmp_path) -> None:
    with TestClient(create_app(make_settings(tmp_path, ALLOW_REGISTRATION=False))) as c:
        r = c.post("/api/auth/register", json={"username": "carol", "password": "password123"})
        assert (r.status_code, r.json()["code"]) == (403, "registration_closed")


def test_the_jwt_secret_is_created_once_and_survives_a_restart(tmp_path) -> None:
    settings = make_settings(tmp_path)
    with TestClient(create_app(settings)) as c:
        token = c.post("/api/auth/register", json={"username": "dave", "password": "password123"}).json()[
            "token"
        ]
    with TestClient(create_app(settings)) as c:
        assert c.get("/api/auth/me", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    assert (tmp_path / "store" / "gateway_jwt_secret").stat().st_mode & 0o077 == 0


def test_the_schema_records_its_version(tmp_path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'g.db'}")
    assert db.migrate() == SCHEMA_VERSION
    assert db.migrate() == SCHEMA_VERSION  # a second start applies nothing twice
    with db.session() as s:
        # One row per migration (the numbers are assigned per feature, so they need not be contiguous).
        assert sorted(m.version for m in s.query(SchemaMigration).all()) == [v for v, _, _ in MIGRATIONS]
        mode = s.connection().exec_driver_sql("PRAGMA journal_mode").scalar()
    assert mode == "wal"
