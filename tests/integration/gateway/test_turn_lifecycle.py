"""The turn lifecycle over real HTTP: Stop that stops, write-ahead turns that survive a `kill -9`, a
stream any replica can rejoin, and scope changes that never break a chat.

Two gateway processes share one database (SQLite file, or Postgres when TEST_DATABASE_URL is set) in front of
one real worker; the fake Ollama writes long answers slowly, so a turn is still running while the test acts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import httpx
import pytest

from tests.integration.gateway.helpers import DUCK, events, register, stream_turn, wait_idle
from tests.integration.ops.postgres import database_urls, fresh_database
from tests.ollama_server import OLLAMA_ENV, FakeOllama, default_responder
from tests.servers import gateway_process, worker_process

STALE_S = 3.0  # TURN_LOCK_STALE_S for these gateways: a crashed turn frees its chat after this
EXTRA_WORDS = 400
KEY_LIMIT = 20  # API_KEY_RATE_LIMIT for these gateways (per minute)


@pytest.fixture(scope="module")
def fake():
    with FakeOllama(models=["qwen3:8b", "qwen3:0.6b"]) as server:
        yield server


@pytest.fixture
def slow(fake):
    """Long streamed answers, one word every 50 ms: about 20 s for a whole one."""
    fake.token_delay_s = 0.05

    def respond(model: str, messages: list[dict], body: dict) -> str:
        text = default_responder(model, messages, body)
        if body.get("stream") is not False:
            text += " " + " ".join(f"more{i}" for i in range(EXTRA_WORDS))
        return text

    fake.responder = respond
    yield fake
    fake.reset()


@pytest.fixture(scope="module")
def cluster_worker(tmp_path_factory, fake):
    """The module's worker and the folder it shares with the replicas; one for both databases (the worker keeps
    no gateway state)."""
    tmp = tmp_path_factory.mktemp("lifecycle")
    worker_env = {"OLLAMA_HOST": fake.url, "SSE_KEEPALIVE_S": "1", "TORCH_THREADS": "1", **OLLAMA_ENV}
    with worker_process(tmp, env=worker_env) as worker:
        yield worker, tmp


@pytest.fixture(scope="module", params=database_urls(), ids=lambda url: url.split(":", 1)[0].split("+")[0])
def cluster(request, cluster_worker, fake):
    """(worker, replica_a, replica_b): two gateway processes on one database."""
    worker, tmp = cluster_worker
    gateway_env = {
        "SSE_KEEPALIVE_S": "5",
        "OLLAMA_HOST": fake.url,
        "TURN_LOCK_STALE_S": str(STALE_S),
        "TURN_HEARTBEAT_S": "0.5",
        "JWT_SECRET": "lifecycle-test-secret-shared-by-both-replicas",
        "API_KEY_RATE_LIMIT": str(KEY_LIMIT),
    }
    with contextlib.ExitStack() as stack:
        if request.param != "sqlite":
            gateway_env["DATABASE_URL"] = stack.enter_context(fresh_database(request.param))
        a = stack.enter_context(gateway_process(tmp, worker_url=worker.url, env=gateway_env))
        b = stack.enter_context(gateway_process(tmp, worker_url=worker.url, env=gateway_env))
        yield worker, a, b


@pytest.fixture(scope="module")
def a(cluster):
    with httpx.Client(base_url=cluster[1].url, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def b(cluster):
    with httpx.Client(base_url=cluster[2].url, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def carol(a):
    return register(a, "carol")


@pytest.fixture(scope="module")
def dave(a, carol):
    return register(a, "dave")


def make_index(api, user, name: str, files: dict[str, bytes]) -> dict:
    index = api.post("/api/indexes", json={"name": name}, headers=user).json()
    for filename, content in files.items():
        r = api.post(
            f"/api/indexes/{index['id']}/documents?wait=1",
            headers=user,
            data={"dataset": "birds"},
            files={"file": (filename, content, "text/markdown")},
        )
        assert r.status_code == 201, r.text
    return api.get(f"/api/indexes/{index['id']}", headers=user).json()


@pytest.fixture(scope="module")
def ducks(a, carol):
    return make_index(a, carol, "Ducks", {"duck.md": DUCK.read_bytes()})


def new_chat(api, user, index=None) -> int:
    body = {"index_ids": [index["id"]]} if index else {}
    return api.post("/api/chats", json=body, headers=user).json()["id"]


class Turn(threading.Thread):
    """A browser streaming one turn in the background; `tokens` fills as the answer arrives."""

    def __init__(self, url: str, chat_id: int, headers: dict, message: str = "What do ducks eat?"):
        super().__init__(daemon=True)
        self.url, self.chat_id, self.headers, self.message = url, chat_id, headers, message
        self.events: list[tuple[str, object]] = []
        self.tokens: list[str] = []
        self.status: int | None = None
        self.start()

    def run(self) -> None:
        with (
            contextlib.suppress(httpx.HTTPError),
            httpx.Client(base_url=self.url, timeout=120) as client,
            client.stream(
                "POST",
                f"/api/chats/{self.chat_id}/messages/stream",
                json={"message": self.message},
                headers=self.headers,
            ) as resp,
        ):
            self.status = resp.status_code
            for event, data in events(resp.iter_lines()):
                if event == ":":
                    continue
                self.events.append((event, data))
                if event == "token":
                    self.tokens.append(data["token"])

    def wait_tokens(self, n: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.tokens) < n:
            assert self.is_alive() or len(self.tokens) >= n, f"the turn ended early: {self.events[-3:]}"
            assert time.monotonic() < deadline, f"fewer than {n} tokens in {timeout} s"
            time.sleep(0.05)

    def names(self) -> list[str]:
        return [e for e, _ in self.events]


def generation_call(fake: FakeOllama) -> dict:
    return [r for r in fake.requests if r["path"] == "/api/chat" and r["body"].get("stream") is not False][-1]


def wait_model_settled(entry: dict, timeout: float = 60.0) -> None:
    """Until the model stops producing (no new piece for 1.5 s) or finishes."""
    deadline = time.monotonic() + timeout
    last, since = entry["pieces_sent"], time.monotonic()
    while time.monotonic() < deadline and not entry["finished"]:
        time.sleep(0.1)
        if entry["pieces_sent"] != last:
            last, since = entry["pieces_sent"], time.monotonic()
        elif time.monotonic() - since >= 1.5:
            return


def read_stream(client: httpx.Client, path: str, headers: dict, until_tokens: int | None = None):
    """GET an SSE route; returns (status, events)."""
    out: list[tuple[str, object]] = []
    with client.stream("GET", path, headers=headers) as resp:
        if resp.status_code != 200:
            resp.read()
            return resp.status_code, resp
        tokens = 0
        for event, data in events(resp.iter_lines()):
            if event == ":":
                continue
            out.append((event, data))
            tokens += event == "token"
            if until_tokens is not None and tokens >= until_tokens:
                break
    return 200, out


# ---- 1. Stop ---------------------------------------------------------------------------------------------------


def test_stop_ends_the_turn_the_model_call_and_frees_the_chat_at_once(cluster, a, carol, ducks, slow):
    chat_id = new_chat(a, carol, ducks)
    turn = Turn(cluster[1].url, chat_id, carol)
    turn.wait_tokens(5)

    r = a.post(f"/api/chats/{chat_id}/stop", headers=carol)
    assert r.status_code == 200, r.text
    stopped = r.json()
    assert stopped["status"] == "interrupted" and stopped["busy"] is False
    answer = stopped["message"]
    assert answer["status"] == "interrupted" and answer["error"] == "stopped by the user"
    assert answer["content"].startswith("According to the sources")
    assert answer["documents"] and [s["step"] for s in answer["steps"]][-1] == "generating"
    assert stopped["user_message"]["content"] == "What do ducks eat?"

    turn.join(30)
    assert turn.names()[-1] == "interrupted" and dict(turn.events)["interrupted"]["code"] == "stopped"
    assert "done" not in turn.names()

    # The model call was closed: it stopped producing long before the end of its answer.
    entry = generation_call(slow)
    wait_model_settled(entry)
    assert entry["finished"] is False and entry["pieces_sent"] < EXTRA_WORDS

    # The chat takes the next message at once, and the stopped answer is kept as it was.
    slow.token_delay_s = 0.0
    assert "saved" in dict(stream_turn(a, chat_id, carol, message="Where do ducks live?"))
    chat = wait_idle(a, chat_id, carol)
    statuses = [(m["role"], m["status"]) for m in chat["messages"]]
    assert statuses == [
        ("user", "interrupted"),
        ("assistant", "interrupted"),
        ("user", "complete"),
        ("assistant", "complete"),
    ]
    assert chat["messages"][1]["content"] == answer["content"]


def test_stop_and_rejoin_from_the_replica_that_did_not_start_the_turn(cluster, a, b, carol, ducks, slow):
    chat_id = new_chat(a, carol, ducks)
    turn = Turn(cluster[1].url, chat_id, carol)  # replica A owns the turn
    turn.wait_tokens(3)

    # Replica B streams it from A's periodic saves: a snapshot, then the answer keeps growing.
    status, seen = read_stream(b, f"/api/chats/{chat_id}/stream", carol, until_tokens=3)
    assert status == 200
    kind, snap = seen[0]
    assert kind == "snapshot" and snap["status"] == "running"
    assert snap["question"] == "What do ducks eat?"
    # The documents are in the snapshot, or follow it if A had not saved them yet.
    assert snap["documents"] or dict(seen)["documents"]["documents"]
    tokens = [d["token"] for e, d in seen if e == "token"]
    assert len(tokens) == 3 and all(tokens)

    rejoined: list = []
    follower = threading.Thread(
        target=lambda: rejoined.extend(read_stream(b, f"/api/chats/{chat_id}/stream", carol)[1]), daemon=True
    )
    follower.start()

    r = b.post(f"/api/chats/{chat_id}/stop", headers=carol)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "interrupted" and r.json()["busy"] is False

    turn.join(30)
    follower.join(30)
    assert turn.names()[-1] == "interrupted"
    assert rejoined[0][0] == "snapshot" and rejoined[-1][0] == "interrupted"
    assert rejoined[-1][1]["code"] == "stopped"
    entry = generation_call(slow)
    wait_model_settled(entry)
    assert entry["finished"] is False

    stored = b.get(f"/api/chats/{chat_id}", headers=carol).json()
    assert stored["busy"] is False and stored["messages"][1]["status"] == "interrupted"
    assert stored["messages"][1]["content"].startswith(snap["answer"])
    slow.token_delay_s = 0.0
    assert "saved" in dict(stream_turn(b, chat_id, carol, message="And where do they live?"))


def test_a_rejoined_stream_on_the_owner_grows_to_the_stored_answer(cluster, a, carol, ducks, slow):
    slow.token_delay_s = 0.01
    chat_id = new_chat(a, carol, ducks)
    turn = Turn(cluster[1].url, chat_id, carol)
    turn.wait_tokens(2)
    assert a.get(f"/api/chats/{chat_id}", headers=carol).json()["busy"] is True

    status, seen = read_stream(a, f"/api/chats/{chat_id}/stream", carol)
    assert status == 200
    names = [e for e, _ in seen]
    assert names[0] == "snapshot" and "token" in names and names[-1] in ("saved", "title")
    assert "done" in names
    rebuilt = seen[0][1]["answer"] + "".join(d["token"] for e, d in seen if e == "token")
    turn.join(60)
    stored = wait_idle(a, chat_id, carol)["messages"][1]
    assert stored["status"] == "complete"
    assert rebuilt.strip() == dict(seen)["done"]["reply"].strip()
    assert stored["content"] == dict(seen)["done"]["reply"]


def test_a_turn_followed_from_another_replica_ends_with_the_answer_the_owner_sent(
    cluster, a, b, carol, ducks, slow
):
    """Replica B follows A's turn from the database: its `done` is the stored answer itself, with the question,
    the history and the flags of A's (without the question, the web said "your question was rewritten")."""
    slow.token_delay_s = 0.01
    chat_id = new_chat(a, carol, ducks)
    turn = Turn(cluster[1].url, chat_id, carol)
    turn.wait_tokens(2)

    status, seen = read_stream(b, f"/api/chats/{chat_id}/stream", carol)
    assert status == 200 and seen[0][0] == "snapshot"
    turn.join(60)
    live = dict(turn.events)["done"]
    assert live["question"] == "What do ducks eat?" and live["history"] and live["flags"]
    assert dict(seen)["done"] == live

    # A reload shows the same answer, typed whole on the stored message.
    stored = wait_idle(b, chat_id, carol)["messages"][1]
    assert stored["status"] == "complete"
    for key in ("reply", "question", "rewritten", "history", "flags", "citations", "route", "model"):
        assert stored["answer"][key] == live[key], key


def test_rejoin_and_stop_with_nothing_running_or_someone_elses_chat(a, b, carol, dave, ducks):
    chat_id = new_chat(a, carol, ducks)
    assert a.get(f"/api/chats/{chat_id}/stream", headers=carol).status_code == 204
    assert b.get(f"/api/chats/{chat_id}/stream", headers=carol).status_code == 204
    r = a.post(f"/api/chats/{chat_id}/stop", headers=carol)
    assert r.status_code == 409 and r.json()["code"] == "no_turn"
    for client in (a, b):
        assert client.get(f"/api/chats/{chat_id}/stream", headers=dave).status_code == 404
        r = client.post(f"/api/chats/{chat_id}/stop", headers=dave)
        assert r.status_code == 404 and r.json()["code"] == "chat_not_found"
        assert client.post("/api/chats/999999/stop", headers=carol).status_code == 404
        assert client.get("/api/chats/999999/stream", headers=carol).status_code == 404
    with httpx.Client(base_url=str(a.base_url), timeout=30) as stranger:  # no token, no cookie
        assert stranger.post(f"/api/chats/{chat_id}/stop").status_code == 401
        assert stranger.get(f"/api/chats/{chat_id}/stream").status_code == 401
    # Hostile bodies: not an object, not JSON, too large.
    r = a.post(f"/api/chats/{chat_id}/stop", content=b"[1, 2]", headers=carol)
    assert r.status_code == 400 and r.json()["code"] == "invalid_json"
    r = a.post(f"/api/chats/{chat_id}/stop", content=b"{nope", headers=carol)
    assert r.status_code == 400 and r.json()["code"] == "invalid_json"
    r = a.post(f"/api/chats/{chat_id}/stop", content=b"{" + b" " * (2 * 1024 * 1024) + b"}", headers=carol)
    assert r.status_code == 413
    assert a.get(f"/api/chats/{chat_id}", headers=carol).json()["messages"] == []


# ---- 2. kill -9 mid-turn ---------------------------------------------------------------------------------------


def test_kill_9_mid_turn_keeps_the_question_and_the_partial_answer_and_frees_the_chat(
    cluster, a, b, carol, ducks, slow
):
    _worker, _replica_a, replica_b = cluster
    chat_id = new_chat(a, carol, ducks)
    turn = Turn(replica_b.url, chat_id, carol)  # B owns the turn, and B dies
    turn.wait_tokens(3)

    # Written ahead: the question and the answer so far are in the database while the turn runs.
    deadline = time.monotonic() + 30
    while True:
        chat = a.get(f"/api/chats/{chat_id}", headers=carol).json()
        if len(chat["messages"]) == 2 and chat["messages"][1]["content"]:
            break
        assert time.monotonic() < deadline, chat
        time.sleep(0.1)
    assert chat["busy"] is True
    assert [(m["role"], m["status"]) for m in chat["messages"]] == [
        ("user", "running"),
        ("assistant", "running"),
    ]
    assert chat["messages"][0]["content"] == "What do ducks eat?"
    saved = chat["messages"][1]["content"]

    os.killpg(replica_b.proc.pid, signal.SIGKILL)
    replica_b.proc.wait(10)
    turn.join(30)
    try:
        freed_after_crash(a, carol, chat_id, saved)
    finally:
        replica_b.start()  # the restarted replica serves the same chat
    stored = b.get(f"/api/chats/{chat_id}", headers=carol).json()
    assert stored["busy"] is False and stored["messages"][1]["status"] == "interrupted"
    assert stored["messages"][1]["content"].startswith(saved)


def freed_after_crash(a, carol, chat_id: int, saved: str) -> None:
    """The chat of a turn whose gateway died, seen through the surviving replica."""
    # Within the heartbeat timeout (seconds, not 15 minutes) the chat is free and the turn marked interrupted.
    deadline = time.monotonic() + STALE_S + 60
    while True:
        r = a.post(f"/api/chats/{chat_id}/messages", json={"message": "thanks!"}, headers=carol)
        if r.status_code != 409:
            break
        assert time.monotonic() < deadline, "the chat stayed locked after its gateway died"
        time.sleep(0.2)
    assert r.status_code == 200, r.text
    chat = a.get(f"/api/chats/{chat_id}", headers=carol).json()
    first, partial = chat["messages"][:2]
    assert first["content"] == "What do ducks eat?" and first["status"] == "interrupted"
    # The partial answer is the last save before the crash (at least what was seen saved while it ran).
    assert partial["status"] == "interrupted" and partial["content"].startswith(saved)
    assert [m["status"] for m in chat["messages"][2:]] == ["complete", "complete"]


def test_a_restarted_gateway_marks_the_turns_it_left_running_as_interrupted(cluster, b, carol, slow):
    _worker, _replica_a, replica_b = cluster
    chat_id = new_chat(b, carol)  # no index: a direct answer, written slowly
    turn = Turn(replica_b.url, chat_id, carol, message="Tell me a long story")
    turn.wait_tokens(3)
    try:
        os.killpg(replica_b.proc.pid, signal.SIGKILL)
        replica_b.proc.wait(10)
        turn.join(30)
    finally:
        replica_b.start()

    deadline = time.monotonic() + STALE_S + 60
    while True:
        chat = b.get(f"/api/chats/{chat_id}", headers=carol).json()
        if not chat["busy"]:
            break
        assert time.monotonic() < deadline, "the restarted gateway left the turn running"
        time.sleep(0.2)
    assert [m["status"] for m in chat["messages"]] == ["interrupted", "interrupted"]
    assert b.get(f"/api/chats/{chat_id}/stream", headers=carol).status_code == 204


# ---- 3 and 4. Scope changes ------------------------------------------------------------------------------------


def test_a_direct_turn_keeps_the_documents_in_hand(a, carol, ducks):
    chat_id = new_chat(a, carol, ducks)
    assert "saved" in dict(stream_turn(a, chat_id, carol, message="What do ducks eat?"))
    before = a.get(f"/api/chats/{chat_id}", headers=carol).json()["state"]["documents"]
    assert before
    small_talk = dict(stream_turn(a, chat_id, carol, message="thanks!"))
    assert small_talk["route"]["route"] == "direct" and small_talk["done"]["documents"] == []
    after = a.get(f"/api/chats/{chat_id}", headers=carol).json()
    assert after["state"]["documents"] == before, "small talk threw away the documents in hand"
    follow_up = dict(stream_turn(a, chat_id, carol, message="And what else do ducks eat?"))
    assert follow_up["done"]["documents"]


def test_unlinking_deleting_a_document_or_the_index_never_breaks_the_chat(a, carol):
    index = make_index(
        a,
        carol,
        "Birds to drop",
        {"duck.md": DUCK.read_bytes(), "geese.md": b"# Geese\n\nGeese eat grass and grain in fields.\n"},
    )
    chat_id = new_chat(a, carol, index)
    assert "saved" in dict(stream_turn(a, chat_id, carol, message="What do ducks eat?"))
    assert a.get(f"/api/chats/{chat_id}", headers=carol).json()["state"]["documents"]

    def ask(message: str) -> dict:
        r = a.post(f"/api/chats/{chat_id}/messages", json={"message": message}, headers=carol)
        assert r.status_code == 200, r.text
        return r.json()

    # Unlinked: no index sends no documents, the answer is direct.
    assert a.patch(f"/api/chats/{chat_id}", json={"index_ids": []}, headers=carol).status_code == 200
    assert ask("What do ducks eat?")["route"]["route"] == "direct"
    # Linked again, one document deleted: the chat still answers, from what is left.
    assert (
        a.patch(f"/api/chats/{chat_id}", json={"index_ids": [index["id"]]}, headers=carol).status_code == 200
    )
    duck = next(d for d in index["documents"] if d["filename"] == "duck.md")
    r = a.delete(f"/api/indexes/{index['id']}/documents/{duck['id']}", headers=carol)
    assert r.status_code in (200, 204), r.text
    answer = ask("And what else do they eat?")
    assert all(d["filename"] != "duck.md" for d in answer["message"]["documents"])
    # The index deleted: the chat goes on, directly.
    assert a.delete(f"/api/indexes/{index['id']}", headers=carol).status_code == 204
    assert ask("What do geese eat?")["status"] == "complete"
    assert ask("thanks!")["status"] == "complete"


def test_the_worker_takes_docs_on_a_direct_turn_without_an_index(cluster, a, carol, ducks):
    chat_id = new_chat(a, carol, ducks)
    assert "saved" in dict(stream_turn(a, chat_id, carol, message="What do ducks eat?"))
    docs = a.get(f"/api/chats/{chat_id}", headers=carol).json()["state"]["documents"]
    worker = cluster[0]
    r = httpx.post(
        worker.url + "/chat",
        json={"prompt": "thanks!", "docs": docs, "options": {"route": "direct"}},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert r.json()["route"] == "direct" and r.json()["reply"]


# ---- 6. Indexing progress --------------------------------------------------------------------------------------


def upload_events(api, user, index_id: int, filename: str, content: bytes):
    with api.stream(
        "POST",
        f"/api/indexes/{index_id}/documents?wait=1",
        headers={**user, "Accept": "text/event-stream"},
        data={"dataset": "birds"},
        files={"file": (filename, content, "text/markdown")},
    ) as resp:
        if resp.status_code != 200:
            resp.read()
            return resp.status_code, resp.json()
        return 200, [(e, d) for e, d in events(resp.iter_lines()) if e != ":"]


def test_an_upload_streams_its_indexing_stages_then_the_stored_document(a, carol):
    index = a.post("/api/indexes", json={"name": "Progress"}, headers=carol).json()
    status, seen = upload_events(a, carol, index["id"], "duck.md", DUCK.read_bytes())
    assert status == 200
    stages = [d["stage"] for e, d in seen if e == "progress"]
    assert stages == ["converting", "chunking", "embedding", "writing"]
    assert all(d["file"] == "duck.md" for e, d in seen if e == "progress")
    kind, document = seen[-1]
    assert kind == "done" and document["filename"] == "duck.md" and document["chunks"] > 0
    listed = a.get(f"/api/indexes/{index['id']}", headers=carol).json()
    assert [d["filename"] for d in listed["documents"]] == ["duck.md"]
    assert listed["documents"][0]["chunks"] == document["chunks"]

    # A file with no text fails in a stage: the stream says why, and nothing is listed.
    status, seen = upload_events(a, carol, index["id"], "blank.md", b"   \n\n  ")
    assert status == 200, seen
    kind, error = seen[-1]
    assert kind == "error" and "no text" in error["error"]
    listed = a.get(f"/api/indexes/{index['id']}", headers=carol).json()
    assert [d["filename"] for d in listed["documents"]] == ["duck.md"]

    # Refusals before any work stay plain JSON 4xx.
    status, body = upload_events(a, carol, index["id"], "virus.exe", b"MZ")
    assert status == 415 and "unsupported" in body["error"]
    status, body = upload_events(a, carol, index["id"], "empty.md", b"")
    assert status == 400 and body["code"] == "empty_file"


def test_a_rebuild_outlives_the_page_that_started_it_and_can_be_rejoined(a, carol, dave):
    index = make_index(
        a, carol, "Rebuilt", {"duck.md": DUCK.read_bytes(), "geese.md": b"# Geese\n\nGeese eat grass.\n"}
    )
    assert a.get(f"/api/indexes/{index['id']}/build", headers=carol).status_code == 204
    assert a.get(f"/api/indexes/{index['id']}/build", headers=dave).status_code == 404
    assert a.get("/api/indexes/999999/build", headers=carol).status_code == 404

    with a.stream("POST", f"/api/indexes/{index['id']}/build", json={"rebuild": True}, headers=carol) as resp:
        assert resp.status_code == 200
        for event, data in events(resp.iter_lines()):
            if event == "progress":
                assert data["total"] == 2
                break  # the page is left as soon as the build shows progress

    status, seen = read_stream(a, f"/api/indexes/{index['id']}/build", carol)
    if status == 200:  # still running when rejoined: the snapshot, then to the end
        kind, snap = seen[0]
        assert kind == "snapshot" and snap["total"] == 2 and snap["files"]
        assert seen[-1][0] == "done", seen
    else:
        assert status == 204  # it had finished already
    after = a.get(f"/api/indexes/{index['id']}", headers=carol).json()
    assert after["status"] == "ready"
    assert sorted(d["filename"] for d in after["documents"]) == ["duck.md", "geese.md"]
    assert all(d["chunks"] > 0 for d in after["documents"])


# ---- 5. chats follow access ------------------------------------------------------------------------------------


def _marks(call: dict) -> list[str]:
    """The `[Sn]` passages the model was given (the worker numbers each passage it sends)."""
    return [
        line
        for m in call["body"]["messages"]
        if m.get("role") in ("system", "user")
        for line in str(m.get("content") or "").splitlines()
        if line.startswith("[S")
    ]


def test_a_revoked_reader_loses_the_index_mid_conversation_and_nothing_of_it_reaches_the_model(
    cluster, a, b, carol, fake, slow
):
    """Olga shares her handbook with Rita; Rita asks it, and while her answer is being written the grant is
    removed: her rejoined stream, her chat's state and her next turn carry none of its passages, and the model
    is given none (asserted on the model's own request)."""
    olga, rita = register(a, "olga"), register(a, "rita")
    handbook = make_index(a, olga, "Handbook", {"duck.md": DUCK.read_bytes()})
    [doc] = handbook["documents"]
    grant = a.post(
        f"/api/indexes/{handbook['id']}/grants",
        json={"subject_type": "user", "username": "rita", "role": "reader"},
        headers=olga,
    )
    assert grant.status_code == 201, grant.text
    listed = {i["id"]: i for i in a.get("/api/indexes", headers=rita).json()}
    assert (listed[handbook["id"]]["access"], listed[handbook["id"]]["owner"]) == ("reader", "olga")
    download = f"/api/indexes/{handbook['id']}/documents/{doc['id']}/download"
    assert a.get(download, headers=rita).content == DUCK.read_bytes()
    upload = a.post(
        f"/api/indexes/{handbook['id']}/documents?wait=1",
        headers=rita,
        files={"file": ("x.md", b"# x", "text/markdown")},
    )
    assert upload.status_code == 404  # a reader may not upload

    slow.token_delay_s = 0.05
    chat_id = new_chat(a, rita, handbook)
    turn = Turn(cluster[1].url, chat_id, rita)
    turn.wait_tokens(3)
    assert _marks(generation_call(fake)), "the first turn was given the handbook's passages"
    status, before = read_stream(a, f"/api/chats/{chat_id}/stream", rita, until_tokens=1)
    assert status == 200 and before[0][1]["documents"], "the running turn's snapshot shows its passages"

    assert (
        a.delete(f"/api/indexes/{handbook['id']}/grants/{grant.json()['id']}", headers=olga).status_code
        == 204
    )
    for client in (a, b):  # the owner's memory, and the other replica's database read
        status, after = read_stream(client, f"/api/chats/{chat_id}/stream", rita, until_tokens=1)
        assert status == 200 and after[0][0] == "snapshot"
        assert not after[0][1]["documents"], "the snapshot shows nothing of an index she can no longer read"
    slow.token_delay_s = 0.0
    turn.join(60)
    chat = wait_idle(a, chat_id, rita)
    assert chat["index_ids"] == [] and chat["state"]["documents"] == []
    # The worker keeps each turn's passages in the history (a system message): that goes too.
    assert [m["role"] for m in chat["state"]["history"]] == ["user", "assistant"]
    assert chat["messages"][1]["answer"]["documents"], "the past answer stays as it was shown"

    second = stream_turn(a, chat_id, rita, message="And what else do ducks eat?")
    assert not [d for e, d in second if e == "documents" and d["documents"]]
    assert _marks(generation_call(fake)) == [], "the next turn gave the model none of the handbook's passages"
    assert wait_idle(a, chat_id, rita)["state"]["documents"] == []
    r = a.post(f"/api/chats/{chat_id}/messages", json={"message": "ducks?", "force_rag": True}, headers=rita)
    assert (r.status_code, r.json()["code"]) == (409, "no_index")
    for path in (f"/api/indexes/{handbook['id']}", f"/api/indexes/{handbook['id']}/datasets", download):
        assert a.get(path, headers=rita).status_code == 404, path
    assert handbook["id"] not in {i["id"] for i in a.get("/api/indexes", headers=rita).json()}
    r = a.patch(f"/api/chats/{chat_id}", json={"index_ids": [handbook["id"]]}, headers=rita)
    assert (r.status_code, r.json()["field"]) == (404, "index_ids")

    # The owner deletes a document, then the index: the administrator's audit log has each, with who and what.
    assert a.delete(f"/api/indexes/{handbook['id']}/documents/{doc['id']}", headers=olga).status_code == 204
    assert a.delete(f"/api/indexes/{handbook['id']}", headers=olga).status_code == 204
    events = a.get("/api/audit", params={"action": "index.", "limit": 200}, headers=carol).json()["events"]
    mine = [(e["action"], e["actor_name"]) for e in events if e["object_id"] == str(handbook["id"])]
    assert mine == [("index.delete", "olga"), ("index.revoke", "olga"), ("index.grant", "olga")]
    deleted = a.get("/api/audit", params={"action": "document.delete", "limit": 200}, headers=carol).json()
    [gone] = [e for e in deleted["events"] if e["actor_name"] == "olga"]
    assert (gone["detail"]["filename"], gone["detail"]["index"]) == ("duck.md", "Handbook")


# ---- 7. Limits hold across gateway processes -------------------------------------------------------------------
# A and B are two processes; what one account may do at once, or per window, is counted in the database, so
# alternating between them (as a load balancer, or the kernel spreading connections over GATEWAY_WORKERS, does)
# gains nothing.


def test_running_turns_per_account_are_counted_across_processes(cluster, a, b, slow):
    erin = register(a, "erin")
    chats = [new_chat(a, erin) for _ in range(5)]
    urls = [cluster[1].url, cluster[2].url]
    turns = [
        Turn(urls[i % 2], chat_id, erin, message="Tell me a long story")
        for i, chat_id in enumerate(chats[:4])
    ]
    for turn in turns:
        turn.wait_tokens(2)
    for client in (a, b):  # MAX_TURNS_PER_USER is 4: two running on each process already make four
        r = client.post(f"/api/chats/{chats[4]}/messages", json={"message": "one more?"}, headers=erin)
        assert (r.status_code, r.json()["code"]) == (429, "too_many_turns"), r.text
        assert r.headers["Retry-After"]
        # A /v1 turn counts against the same allowance, whichever process relays it.
        question = {"model": "direct", "messages": [{"role": "user", "content": "one more?"}]}
        r = client.post("/v1/chat/completions", json=question, headers=erin)
        assert (r.status_code, r.json()["error"]["code"]) == (429, "too_many_turns"), r.text
    # Stopped from the process that does not own each one: the allowance comes back at once.
    for i, (turn, chat_id) in enumerate(zip(turns, chats, strict=False)):
        r = (b if i % 2 == 0 else a).post(f"/api/chats/{chat_id}/stop", headers=erin)
        assert (r.status_code, r.json()["status"]) == (200, "interrupted"), r.text
        turn.join(30)
    slow.token_delay_s = 0.0
    assert "saved" in dict(stream_turn(b, chats[4], erin, message="one more?"))


def test_an_api_keys_allowance_is_counted_across_processes(a, b):
    frank = register(a, "frank")
    key = a.post("/api/keys", json={"name": "script"}, headers=frank)
    assert key.status_code == 201, key.text
    bearer = {"Authorization": f"Bearer {key.json()['key']}"}
    for i in range(KEY_LIMIT):
        r = (a, b)[i % 2].get("/api/chats", headers=bearer)
        assert r.status_code == 200, (i, r.text)
    for client in (a, b):
        r = client.get("/api/chats", headers=bearer)
        assert (r.status_code, r.json()["code"]) == (429, "rate_limited"), r.text
        assert 1 <= int(r.headers["Retry-After"]) <= 60
    assert a.get("/api/chats", headers=frank).status_code == 200  # the account's session is not the key's


def test_new_accounts_per_address_are_counted_across_processes(a, b):
    proxied = {"X-Forwarded-For": "203.0.113.21"}  # one client address, as seen through the trusted proxy
    password = "a long enough passphrase"
    for i in range(10):  # REGISTER_LIMIT
        r = (a, b)[i % 2].post(
            "/api/auth/register", json={"username": f"spree{i}", "password": password}, headers=proxied
        )
        assert r.status_code == 201, (i, r.text)
    for client in (a, b):
        r = client.post(
            "/api/auth/register", json={"username": "spree10", "password": password}, headers=proxied
        )
        assert (r.status_code, r.json()["code"]) == (429, "rate_limited"), r.text
    other = {"X-Forwarded-For": "203.0.113.22"}
    assert (
        b.post(
            "/api/auth/register", json={"username": "spree11", "password": password}, headers=other
        ).status_code
        == 201
    )
