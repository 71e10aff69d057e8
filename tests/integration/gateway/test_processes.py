"""Two processes of each service on one port each: the worker with WORKER_WORKERS=2 (gunicorn) and the gateway
with GATEWAY_WORKERS=2 (uvicorn) on one SQLite file, as `run_system.py` and compose start them on a 2-core
machine. The kernel hands each new connection to either process, so every request here opens a connection of
its own: a turn, its Stop and its rejoin, a rate limit and the metrics must come out the same whichever process
answers. (The same guarantees with a chosen process for each request: the two-replica tests of
test_turn_lifecycle.py.)
"""

from __future__ import annotations

import contextlib
import re
import threading
import time

import httpx
import pytest

from tests.integration.gateway.helpers import events, register, stream_turn, wait_idle
from tests.ollama_server import OLLAMA_ENV, FakeOllama, default_responder
from tests.servers import gateway_process, worker_process

KEY_LIMIT = 10  # API_KEY_RATE_LIMIT for this gateway


@pytest.fixture(scope="module")
def fake():
    with FakeOllama(models=["qwen3:8b", "qwen3:0.6b"]) as server:
        yield server


@pytest.fixture(scope="module")
def stack(tmp_path_factory, fake):
    tmp = tmp_path_factory.mktemp("processes")
    worker_env = {
        "OLLAMA_HOST": fake.url,
        "SSE_KEEPALIVE_S": "1",
        "TORCH_THREADS": "1",
        "WORKER_WORKERS": "2",
        **OLLAMA_ENV,
    }
    gateway_env = {
        "GATEWAY_WORKERS": "2",
        "OLLAMA_HOST": fake.url,
        "SSE_KEEPALIVE_S": "5",
        "TURN_HEARTBEAT_S": "0.5",
        "API_KEY_RATE_LIMIT": str(KEY_LIMIT),
        "PROMETHEUS_MULTIPROC_DIR": str(tmp / "gateway-metrics"),
    }
    with (
        worker_process(tmp, env=worker_env) as worker,
        gateway_process(tmp, worker_url=worker.url, env=gateway_env) as gateway,
    ):
        yield worker, gateway, tmp


def fresh(stack) -> httpx.Client:
    """A client of its own connection (either process may take it)."""
    return httpx.Client(base_url=stack[1].url, timeout=120)


def call(stack, method: str, path: str, **kwargs) -> httpx.Response:
    with fresh(stack) as client:
        return client.request(method, path, **kwargs)


def test_both_services_start_with_two_processes_and_one_schema(stack):
    worker, gateway, _tmp = stack
    deadline = time.monotonic() + 120  # /health answered as soon as one process served; the other follows
    while (log := gateway.log_tail(50_000)).count("Application startup complete.") < 2:
        assert time.monotonic() < deadline, log
        time.sleep(0.2)
    assert len(re.findall(r"Started server process \[\d+\]", log)) == 2, log
    # The parent migrated once, before the processes started; each found the schema up to date.
    assert log.count("(initial schema)") == 1, log
    assert "with 2 gevent process(es)" in worker.log_tail(20_000)
    health = call(stack, "GET", "/health").json()
    assert (health["database"], health["worker"]) == ("ok", "ok"), health


def test_a_turn_is_stopped_and_rejoined_whichever_process_owns_it(stack, fake):
    alice = register(fresh(stack), "alice")
    chat_id = call(stack, "POST", "/api/chats", json={}, headers=alice).json()["id"]
    fake.token_delay_s = 0.05

    def respond(model, messages, body):
        text = default_responder(model, messages, body)
        return (
            text + " " + " ".join(f"more{i}" for i in range(400)) if body.get("stream") is not False else text
        )

    fake.responder = respond
    tokens: list[str] = []
    ended: list[str] = []

    def browse() -> None:
        with (
            contextlib.suppress(httpx.HTTPError),
            fresh(stack) as client,
            client.stream(
                "POST",
                f"/api/chats/{chat_id}/messages/stream",
                json={"message": "A long story"},
                headers=alice,
            ) as resp,
        ):
            for event, data in events(resp.iter_lines()):
                if event == "token":
                    tokens.append(data["token"])
                elif event in ("done", "interrupted", "error"):
                    ended.append(event)

    browser = threading.Thread(target=browse, daemon=True)
    browser.start()
    try:
        for _ in range(600):
            if len(tokens) >= 3:
                break
            browser.join(0.05)
        assert len(tokens) >= 3, "the turn did not start streaming"
        # Rejoined on a new connection: the snapshot of the running turn, from the owner's memory or its saves.
        with (
            fresh(stack) as client,
            client.stream("GET", f"/api/chats/{chat_id}/stream", headers=alice) as resp,
        ):
            assert resp.status_code == 200
            first = next((e, d) for e, d in events(resp.iter_lines()) if e != ":")
        assert first[0] == "snapshot" and first[1]["status"] == "running"
        assert first[1]["question"] == "A long story"
        stopped = call(stack, "POST", f"/api/chats/{chat_id}/stop", headers=alice)
        assert stopped.status_code == 200, stopped.text
        assert (stopped.json()["status"], stopped.json()["busy"]) == ("interrupted", False)
        browser.join(30)
        assert ended == ["interrupted"]
    finally:
        fake.reset()
    assert "saved" in dict(stream_turn(fresh(stack), chat_id, alice, message="And then?"))
    chat = wait_idle(fresh(stack), chat_id, alice)
    assert [m["status"] for m in chat["messages"]] == ["interrupted", "interrupted", "complete", "complete"]


def test_an_api_key_allowance_and_the_metrics_are_whole_across_the_processes(stack):
    bob = register(fresh(stack), "bob")
    key = call(stack, "POST", "/api/keys", json={"name": "script"}, headers=bob)
    assert key.status_code == 201, key.text
    bearer = {"Authorization": f"Bearer {key.json()['key']}"}
    for i in range(KEY_LIMIT):
        r = call(stack, "GET", "/api/indexes", headers=bearer)
        assert r.status_code == 200, (i, r.text)
    r = call(stack, "GET", "/api/indexes", headers=bearer)
    assert (r.status_code, r.json()["code"]) == (429, "rate_limited"), r.text
    # The scrape sums both processes: every one of those answers is counted, whichever process gave it.
    text = call(stack, "GET", "/metrics").text
    counted = {
        status: float(n)
        for status, n in re.findall(
            r'gateway_http_requests_total\{method="GET",route="/api/indexes",status="(\d+)"\} (\S+)', text
        )
    }
    assert counted == {"200": KEY_LIMIT, "429": 1}, counted
