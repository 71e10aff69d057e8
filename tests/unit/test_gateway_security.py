"""Account and browser-facing hardening of the gateway, in-process (real app, real SQLite, no worker):
throttling per (account, address) and per address behind trusted proxies, registration limits, ending sessions
(logout, password change, disabling), the HttpOnly session cookie with its Origin check, security headers,
strict turn options, the first-admin seat, private data files and `python -m gateway create-admin`."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from sqlalchemy.exc import IntegrityError
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.db import SCHEMA_VERSION, Database, User
from gateway.proxy import TrustedProxies
from gateway.schemas import TurnOptions
from gateway.settings import Settings
from tests.integration.ops.postgres import database_urls, fresh_database
from tests.servers import ROOT, free_port

PASSWORD = "password123"


def make_settings(tmp: Path, **extra) -> Settings:
    base = {
        "INDEX_STORE": tmp / "store",
        "UPLOADS_DIR": tmp / "uploads",
        "WORKER_URL": f"http://127.0.0.1:{free_port()}",  # no worker: these routes never need one
        # Starlette's test client connects as "testclient": trust it as a proxy, so each test can speak for
        # several client addresses through X-Forwarded-For.
        "FORWARDED_ALLOW_IPS": "testclient",
        "LOGIN_BASE_DELAY_S": 0,
        "LOGIN_FREE_ATTEMPTS": 3,
        "LOGIN_LOCK_ATTEMPTS": 3,
        "LOGIN_ADDRESS_LOCK_ATTEMPTS": 6,
        "GATEWAY_ALLOWED_HOSTS": "gw.test",  # the name app_client's requests are for
    }
    return Settings(**{**base, **extra})


def app_client(tmp: Path, **extra) -> TestClient:
    return TestClient(create_app(make_settings(tmp, **extra)), base_url="http://gw.test")


def at(address: str, **headers: str) -> dict:
    """Headers of a request that reached our trusted proxy from `address`."""
    return {"X-Forwarded-For": address, **headers}


def register(c: TestClient, name: str, address: str = "198.51.100.1") -> dict:
    r = c.post("/api/auth/register", json={"username": name, "password": PASSWORD}, headers=at(address))
    assert r.status_code == 201, r.text
    c.cookies.clear()
    return {"Authorization": f"Bearer {r.json()['token']}", "id": r.json()["user"]["id"]}


def bearer(user: dict) -> dict:
    return {"Authorization": user["Authorization"]}


def login(c: TestClient, name: str, password: str, address: str, **headers: str):
    return c.post(
        "/api/auth/login", json={"username": name, "password": password}, headers=at(address, **headers)
    )


# -- throttling ---------------------------------------------------------------------------------------------


def test_guessing_from_one_address_does_not_lock_the_owner_out_elsewhere(tmp_path) -> None:
    with app_client(tmp_path) as c:
        register(c, "alice")
        for _ in range(4):
            assert login(c, "alice", "wrong-guess", "203.0.113.66").status_code in (401, 429)
        # The guessing address is refused, even with the right password...
        r = login(c, "alice", PASSWORD, "203.0.113.66")
        assert (r.status_code, r.json()["code"]) == (429, "login_throttled")
        assert int(r.headers["Retry-After"]) > 0
        # ...the owner, from anywhere else, is not.
        assert login(c, "alice", PASSWORD, "198.51.100.20").status_code == 200


def test_one_address_guessing_many_accounts_is_refused_but_others_are_not(tmp_path) -> None:
    with app_client(tmp_path) as c:
        register(c, "carol")
        for n in range(6):
            assert login(c, f"victim{n}", "wrong-guess", "203.0.113.7").status_code == 401
        r = login(c, "carol", PASSWORD, "203.0.113.7")
        assert (r.status_code, r.json()["code"]) == (429, "login_throttled")
        assert login(c, "carol", PASSWORD, "198.51.100.8").status_code == 200


def test_a_client_cannot_escape_the_throttle_by_writing_its_own_forwarded_for(tmp_path) -> None:
    """Our proxy appends the real address on the right; whatever the client wrote on the left is ignored."""
    with app_client(tmp_path) as c:
        register(c, "dora")
        for n in range(6):
            r = login(c, f"victim{n}", "wrong-guess", f"10.9.8.{n}, 203.0.113.50")
            assert r.status_code == 401
        r = login(c, "dora", PASSWORD, "192.0.2.1, 203.0.113.50")
        assert r.status_code == 429
        assert login(c, "dora", PASSWORD, "203.0.113.50, 198.51.100.9").status_code == 200


def test_forwarded_headers_from_an_untrusted_peer_are_ignored(tmp_path) -> None:
    with app_client(tmp_path, FORWARDED_ALLOW_IPS="127.0.0.1") as c:
        register(c, "erin")
        for n in range(4):
            login(c, "erin", "wrong-guess", f"198.51.100.{n}")
        # Every attempt came from the test client itself, whatever it claimed: the pair is locked.
        assert login(c, "erin", PASSWORD, "198.51.100.99").status_code == 429


def test_the_client_is_the_right_most_untrusted_hop() -> None:
    proxies = TrustedProxies("127.0.0.1, 10.0.0.0/8")
    assert proxies.client("127.0.0.1", ["6.6.6.6", "1.2.3.4", "10.0.0.5"]) == "1.2.3.4"
    assert proxies.client("127.0.0.1", ["1.2.3.4:5555"]) == "1.2.3.4"
    assert proxies.client("127.0.0.1", ["[2001:db8::1]:80"]) == "2001:db8::1"
    assert proxies.client("127.0.0.1", []) == "127.0.0.1"
    assert proxies.client("192.0.2.9", ["1.2.3.4"]) == "192.0.2.9"  # not a proxy of ours: its header is noise
    assert proxies.client("10.1.1.1", ["10.2.2.2"]) == "10.2.2.2"  # only proxies: the left-most of them
    # `*` (every peer trusted, behind the compose load balancer): the hop our own proxy appended.
    assert TrustedProxies("*").client("172.18.0.4", ["6.6.6.6", "1.2.3.4"]) == "1.2.3.4"


def test_registration_is_limited_per_address(tmp_path) -> None:
    with app_client(tmp_path, REGISTER_LIMIT=2) as c:
        register(c, "reg1", "203.0.113.1")
        register(c, "reg2", "192.0.2.77, 203.0.113.1")
        r = c.post(
            "/api/auth/register",
            json={"username": "reg3", "password": PASSWORD},
            headers=at("192.0.2.78, 203.0.113.1"),
        )
        assert (r.status_code, r.json()["code"]) == (429, "rate_limited")
        assert "Retry-After" in r.headers
        register(c, "reg3", "203.0.113.2")  # another address is not affected


# -- ending sessions ----------------------------------------------------------------------------------------


def test_logout_ends_every_session_of_the_user(tmp_path) -> None:
    with app_client(tmp_path) as c:
        alice = register(c, "alice")
        second = login(c, "alice", PASSWORD, "198.51.100.2").json()["token"]
        c.cookies.clear()
        assert c.post("/api/auth/logout", headers=bearer(alice)).status_code == 204
        for token in (alice["Authorization"].split()[1], second):
            r = c.get("/api/auth/me", headers={"Authorization": f"Bearer {token}"})
            assert (r.status_code, r.json()["code"]) == (401, "token_revoked")
        # Signing in again works, and a second logout with the dead token is harmless.
        assert login(c, "alice", PASSWORD, "198.51.100.2").status_code == 200
        assert c.post("/api/auth/logout", headers=bearer(alice)).status_code == 204


def test_a_password_change_ends_other_sessions_and_keeps_this_one(tmp_path) -> None:
    with app_client(tmp_path) as c:
        alice = register(c, "alice")
        other = login(c, "alice", PASSWORD, "198.51.100.3").json()["token"]
        c.cookies.clear()
        r = c.post(
            "/api/auth/password",
            json={"current_password": "not it", "new_password": "a new passphrase"},
            headers=bearer(alice),
        )
        assert (r.status_code, r.json()["field"]) == (403, "current_password")
        r = c.post(
            "/api/auth/password",
            json={"current_password": PASSWORD, "new_password": "short"},
            headers=bearer(alice),
        )
        assert (r.status_code, r.json()["field"]) == (400, "new_password")
        r = c.post(
            "/api/auth/password",
            json={"current_password": PASSWORD, "new_password": "a new passphrase"},
            headers=bearer(alice),
        )
        assert r.status_code == 200
        fresh = r.json()["token"]
        c.cookies.clear()
        assert c.get("/api/auth/me", headers={"Authorization": f"Bearer {fresh}"}).status_code == 200
        for token in (alice["Authorization"].split()[1], other):
            assert c.get("/api/auth/me", headers={"Authorization": f"Bearer {token}"}).status_code == 401
        assert login(c, "alice", PASSWORD, "198.51.100.4").status_code == 401
        assert login(c, "alice", "a new passphrase", "198.51.100.4").status_code == 200


def test_an_admin_disables_an_account_and_its_sessions_end(tmp_path) -> None:
    with app_client(tmp_path) as c:
        admin, bob = register(c, "admin"), register(c, "bob")
        # Not there for anyone but an administrator (a 404, as for a route that does not exist).
        assert c.get("/api/users", headers=bearer(bob)).status_code == 404
        assert (
            c.patch(f"/api/users/{admin['id']}", json={"disabled": True}, headers=bearer(bob)).status_code
            == 404
        )
        r = c.patch(f"/api/users/{admin['id']}", json={"disabled": True}, headers=bearer(admin))
        assert (r.status_code, r.json()["code"]) == (409, "cannot_disable_self")
        for body in ({"disabled": "yes please"}, {}):
            r = c.patch(f"/api/users/{bob['id']}", json=body, headers=bearer(admin))
            assert (r.status_code, r.json()["field"]) == (400, "disabled")
        assert c.patch("/api/users/9999", json={"disabled": True}, headers=bearer(admin)).status_code == 404

        r = c.patch(f"/api/users/{bob['id']}", json={"disabled": True}, headers=bearer(admin))
        assert r.status_code == 200 and r.json()["disabled"] is True
        r = c.get("/api/chats", headers=bearer(bob))
        assert (r.status_code, r.json()["code"]) == (401, "account_disabled")
        # Signing in answers as a wrong password does: another answer would tell a guesser the password is right.
        r = login(c, "bob", PASSWORD, "198.51.100.5")
        assert (r.status_code, r.json()["code"]) == (401, "bad_credentials")
        listed = {u["username"]: u["disabled"] for u in c.get("/api/users", headers=bearer(admin)).json()}
        assert listed == {"admin": False, "bob": True}

        r = c.patch(f"/api/users/{bob['id']}", json={"disabled": False}, headers=bearer(admin))
        assert r.json()["disabled"] is False
        assert login(c, "bob", PASSWORD, "198.51.100.5").status_code == 200
        # The token from before the disabling stays dead.
        assert c.get("/api/chats", headers=bearer(bob)).status_code == 401


# -- the session cookie -------------------------------------------------------------------------------------


def test_login_sets_an_httponly_strict_cookie_that_signs_the_browser_in(tmp_path) -> None:
    with app_client(tmp_path) as c:
        register(c, "alice")
        r = login(c, "alice", PASSWORD, "198.51.100.6")
        cookie = r.headers["set-cookie"]
        assert cookie.startswith("rag_session=")
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
        assert "Secure" not in cookie  # plain HTTP here: a Secure cookie would never come back
        assert c.get("/api/auth/me").json()["username"] == "alice"
        r = login(c, "alice", PASSWORD, "198.51.100.6", **{"X-Forwarded-Proto": "https"})
        assert "Secure" in r.headers["set-cookie"]


def test_state_changing_cookie_requests_must_come_from_our_own_pages(tmp_path) -> None:
    with app_client(tmp_path) as c:
        register(c, "alice")
        login(c, "alice", PASSWORD, "198.51.100.6")
        r = c.post("/api/chats", json={"title": "csrf"}, headers={"Origin": "http://evil.example"})
        assert (r.status_code, r.json()["code"]) == (403, "origin_not_allowed")
        r = c.post("/api/chats", json={"title": "csrf"})
        assert (r.status_code, r.json()["code"]) == (403, "origin_required")
        r = c.post("/api/auth/logout", headers={"Origin": "http://evil.example"})
        assert c.get("/api/auth/me").status_code == 200  # a foreign page cannot sign the user out either
        assert c.get("/api/chats").json() == []  # reads need no Origin
        for lookalike in ("http://gw.test.evil.example", "http://evil.example/http://gw.test", "null"):
            r = c.post("/api/chats", json={}, headers={"Origin": lookalike})
            assert r.status_code == 403, lookalike
        r = c.post("/api/chats", json={"title": "mine"}, headers={"Origin": "http://gw.test"})
        assert r.status_code == 201
        # Served as https by a TLS proxy that passes plain http on: still the same host.
        assert c.post("/api/chats", json={}, headers={"Origin": "https://gw.test"}).status_code == 201
        # A script with the Bearer token needs no Origin.
        token = login(c, "alice", PASSWORD, "198.51.100.6").json()["token"]
        c.cookies.clear()
        r = c.post("/api/chats", json={"title": "script"}, headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 201


def test_an_extra_allowed_origin_is_accepted(tmp_path) -> None:
    with app_client(tmp_path, GATEWAY_ALLOWED_ORIGINS="https://chat.example.org") as c:
        register(c, "alice")
        login(c, "alice", PASSWORD, "198.51.100.6")
        r = c.post("/api/chats", json={}, headers={"Origin": "https://chat.example.org"})
        assert r.status_code == 201


def test_another_sites_page_cannot_sign_a_browser_in(tmp_path) -> None:
    with app_client(tmp_path) as c:
        register(c, "alice")
        r = login(c, "alice", PASSWORD, "198.51.100.6", Origin="http://evil.example")
        assert (r.status_code, r.json()["code"]) == (403, "origin_not_allowed")
        assert "set-cookie" not in r.headers


def test_logout_clears_the_cookie(tmp_path) -> None:
    with app_client(tmp_path) as c:
        register(c, "alice")
        assert c.get("/api/auth/session").json() == {"user": None}  # a page asks at load: no error
        login(c, "alice", PASSWORD, "198.51.100.6")
        assert c.get("/api/auth/session").json()["user"]["username"] == "alice"
        r = c.post("/api/auth/logout", headers={"Origin": "http://gw.test"})
        assert r.status_code == 204
        assert 'rag_session=""' in r.headers["set-cookie"] and "Max-Age=0" in r.headers["set-cookie"]
        assert c.get("/api/auth/me").status_code == 401
        assert c.get("/api/auth/session").json() == {"user": None}


# -- headers and the page -----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/", "/js/main.js", "/api/auth/me", "/health"])
def test_every_answer_carries_the_security_headers(tmp_path, path) -> None:
    with app_client(tmp_path) as c:
        r = c.get(path)
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "object-src 'none'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["referrer-policy"] == "no-referrer"
    assert r.headers["x-frame-options"] == "DENY"


class _Scripts(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.inline: list[str] = []
        self.styled: list[str] = []
        self._open: dict | None = None

    def handle_starttag(self, tag, attrs) -> None:
        attrs = dict(attrs)
        if tag == "script" and not attrs.get("src"):
            self.inline.append(str(attrs))
        if "style" in attrs or any(k.startswith("on") for k in attrs):
            self.styled.append(f"{tag} {attrs}")


def test_the_page_has_no_inline_script_for_the_policy_to_block() -> None:
    parser = _Scripts()
    parser.feed((ROOT / "web" / "index.html").read_text())
    assert parser.inline == [] and parser.styled == []
    # Modules import their dependencies by path (an import map would be an inline script).
    for js in (ROOT / "web" / "js").rglob("*.js"):
        for spec in re.findall(r"""^import .* from ["']([^"']+)["']""", js.read_text(), re.M):
            assert spec.startswith("."), f"{js.name} imports {spec!r}, which needs an import map"


# -- turn options -------------------------------------------------------------------------------------------


def test_the_gateways_turn_options_are_exactly_the_workers() -> None:
    """Same names, and for each the same wire schema (types, enums, bounds), apart from `route`."""
    from rag_worker.schemas import Options

    def wire(model) -> dict:
        schema = model.model_json_schema()
        defs = schema.get("$defs", {})

        def clean(node):
            if isinstance(node, dict):
                if "$ref" in node:
                    return clean(defs[node["$ref"].rsplit("/", 1)[-1]])
                return {k: clean(v) for k, v in node.items() if k not in ("title", "description", "default")}
            if isinstance(node, list):
                return [clean(v) for v in node]
            return node

        return {name: clean(prop) for name, prop in schema["properties"].items() if name != "route"}

    worker, gateway = wire(Options), wire(TurnOptions)
    assert gateway.keys() == worker.keys()
    for name, prop in worker.items():
        # The gateway may add its own bounds (e.g. on prompts); the worker's must all hold at the gateway.
        assert _contains(gateway[name], prop), (name, gateway[name], prop)


def _contains(outer, inner) -> bool:
    if isinstance(inner, dict):
        return isinstance(outer, dict) and all(
            k in outer and _contains(outer[k], v) for k, v in inner.items()
        )
    if isinstance(inner, list):
        return isinstance(outer, list) and len(outer) == len(inner) and all(map(_contains, outer, inner))
    return outer == inner


def test_unknown_and_oversized_turn_options_are_a_400(tmp_path) -> None:
    with app_client(tmp_path, MAX_TOKENS=512) as c:
        alice = register(c, "alice")
        chat = c.post("/api/chats", json={}, headers=bearer(alice)).json()
        url = f"/api/chats/{chat['id']}/messages"
        cases = [
            ({"colour": "blue"}, "options.colour"),
            ({"route": "rag"}, "options.route"),
            ({"max_tokens": 513}, "options.max_tokens"),
            ({"max_tokens": 100000}, "options.max_tokens"),
            ({"mode": "telepathy"}, "options.mode"),
            ({"prompts": {"../system": "x"}}, "options.prompts"),
            ({"prompts": {"system": "x" * 9000}}, "options.prompts"),
        ]
        for options, field in cases:
            r = c.post(url, json={"message": "hi", "options": options}, headers=bearer(alice))
            assert (r.status_code, r.json().get("field")) == (400, field), (options, r.text)
        # Within the cap the turn goes ahead (and fails only because no worker runs here).
        r = c.post(url, json={"message": "hi", "options": {"max_tokens": 512}}, headers=bearer(alice))
        assert r.status_code == 503
        r = c.put("/api/settings", json={"options": {"max_tokens": 4096}}, headers=bearer(alice))
        assert (r.status_code, r.json()["field"]) == (400, "options.max_tokens")
        r = c.put("/api/settings", json={"options": {"colour": "blue"}}, headers=bearer(alice))
        assert (r.status_code, r.json()["field"]) == (400, "options.colour")


# -- first admin, create-admin, files ---------------------------------------------------------------------


@pytest.fixture(params=database_urls(), ids=lambda url: url.split(":", 1)[0].split("+")[0])
def database(request, tmp_path):
    if request.param == "sqlite":
        db = Database(f"sqlite:///{tmp_path / 'g.db'}")
        yield db
        db.dispose()
        return
    with fresh_database(request.param) as url:
        db = Database(url)
        yield db
        db.dispose()


def test_the_database_holds_at_most_one_first_admin(database) -> None:
    """Whatever the code above it does, the database itself refuses a second holder of the first-admin seat
    (on Postgres two racing count-then-insert registrations both saw 0 users and both became admin)."""
    db = database
    db.migrate()
    with db.session() as s:
        s.add(User(username="one", password_hash="x", is_admin=True, first_admin=True))
        s.add(User(username="two", password_hash="x", is_admin=False))
        s.commit()
    with db.session() as s, pytest.raises(IntegrityError):
        s.add(User(username="three", password_hash="x", is_admin=True, first_admin=True))
        s.commit()


def test_a_version_1_database_gets_its_admin_seat_on_upgrade(tmp_path) -> None:
    import sqlite3

    path = tmp_path / "old.db"
    con = sqlite3.connect(path)
    con.executescript(
        """
        CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, applied_at DATETIME);
        INSERT INTO schema_migrations VALUES (1, 'initial schema', '2026-01-01 00:00:00');
        CREATE TABLE users (id INTEGER PRIMARY KEY, username VARCHAR(64) NOT NULL UNIQUE,
                            password_hash VARCHAR NOT NULL, is_admin BOOLEAN NOT NULL, created_at DATETIME NOT NULL);
        INSERT INTO users VALUES (1, 'root', 'h', 1, '2026-01-01'), (2, 'bob', 'h', 0, '2026-01-01');
        """
    )
    con.close()
    db = Database(f"sqlite:///{path}")
    assert db.migrate() == SCHEMA_VERSION
    with db.session() as s:
        rows = {u.username: (u.first_admin, u.token_version, u.disabled) for u in s.query(User).all()}
    assert rows == {"root": (True, 0, False), "bob": (None, 0, False)}


def test_data_files_are_private(tmp_path) -> None:
    with app_client(tmp_path) as c:
        register(c, "alice")
    store = tmp_path / "store"
    assert stat.S_IMODE(store.stat().st_mode) == 0o700
    for name in ("gateway.db", "gateway_jwt_secret"):
        assert stat.S_IMODE((store / name).stat().st_mode) == 0o600, name
    for extra in store.glob("gateway.db-*"):  # -wal, -shm while open
        assert stat.S_IMODE(extra.stat().st_mode) == 0o600, extra.name


def _create_admin(store: Path, username: str, password: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "INDEX_STORE": str(store), "DATABASE_URL": ""}
    return subprocess.run(
        [sys.executable, "-m", "gateway", "create-admin", username],
        input=password + "\n",
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )


def test_create_admin_opens_a_closed_server(tmp_path) -> None:
    done = _create_admin(tmp_path / "store", "root", "a long admin passphrase")
    assert done.returncode == 0, done.stderr
    assert "root" in done.stdout
    again = _create_admin(tmp_path / "store", "ROOT", "a long admin passphrase")
    assert again.returncode == 1 and "taken" in again.stderr
    short = _create_admin(tmp_path / "store", "other", "short")
    assert short.returncode == 2 and "8 characters" in short.stderr
    with app_client(tmp_path, ALLOW_REGISTRATION=False) as c:
        r = login(c, "root", "a long admin passphrase", "198.51.100.1")
        assert r.status_code == 200 and r.json()["user"]["is_admin"] is True
        r = c.post("/api/auth/register", json={"username": "eve", "password": PASSWORD})
        assert r.status_code == 403
