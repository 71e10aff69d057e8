"""Account hardening through the real gateway (uvicorn) and worker, on SQLite and, when a server is given,
PostgreSQL: racing first registrations, client addresses behind a proxy, the worker's configuration shown to
admins only, and the running-turn allowance per account (MAX_TURNS_PER_USER, default 4)."""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.integration.gateway.helpers import events, wait_idle
from tests.ollama_server import default_responder

PASSWORD = "a long enough passphrase"


def _register(api: httpx.Client, name: str, address: str) -> httpx.Response:
    # The test talks to the gateway from 127.0.0.1, a trusted proxy by default (FORWARDED_ALLOW_IPS), so the
    # right-most X-Forwarded-For hop is the client's address.
    return api.post(
        "/api/auth/register",
        json={"username": name, "password": PASSWORD},
        headers={"X-Forwarded-For": address},
    )


def test_racing_first_registrations_make_exactly_one_admin(gateway):
    """Runs first in the module, on an empty database: eight accounts registered at the same moment."""
    barrier = threading.Barrier(8)

    def one(n: int) -> dict:
        with httpx.Client(base_url=gateway.url, timeout=120) as client:
            barrier.wait()
            r = _register(client, f"racer{n}", f"198.51.100.{n + 10}")
            assert r.status_code == 201, r.text
            return r.json()["user"]

    with ThreadPoolExecutor(8) as pool:
        users = list(pool.map(one, range(8)))
    admins = [u["username"] for u in users if u["is_admin"]]
    assert len(admins) == 1, users


def test_registration_is_limited_per_client_address_not_per_forged_header(api):
    for n in range(10):  # REGISTER_LIMIT's default
        assert _register(api, f"limited{n}", f"10.0.0.{n}, 203.0.113.80").status_code == 201
    r = _register(api, "limited10", "10.0.0.99, 203.0.113.80")
    assert (r.status_code, r.json()["code"]) == (429, "rate_limited")
    assert _register(api, "limited10", "203.0.113.81").status_code == 201


@pytest.fixture(scope="module")
def admin(api) -> dict:
    r = api.post("/api/auth/login", json={"username": _admin_name(api), "password": PASSWORD})
    return {"Authorization": f"Bearer {r.json()['token']}"}


def _admin_name(api) -> str:
    for n in range(8):
        r = api.post("/api/auth/login", json={"username": f"racer{n}", "password": PASSWORD})
        if r.json()["user"]["is_admin"]:
            return f"racer{n}"
    raise AssertionError("no admin among the racers")


@pytest.fixture(scope="module")
def member(api) -> dict:
    r = _register(api, "member", "198.51.100.200")
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['token']}"}


def test_only_admins_see_the_workers_configuration(api, admin, member):
    mine = api.get("/api/settings", headers=member).json()
    assert mine["worker_defaults"] is None
    assert "options" in mine
    theirs = api.get("/api/settings", headers=admin).json()
    assert isinstance(theirs["worker_defaults"], dict) and theirs["worker_defaults"]


def test_one_account_may_run_only_so_many_turns_at_once(api, member, ollama):
    release = threading.Event()

    def responder(model, messages, body):
        if any("HOLD" in str(m.get("content")) for m in messages):
            release.wait(120)
        return default_responder(model, messages, body)

    ollama.responder = responder
    chats = [api.post("/api/chats", json={}, headers=member).json()["id"] for _ in range(5)]
    with contextlib.ExitStack() as held:
        try:
            responses = []
            for chat_id in chats[:4]:
                url = f"/api/chats/{chat_id}/messages/stream"
                resp = held.enter_context(
                    api.stream("POST", url, json={"message": "HOLD on"}, headers=member)
                )
                assert resp.status_code == 200  # the turn is running (held in the model)
                responses.append(resp)
            r = api.post(f"/api/chats/{chats[4]}/messages/stream", json={"message": "hi"}, headers=member)
            assert (r.status_code, r.json()["code"]) == (429, "too_many_turns")
            # Another account is not affected.
            other = {
                "Authorization": f"Bearer {_register(api, 'bystander', '198.51.100.201').json()['token']}"
            }
            other_chat = api.post("/api/chats", json={}, headers=other).json()
            r = api.post(f"/api/chats/{other_chat['id']}/messages", json={"message": "hello"}, headers=other)
            assert r.status_code == 200, r.text
        finally:
            release.set()
        for resp in responses:
            assert [e for e, _ in events(resp.iter_lines()) if e == "done"] == ["done"]
    for chat_id in chats[:4]:
        wait_idle(api, chat_id, member)
    # Once they are finished, the account may start turns again.
    r = api.post(f"/api/chats/{chats[4]}/messages", json={"message": "hello"}, headers=member)
    assert r.status_code == 200, r.text
