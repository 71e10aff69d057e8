"""The gateway stores the worker's final, checked answer: when the grounding check replaces an invented draft,
the chat shows the replacement after a reload, with the check that explains it."""

from __future__ import annotations

import pytest

from tests.integration.gateway.helpers import DUCK, register, stream_turn, wait_idle
from tests.ollama_server import default_responder

INVENTED = "Ducks migrate to the moon every winter on rockets [S1]. They pay their taxes in gold coins [S1]."


@pytest.fixture(scope="module")
def user(api):
    register(api, "grounding_user")
    r = api.post(
        "/api/auth/login", json={"username": "grounding_user", "password": "a long enough passphrase"}
    )
    assert r.status_code == 200
    return {"Authorization": f"Bearer {r.json()['token']}"}


@pytest.fixture(scope="module")
def chat(api, user):
    index = api.post("/api/indexes", json={"name": "Ducks"}, headers=user).json()
    r = api.post(
        f"/api/indexes/{index['id']}/documents?wait=1",
        headers=user,
        data={"dataset": "animals"},
        files={"file": ("duck.md", DUCK.read_bytes(), "text/markdown")},
    )
    assert r.status_code == 201, r.text
    return api.post("/api/chats", json={"index_ids": [index["id"]]}, headers=user).json()


def test_an_extracted_answer_replaces_the_streamed_draft_in_the_stored_message(api, user, chat, ollama):
    def responder(model, messages, body):
        asks_yes_no = any("answer yes or no" in str(m.get("content") or "").lower() for m in messages)
        return (
            INVENTED
            if model.startswith("qwen3:8b") and not asks_yes_no
            else default_responder(model, messages, body)
        )

    ollama.responder = responder
    events = stream_turn(
        api, chat["id"], user, message="What do ducks eat?", options={"grounding": "extract"}
    )
    done = dict(events)["done"]
    streamed = "".join(d["token"] for e, d in events if e == "token")
    assert "moon" in streamed and "moon" not in done["reply"] and "From duck.md:" in done["reply"]
    stored = wait_idle(api, chat["id"], user)
    answer = stored["messages"][-1]
    assert answer["content"] == done["reply"]
    assert answer["details"]["grounding"]["action"] == "extracted"
    assert answer["details"]["grounding"]["supported_share"] == 1.0
    assert stored["state"]["history"][-1] == {"role": "assistant", "content": done["reply"]}


def test_a_flagged_answer_is_stored_with_its_unsupported_sentences(api, user, chat, ollama):
    def responder(model, messages, body):
        asks_yes_no = any("answer yes or no" in str(m.get("content") or "").lower() for m in messages)
        return (
            INVENTED
            if model.startswith("qwen3:8b") and not asks_yes_no
            else default_responder(model, messages, body)
        )

    ollama.responder = responder
    events = stream_turn(api, chat["id"], user, message="What do ducks eat, then?")
    done = dict(events)["done"]
    assert done["grounding"]["action"] == "flagged" and "moon" in done["reply"]
    answer = wait_idle(api, chat["id"], user)["messages"][-1]
    labels = [s["label"] for s in answer["details"]["grounding"]["sentences"]]
    assert labels and "supported" not in labels


def test_the_interface_language_reaches_the_worker_for_a_message_too_short_to_detect(api, user, chat, ollama):
    """The web sends its locale as `options.language`: "merci ?" (too unsure to detect) is refused in French, the
    answer says the hint decided; a clear English question in the French interface stays English."""
    from rag_worker.i18n.messages import CATALOGUE

    def responder(model, messages, body):
        asks_yes_no = any("answer yes or no" in str(m.get("content") or "").lower() for m in messages)
        return (
            INVENTED
            if model.startswith("qwen3:8b") and not asks_yes_no
            else default_responder(model, messages, body)
        )

    ollama.responder = responder
    fr, en = CATALOGUE["fr"], CATALOGUE["en"]
    events = stream_turn(
        api, chat["id"], user, message="merci ?", options={"grounding": "refuse", "language": "fr"}
    )
    done = dict(events)["done"]
    assert done["reply"] in (fr["abstain"], fr["ungrounded"]), done["reply"]
    assert done["language"] == {"code": "fr", "source": "hinted"}
    wait_idle(api, chat["id"], user)
    events = stream_turn(
        api,
        chat["id"],
        user,
        message="What do ducks eat in the winter?",
        options={"grounding": "refuse", "language": "fr-FR"},
    )
    done = dict(events)["done"]
    assert done["reply"] in (en["abstain"], en["ungrounded"]), done["reply"]
    assert done["language"] == {"code": "en", "source": "detected"}
    wait_idle(api, chat["id"], user)
    for bad in ("klingon", "xx", 7):
        r = api.post(
            f"/api/chats/{chat['id']}/messages/stream",
            json={"message": "merci ?", "options": {"language": bad}},
            headers=user,
        )
        assert r.status_code == 400 and r.json()["field"] == "options.language", (bad, r.text)
