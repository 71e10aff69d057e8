"""API keys and the user administration, in-process (the real app on real SQLite, and on Postgres when
TEST_DATABASE_URL names one; no worker: none of these routes needs it): a key shown once and stored hashed,
revoked, expired, read-only, acting with its user's current rights, limited per key; an administrator's changes
to accounts; bad input on every new route; the upgrade of an older database. The key principals over every
route are in tests/integration/gateway/test_access_matrix.py.

One app per database for the whole module (the scenarios use their own accounts)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlmodel import select
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.db import ApiKey
from gateway.keys import secret_hash
from tests.integration.ops.postgres import database_urls, fresh_database
from tests.unit.test_gateway_security import PASSWORD, make_settings

RATE_LIMIT = 40  # API_KEY_RATE_LIMIT here: no scenario but the rate limit's sends that many with one key


@pytest.fixture(scope="module", params=database_urls(), ids=lambda url: url.split(":", 1)[0].split("+")[0])
def client(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("keys")
    extra = {"API_KEY_RATE_LIMIT": RATE_LIMIT, "REGISTER_LIMIT": 1000}
    if request.param == "sqlite":
        app = create_app(make_settings(tmp, **extra))
        with TestClient(app, base_url="http://gw.test") as c:
            yield c
        return
    with fresh_database(request.param) as url:
        app = create_app(make_settings(tmp, DATABASE_URL=url, **extra))
        with TestClient(app, base_url="http://gw.test") as c:
            yield c


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def register(c: TestClient, name: str) -> dict:
    r = c.post("/api/auth/register", json={"username": name, "password": PASSWORD})
    assert r.status_code == 201, r.text
    c.cookies.clear()  # every request below says who it is in its Authorization header
    return {
        **bearer(r.json()["token"]),
        "id": r.json()["user"]["id"],
        "is_admin": r.json()["user"]["is_admin"],
    }


def session(user: dict) -> dict:
    return {"Authorization": user["Authorization"]}


def new_key(c: TestClient, user: dict, name: str = "script", **fields) -> dict:
    r = c.post("/api/keys", json={"name": name, **fields}, headers=session(user))
    assert r.status_code == 201, r.text
    return r.json()


@pytest.fixture(scope="module")
def admin(client) -> dict:
    user = register(client, "admin")  # the module's first account: the administrator
    assert user["is_admin"]
    return user


def audit(c: TestClient, admin: dict, **filters) -> list[dict]:
    r = c.get("/api/audit", params=filters, headers=session(admin))
    assert r.status_code == 200, r.text
    return r.json()["events"]


def soon_expired_key(c: TestClient, user: dict, name: str) -> dict:
    """A key that expires a moment after it is made (a past expiry is refused), once it has expired."""
    expires = (datetime.now(UTC) + timedelta(seconds=1.5)).isoformat()
    key = new_key(c, user, name, expires_at=expires)
    assert c.get("/api/auth/me", headers=bearer(key["key"])).status_code == 200
    deadline = time.monotonic() + 30
    while c.get("/api/auth/me", headers=bearer(key["key"])).status_code == 200:
        assert time.monotonic() < deadline, "the key never expired"
        time.sleep(0.2)
    return key


def test_a_key_is_shown_once_stored_hashed_used_as_a_bearer_and_revoked(client, admin) -> None:
    c = client
    alice, bob = register(c, "alice"), register(c, "bob")
    created = new_key(c, alice, "nightly report")
    secret = created["key"]
    assert secret.startswith("rag_") and len(secret) >= 40
    assert created["prefix"] == secret[:12] and created["read_only"] is False
    assert created["expires_at"] is None and created["expired"] is False
    # Only its hash is stored: the database holds nothing a reader could sign in with.
    with c.app.state.ctx.db.session() as s:
        row = s.get(ApiKey, created["id"])
        assert row.secret_hash == secret_hash(secret) and secret not in repr(row.model_dump())

    r = c.get("/api/auth/me", headers=bearer(secret))
    assert (r.status_code, r.json()["username"]) == (200, "alice")
    assert c.post("/api/chats", json={"title": "by key"}, headers=bearer(secret)).status_code == 201
    listed = c.get("/api/keys", headers=session(alice)).json()
    assert [k["name"] for k in listed] == ["nightly report"]
    assert "key" not in listed[0] and listed[0]["prefix"] == created["prefix"]
    assert listed[0]["last_used_at"] is not None
    assert c.get("/api/keys", headers=session(bob)).json() == []

    # Another user's key id is a 404, exactly as one that never was; the key goes on working.
    for method in ("DELETE",):
        r = c.request(method, f"/api/keys/{created['id']}", headers=session(bob))
        assert (r.status_code, r.json()["code"]) == (404, "key_not_found")
    r = c.delete("/api/keys/987654", headers=session(bob))
    assert (r.status_code, r.json()["code"]) == (404, "key_not_found")
    assert c.get("/api/auth/me", headers=bearer(secret)).status_code == 200

    assert c.delete(f"/api/keys/{created['id']}", headers=session(alice)).status_code == 204
    r = c.get("/api/auth/me", headers=bearer(secret))
    assert (r.status_code, r.json()["code"]) == (401, "key_revoked")
    assert c.get("/api/keys", headers=session(alice)).json() == []
    assert c.delete(f"/api/keys/{created['id']}", headers=session(alice)).status_code == 404
    r = c.get("/api/auth/me", headers=bearer("rag_" + "x" * 43))
    assert (r.status_code, r.json()["code"]) == (401, "key_invalid")
    # Both are on the audit log, with the key's name and prefix and never its secret.
    events = audit(c, admin, object_type="key", object_id=str(created["id"]))
    assert [(e["action"], e["actor_name"]) for e in events] == [
        ("key.revoke", "alice"),
        ("key.create", "alice"),
    ]
    assert (
        events[1]["detail"]["name"] == "nightly report" and events[1]["detail"]["prefix"] == created["prefix"]
    )
    assert secret not in str(events)
    # Logging out ends sessions, not keys (a script's key is not a browser's session).
    other = new_key(c, alice, "survives logout")
    assert c.post("/api/auth/logout", headers=session(alice)).status_code == 204
    assert c.get("/api/auth/me", headers=session(alice)).status_code == 401
    assert c.get("/api/auth/me", headers=bearer(other["key"])).status_code == 200


def test_a_key_expires_and_a_past_expiry_is_refused(client, admin) -> None:
    c = client
    dora = register(c, "dora")
    r = c.post("/api/keys", json={"name": "old", "expires_at": "2020-01-01T00:00:00Z"}, headers=session(dora))
    assert (r.status_code, r.json()["code"], r.json()["field"]) == (400, "expiry_in_past", "expires_at")
    assert "in the past" in r.json()["error"]
    later = new_key(c, dora, "quarterly", expires_at="2999-03-31T12:00:00+02:00")
    assert later["expires_at"] == "2999-03-31T10:00:00.000Z"  # stored in UTC
    key = soon_expired_key(c, dora, "brief")
    r = c.get("/api/auth/me", headers=bearer(key["key"]))
    assert (r.status_code, r.json()["code"]) == (401, "key_expired")
    listed = {k["name"]: k["expired"] for k in c.get("/api/keys", headers=session(dora)).json()}
    assert listed == {"quarterly": False, "brief": True}


def test_a_read_only_key_can_ask_and_read_but_change_nothing(client, admin) -> None:
    c = client
    erin = register(c, "erin")
    index = c.post("/api/indexes", json={"name": "notes"}, headers=session(erin)).json()
    full = new_key(c, erin, "full")
    key = new_key(c, erin, "reader", read_only=True)
    assert key["read_only"] is True
    ro = bearer(key["key"])
    assert [i["name"] for i in c.get("/api/indexes", headers=ro).json()] == ["notes"]
    assert c.get(f"/api/indexes/{index['id']}", headers=ro).status_code == 200
    assert [k["name"] for k in c.get("/api/keys", headers=ro).json()] == ["full", "reader"]
    assert c.get("/v1/models", headers=ro).status_code == 200
    chat = c.post("/api/chats", json={"index_ids": [index["id"]]}, headers=ro)
    assert chat.status_code == 201  # a chat to ask in
    refused = [
        ("POST", "/api/indexes", {"name": "mine now"}),
        ("PATCH", f"/api/indexes/{index['id']}", {"name": "renamed"}),
        ("DELETE", f"/api/indexes/{index['id']}", None),
        ("POST", f"/api/indexes/{index['id']}/documents?wait=1", None),
        ("POST", f"/api/indexes/{index['id']}/build", {}),
        ("PATCH", f"/api/chats/{chat.json()['id']}", {"title": "x"}),
        ("DELETE", f"/api/chats/{chat.json()['id']}", None),
        ("POST", "/api/keys", {"name": "another"}),
        ("DELETE", f"/api/keys/{full['id']}", None),
        ("POST", "/api/auth/password", {"current_password": PASSWORD, "new_password": "a new passphrase"}),
        ("PUT", "/api/settings", {}),
    ]
    for method, path, body in refused:
        r = c.request(method, path, json=body, headers=ro)
        assert (r.status_code, r.json()["code"]) == (403, "read_only_key"), (method, path, r.text)
    # Nothing of that happened.
    assert c.get(f"/api/indexes/{index['id']}", headers=session(erin)).json()["name"] == "notes"
    assert len(c.get("/api/keys", headers=session(erin)).json()) == 2
    assert c.get("/api/auth/me", headers=session(erin)).status_code == 200


def test_keys_are_made_from_a_session_and_a_full_key_may_revoke(client, admin) -> None:
    c = client
    finn = register(c, "finn")
    one, two = new_key(c, finn, "one"), new_key(c, finn, "two")
    r = c.post("/api/keys", json={"name": "minted"}, headers=bearer(one["key"]))
    assert (r.status_code, r.json()["code"]) == (403, "session_required")
    assert c.delete(f"/api/keys/{two['id']}", headers=bearer(one["key"])).status_code == 204
    assert c.get("/api/auth/me", headers=bearer(two["key"])).status_code == 401
    assert [k["name"] for k in c.get("/api/keys", headers=bearer(one["key"])).json()] == ["one"]


def test_a_key_acts_with_its_users_rights_as_they_are_now(client, admin) -> None:
    c = client
    gail = register(c, "gail")
    key = bearer(new_key(c, gail, "ops")["key"])
    assert c.get("/api/users", headers=key).status_code == 404  # not an administrator: no such route
    r = c.patch(f"/api/users/{gail['id']}", json={"is_admin": True}, headers=session(admin))
    assert (r.status_code, r.json()["is_admin"]) == (200, True)
    assert c.get("/api/users", headers=key).status_code == 200  # made admin: through the key too
    assert (
        c.patch(f"/api/users/{gail['id']}", json={"is_admin": False}, headers=session(admin)).status_code
        == 200
    )
    assert c.get("/api/users", headers=key).status_code == 404  # and no longer
    assert (
        c.patch(f"/api/users/{gail['id']}", json={"disabled": True}, headers=session(admin)).status_code
        == 200
    )
    r = c.get("/api/auth/me", headers=key)
    assert (r.status_code, r.json()["code"]) == (401, "account_disabled")
    assert c.get("/v1/models", headers=key).status_code == 401
    assert (
        c.patch(f"/api/users/{gail['id']}", json={"disabled": False}, headers=session(admin)).status_code
        == 200
    )
    assert c.get("/api/auth/me", headers=key).status_code == 200  # re-enabled: its keys work again
    events = audit(c, admin, object_type="user", object_id=str(gail["id"]))
    assert [(e["action"], e["detail"].get("is_admin")) for e in events] == [
        ("user.enable", None),
        ("user.disable", None),
        ("user.role", False),
        ("user.role", True),
        ("user.create", None),
    ]
    assert {e["actor_name"] for e in events[:4]} == {"admin"}
    # A null is neither true nor false: a 400 that names the field, and the account stays as it was.
    r = c.patch(
        f"/api/users/{gail['id']}", json={"disabled": False, "is_admin": None}, headers=session(admin)
    )
    assert (r.status_code, r.json()["field"]) == (400, "is_admin"), r.text


def test_each_key_has_its_own_request_allowance(client, admin) -> None:
    c = client
    hank = register(c, "hank")
    busy, calm = bearer(new_key(c, hank, "busy")["key"]), bearer(new_key(c, hank, "calm")["key"])
    for _ in range(RATE_LIMIT):
        assert c.get("/api/chats", headers=busy).status_code == 200
    r = c.get("/api/chats", headers=busy)
    assert (r.status_code, r.json()["code"]) == (429, "rate_limited")
    assert int(r.headers["Retry-After"]) >= 1 and "with this API key" in r.json()["error"]
    assert c.get("/api/chats", headers=calm).status_code == 200  # another key of the same user
    assert c.get("/api/chats", headers=session(hank)).status_code == 200  # and the user's session


def test_an_administrator_manages_accounts_and_nobody_else_sees_it(client, admin) -> None:
    c = client
    ivy, jack = register(c, "ivy"), register(c, "jack")
    for who in (ivy, bearer(new_key(c, ivy, "k")["key"])):
        headers = session(who) if "id" in who else who
        for method, path, body in [
            ("GET", "/api/users", None),
            ("PATCH", f"/api/users/{jack['id']}", {"disabled": True}),
            ("POST", f"/api/users/{jack['id']}/password", {"new_password": "taken over now"}),
        ]:
            r = c.request(method, path, json=body, headers=headers)
            assert (r.status_code, r.json()["code"]) == (404, "not_found"), (method, path)
    listed = {u["username"]: u for u in c.get("/api/users", headers=session(admin)).json()}
    assert listed["jack"]["is_admin"] is False and listed["jack"]["disabled"] is False

    r = c.post(
        f"/api/users/{jack['id']}/password",
        json={"new_password": "reset by the admin"},
        headers=session(admin),
    )
    assert r.status_code == 200 and r.json()["username"] == "jack"
    assert c.get("/api/auth/me", headers=session(jack)).status_code == 401  # his sessions ended
    login = c.post("/api/auth/login", json={"username": "jack", "password": "reset by the admin"})
    assert login.status_code == 200
    assert c.post("/api/auth/login", json={"username": "jack", "password": PASSWORD}).status_code == 401
    c.cookies.clear()

    r = c.patch(f"/api/users/{admin['id']}", json={"is_admin": False}, headers=session(admin))
    assert (r.status_code, r.json()["code"]) == (409, "cannot_demote_self")
    r = c.post(
        f"/api/users/{admin['id']}/password", json={"new_password": "another one!"}, headers=session(admin)
    )
    assert (r.status_code, r.json()["code"]) == (409, "use_password_change")
    r = c.post("/api/users/424242/password", json={"new_password": "whoever you are"}, headers=session(admin))
    assert (r.status_code, r.json()["code"]) == (404, "user_not_found")
    assert c.get("/api/auth/me", headers=session(admin)).json()["is_admin"] is True
    # Every change is on the audit log, by whom and to whom; the refused ones are not.
    events = audit(c, admin, object_type="user", object_id=str(jack["id"]))
    assert [(e["action"], e["actor_name"], e["detail"]["username"]) for e in events] == [
        ("user.password_reset", "admin", "jack"),
        ("user.create", "jack", "jack"),
    ]


# -- bad input ----------------------------------------------------------------------------------------------


def _error(r) -> dict:
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    return r.json()


def test_bad_input_on_the_new_routes_is_a_4xx_that_says_what_and_stores_nothing(client, admin) -> None:
    c = client
    kim = register(c, "kim")
    headers = {**session(kim), "Content-Type": "application/json"}
    bad_keys = [
        (b"{not json", 400, "invalid_json"),
        (b"[]", 400, "invalid_json"),
        (b'{"name": ""}', 400, "invalid"),
        (b'{"name": "   "}', 400, "invalid"),
        (('{"name": "%s"}' % ("k" * 101)).encode(), 400, "invalid"),
        (b'{"name": "nul\\u0000here"}', 400, "invalid"),
        (b'{"name": "invoice\\u202egpj.exe"}', 400, "invalid"),  # a bidirectional control
        (b'{"name": "half \\ud800 a pair"}', 400, "invalid_text"),  # a lone surrogate
        (b'{"name": 7}', 400, "invalid"),
        (b'{"name": "ok", "read_only": "yes"}', 400, "invalid"),  # strict: no coercion
        (b'{"name": "ok", "readonly": true}', 400, "invalid"),  # unknown field: refused, never ignored here
        (b'{"name": "ok", "expires_at": 1893456000}', 400, "invalid"),
        (b'{"name": "ok", "expires_at": "next tuesday"}', 400, "invalid"),
        (('{"name": "ok", "expires_at": "%s"}' % ("9" * 65)).encode(), 400, "invalid"),
    ]
    for raw, status, code in bad_keys:
        r = c.post("/api/keys", content=raw, headers=headers)
        body = _error(r)
        assert (r.status_code, body["code"]) == (status, code), raw
        assert isinstance(body["error"], str) and body["error"]
    assert c.get("/api/keys", headers=session(kim)).json() == []  # nothing half-made
    r = c.post("/api/keys", content=b"{" + b'"name": "x",' * 200_000 + b"}", headers=headers)
    assert (r.status_code, _error(r)["code"]) == (413, "too_large")
    # Unicode that is only unusual is fine, and kept as sent.
    assert new_key(c, kim, "Schlüssel für Берлин ✓")["name"] == "Schlüssel für Берлин ✓"

    user_id = kim["id"]
    admin_headers = {**session(admin), "Content-Type": "application/json"}
    for path, raw in [
        (f"/api/users/{user_id}", b"{oops"),
        (f"/api/users/{user_id}", b'{"is_admin": "yes"}'),
        (f"/api/users/{user_id}", b'{"admin": true}'),  # nothing known to change
        (f"/api/users/{user_id}/password", b"{}"),
        (f"/api/users/{user_id}/password", b'{"new_password": "short"}'),
        (f"/api/users/{user_id}/password", ('{"new_password": "%s"}' % ("p" * 1025)).encode()),
        (f"/api/users/{user_id}/password", b'{"new_password": "\\ud83d broken pair"}'),
    ]:
        method = "PATCH" if path.endswith(str(user_id)) else "POST"
        assert _error(c.request(method, path, content=raw, headers=admin_headers))["error"], (path, raw)
    assert c.get("/api/auth/me", headers=session(kim)).status_code == 200  # no change went through

    key = {**bearer(new_key(c, kim, "v1")["key"]), "Content-Type": "application/json"}
    question = [{"role": "user", "content": "hello"}]
    import json

    bad_completions = [
        b"{nope",
        b'"a string"',
        json.dumps({"messages": question}).encode(),  # no model
        json.dumps({"model": "direct"}).encode(),  # no messages
        json.dumps({"model": "direct", "messages": []}).encode(),
        json.dumps({"model": "direct", "messages": [{"role": "tool", "content": "x"}]}).encode(),
        json.dumps(
            {"model": "direct", "messages": [{"role": "system", "content": "only a system note"}]}
        ).encode(),
        json.dumps({"model": "m" * 201, "messages": question}).encode(),
        json.dumps({"model": "direct", "messages": question, "n": 2}).encode(),
        json.dumps({"model": "direct", "messages": question, "temperature": 9}).encode(),
        json.dumps({"model": "direct", "messages": question, "max_tokens": 0}).encode(),
        json.dumps({"model": "direct", "messages": question, "datasets": ["../etc"]}).encode(),
        json.dumps({"model": "direct", "messages": question, "options": {"shell": "rm"}}).encode(),
        json.dumps(
            {
                "model": "direct",
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
            }
        ).encode(),
        b'{"model": "direct", "messages": [{"role": "user", "content": "\\udc00"}]}',
        json.dumps(
            {"model": "rag/u1_not-yours_00000000", "messages": question, "top_p": 1, "user": "z"}
        ).encode(),
    ]
    for raw in bad_completions:
        r = c.post("/v1/chat/completions", content=raw, headers=key)
        body = _error(r)
        # OpenAI's error shape, which its clients read.
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, raw
        assert body["error"]["type"] == "invalid_request_error" and body["error"]["message"], raw
    # Fields OpenAI clients send that mean nothing here are ignored, as by OpenAI-compatible servers: the last
    # request above failed on its model (a 404), not on `top_p` or `user`.
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = c.get("/v1/models/rag%2Fnothing", headers=key)
    assert (r.status_code, r.json()["error"]["code"]) == (404, "model_not_found")
    r = c.put("/v1/models", headers=key)
    assert (r.status_code, r.headers["allow"]) == (405, "GET, HEAD")
    assert c.get("/v1/embeddings", headers=key).json()["error"]["code"] == "not_found"


# -- migration ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("database", database_urls(), ids=lambda url: url.split(":", 1)[0].split("+")[0])
def test_a_database_from_before_keys_upgrades_in_place(tmp_path, database) -> None:
    import contextlib

    from sqlalchemy import inspect

    from gateway.db import MIGRATIONS, SCHEMA_VERSION, Database, SchemaMigration, User
    from gateway.keys import _load, new_secret

    with contextlib.ExitStack() as stack:
        url = (
            f"sqlite:///{tmp_path / 'old.db'}"
            if database == "sqlite"
            else stack.enter_context(fresh_database(database))
        )
        db = Database(url)
        stack.callback(db.dispose)
        SchemaMigration.__table__.create(db.engine)
        with db.engine.begin() as conn:
            for version, name, change in [m for m in MIGRATIONS if m[0] < 7]:  # the schema before API keys
                change(conn)
                conn.execute(SchemaMigration.__table__.insert().values(version=version, name=name))
        with db.session() as s:
            s.add(User(username="old_timer", password_hash="x"))
            s.commit()
        assert not inspect(db.engine).has_table("api_keys")

        assert db.migrate() == SCHEMA_VERSION
        assert db.migrate() == SCHEMA_VERSION  # a second start applies nothing twice
        assert inspect(db.engine).has_table("api_keys")
        secret = new_secret()
        with db.session() as s:
            user = s.exec(select(User).where(User.username == "old_timer")).one()
            s.add(
                ApiKey(
                    user_id=user.id,
                    name="after the upgrade",
                    prefix=secret[:12],
                    secret_hash=secret_hash(secret),
                )
            )
            s.commit()
        key, owner = _load(db, secret_hash(secret))
        assert (key.name, key.read_only, key.revoked_at, owner.username) == (
            "after the upgrade",
            False,
            None,
            "old_timer",
        )


def test_a_long_conversation_reaches_the_worker_trimmed_oldest_first_with_its_question(tmp_path) -> None:
    """What /v1 sends the worker for a conversation past MAX_HISTORY_MESSAGES: the newest messages before the
    question, the question itself, nothing empty (a web turn's history is trimmed the same way)."""
    from types import SimpleNamespace

    from gateway.v1 import CompletionRequest, _conversation

    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(300)]
    body = CompletionRequest.model_validate(
        {
            "model": "direct",
            "messages": [*turns, {"role": "user", "content": "the question"}, {"role": "user"}],
        }
    )
    c = SimpleNamespace(settings=make_settings(tmp_path, MAX_HISTORY_MESSAGES=10))
    question, messages = _conversation(c, body)
    assert question == "the question"
    assert [m["content"] for m in messages] == [f"message {i}" for i in range(290, 300)] + ["the question"]
