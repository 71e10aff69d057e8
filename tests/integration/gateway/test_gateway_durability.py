"""Turns that go wrong, and users who must not see each other, against the real gateway and worker."""

from __future__ import annotations

import threading
import time

import httpx
import jwt
import pytest

from tests.integration.gateway.conftest import MAX_UPLOAD_BYTES
from tests.integration.gateway.helpers import DUCK, events, register, stream_turn, wait_idle


@pytest.fixture(scope="module")
def alice(api):
    return register(api, "alice")


@pytest.fixture(scope="module")
def bob(api, alice):
    return register(api, "bob")


@pytest.fixture(scope="module")
def alice_index(api, alice):
    index = api.post("/api/indexes", json={"name": "Ducks"}, headers=alice).json()
    r = api.post(
        f"/api/indexes/{index['id']}/documents?wait=1",
        headers=alice,
        data={"dataset": "birds"},
        files={"file": ("duck.md", DUCK.read_bytes(), "text/markdown")},
    )
    assert r.status_code == 201, r.text
    return {**index, "document": r.json()}


def new_chat(api, user, index) -> int:
    return api.post("/api/chats", json={"index_ids": [index["id"]]}, headers=user).json()["id"]


def test_a_browser_that_leaves_mid_answer_still_gets_the_whole_turn_stored(
    gateway, api, alice, alice_index, ollama
):
    ollama.token_delay_s = 0.1
    chat_id = new_chat(api, alice, alice_index)
    seen_tokens = []
    with (
        httpx.Client(base_url=gateway.url, timeout=60) as browser,
        browser.stream(
            "POST",
            f"/api/chats/{chat_id}/messages/stream",
            json={"message": "What do ducks eat?"},
            headers=alice,
        ) as resp,
    ):
        for event, data in events(resp.iter_lines()):
            if event == "token":
                seen_tokens.append(data["token"])
                if len(seen_tokens) == 2:
                    break  # the tab is closed: the connection goes away with the answer half written
    assert api.get(f"/api/chats/{chat_id}", headers=alice).json()["busy"] is True

    stored = wait_idle(api, chat_id, alice)
    user_msg, answer = stored["messages"]
    assert user_msg["status"] == answer["status"] == "complete"
    assert answer["content"].startswith("".join(seen_tokens).strip()[:5])
    assert len(answer["content"]) > len("".join(seen_tokens))
    assert answer["documents"] and answer["timings"]["total_ms"] > 0
    assert stored["state"]["history"][-1] == {"role": "assistant", "content": answer["content"]}
    assert stored["title"]


def test_a_second_message_while_a_turn_runs_is_a_409(gateway, api, alice, alice_index, ollama):
    ollama.token_delay_s = 0.1
    chat_id = new_chat(api, alice, alice_index)
    first_events: list = []
    started = threading.Event()

    def first_turn() -> None:
        with (
            httpx.Client(base_url=gateway.url, timeout=60) as c,
            c.stream(
                "POST",
                f"/api/chats/{chat_id}/messages/stream",
                json={"message": "What do ducks eat?"},
                headers=alice,
            ) as resp,
        ):
            for event, data in events(resp.iter_lines()):
                first_events.append((event, data))
                if event == "route":
                    started.set()

    thread = threading.Thread(target=first_turn)
    thread.start()
    assert started.wait(30)
    second = api.post(
        f"/api/chats/{chat_id}/messages/stream", json={"message": "And what else?"}, headers=alice
    )
    assert second.status_code == 409 and second.json()["code"] == "turn_in_progress"
    again = api.post(f"/api/chats/{chat_id}/messages", json={"message": "And what else?"}, headers=alice)
    assert again.status_code == 409
    thread.join(60)
    assert [e for e, _ in first_events if e != ":"][-1] == "title"
    ollama.token_delay_s = 0.0
    # Once it is finished, the chat takes the next message.
    assert "saved" in dict(stream_turn(api, chat_id, alice, message="And what else?"))
    assert len(wait_idle(api, chat_id, alice)["messages"]) == 4


def test_a_model_failure_mid_answer_stores_the_error_and_keeps_the_chat_state(
    api, alice, alice_index, ollama
):
    chat_id = new_chat(api, alice, alice_index)
    assert "saved" in dict(stream_turn(api, chat_id, alice, message="What do ducks eat?"))
    before = api.get(f"/api/chats/{chat_id}", headers=alice).json()

    ollama.error_after_tokens = 2
    turn = stream_turn(api, chat_id, alice, message="Where do ducks live?")
    names = [e for e, _ in turn]
    assert names[-1] == "error" and "done" not in names and "saved" not in names
    after = api.get(f"/api/chats/{chat_id}", headers=alice).json()
    assert after["state"] == before["state"], "a failed turn must not change what the next turn builds on"
    failed = after["messages"][2:]
    assert failed[0]["role"] == "user" and failed[0]["status"] == "failed" and failed[0]["error"]
    assert failed[0]["content"] == "Where do ducks live?"
    assert all(m["status"] == "failed" for m in failed)
    assert after["busy"] is False

    ollama.error_after_tokens = None
    retry = stream_turn(api, chat_id, alice, message="Where do ducks live?")
    done = dict(retry)["done"]
    assert done["history"][: len(before["state"]["history"])] == before["state"]["history"]
    assert "saved" in dict(retry)


def test_ollama_down_is_a_stored_failure_and_a_clear_error(api, alice, alice_index, ollama):
    chat_id = new_chat(api, alice, alice_index)
    ollama.set_down(True)
    r = api.post(f"/api/chats/{chat_id}/messages", json={"message": "What do ducks eat?"}, headers=alice)
    assert r.status_code in (502, 503)
    assert r.json()["error"] and r.json()["status"] == "failed"
    stored = api.get(f"/api/chats/{chat_id}", headers=alice).json()
    assert stored["messages"][0]["status"] == "failed" and stored["state"]["history"] == []


def test_two_users_cannot_touch_each_others_chats_or_indexes(api, alice, bob, alice_index):
    chat_id = new_chat(api, alice, alice_index)
    assert "saved" in dict(stream_turn(api, chat_id, alice, message="What do ducks eat?"))
    i, d, c = alice_index["id"], alice_index["document"]["id"], chat_id
    attempts = [
        ("GET", f"/api/chats/{c}", None),
        ("PATCH", f"/api/chats/{c}", {"title": "mine now"}),
        ("POST", f"/api/chats/{c}/messages", {"message": "hi"}),
        ("POST", f"/api/chats/{c}/messages/stream", {"message": "hi"}),
        ("DELETE", f"/api/chats/{c}", None),
        ("GET", f"/api/indexes/{i}", None),
        ("PATCH", f"/api/indexes/{i}", {"name": "mine now"}),
        ("GET", f"/api/indexes/{i}/datasets", None),
        ("POST", f"/api/indexes/{i}/build", {"rebuild": True}),
        ("GET", f"/api/indexes/{i}/documents/{d}/download", None),
        ("DELETE", f"/api/indexes/{i}/documents/{d}", None),
        ("DELETE", f"/api/indexes/{i}", None),
        ("POST", "/api/chats", {"index_ids": [i]}),
        ("PATCH", "/api/chats/0", {"index_ids": [i]}),
    ]
    for method, path, body in attempts:
        r = api.request(method, path, json=body, headers=bob)
        assert r.status_code == 404, (method, path, r.status_code, r.text)
    r = api.post(
        f"/api/indexes/{i}/documents?wait=1",
        headers=bob,
        files={"file": ("x.md", b"# planted\n", "text/markdown")},
    )
    assert r.status_code == 404
    bob_chat = api.post("/api/chats", json={}, headers=bob).json()
    r = api.patch(f"/api/chats/{bob_chat['id']}", json={"index_ids": [i]}, headers=bob)
    assert r.status_code == 404
    assert api.get("/api/indexes", headers=bob).json() == []
    assert [ch["id"] for ch in api.get("/api/chats", headers=bob).json()] == [bob_chat["id"]]
    # Everything of alice's is as she left it.
    mine = api.get(f"/api/chats/{c}", headers=alice).json()
    assert len(mine["messages"]) == 2 and mine["title"] != "mine now"
    index = api.get(f"/api/indexes/{i}", headers=alice).json()
    assert index["name"] == "Ducks" and [x["filename"] for x in index["documents"]] == ["duck.md"]
    assert api.get(f"/api/indexes/{i}/documents/{d}/download", headers=alice).content == DUCK.read_bytes()


def test_bad_tokens_get_a_clear_401(gateway, api, alice):
    secret = (gateway.log_path.parent.parent / "index_store" / "gateway_jwt_secret").read_text().strip()
    me = api.get("/api/auth/me", headers=alice).json()
    now = int(time.time())
    tokens = {
        "token_expired": jwt.encode({"sub": str(me["id"]), "exp": now - 10}, secret, algorithm="HS256"),
        "token_invalid": jwt.encode({"sub": str(me["id"]), "exp": now + 600}, "y" * 64, algorithm="HS256"),
    }
    none = jwt.api_jws.base64url_encode(b'{"alg":"none","typ":"JWT"}').decode()
    body = jwt.api_jws.base64url_encode(f'{{"sub":"{me["id"]}","exp":{now + 600}}}'.encode()).decode()
    for code, token in [*tokens.items(), ("token_invalid", f"{none}.{body}.")]:
        r = api.get("/api/chats", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 401 and r.json()["code"] == code, r.text


def test_an_oversized_upload_is_refused_before_reaching_the_worker(api, alice, alice_index):
    big = b"# big\n" + b"x" * (MAX_UPLOAD_BYTES + 100 * 1024)
    r = api.post(
        f"/api/indexes/{alice_index['id']}/documents?wait=1",
        headers=alice,
        files={"file": ("big.md", big, "text/markdown")},
    )
    assert r.status_code == 413 and r.json()["code"] == "too_large"
    index = api.get(f"/api/indexes/{alice_index['id']}", headers=alice).json()
    assert "big.md" not in [x["filename"] for x in index["documents"]]


def test_an_unsupported_file_gets_the_workers_clear_4xx(api, alice, alice_index):
    r = api.post(
        f"/api/indexes/{alice_index['id']}/documents?wait=1",
        headers=alice,
        files={"file": ("tool.exe", b"MZ\x90\x00binary", "application/octet-stream")},
    )
    assert r.status_code in (400, 415) and r.json()["error"]
