"""Grounding through the real worker: the fake Ollama invents an answer, and each policy deals with it."""

from __future__ import annotations

import httpx
import pytest

from rag_worker.pipeline.prompts import DEFAULTS
from tests.ollama_server import default_responder
from tests.sse import post_events

QUESTION = "How tall is the Eiffel Tower?"
INVENTED = (
    "To climb it you must first install the Heroku client and run sudo wget backup.php on a server [S1]. "
    "Tickets are sold only on Tuesdays by the ministry of agriculture [S2]."
)


def answering(answer: str):
    """A model that answers yes/no checks like the default one but writes `answer` itself."""

    def responder(model: str, messages: list[dict], request: dict) -> str:
        if any("answer yes or no" in str(m.get("content") or "").lower() for m in messages):
            return default_responder(model, messages, request)
        return answer

    return responder


inventing = answering(INVENTED)


def turn(worker, prompt: str = QUESTION, **options):
    """(streamed tokens, the `done` payload, the grounding steps) of one RAG turn on the corpus."""
    body = {"prompt": prompt, "index": "corpus", "options": {"route": "rag", **options}}
    status, events = post_events(worker.url + "/chat_stream", body)
    assert status == 200, events
    events = [(e, d) for e, d in events if e != ":"]
    assert events[-1][0] == "done", events[-1]
    tokens = "".join(d["token"] for e, d in events if e == "token")
    steps = [d for e, d in events if e == "step" and d["step"] == "grounding"]
    return tokens, events[-1][1], steps


def test_flag_keeps_the_invented_answer_and_marks_every_sentence(worker, fake_ollama):
    fake_ollama.responder = inventing
    _, done, steps = turn(worker, grounding="flag")
    g = done["grounding"]
    assert "Heroku" in done["reply"] and done["abstained"] is False
    assert g["action"] == "flagged" and g["policy"] == "flag" and g["supported_share"] == 0.0
    assert g["checked"] == 2 and all(s["label"] != "supported" for s in g["sentences"])
    assert done["flags"]["grounding"] == "flagged"
    assert "unsupported ones are marked" in steps[-1]["label"]


def test_extract_replaces_the_invented_answer_with_quotes_of_the_sources(worker, fake_ollama):
    fake_ollama.responder = inventing
    tokens, done, steps = turn(worker, grounding="extract")
    g = done["grounding"]
    assert "Heroku" in tokens, "the streamed draft was the invention"
    assert "Heroku" not in done["reply"] and done["abstained"] is False
    assert done["reply"].startswith(DEFAULTS["extract_caveat"])
    assert "From eiffel.md:" in done["reply"] and "330 metres" in done["reply"]
    eiffel = next(d["ref"] for d in done["documents"] if d["filename"] == "eiffel.md")
    assert f"[{eiffel}]" in done["reply"] and eiffel in {c["ref"] for c in done["citations"]}
    assert g["action"] == "extracted" and g["answer_mode"] == "extractive" and g["supported_share"] == 1.0
    assert g["draft"]["supported_share"] == 0.0
    assert done["history"][-1] == {"role": "assistant", "content": done["reply"]}
    assert steps[-1]["method"] == "extracted"


def test_refuse_abstains_and_says_why(worker, fake_ollama):
    fake_ollama.responder = inventing
    _, done, _ = turn(worker, grounding="refuse")
    assert done["abstained"] is True and done["reply"] == DEFAULTS["ungrounded"]
    assert done["grounding"]["action"] == "refused" and done["flags"]["grounding"] == "refused"
    assert "Heroku" not in done["reply"] and done["citations"] == []


def test_a_grounded_answer_passes_and_an_invented_ref_is_corrected(worker, fake_ollama):
    fake_ollama.replies = []
    fake_ollama.responder = lambda model, messages, request: (
        default_responder(model, messages, request)
        if any("answer yes or no" in str(m.get("content") or "").lower() for m in messages)
        else "The Eiffel Tower is 330 metres tall and stands on the Champ de Mars in Paris [S9]."
    )
    _, done, _ = turn(worker, grounding="refuse")
    eiffel = next(d["ref"] for d in done["documents"] if d["filename"] == "eiffel.md")
    assert (
        done["reply"]
        == f"The Eiffel Tower is 330 metres tall and stands on the Champ de Mars in Paris [{eiffel}]."
    )
    (sentence,) = done["grounding"]["sentences"]
    assert sentence["label"] == "supported" and sentence["corrected_from"] == ["S9"]
    assert sentence["source"]["ref"] == eiffel and done["grounding"]["action"] == "none"
    assert [c["ref"] for c in done["citations"]] == [eiffel]
    assert done["flags"]["invented_refs_corrected"] == ["S9"] and done["flags"]["corrected_citations"] == 1


def test_extractive_answer_mode_quotes_without_calling_the_model(worker, fake_ollama):
    before = len([r for r in fake_ollama.requests if r["path"] == "/api/chat" and r["body"].get("stream")])
    _, done, _ = turn(worker, answer_mode="extractive")
    after = len([r for r in fake_ollama.requests if r["path"] == "/api/chat" and r["body"].get("stream")])
    assert after == before, "no generation for an extractive answer"
    assert done["reply"].startswith("From eiffel.md:") and "330 metres" in done["reply"]
    assert done["grounding"]["answer_mode"] == "extractive" and done["grounding"]["supported_share"] == 1.0


@pytest.mark.parametrize(
    ("options", "field"),
    [({"grounding": "maybe"}, "options.grounding"), ({"answer_mode": 3}, "options.answer_mode")],
)
def test_bad_grounding_options_are_a_400_naming_the_field(worker, options, field):
    r = httpx.post(worker.url + "/chat", json={"prompt": QUESTION, "index": "corpus", "options": options})
    assert r.status_code == 400 and r.json()["field"] == field, r.text


# A question on the corpus's topic that its documents can't answer (they say nothing of tickets or prices):
# retrieval finds the Eiffel passages, and the model makes an answer up.
UNANSWERABLE = "How much does a ticket to the top of the Eiffel Tower cost?"
MADE_UP = (
    "A ticket to the top costs 29 euros and is sold at the south pillar [S1]. "
    "Children under four go up for free on weekdays [S1]."
)
making_up = answering(MADE_UP)


def unanswerable_turn(worker, **options):
    return turn(worker, UNANSWERABLE, **options)[1]


def test_an_unanswerable_question_forced_through_retrieval_is_quoted_with_a_caveat(worker, fake_ollama):
    fake_ollama.responder = making_up
    done = unanswerable_turn(worker, grounding="extract")
    assert done["documents"], "retrieval found passages: the check, not abstention, must catch the invention"
    assert "29 euros" not in done["reply"] and "free" not in done["reply"]
    assert done["reply"].startswith(DEFAULTS["extract_caveat"]) and "From eiffel.md:" in done["reply"]
    assert done["flags"]["grounding"] == "extracted" and done["grounding"]["draft"]["supported_share"] == 0.0


def test_an_unanswerable_question_forced_through_retrieval_is_refused(worker, fake_ollama):
    fake_ollama.responder = making_up
    done = unanswerable_turn(worker, grounding="refuse")
    assert done["abstained"] is True and done["reply"] == DEFAULTS["ungrounded"]
    assert done["flags"]["grounding"] == "refused" and done["citations"] == []


def test_an_invented_answer_under_the_ollama_default_is_marked_not_passed_off(worker, fake_ollama):
    # Ollama's default policy is `flag`: the made-up answer stays, but every sentence is marked unsupported and
    # the flags say so (the web strikes them through under a banner).
    fake_ollama.responder = making_up
    done = unanswerable_turn(worker)
    g = done["grounding"]
    assert g["policy"] == "flag" and g["action"] == "flagged" and done["flags"]["grounding"] == "flagged"
    assert g["supported"] == 0 and all(s["label"] != "supported" for s in g["sentences"]), g
