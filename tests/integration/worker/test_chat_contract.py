"""The chat turn's public contract (docs/design/WORKER_API.md), against the real worker and the fake Ollama."""

from __future__ import annotations

import httpx
import pytest

from tests.sse import post_events

DONE_FIELDS = {
    "reply",
    "question",
    "rewritten",
    "history",
    "documents",
    "fetched_new_documents",
    "route",
    "citations",
    "abstained",
    "model",
    "timings",
}


def chat(worker, body: dict, **kw) -> httpx.Response:
    return httpx.post(worker.url + "/chat", json=body, timeout=120, **kw)


def events_of(worker, body: dict):
    status, events = post_events(worker.url + "/chat_stream", body)
    assert status == 200, events
    return [(e, d) for e, d in events if e != ":"]


def test_stream_announces_steps_then_documents_then_tokens_then_done(worker, fake_ollama):
    events = events_of(worker, {"prompt": "What do ducks eat?", "index": "corpus"})
    names = [e for e, _ in events]
    assert names[-1] == "done" and names.count("done") == 1 and "error" not in names
    first_doc, first_token = names.index("documents"), names.index("token")
    assert names[0] == "step" and first_doc < first_token
    steps = [d["step"] for e, d in events if e == "step"]
    assert {"retrieving", "evaluating", "generating"} <= set(steps)
    assert all(isinstance(d["elapsed_ms"], int) for e, d in events if e == "step")
    done = events[-1][1]
    assert DONE_FIELDS <= done.keys()
    tokens = "".join(d["token"] for e, d in events if e == "token")
    assert tokens.strip() == done["reply"]
    docs = dict(events)["documents"]["documents"]
    assert [d["id"] for d in docs] == [d["id"] for d in done["documents"]] and docs[0][
        "filename"
    ] == "ducks.md"
    assert all(d["provenance"] is None for d in docs), "provenance is known only once the answer is"
    assert "aquatic plants" in done["reply"] and done["route"] == "rag" and done["abstained"] is False
    assert done["citations"] and {c["ref"] for c in done["citations"]} <= {d["ref"] for d in docs}
    assert sum(d["provenance"] for d in done["documents"]) == pytest.approx(1.0, abs=0.01)
    assert done["timings"]["total_ms"] >= done["timings"]["first_token_ms"] > 0


def test_chat_json_answer_equals_the_done_payload_shape(worker, fake_ollama):
    answer = chat(worker, {"query": "How tall is the Eiffel Tower?", "index": "corpus"}).json()
    assert DONE_FIELDS <= answer.keys()
    assert answer["question"] == "How tall is the Eiffel Tower?"
    assert answer["documents"][0]["filename"] == "eiffel.md" and "330 metres" in answer["reply"]
    roles = [m["role"] for m in answer["history"]]
    assert roles == ["user", "system", "assistant"]
    assert "[S1]" in answer["history"][1]["content"]


def test_history_round_trips_over_three_turns_by_an_echoing_client(worker, fake_ollama):
    body = {"prompt": "What do ducks eat?", "index": "corpus"}
    history, docs = [], []
    for prompt in ("What do ducks eat?", "What is a male one called?", "How tall is the Eiffel Tower?"):
        body = {"prompt": prompt, "history": history, "docs": docs, "index": "corpus"}
        answer = chat(worker, body).json()
        assert answer["history"][: len(history)] == history, "the sent history must come back unchanged"
        assert answer["history"][len(history)] == {"role": "user", "content": prompt}
        assert answer["history"][-1] == {"role": "assistant", "content": answer["reply"]}
        history, docs = answer["history"], answer["documents"]
    assert len([m for m in history if m["role"] == "user"]) == 3
    # The third question changed the subject: new documents were fetched for it.
    assert answer["fetched_new_documents"] is True and answer["documents"][0]["filename"] == "eiffel.md"
    # What the worker sent to the model on the last turn included the earlier turns.
    last_chat = [r for r in fake_ollama.requests if r["path"] == "/api/chat"][-1]["body"]["messages"]
    assert any("What do ducks eat?" == m["content"] for m in last_chat)


def test_follow_up_reuses_the_documents_it_was_sent(worker, fake_ollama):
    first = chat(worker, {"prompt": "What do ducks eat?", "index": "corpus"}).json()
    calls_before = len(fake_ollama.requests)
    second = chat(
        worker,
        {
            "prompt": "Tell me more about that",
            "history": first["history"],
            "docs": first["documents"],
            "index": "corpus",
        },
    ).json()
    assert second["fetched_new_documents"] is False
    assert [d["id"] for d in second["documents"]] == [d["id"] for d in first["documents"]]
    assert second["documents"], "reused documents are never empty"
    # No second copy of the same sources in the history.
    assert [m["role"] for m in second["history"]].count("system") == 1
    assert len(fake_ollama.requests) > calls_before


def test_dataset_filter_keeps_other_datasets_out(worker, fake_ollama):
    answer = chat(
        worker,
        {
            "prompt": "What do ducks eat?",
            "index": "corpus",
            "datasets": ["places"],
            "options": {"route": "rag"},
        },
    ).json()
    assert all(d["dataset"] == "places" for d in answer["documents"])
    answer = chat(
        worker, {"prompt": "Which tower is in Paris?", "index": "corpus", "datasets": ["places", "animals"]}
    ).json()
    assert answer["documents"] and {d["dataset"] for d in answer["documents"]} <= {"places", "animals"}


def test_invented_citations_are_dropped(worker, fake_ollama):
    fake_ollama.responder = lambda model, messages, body: (
        "YES" if "answer yes or no" in str(messages).lower() else "Ducks eat plants [S1] and stones [S9]."
    )
    answer = chat(worker, {"prompt": "What do ducks eat?", "index": "corpus"}).json()
    assert [c["ref"] for c in answer["citations"]] == ["S1"]
    assert "[S9]" not in answer["reply"] and "[S1]" in answer["reply"]
    assert answer["flags"]["invented_refs"] == ["S9"]


def test_abstains_when_the_corpus_cannot_answer(worker, fake_ollama):
    before = len(fake_ollama.requests)
    events = events_of(worker, {"prompt": "What was the GDP of Mongolia in 1950?", "index": "corpus"})
    done = events[-1][1]
    assert done["abstained"] is True and done["documents"] == [] and done["citations"] == []
    assert "could not find" in done["reply"]
    steps = [d["step"] for e, d in events if e == "step"]
    assert "retrying" in steps, "one retry with a better query comes before giving up"
    # The answer was not left to the model: no generation request was made for it.
    gen = [r for r in fake_ollama.requests[before:] if r["body"].get("model") == "qwen3:8b"]
    assert gen == []


def test_direct_route_answers_without_documents(worker, fake_ollama):
    answer = chat(worker, {"prompt": "hello there", "index": "corpus", "options": {"route": "direct"}}).json()
    assert answer["route"] == "direct" and answer["documents"] == []
    assert [m["role"] for m in answer["history"]] == ["user", "assistant"]
    assert answer["reply"].startswith("Hello!")


def test_triage_may_answer_directly_when_the_model_says_so(worker, fake_ollama):
    fake_ollama.responder = lambda model, messages, body: (
        "NO" if "answer yes or no" in str(messages).lower() else "Four."
    )
    events = events_of(worker, {"prompt": "What is two plus two?", "index": "corpus"})
    triage = [d for e, d in events if e == "step" and d["step"] == "triage" and "method" in d]
    assert triage and triage[0]["method"] == "llm" and triage[0]["detail"]["route"] == "direct"
    assert events[-1][1]["route"] == "direct" and events[-1][1]["reply"] == "Four."


def test_rewrite_is_surfaced(worker, fake_ollama):
    first = chat(worker, {"prompt": "Tell me about owls", "index": "corpus"}).json()
    fake_ollama.replies.append("How far can owls turn their heads?")
    answer = chat(
        worker, {"prompt": "How far can they turn them?", "history": first["history"], "index": "corpus"}
    ).json()
    assert answer["rewritten"] == "How far can owls turn their heads?"
    assert answer["documents"][0]["filename"] == "owls.txt"


def test_ollama_dying_mid_stream_gives_an_error_event(worker, fake_ollama):
    fake_ollama.fail_after_tokens = 3
    events = events_of(worker, {"prompt": "What do ducks eat?", "index": "corpus"})
    names = [e for e, _ in events]
    assert names[-1] == "error" and "done" not in names
    assert names.count("token") == 3
    assert events[-1][1]["code"] == "llm_failed"


def test_ollama_down_gives_an_error_event_or_503(worker, fake_ollama):
    fake_ollama.set_down(True)
    events = events_of(worker, {"prompt": "hello", "index": "corpus", "options": {"route": "direct"}})
    assert events[-1][0] == "error" and events[-1][1]["code"] in {"llm_unavailable", "llm_failed"}
    resp = chat(worker, {"prompt": "hello", "index": "corpus", "options": {"route": "direct"}})
    assert resp.status_code == 503 and resp.json()["code"] in {"llm_unavailable", "llm_failed"}


def test_keepalive_comments_flow_while_the_model_is_slow(worker, fake_ollama):
    fake_ollama.token_delay_s = 1.3  # worker runs with SSE_KEEPALIVE_S=1
    fake_ollama.replies.append("one two three")
    status, events = post_events(
        worker.url + "/chat_stream", {"prompt": "hi", "index": "corpus", "options": {"route": "direct"}}
    )
    assert status == 200
    assert (":", "keepalive") in events
    assert events[-1][0] == "done"


def test_client_disconnect_stops_generation(worker, fake_ollama):
    fake_ollama.token_delay_s = 0.05
    fake_ollama.replies.append(" ".join(f"word{i}" for i in range(400)))
    body = {"prompt": "hi", "index": "corpus", "options": {"route": "direct"}}
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", worker.url + "/chat_stream", json=body) as r,
    ):
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("event: token")
            if seen >= 5:
                break
    import time

    time.sleep(2.0)
    entry = [r for r in fake_ollama.requests if r["path"] == "/api/chat"][-1]
    assert entry["finished"] is False
    assert entry["pieces_sent"] < 200, "the worker kept the model generating for a client that had left"


def test_create_title(worker, fake_ollama):
    fake_ollama.replies.append("Duck diets")
    resp = httpx.post(worker.url + "/create_title", json={"question": "What do ducks eat?"})
    assert resp.status_code == 200 and resp.json() == {"title": "Duck diets"}


def test_health_config_openapi(worker, fake_ollama):
    health = httpx.get(worker.url + "/health").json()
    assert health["status"] == "ok" and health["llm"]["backend"] == "ollama"
    assert health["reranker"]["model"] is None and "fusion" in health["reranker"]["note"]
    config = httpx.get(worker.url + "/config").json()
    assert config["defaults"]["top_k"] == 5 and config["settings"]["worker_api_key"] is None
    spec = httpx.get(worker.url + "/openapi.json").json()
    assert {"/chat", "/chat_stream", "/add_document", "/health"} <= spec["paths"].keys()


@pytest.mark.parametrize("mode", ["fts", "vector", "hybrid"])
def test_each_retrieval_mode_finds_the_right_passage(worker, fake_ollama, mode):
    answer = chat(
        worker,
        {
            "prompt": "How tall is the Eiffel Tower?",
            "index": "corpus",
            "options": {"mode": mode, "route": "rag"},
        },
    ).json()
    top = answer["documents"][0]
    assert top["filename"] == "eiffel.md" and "330 metres" in top["text"]
    if mode == "fts":
        assert top["fts_score"] is not None
    if mode == "vector":
        assert top["fts_score"] is None and top["vector_score"] > 0.5


def test_hyde_searches_with_an_imagined_answer(worker, fake_ollama):
    before = len(fake_ollama.requests)
    events = events_of(worker, {"prompt": "What do ducks eat?", "index": "corpus", "options": {"hyde": True}})
    assert "hyde" in [d["step"] for e, d in events if e == "step"]
    done = events[-1][1]
    assert done["flags"]["hyde"] is True and done["documents"][0]["filename"] == "ducks.md"
    prompts = [m["content"] for r in fake_ollama.requests[before:] for m in r["body"].get("messages", [])]
    assert any("passage" in p and "answer the question" in p for p in prompts)


def test_a_retry_that_drifts_off_topic_does_not_talk_the_worker_out_of_abstaining(worker, fake_ollama):
    from tests.ollama_server import default_responder

    def responder(model, messages, body):
        if "better search query" in str(messages):
            return "Ducks eat aquatic plants, small fish, insects and worms."  # on-corpus, off-question
        return default_responder(model, messages, body)

    fake_ollama.responder = responder
    events = events_of(worker, {"prompt": "What was the GDP of Mongolia in 1950?", "index": "corpus"})
    retry = [d for e, d in events if e == "step" and d["step"] == "retrying" and "method" in d]
    assert retry and retry[0]["detail"]["query"].startswith("Ducks eat")
    done = events[-1][1]
    assert done["abstained"] is True and done["documents"] == []
    assert done.get("retried_query") is None, "no passage shown came from the retry"


def test_a_retried_search_shows_its_query_and_the_answer_says_its_passages_came_from_it(worker, fake_ollama):
    from tests.ollama_server import default_responder

    def responder(model, messages, body):
        if "better search query" in str(messages):
            return "ducks eat"
        return default_responder(model, messages, body)

    fake_ollama.responder = responder
    # Full-text search finds no word of the question in the animals: only the retry's query finds the ducks.
    body = {
        "prompt": "What does a waterfowl have for dinner?",
        "index": "corpus",
        "datasets": ["animals"],
        "options": {"mode": "fts", "route": "rag"},
    }
    events = events_of(worker, body)
    done = events[-1][1]
    assert done["abstained"] is False and done["documents"][0]["filename"] == "ducks.md"
    retry = [d for e, d in events if e == "step" and d["step"] == "retrying"]
    shown = [d for d in retry if "ducks eat" in d["label"]]
    assert shown and shown[0]["detail"]["query"] == "ducks eat", "the stream says what it searched again for"
    assert "ducks eat" in retry[-1]["label"], (
        "the stage's outcome, the line a client keeps, names the query too"
    )
    assert retry[-1]["detail"]["used"] is True
    assert done["retried_query"] == "ducks eat", "the answer says which query its passages came from"
    assert done["rewritten"] is None, "the question itself was not rewritten"
    assert done["question"] == "What does a waterfowl have for dinner?"


def test_a_model_the_request_chose_that_ollama_lacks_is_a_404_naming_the_option(worker, fake_ollama):
    body = {"prompt": "hello", "index": "corpus", "options": {"route": "direct", "model": "no-such-model:1b"}}
    resp = chat(worker, body)
    assert resp.status_code == 404, resp.text
    error = resp.json()
    assert error["code"] == "model_not_found"
    assert "options.model" in error["error"] and "no-such-model:1b" in error["error"]
    events = events_of(worker, body)
    assert events[-1][0] == "error" and events[-1][1]["code"] == "model_not_found"
