"""A user's whole path through the real gateway and the real worker (fake Ollama the only stand-in):
register, log in, build an index from an upload, chat with it, come back and find everything as it was; and a
program's path: the official `openai` client with the user's API key on the gateway's /v1 (these share the
module's stack: no worker of their own)."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import openai
import pytest

from tests.integration.gateway.helpers import DUCK, register, stream_turn, wait_idle
from tests.servers import SHARED


@pytest.fixture(scope="module")
def user(api):
    register(api, "flow_user")
    r = api.post("/api/auth/login", json={"username": "flow_user", "password": "a long enough passphrase"})
    assert r.status_code == 200
    return {"Authorization": f"Bearer {r.json()['token']}"}


@pytest.fixture(scope="module")
def duck_index(api, user):
    index = api.post(
        "/api/indexes", json={"name": "Birds", "description": "about ducks"}, headers=user
    ).json()
    r = api.post(
        f"/api/indexes/{index['id']}/documents?wait=1",
        headers=user,
        data={"dataset": "animals"},
        files={"file": ("duck.md", DUCK.read_bytes(), "text/markdown")},
    )
    assert r.status_code == 201, r.text
    assert r.json()["chunks"] > 0 and r.json()["filename"] == "duck.md" and r.json()["dataset"] == "animals"
    return api.get(f"/api/indexes/{index['id']}", headers=user).json()


def test_the_upload_is_listed_with_its_dataset_and_chunks(duck_index):
    assert duck_index["status"] == "ready"
    assert duck_index["datasets"] == ["animals"]
    [doc] = duck_index["documents"]
    assert doc["filename"] == "duck.md" and doc["chunks"] == duck_index["chunks"] > 0


def test_a_streamed_turn_is_relayed_then_stored_and_a_follow_up_uses_the_history(
    api, user, duck_index, ollama
):
    chat = api.post("/api/chats", json={"index_ids": [duck_index["id"]]}, headers=user).json()
    assert chat["title"] is None

    first = stream_turn(api, chat["id"], user, message="What do ducks eat?")
    names = [e for e, _ in first]
    assert names[0] == "route" and first[0][1] == {"layer": 1, "route": "rag", "reason": "default"}
    assert "step" in names and "documents" in names and "token" in names
    assert names.index("documents") < names.index("token") < names.index("done") < names.index("saved")
    assert names[-1] == "title" and names.count("done") == 1 and "error" not in names
    done = dict(first)["done"]
    streamed_reply = "".join(d["token"] for e, d in first if e == "token")
    assert streamed_reply.strip() == done["reply"].strip() and done["reply"]

    stored = wait_idle(api, chat["id"], user)
    assert stored["title"] and stored["title"] == dict(first)["title"]["title"]
    user_msg, answer = stored["messages"]
    assert (user_msg["role"], user_msg["content"], user_msg["status"]) == (
        "user",
        "What do ducks eat?",
        "complete",
    )
    assert answer["id"] == dict(first)["saved"]["message_id"]
    assert (answer["role"], answer["status"], answer["content"]) == ("assistant", "complete", done["reply"])
    assert answer["documents"] == done["documents"] and answer["documents"]
    assert all(d["filename"] == "duck.md" and d["dataset"] == "animals" for d in answer["documents"])
    assert all("score" in d and "provenance" in d for d in answer["documents"])
    assert answer["timings"] == done["timings"] and answer["timings"]["total_ms"] > 0
    streamed_steps = [d for e, d in first if e == "step"]
    assert answer["steps"] == streamed_steps and all("elapsed_ms" in s for s in answer["steps"])
    assert answer["route"] == done["route"] and answer["gate"]["reason"] == "default"
    assert stored["state"]["history"] == done["history"] and stored["state"]["documents"] == done["documents"]

    # The follow-up: the browser sends only the new message; the gateway supplies the stored history.
    ollama.requests.clear()
    second = stream_turn(api, chat["id"], user, message="And where do they live?")
    done2 = dict(second)["done"]
    assert done2["history"][: len(done["history"])] == done["history"]
    sent_to_model = " ".join(
        str(m.get("content")) for r in ollama.requests for m in r["body"].get("messages", [])
    )
    assert "What do ducks eat?" in sent_to_model, "the stored history must reach the model"
    assert [e for e, _ in second][-1] == "saved"  # titled already: no second title

    # Reloading gives the same chat, twice over, and it matches what was streamed.
    again = api.get(f"/api/chats/{chat['id']}", headers=user).json()
    assert again == api.get(f"/api/chats/{chat['id']}", headers=user).json()
    assert [m["content"] for m in again["messages"]] == [
        "What do ducks eat?",
        done["reply"],
        "And where do they live?",
        done2["reply"],
    ]
    assert again["messages"][:2] == stored["messages"]
    listed = api.get("/api/chats", headers=user).json()
    assert listed[0]["id"] == chat["id"] and listed[0]["index_ids"] == [duck_index["id"]]


def test_smalltalk_goes_direct_and_says_so(api, user, duck_index):
    chat = api.post("/api/chats", json={"index_ids": [duck_index["id"]]}, headers=user).json()
    turn = stream_turn(api, chat["id"], user, message="Thanks!")
    assert turn[0] == ("route", {"layer": 1, "route": "direct", "reason": "smalltalk"})
    assert dict(turn)["done"]["route"] == "direct"
    assert "documents" not in [e for e, _ in turn] or dict(turn)["documents"]["documents"] == []
    stored = wait_idle(api, chat["id"], user)
    assert [m["route"] for m in stored["messages"]] == ["direct", "direct"]


def test_force_rag_searches_even_for_smalltalk(api, user, duck_index):
    chat = api.post("/api/chats", json={"index_ids": [duck_index["id"]]}, headers=user).json()
    turn = stream_turn(api, chat["id"], user, message="hello", force_rag=True)
    assert turn[0] == ("route", {"layer": 1, "route": "rag", "reason": "force_rag"})
    assert "done" in dict(turn)


def test_a_chat_without_an_index_is_answered_directly(api, user):
    chat = api.post("/api/chats", json={"title": "no docs"}, headers=user).json()
    turn = stream_turn(api, chat["id"], user, message="What do ducks eat?")
    assert turn[0] == ("route", {"layer": 1, "route": "direct", "reason": "no_index"})
    assert "done" in dict(turn) and "saved" in dict(turn)
    assert api.get(f"/api/chats/{chat['id']}", headers=user).json()["title"] == "no docs"


def test_the_json_route_returns_the_same_finished_turn(api, user, duck_index):
    chat = api.post("/api/chats", json={"index_ids": [duck_index["id"]]}, headers=user).json()
    r = api.post(f"/api/chats/{chat['id']}/messages", json={"message": "What do ducks eat?"}, headers=user)
    assert r.status_code == 200, r.text
    turn = r.json()
    assert turn["status"] == "complete" and turn["route"]["route"] == "rag"
    stored = api.get(f"/api/chats/{chat['id']}", headers=user).json()
    assert stored["messages"] == [turn["user_message"], turn["message"]]
    assert turn["message"]["documents"] and turn["message"]["content"]
    assert turn["title"] and stored["title"] == turn["title"]


def test_datasets_scope_the_turn_and_are_kept_with_the_chat(api, user, duck_index):
    chat = api.post("/api/chats", json={"index_ids": [duck_index["id"]]}, headers=user).json()
    turn = stream_turn(api, chat["id"], user, message="What do ducks eat?", datasets=["animals"])
    done = dict(turn)["done"]
    assert done["documents"] and all(d["dataset"] == "animals" for d in done["documents"])
    stored = wait_idle(api, chat["id"], user)
    assert stored["state"]["datasets"] == stored["datasets"] == ["animals"]
    # The next turn, sent without datasets, keeps the chat's scope.
    assert "saved" in dict(stream_turn(api, chat["id"], user, message="Where do they live?"))
    assert wait_idle(api, chat["id"], user)["state"]["datasets"] == ["animals"]


def test_the_original_file_downloads_and_a_document_can_be_removed(api, user):
    index = api.post("/api/indexes", json={"name": "Removable"}, headers=user).json()
    body = b"# Geese\n\nGeese are large waterfowl that migrate in V formations.\n"
    r = api.post(
        f"/api/indexes/{index['id']}/documents?wait=1",
        headers=user,
        files={"file": ("geese.md", body, "text/markdown")},
    )
    assert r.status_code == 201, r.text
    doc = r.json()
    assert doc["dataset"] == "default"
    got = api.get(f"/api/indexes/{index['id']}/documents/{doc['id']}/download", headers=user)
    assert got.status_code == 200 and got.content == body
    assert api.delete(f"/api/indexes/{index['id']}/documents/{doc['id']}", headers=user).status_code == 204
    after = api.get(f"/api/indexes/{index['id']}", headers=user).json()
    assert after["documents"] == [] and after["chunks"] == 0 and after["status"] == "empty"
    assert (
        api.get(f"/api/indexes/{index['id']}/documents/{doc['id']}/download", headers=user).status_code == 404
    )


def test_a_rebuild_relays_progress_and_keeps_the_documents(api, user, duck_index):
    with api.stream(
        "POST", f"/api/indexes/{duck_index['id']}/build", json={"rebuild": True}, headers=user
    ) as r:
        assert r.status_code == 200, r.read()
        from tests.integration.gateway.helpers import events

        seen = [(e, d) for e, d in events(r.iter_lines()) if e != ":"]
    assert seen[-1][0] == "done", seen
    assert any(e == "progress" for e, _ in seen)
    after = wait_index(api, duck_index["id"], user)
    assert after["status"] == "ready" and after["chunks"] > 0
    assert [d["filename"] for d in after["documents"]] == ["duck.md"]


def wait_index(api, index_id, user, timeout=30.0):
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        index = api.get(f"/api/indexes/{index_id}", headers=user).json()
        if index["status"] != "building":
            return index
        time.sleep(0.2)
    raise AssertionError("index still building")


def test_deleting_an_index_drops_its_table_its_files_and_its_links(api, user, stack):
    worker, _gateway = stack
    index = api.post("/api/indexes", json={"name": "Doomed"}, headers=user).json()
    r = api.post(
        f"/api/indexes/{index['id']}/documents?wait=1",
        headers=user,
        data={"dataset": "d1"},
        files={"file": ("doomed.md", b"# Doomed\n\nThis index will be deleted soon.\n", "text/markdown")},
    )
    assert r.status_code == 201, r.text
    chat = api.post("/api/chats", json={"index_ids": [index["id"]]}, headers=user).json()
    uploads = worker.log_path.parent.parent / "shared_uploads"
    assert any(p.name == "doomed.md" for p in uploads.rglob("*"))
    assert api.delete(f"/api/indexes/{index['id']}", headers=user).status_code == 204
    assert api.get(f"/api/indexes/{index['id']}", headers=user).status_code == 404
    assert not any(p.name == "doomed.md" for p in uploads.rglob("*"))
    assert api.get(f"/api/chats/{chat['id']}", headers=user).json()["index_ids"] == []


def test_health_is_ok_then_names_ollama_when_it_stops(api, ollama):
    r = api.get("/health")
    assert r.status_code == 200, r.text
    assert r.json() == {**r.json(), "status": "ok", "database": "ok", "worker": "ok", "ollama": "ok"}
    ollama.set_down(True)
    r = api.get("/health")
    assert r.status_code == 503
    assert r.json()["ollama"] == "down" and "ollama" in r.json()["down"]


def test_the_web_app_is_served_at_the_root(api):
    r = api.get("/")
    assert r.status_code == 200 and "<html" in r.text.lower()


# -- /v1 with an API key, through the official openai client ----------------------------------------------


@pytest.fixture(scope="module")
def people(api) -> dict:
    alice, bob = register(api, "v1alice"), register(api, "v1bob")
    index = api.post("/api/indexes", json={"name": "Birds"}, headers=alice).json()
    r = api.post(
        f"/api/indexes/{index['id']}/documents?wait=1",
        headers=alice,
        data={"dataset": "animals"},
        files={"file": ("duck.md", DUCK.read_bytes(), "text/markdown")},
    )
    assert r.status_code == 201, r.text
    theirs = api.post("/api/indexes", json={"name": "Bob's secrets"}, headers=bob).json()

    def key(headers: dict, **fields) -> dict:
        r = api.post("/api/keys", json={"name": "program", **fields}, headers=headers)
        assert r.status_code == 201, r.text
        return r.json()

    return {
        "alice": alice,
        "index": index,
        "bobs_index": theirs,
        "key": key(alice)["key"],
        "read_only": key(alice, read_only=True)["key"],
        "revoked": key(alice),
        "bob_key": key(bob)["key"],
    }


def client(gateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0, timeout=120)


def test_the_openai_client_with_a_key_lists_only_its_users_indexes_and_gets_cited_answers(
    gateway, api, people
):
    alice = client(gateway, people["key"])
    models = {m.id: m for m in alice.models.list()}
    rag = sorted(m for m in models if m.startswith("rag/"))
    assert len(rag) == 1 and set(models) == {"direct", *rag}
    model = models[rag[0]]
    assert (model.model_extra["name"], model.model_extra["index_id"]) == ("Birds", people["index"]["id"])
    assert model.owned_by == "v1alice"
    assert alice.models.retrieve(model.id).id == model.id
    bobs = {m.id for m in client(gateway, people["bob_key"]).models.list()}
    assert model.id not in bobs and len(bobs) == 2  # direct and his own

    # Streamed: tokens as they come, the sources list, then the structured answer on the last chunk.
    chunks = list(
        alice.chat.completions.create(
            model=model.id,
            messages=[{"role": "user", "content": "What does a duck like to eat?"}],
            stream=True,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "[S1]" in text and "Sources:" in text and "duck.md" in text
    answer = chunks[-1].model_extra["rag"]
    assert answer["route"] == "rag" and answer["citations"]
    cited = {c["ref"] for c in answer["citations"]}
    assert {d["filename"] for d in answer["documents"] if d["ref"] in cited} == {"duck.md"}
    assert chunks[-1].choices[0].finish_reason == "stop"

    # Not streamed, through a read-only key (it may ask).
    done = client(gateway, people["read_only"]).chat.completions.create(
        model=model.id,
        messages=[{"role": "user", "content": "What should a duck wear when swimming?"}],
        max_tokens=100_000,  # an upper bound, as for OpenAI: past this server's MAX_TOKENS it is that
    )
    assert "[S" in done.choices[0].message.content and done.model_extra["rag"]["citations"]

    # Smalltalk over an index: the layer-1 gate answers it directly, nothing is searched.
    hello = alice.chat.completions.create(model=model.id, messages=[{"role": "user", "content": "thanks!"}])
    assert hello.model_extra["rag"]["route"] == "direct" and hello.model_extra["rag"]["documents"] == []


def test_another_users_index_is_a_404_and_a_revoked_key_a_401(gateway, api, people):
    alice = client(gateway, people["key"])
    bobs_model = next(
        m["id"]
        for m in api.get("/v1/models", headers={"Authorization": f"Bearer {people['bob_key']}"}).json()[
            "data"
        ]
        if m.get("index_id") == people["bobs_index"]["id"]
    )
    question = [{"role": "user", "content": "What are Bob's secrets?"}]
    with pytest.raises(openai.NotFoundError) as err:
        alice.chat.completions.create(model=bobs_model, messages=question)
    assert err.value.body["code"] == "model_not_found" and "Bob" not in err.value.message
    with pytest.raises(openai.NotFoundError):
        alice.chat.completions.create(model=bobs_model, messages=question, stream=True)
    with pytest.raises(openai.NotFoundError):
        alice.models.retrieve(bobs_model)
    # Bob's own index has no documents yet: like a web turn, the question is answered without searching it.
    empty = client(gateway, people["bob_key"]).chat.completions.create(model=bobs_model, messages=question)
    assert empty.model_extra["rag"]["route"] == "direct" and empty.model_extra["rag"]["documents"] == []

    revoked = people["revoked"]
    r = api.delete(f"/api/keys/{revoked['id']}", headers=people["alice"])
    assert r.status_code == 204
    with pytest.raises(openai.AuthenticationError) as err:
        client(gateway, revoked["key"]).models.list()
    assert err.value.body["code"] == "key_revoked"
    # A session token works on /v1 as well (the web's own scripts, a quick curl).
    r = httpx.get(f"{gateway.url}/v1/models", headers=people["alice"], timeout=30)
    assert r.status_code == 200 and len(r.json()["data"]) == 2


def test_an_original_downloads_in_byte_ranges_and_bad_ranges_are_answered_per_rfc_7233(api, user, stack):
    index = api.post("/api/indexes", json={"name": "Ranged"}, headers=user).json()
    body = ("# Herons\n\n" + "Herons stand still in shallow water for a long time. " * 40 + "\n").encode()
    doc = api.post(
        f"/api/indexes/{index['id']}/documents?wait=1",
        headers=user,
        files={"file": ("herons.md", body, "text/markdown")},
    ).json()
    url = f"/api/indexes/{index['id']}/documents/{doc['id']}/download"
    size = len(body)

    def get(value: str | None):
        return api.get(url, headers={**user, **({"Range": value} if value is not None else {})})

    whole = get(None)
    assert whole.status_code == 200 and whole.content == body and whole.headers["accept-ranges"] == "bytes"
    for asked, first, last in [
        ("bytes=0-9", 0, 9),
        ("bytes=10-", 10, size - 1),
        ("bytes=-7", size - 7, size - 1),
        (f"bytes=5-{size + 500}", 5, size - 1),  # an end past the file is cut at its end
        (f"bytes=-{size * 3}", 0, size - 1),  # a suffix longer than the file is all of it
        ("BYTES = 3 - 4", 3, 4),
    ]:
        part = get(asked)
        assert part.status_code == 206, (asked, part.status_code, part.text[:200])
        assert part.headers["content-range"] == f"bytes {first}-{last}/{size}", asked
        assert (
            part.content == body[first : last + 1] and int(part.headers["content-length"]) == last - first + 1
        )
    for asked in [
        f"bytes={size}-",
        f"bytes={size + 10}-{size + 20}",
        "bytes=-0",
        "bytes=99999999999999999999999-",
    ]:
        refused = get(asked)
        assert refused.status_code == 416, (asked, refused.status_code)
        assert refused.json()["code"] == "range_not_satisfiable" and refused.json()["error"]
        if not asked.startswith("bytes=9999"):
            assert refused.headers["content-range"] == f"bytes */{size}", asked
    # Malformed, reversed, multi-range or foreign-unit headers are ignored: the whole file, never a 5xx.
    for asked in ["bytes=9-3", "bytes=abc", "bytes=0-1,4-5", "items=0-3", "bytes=", "bytes=-", "x" * 500]:
        ignored = get(asked)
        assert ignored.status_code == 200 and ignored.content == body, asked
    # Behind the same access checks: another user's range request is a 404 with nothing of the file.
    register(api, "range_stranger")
    r = api.post(
        "/api/auth/login", json={"username": "range_stranger", "password": "a long enough passphrase"}
    )
    stranger = {"Authorization": f"Bearer {r.json()['token']}"}
    other = api.get(url, headers={**stranger, "Range": "bytes=0-9"})
    assert other.status_code == 404 and body[:10] not in other.content


def login(api, name: str) -> dict:
    register(api, name)
    r = api.post("/api/auth/login", json={"username": name, "password": "a long enough passphrase"})
    return {"Authorization": f"Bearer {r.json()['token']}"}


def answered(api, headers, index_id: int, question: str) -> tuple[int, int]:
    """(chat id, the stored answer's message id) of a new one-turn chat over the index."""
    chat = api.post("/api/chats", json={"index_ids": [index_id]}, headers=headers).json()
    turn = stream_turn(api, chat["id"], headers, message=question)
    return chat["id"], dict(turn)["saved"]["message_id"]


def test_answers_are_rated_changed_and_reviewed_by_admins_and_index_owners_only(
    api, user, duck_index, ollama
):
    assert api.get("/api/auth/me", headers=user).json()["is_admin"]  # the module's first account
    chat_id, message_id = answered(api, user, duck_index["id"], "What do ducks eat?")
    rate = f"/api/chats/{chat_id}/messages/{message_id}/feedback"
    up = api.put(rate, json={"rating": "up"}, headers=user)
    assert up.status_code == 200 and up.json()["rating"] == "up" and up.json()["reason"] is None
    changed = api.put(
        rate, json={"rating": "down", "reason": "incomplete", "comment": " misses seeds "}, headers=user
    )
    assert changed.status_code == 200 and changed.json()["id"] == up.json()["id"]  # one rating per answer
    assert (changed.json()["rating"], changed.json()["reason"], changed.json()["comment"]) == (
        "down",
        "incomplete",
        "misses seeds",
    )
    mine = api.get(f"/api/chats/{chat_id}/feedback", headers=user).json()["feedback"]
    assert mine[str(message_id)]["rating"] == "down"

    # Malformed and hostile input: 400s in the error shape, the stored rating untouched.
    for body in (
        {"rating": "meh"},
        {"rating": "down", "reason": "other"},
        {"rating": 1},
        {"rating": "up", "comment": "x" * 2001},
        {},
    ):
        r = api.put(rate, json=body, headers=user)
        assert r.status_code == 400 and r.json()["error"], (body, r.status_code)
    assert api.put(rate, content=b"{not json", headers=user).status_code == 400
    user_message = api.get(f"/api/chats/{chat_id}", headers=user).json()["messages"][0]["id"]
    for wrong in (
        f"/api/chats/{chat_id}/messages/{user_message}/feedback",
        f"/api/chats/{chat_id}/messages/99999999999/feedback",
    ):
        assert api.put(wrong, json={"rating": "up"}, headers=user).status_code == 404
    assert (
        api.get(f"/api/chats/{chat_id}/feedback", headers=user).json()["feedback"][str(message_id)]["reason"]
        == "incomplete"
    )

    # Someone else's answer is a 404 to rate, to withdraw and to read, as if it did not exist.
    owner_b = login(api, "feedback_owner_b")
    for call in (
        lambda: api.put(rate, json={"rating": "up"}, headers=owner_b),
        lambda: api.delete(rate, headers=owner_b),
    ):
        assert call().status_code == 404
    assert api.get(f"/api/chats/{chat_id}/feedback", headers=owner_b).status_code == 404

    # A turn still running is a 409: it has no answer to rate yet.
    ollama.token_delay_s = 0.3
    chat = api.post("/api/chats", json={"index_ids": [duck_index["id"]]}, headers=user).json()
    with api.stream(
        "POST",
        f"/api/chats/{chat['id']}/messages/stream",
        json={"message": "Where do ducks live?"},
        headers=user,
    ) as resp:
        from tests.integration.gateway.helpers import events

        for name, _ in events(resp.iter_lines()):
            if name == "token":
                running = api.get(f"/api/chats/{chat['id']}", headers=user).json()["messages"][-1]
                assert running["status"] == "running"
                r = api.put(
                    f"/api/chats/{chat['id']}/messages/{running['id']}/feedback",
                    json={"rating": "up"},
                    headers=user,
                )
                assert r.status_code == 409 and r.json()["code"] == "turn_running"
                break
    ollama.token_delay_s = 0.0
    wait_idle(api, chat["id"], user)

    # An index owner reviews the ratings on their own index only; the admin reviews all.
    index_b = api.post("/api/indexes", json={"name": "Owls"}, headers=owner_b).json()
    owl = b"# Owls\n\nOwls hunt mice at night and swallow them whole.\n"
    assert (
        api.post(
            f"/api/indexes/{index_b['id']}/documents?wait=1",
            headers=owner_b,
            files={"file": ("owls.md", owl, "text/markdown")},
        ).status_code
        == 201
    )
    chat_b, message_b = answered(api, owner_b, index_b["id"], "What do owls hunt?")
    assert (
        api.put(
            f"/api/chats/{chat_b}/messages/{message_b}/feedback", json={"rating": "up"}, headers=owner_b
        ).status_code
        == 200
    )
    seen_b = api.get("/api/feedback", headers=owner_b).json()["items"]
    assert [i["message_id"] for i in seen_b] == [message_b]
    item = seen_b[0]
    assert item["question"] == "What do owls hunt?" and item["answer"] and item["steps"]
    assert (
        item["documents"]
        and item["documents"][0]["filename"] == "owls.md"
        and item["index_ids"] == [index_b["id"]]
    )
    assert api.get(f"/api/feedback?index_id={duck_index['id']}", headers=owner_b).status_code == 404
    everything = api.get("/api/feedback", headers=user).json()["items"]
    assert {message_id, message_b} <= {i["message_id"] for i in everything}
    ducks = api.get(f"/api/feedback?index_id={duck_index['id']}&rating=down", headers=user).json()["items"]
    assert [(i["message_id"], i["reason"], i["comment"]) for i in ducks] == [
        (message_id, "incomplete", "misses seeds")
    ]
    assert api.get("/api/feedback?rating=up&since=2999-01-01", headers=user).json()["items"] == []
    for bad in ("rating=sideways", "since=yesterday", "limit=0", "limit=100000", "index_id=abc", "offset=-1"):
        r = api.get(f"/api/feedback?{bad}", headers=user)
        assert r.status_code == 400 and r.json()["field"], bad
    import json as _json

    with api.stream("GET", "/api/feedback/export", headers=user) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
        lines = [_json.loads(line) for line in r.iter_lines() if line]
    assert [i["id"] for i in lines] == [i["id"] for i in everything]
    # A reader of a shared index (teams): rates what they asked and opens its sources, sees no ratings of the
    # index (they do not own it); its owner sees the reader's rating too. Once the share is gone, the source is a 404.
    reader = login(api, "feedback_reader")
    grant = api.post(
        f"/api/indexes/{index_b['id']}/grants",
        json={"subject_type": "user", "username": "feedback_reader", "role": "reader"},
        headers=owner_b,
    )
    assert grant.status_code == 201, grant.text
    chat_r, message_r = answered(api, reader, index_b["id"], "What do owls swallow?")
    rated = api.put(
        f"/api/chats/{chat_r}/messages/{message_r}/feedback", json={"rating": "down"}, headers=reader
    )
    assert rated.status_code == 200, rated.text
    source = f"/api/chats/{chat_r}/messages/{message_r}/sources/S1"
    opened = api.get(source, headers=reader)
    assert opened.status_code == 200 and opened.json()["filename"] == "owls.md", opened.text
    assert api.get("/api/feedback", headers=reader).json()["items"] == []
    assert api.get(f"/api/feedback?index_id={index_b['id']}", headers=reader).status_code == 404
    by_owner = api.get(f"/api/feedback?index_id={index_b['id']}", headers=owner_b).json()["items"]
    assert {i["message_id"] for i in by_owner} == {message_b, message_r}
    assert (
        api.delete(f"/api/indexes/{index_b['id']}/grants/{grant.json()['id']}", headers=owner_b).status_code
        == 204
    )
    assert api.get(source, headers=reader).status_code == 404
    assert api.delete(f"/api/chats/{chat_r}", headers=reader).status_code == 204

    # Withdrawn, then the chat deleted: nothing of it is left in the review.
    assert api.delete(rate, headers=user).status_code == 204
    assert str(message_id) not in api.get(f"/api/chats/{chat_id}/feedback", headers=user).json()["feedback"]
    assert api.delete(f"/api/chats/{chat_b}", headers=owner_b).status_code == 204
    assert api.get("/api/feedback", headers=owner_b).json()["items"] == []


MULTI_PAGE = SHARED / "fixtures" / "docling" / "sources" / "multi_page.pdf"
CITED = re.compile(r"^- \[(S\d+)\] (.+?) — (.*)$")


def lines_of(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


@pytest.mark.skipif(
    not MULTI_PAGE.exists(), reason="needs ../shared (fixtures/docling/sources/multi_page.pdf)"
)
def test_a_three_turn_chat_exports_as_markdown_whose_citations_resolve_in_the_index(api, user):
    index = api.post("/api/indexes", json={"name": "Word processors"}, headers=user).json()
    r = api.post(
        f"/api/indexes/{index['id']}/documents?wait=1",
        headers=user,
        files={"file": ("multi_page.pdf", MULTI_PAGE.read_bytes(), "application/pdf")},
    )
    assert r.status_code == 201, r.text
    document = r.json()
    chat = api.post(
        "/api/chats", json={"index_ids": [index["id"]], "title": "Word *processors*"}, headers=user
    ).json()
    for question in (
        "Which word processors are tailored for legal professionals?",
        "What did Wang Laboratories introduce in the 1970s?",
        "What did Microsoft Office Suite integrate?",
    ):
        assert "saved" in dict(stream_turn(api, chat["id"], user, message=question))
    wait_idle(api, chat["id"], user)

    got = api.get(f"/api/chats/{chat['id']}/export?format=markdown", headers=user)
    assert got.status_code == 200 and got.headers["content-type"].startswith("text/markdown")
    assert "attachment" in got.headers["content-disposition"]
    markdown = got.text
    assert markdown.startswith("# Word \\*processors\\*\n")
    assert markdown.count("\n## ") == 3
    text = api.get(f"/api/indexes/{index['id']}/documents/{document['id']}/text", headers=user).json()
    files = {d["filename"] for d in api.get(f"/api/indexes/{index['id']}", headers=user).json()["documents"]}
    lines = markdown.splitlines()
    citations = 0
    for n, line in enumerate(lines):
        match = CITED.match(line)
        if not match:
            continue
        citations += 1
        ref, filename, where = match.groups()
        assert unescape(filename) in files
        pages = [int(p) for p in re.findall(r"\d+", where.split(" · ")[0])]
        assert where.split(" · ")[0].startswith(("p. ", "pp. ")) and pages, where
        quoted = []
        for follow in lines[n + 1 :]:
            if not follow.startswith("  >"):
                break
            quoted.append(follow[4:])
        passage = "\n".join(quoted).strip()
        # the quote is a passage of that file, on the page cited
        on_page = [c for c in text["chunks"] if lines_of(c["text"]) == passage]
        assert on_page and on_page[0]["page"] == pages[0], (ref, where, passage[:80])
    assert citations >= 3  # one cited source per answer at least

    typed = api.get(f"/api/chats/{chat['id']}/export?format=json", headers=user).json()
    assert typed["chat"]["id"] == chat["id"] and typed["chat"]["index_ids"] == [index["id"]]
    answers = [m for m in typed["messages"] if m["role"] == "assistant"]
    assert len(answers) == 3 and all(m["answer"]["citations"] for m in answers)
    assert api.get(f"/api/chats/{chat['id']}/export?format=pdf", headers=user).status_code == 400
    stranger = login(api, "export_stranger")
    assert api.get(f"/api/chats/{chat['id']}/export?format=json", headers=stranger).status_code == 404

    import json as _json

    with api.stream("GET", "/api/account/export", headers=user) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
        rows = [_json.loads(line) for line in r.iter_lines() if line]
    assert rows[0]["type"] == "account" and rows[0]["username"] == "flow_user"
    chats = [row for row in rows if row["type"] == "chat"]
    assert chat["id"] in {c["id"] for c in chats}
    mine = [row for row in rows if row["type"] == "message" and row["chat_id"] == chat["id"]]
    assert [m["role"] for m in mine] == ["user", "assistant"] * 3
    with api.stream("GET", "/api/account/export", headers=stranger) as r:
        only = [_json.loads(line) for line in r.iter_lines() if line]
    assert [row["type"] for row in only] == ["account"]  # nothing of another account


def test_an_index_made_with_a_language_keeps_it_on_the_worker_and_bad_choices_are_400(api, user, stack):
    import httpx

    worker, _ = stack
    # The module's worker serves its SQLite and its Postgres gateway: this gateway's table is the new one.
    lancedb = Path(worker.env["INDEX_STORE"]) / "lancedb"
    tables_before = set(lancedb.glob("u*_canards_*.lance"))
    r = api.post("/api/indexes", json={"name": "Canards", "language": "fr"}, headers=user)
    assert r.status_code == 201, r.text
    made = r.json()
    assert made["language"] == "fr" and made["embedder"] == "default" and made["name"] == "Canards"
    # The worker's table exists now, in French: asking for it again in French is a no-op, in German a conflict.
    [table] = [p.name.removesuffix(".lance") for p in set(lancedb.glob("u*_canards_*.lance")) - tables_before]
    again = httpx.put(f"{worker.url}/indexes/{table}", json={"language": "fr"})
    assert again.status_code == 200 and again.json()["created"] is False
    assert httpx.put(f"{worker.url}/indexes/{table}", json={"language": "de"}).status_code == 409

    before = api.get("/api/indexes", headers=user).json()
    for body, field in [
        ({"name": "Bad1", "embedder": "bge-m3"}, "embedder"),
        ({"name": "Bad2", "language": "klingon"}, "language"),
        ({"name": "Bad3", "embedder": 7}, "embedder"),
    ]:
        r = api.post("/api/indexes", json=body, headers=user)
        assert r.status_code == 400, r.text
        assert r.json()["field"] == field, r.text
    r = api.post("/api/indexes", json={"name": "Bad4", "embedder": "nope"}, headers=user)
    assert "multilingual-e5-small" in r.text, "the refusal lists the valid embedders"
    assert api.get("/api/indexes", headers=user).json() == before, "a refused creation made nothing"
