"""The worker as an OpenAI-compatible RAG model, driven by the real `openai` SDK against the running worker."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from tests.ollama_server import OLLAMA_ENV
from tests.servers import worker_process

KEY = "openai-compat-key"


@pytest.fixture
def client(worker):
    with openai.OpenAI(base_url=worker.url + "/v1", api_key="unused-when-open", max_retries=0) as c:
        yield c


def extension(obj) -> dict:
    return obj.model_extra["rag"]


def chat_calls(fake) -> list[dict]:
    return [r for r in fake.requests if r["path"] == "/api/chat"]


def test_models_lists_each_index_and_direct(client):
    ids = [m.id for m in client.models.list()]
    assert "direct" in ids and "rag/corpus" in ids
    assert client.models.retrieve("rag/corpus").id == "rag/corpus"


def test_plain_completion_over_an_index_cites_and_lists_sources(client, fake_ollama):
    resp = client.chat.completions.create(
        model="rag/corpus", messages=[{"role": "user", "content": "What do ducks eat?"}]
    )
    choice = resp.choices[0]
    text = choice.message.content
    assert choice.finish_reason == "stop" and resp.model == "rag/corpus"
    assert "aquatic plants" in text and "[S1]" in text
    assert text.rstrip().endswith("[S1] ducks.md"), text
    rag = extension(resp)
    assert rag["documents"][0]["filename"] == "ducks.md" and rag["citations"][0]["ref"] == "S1"
    assert rag["abstained"] is False and rag["route"] == "rag"
    assert {"retrieving", "generating"} <= {s["step"] for s in rag["steps"]}
    assert text.startswith(rag["reply"])


def test_streamed_completion_ends_with_the_structured_answer(client, fake_ollama):
    stream = client.chat.completions.create(
        model="rag/corpus",
        messages=[{"role": "user", "content": "How tall is the Eiffel Tower?"}],
        stream=True,
    )
    received = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in received)
    assert received[0].choices[0].delta.role == "assistant"
    assert received[-1].choices[0].finish_reason == "stop"
    assert all(c.choices[0].finish_reason is None for c in received[:-1])
    assert len(received) > 4, "the answer arrives piece by piece"
    rag = extension(received[-1])
    assert rag["documents"][0]["filename"] == "eiffel.md" and "330 metres" in rag["reply"]
    assert "330 metres" in text and text.rstrip().endswith("[S1] eiffel.md")
    assert [s["step"] for s in rag["steps"]].count("generating") == 1


def test_two_turns_send_the_history_and_the_follow_up_is_rewritten(client, fake_ollama):
    first = client.chat.completions.create(
        model="rag/corpus", messages=[{"role": "user", "content": "What do ducks eat?"}]
    )
    messages = [
        {"role": "user", "content": "What do ducks eat?"},
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And what is a male one called?"},
    ]
    fake_ollama.requests.clear()
    second = client.chat.completions.create(model="rag/corpus", messages=messages)
    rag = extension(second)
    assert [m["role"] for m in rag["history"]][:3] == ["user", "assistant", "user"]
    assert rag["history"][1]["content"] == first.choices[0].message.content.split("\n\nSources:")[0]
    generation = chat_calls(fake_ollama)[-1]["body"]["messages"]
    assert any(m["content"] == "What do ducks eat?" for m in generation), "the model saw the first turn"
    assert not any("Sources:\n[S" in m["content"] for m in generation if m["role"] == "assistant")
    assert any(s["step"] == "rewriting" for s in rag["steps"])


def test_temperature_max_tokens_and_stop_are_honoured(client, fake_ollama):
    fake_ollama.replies.append("alpha beta gamma STOP delta epsilon")
    resp = client.chat.completions.create(
        model="direct",
        messages=[{"role": "user", "content": "say some words"}],
        temperature=0.3,
        max_tokens=77,
        stop=["STOP"],
    )
    assert resp.choices[0].message.content == "alpha beta gamma"
    options = chat_calls(fake_ollama)[-1]["body"]["options"]
    assert options["temperature"] == 0.3 and options["num_predict"] == 77
    assert extension(resp)["route"] == "direct" and extension(resp)["documents"] == []


def test_a_stop_sequence_split_across_tokens_still_stops_the_stream(client, fake_ollama):
    fake_ollama.replies.append("one two three four five")
    stream = client.chat.completions.create(
        model="direct", messages=[{"role": "user", "content": "count"}], stop="ee fo", stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream)
    assert text == "one two thr"


def test_extra_body_carries_datasets_docs_and_options(client, fake_ollama):
    resp = client.chat.completions.create(
        model="rag/corpus",
        messages=[{"role": "user", "content": "What do ducks eat?"}],
        extra_body={"datasets": ["places"], "options": {"route": "rag", "top_k": 1, "rewrite": False}},
    )
    rag = extension(resp)
    assert rag["documents"] == [] or {d["dataset"] for d in rag["documents"]} == {"places"}
    assert len(rag["documents"]) <= 1
    first = client.chat.completions.create(
        model="rag/corpus", messages=[{"role": "user", "content": "How tall is the Eiffel Tower?"}]
    )
    docs = extension(first)["documents"]
    follow = client.chat.completions.create(
        model="rag/corpus",
        messages=[
            {"role": "user", "content": "How tall is the Eiffel Tower?"},
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "And when was it completed?"},
        ],
        extra_body={"docs": docs},
    )
    steps = [s["step"] for s in extension(follow)["steps"]]
    assert "fetch_check" in steps, "sent docs are considered for reuse"


def test_unknown_models_are_404_in_openai_shape(client, worker):
    for model in ("rag/no_such_index", "gpt-4o", "rag/../../etc"):
        with pytest.raises(openai.NotFoundError) as caught:
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
        assert caught.value.status_code == 404 and caught.value.code == "model_not_found"
        assert caught.value.body["type"] == "invalid_request_error" and caught.value.body["param"] == "model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("rag/no_such_index")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "direct", "messages": []}, "messages"),
        ({"model": "direct"}, "messages"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
        ({"model": "direct", "messages": [{"role": "assistant", "content": "hi"}]}, "messages"),
        ({"model": "direct", "messages": [{"role": "system", "content": "be brief"}]}, "messages"),
        ({"model": "direct", "messages": [{"role": "user", "content": "   "}]}, "messages"),
        ({"model": "direct", "messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
        ({"model": "direct", "messages": [{"role": "user", "content": 42}]}, "messages.0.content.str"),
        (
            {
                "model": "direct",
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
            },
            "messages",
        ),
        ({"model": "direct", "messages": [{"role": "user", "content": "hi"}], "n": 2}, "n"),
        (
            {"model": "direct", "messages": [{"role": "user", "content": "hi"}], "temperature": 9},
            "temperature",
        ),
        ({"model": "direct", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
        ({"model": "direct", "messages": [{"role": "user", "content": "hi"}], "stop": ["a"] * 5}, "stop"),
        ({"model": "direct", "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, "stream"),
        (
            {"model": "rag/corpus", "messages": [{"role": "user", "content": "hi"}], "datasets": ["../x"]},
            "datasets",
        ),
        ({"model": "x" * 5000, "messages": [{"role": "user", "content": "hi"}]}, "model"),
    ],
)
def test_malformed_requests_are_400_in_openai_shape(worker, body, param):
    resp = httpx.post(worker.url + "/v1/chat/completions", json=body)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] is not None and error["param"].startswith(param.split(".")[0]), error


def test_oversized_and_non_json_bodies_are_refused_in_openai_shape(worker):
    history = [{"role": "user", "content": "x"}] * 300 + [{"role": "user", "content": "hi"}]
    resp = httpx.post(worker.url + "/v1/chat/completions", json={"model": "direct", "messages": history})
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "too_large"
    json_type = {"Content-Type": "application/json"}
    resp = httpx.post(
        worker.url + "/v1/chat/completions", content=b"{not json", headers=json_type, timeout=30
    )
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "bad_json"
    # Without a JSON content type (what a cross-site form post sends) the body is not read at all.
    resp = httpx.post(worker.url + "/v1/chat/completions", content=b"{not json", timeout=30)
    assert resp.status_code == 415 and resp.json()["error"]["code"] == "json_required"
    resp = httpx.get(worker.url + "/v1/chat/completions")
    assert resp.status_code == 405 and "error" in resp.json() and "message" in resp.json()["error"]
    resp = httpx.get(worker.url + "/v1/nothing/here")
    assert resp.status_code == 404 and resp.json()["error"]["type"] == "invalid_request_error"


def test_a_model_failure_mid_stream_reaches_the_sdk_as_an_error(client, fake_ollama):
    fake_ollama.error_after_tokens = 2
    stream = client.chat.completions.create(
        model="direct", messages=[{"role": "user", "content": "tell me a long story"}], stream=True
    )
    with pytest.raises(openai.APIError) as caught:
        list(stream)
    assert "Ollama" in str(caught.value)


def test_a_cancelled_stream_cancels_the_model_call(client, fake_ollama):
    fake_ollama.token_delay_s = 0.05
    fake_ollama.replies.append(" ".join(f"word{i}" for i in range(2000)))
    fake_ollama.requests.clear()
    stream = client.chat.completions.create(
        model="direct", messages=[{"role": "user", "content": "talk for a long time"}], stream=True
    )
    seen = 0
    for chunk in stream:
        seen += bool(chunk.choices[0].delta.content)
        if seen >= 5:
            break
    stream.close()
    deadline = time.monotonic() + 90  # generous: on a loaded machine, noticing may take a while
    entry = chat_calls(fake_ollama)[-1]
    while not (entry["aborted"] or entry["finished"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert entry["aborted"] and not entry["finished"], "the model kept generating for a client that had left"


@pytest.fixture(scope="module")
def locked_worker(corpus_root, fake_ollama_server):
    proc = worker_process(
        corpus_root, env={"OLLAMA_HOST": fake_ollama_server.url, "WORKER_API_KEY": KEY, **OLLAMA_ENV}
    )
    with proc:
        yield proc


def test_the_worker_api_key_is_the_openai_api_key(locked_worker, fake_ollama):
    with openai.OpenAI(base_url=locked_worker.url + "/v1", api_key="wrong", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError) as caught:
            bad.models.list()
        assert caught.value.status_code == 401 and caught.value.code == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            bad.chat.completions.create(model="direct", messages=[{"role": "user", "content": "hi"}])
    with openai.OpenAI(base_url=locked_worker.url + "/v1", api_key=KEY, max_retries=0) as good:
        assert "rag/corpus" in [m.id for m in good.models.list()]
        resp = good.chat.completions.create(model="direct", messages=[{"role": "user", "content": "hi"}])
        assert resp.choices[0].message.content
