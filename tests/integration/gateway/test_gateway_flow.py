"""A user's whole path through the real gateway and the real worker (fake Ollama the only stand-in):
register, log in, build an index from an upload, chat with it, come back and find everything as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.gateway.helpers import DUCK, register, stream_turn, wait_idle


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
        f"/api/indexes/{index['id']}/documents",
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
        f"/api/indexes/{index['id']}/documents",
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
        f"/api/indexes/{index['id']}/documents",
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


def test_an_index_made_with_a_language_keeps_it_on_the_worker_and_bad_choices_are_400(api, user, stack):
    import httpx

    worker, _ = stack
    r = api.post("/api/indexes", json={"name": "Canards", "language": "fr"}, headers=user)
    assert r.status_code == 201, r.text
    made = r.json()
    assert made["language"] == "fr" and made["embedder"] == "default" and made["name"] == "Canards"
    # The worker's table exists now, in French: asking for it again in French is a no-op, in German a conflict.
    lancedb = Path(worker.env["INDEX_STORE"]) / "lancedb"
    [table] = [p.name.removesuffix(".lance") for p in lancedb.glob("u*_canards_*.lance")]
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
