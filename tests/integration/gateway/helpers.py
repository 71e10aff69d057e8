"""Small client-side helpers: accounts, and reading the gateway's SSE as a browser would."""

from __future__ import annotations

import time

import httpx

from tests.servers import ROOT
from tests.sse import parse_lines as events

# A copy of shared/fixtures/docling/sources/duck.md, so the gateway suite runs on a bare clone too.
DUCK = ROOT / "tests" / "fixtures" / "duck.md"


def register(api: httpx.Client, username: str, password: str = "a long enough passphrase") -> dict:
    r = api.post("/api/auth/register", json={"username": username, "password": password})
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['token']}"}


def stream_turn(api: httpx.Client, chat_id: int, headers: dict, **body) -> list[tuple[str, object]]:
    with api.stream("POST", f"/api/chats/{chat_id}/messages/stream", json=body, headers=headers) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        return [(e, d) for e, d in events(resp.iter_lines()) if e != ":"]


def wait_idle(api: httpx.Client, chat_id: int, headers: dict, timeout: float = 120.0) -> dict:
    """The chat once no turn is running in it (a turn the browser left is still being finished)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        chat = api.get(f"/api/chats/{chat_id}", headers=headers).json()
        if not chat["busy"]:
            return chat
        time.sleep(0.2)
    raise AssertionError(f"chat {chat_id} still busy after {timeout} s")
