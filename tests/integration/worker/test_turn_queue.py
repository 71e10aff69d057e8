"""Past capacity the worker degrades visibly: turns wait in a fair queue (a `queued` step with the position) and
beyond MAX_QUEUED_TURNS a new turn gets 503 with Retry-After, never a stall.

One slot, one queue place. Turn A asks for HyDE, whose utility-model call happens inside the retrieval stage, and
the fake Ollama holds that call open: A holds the only slot for as long as the test wants, so B waits in line and C
finds the line full, with no timing involved.

Every turn's passages fall in the relevance check's unsure band here (RELEVANT_ABOVE 0.999), so each asks the model
its YES/NO: that call runs outside the slots, and a turn whose judge the fake Ollama holds keeps no other turn
waiting."""

from __future__ import annotations

import threading

import httpx
import pytest

from rag_worker.pipeline.prompts import prompt
from tests.ollama_server import OLLAMA_ENV, default_responder
from tests.servers import SHARED, gateway_process, worker_process
from tests.sse import parse_lines

QUESTION = {"prompt": "What do ducks eat?", "index": "corpus", "options": {"provenance": "similarity"}}


@pytest.fixture(scope="module")
def one_slot_worker(corpus_root, fake_ollama_server):
    env = {
        "OLLAMA_HOST": fake_ollama_server.url,
        "RAG_CONCURRENCY": "1",
        "MAX_QUEUED_TURNS": "1",
        "SSE_KEEPALIVE_S": "1",
        # Every turn asks the model whether its passages answer it (the unsure band covers every score).
        "ABSTAIN_BELOW": "0.0",
        "RELEVANT_ABOVE": "0.999",
        # The line is per process (docs/design/ARCHITECTURE.md, "Several processes per service"): this file
        # fills one process's, so it runs one whatever TEST_WORKER_WORKERS says.
        "WORKER_WORKERS": "1",
        **OLLAMA_ENV,
    }
    with worker_process(corpus_root, env=env) as proc:
        yield proc


@pytest.fixture(scope="module")
def gateway_api(one_slot_worker, corpus_root, tmp_path_factory):
    """The real gateway in front of the one-slot worker, with a user whose index holds the duck page."""
    duck = SHARED / "fixtures" / "docling" / "sources" / "duck.md"
    if not duck.exists():
        pytest.skip(f"needs ../shared (the duck fixture {duck} is absent)")
    env = {"UPLOADS_DIR": str(corpus_root / "shared_uploads")}
    tmp = tmp_path_factory.mktemp("queue-gateway")
    with (
        gateway_process(tmp, worker_url=one_slot_worker.url, env=env) as gw,
        httpx.Client(base_url=gw.url, timeout=120) as api,
    ):
        r = api.post(
            "/api/auth/register", json={"username": "queuer", "password": "a long enough passphrase"}
        )
        assert r.status_code == 201, r.text
        user = {"Authorization": f"Bearer {r.json()['token']}"}
        index = api.post("/api/indexes", json={"name": "Birds"}, headers=user).json()
        r = api.post(
            f"/api/indexes/{index['id']}/documents?wait=1",
            headers=user,
            data={"dataset": "animals"},
            files={"file": ("duck.md", duck.read_bytes(), "text/markdown")},
        )
        assert r.status_code == 201, r.text
        yield api, user, index


def hold_hyde(fake):
    """Make the fake Ollama hold HyDE calls until the returned event is set."""
    entered, release = threading.Event(), threading.Event()
    hyde = prompt("hyde", {})

    def responder(model, messages, request):
        if any(m.get("role") == "system" and m.get("content") == hyde for m in messages):
            entered.set()
            release.wait(60)
            return "Ducks eat plants, seeds and small insects."
        return default_responder(model, messages, request)

    fake.responder = responder
    return entered, release


def hold_relevance(fake, question: str):
    """Make the fake Ollama hold the relevance check's YES/NO for `question` until the returned event is set."""
    entered, release = threading.Event(), threading.Event()

    def responder(model, messages, request):
        last = str(messages[-1].get("content") or "") if messages else ""
        if f"Question: {question}\n" in last and "Answer YES or NO" in last:
            entered.set()
            release.wait(60)
        return default_responder(model, messages, request)

    fake.responder = responder
    return entered, release


def stream_all(url: str, body: dict, events: list, first_queued: threading.Event | None = None):
    with httpx.Client(timeout=120) as client, client.stream("POST", url, json=body) as resp:
        assert resp.status_code == 200
        for event, data in parse_lines(resp.iter_lines()):
            events.append((event, data))
            if first_queued is not None and event == "step" and data["step"] == "queued":
                first_queued.set()


def test_queued_step_then_503_with_retry_after_when_the_line_is_full(
    one_slot_worker, gateway_api, fake_ollama
):
    url = one_slot_worker.url
    entered, release = hold_hyde(fake_ollama)
    a_events: list = []
    b_events: list = []
    b_queued = threading.Event()
    a = threading.Thread(
        target=stream_all,
        args=(url + "/chat_stream", {**QUESTION, "options": {**QUESTION["options"], "hyde": True}}, a_events),
    )
    b = threading.Thread(target=stream_all, args=(url + "/chat_stream", QUESTION, b_events, b_queued))
    try:
        a.start()
        assert entered.wait(60), "turn A never reached its HyDE call"
        b.start()
        assert b_queued.wait(60), "turn B never said it was queued"

        # The line (one place) is full: a third turn is refused up front, streamed or not, with a JSON error
        # and a Retry-After the client can act on.
        for path in ("/chat_stream", "/chat"):
            resp = httpx.post(url + path, json=QUESTION, timeout=60)
            assert resp.status_code == 503, resp.text
            body = resp.json()
            assert body["code"] == "busy" and "MAX_QUEUED_TURNS" in body["error"]
            assert int(resp.headers["Retry-After"]) >= 1 and body["retry_after_s"] >= 1
        # OpenAI clients are told the same, in OpenAI's shape, streamed or not: the SDKs retry a 503 after
        # its Retry-After.
        for stream in (False, True):
            ask = {"model": "rag/corpus", "messages": [{"role": "user", "content": "What do ducks eat?"}]}
            resp = httpx.post(url + "/v1/chat/completions", json={**ask, "stream": stream}, timeout=60)
            assert resp.status_code == 503, resp.text
            error = resp.json()["error"]
            assert error["code"] == "busy" and error["type"] == "server_error"
            assert "MAX_QUEUED_TURNS" in error["message"] and int(resp.headers["Retry-After"]) >= 1
        # Through the gateway the browser gets the same clear 503 (not a 502) and the worker's Retry-After; the
        # failed turn is stored as such and the chat is free again.
        api, user, index = gateway_api
        chat = api.post("/api/chats", json={"index_ids": [index["id"]]}, headers=user).json()
        r = api.post(
            f"/api/chats/{chat['id']}/messages", json={"message": "What do ducks eat?"}, headers=user
        )
        assert r.status_code == 503, r.text
        assert r.json()["code"] == "busy" and int(r.headers["Retry-After"]) >= 1
        assert r.json()["retry_after_s"] == int(r.headers["Retry-After"])
        with api.stream(
            "POST",
            f"/api/chats/{chat['id']}/messages/stream",
            json={"message": "And ducklings?"},
            headers=user,
        ) as resp:
            frames = [(e, d) for e, d in parse_lines(resp.iter_lines()) if e != ":"]
        error = dict(frames)["error"]
        assert error["code"] == "busy" and error["retry_after_s"] >= 1
        stored = api.get(f"/api/chats/{chat['id']}", headers=user).json()
        assert not stored["busy"] and [m["status"] for m in stored["messages"]] == ["failed", "failed"]
        # A direct turn never touches the CPU stages: it is not refused.
        direct = httpx.post(
            url + "/chat", json={"prompt": "hello", "options": {"route": "direct"}}, timeout=60
        )
        assert direct.status_code == 200
    finally:
        release.set()
        a.join(120)
        b.join(120)

    # Both waiting turns complete once the slot frees; B was told where it stood.
    assert a_events[-1][0] == "done" and b_events[-1][0] == "done"
    queued = [d for e, d in b_events if e == "step" and d["step"] == "queued"]
    assert queued[0]["detail"]["position"] == 1 and "1st in line" in queued[0]["label"]
    steps = [d["step"] for e, d in b_events if e == "step"]
    assert steps.index("queued") < steps.index("retrieving")
    assert b_events[-1][1]["documents"] and b_events[-1][1]["reply"]
    # The slot is free again: a new turn goes straight through.
    again = httpx.post(url + "/chat", json=QUESTION, timeout=60)
    assert again.status_code == 200 and again.json()["documents"]


def test_a_turn_waiting_for_the_models_relevance_check_holds_no_slot(one_slot_worker, fake_ollama):
    # While the model takes its time judging A's passages, B is searched, judged and answered on the one slot.
    url = one_slot_worker.url
    entered, release = hold_relevance(fake_ollama, QUESTION["prompt"])
    a_events: list = []
    a = threading.Thread(target=stream_all, args=(url + "/chat_stream", QUESTION, a_events))
    try:
        a.start()
        assert entered.wait(60), "turn A never asked the model about its passages"
        b = httpx.post(url + "/chat", json={**QUESTION, "prompt": "What do ducklings eat?"}, timeout=30)
        assert b.status_code == 200, b.text
        answer = b.json()
        assert answer["documents"] and answer["reply"] and not answer["abstained"]
        assert not a_events or a_events[-1][0] != "done"  # A is still waiting for its verdict
    finally:
        release.set()
        a.join(120)
    assert a_events[-1][0] == "done" and a_events[-1][1]["documents"]
    evaluating = [d for e, d in a_events if e == "step" and d["step"] == "evaluating"]
    assert evaluating[-1]["method"] == "llm"  # A's verdict was the model's


@pytest.mark.parametrize("value", ["-1", "lots"])
def test_bad_queue_settings_are_refused_at_start(value):
    from pydantic import ValidationError

    from rag_worker.settings import Settings

    with pytest.raises(ValidationError):
        Settings(MAX_QUEUED_TURNS=value)
