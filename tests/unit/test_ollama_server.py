"""The fake Ollama server speaks the protocol the real `ollama` client expects (it is the tests' only stand-in)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import httpx
import ollama
import pytest

from tests.ollama_server import FakeOllama, default_responder


@pytest.fixture
def fake():
    with FakeOllama(models=["qwen3:8b", "qwen3:0.6b", "all-minilm"]) as server:
        yield server


def test_list_show_version_and_root(fake):
    client = ollama.Client(host=fake.url)
    assert [m.model for m in client.list().models] == ["qwen3:8b", "qwen3:0.6b", "all-minilm:latest"]
    assert client.show("qwen3:8b").details.format == "gguf"
    with urllib.request.urlopen(fake.url + "/api/version") as r:
        assert "version" in json.load(r)
    with urllib.request.urlopen(fake.url + "/") as r:
        assert r.read() == b"Ollama is running"


def test_chat_without_streaming_returns_the_whole_reply_with_stats(fake):
    fake.replies.append("Paris is the capital of France.")
    response = ollama.Client(host=fake.url).chat(
        model="qwen3:8b", stream=False, messages=[{"role": "user", "content": "Capital of France?"}]
    )
    assert response.message.content == "Paris is the capital of France."
    assert response.done and response.done_reason == "stop"
    assert response.eval_count == 6 and response.total_duration > 0


def test_chat_streams_one_word_per_chunk_then_a_final_done_line(fake):
    chunks = list(
        ollama.Client(host=fake.url).chat(
            model="qwen3:8b", stream=True, messages=[{"role": "user", "content": "say hello"}]
        )
    )
    assert [c.done for c in chunks] == [False] * (len(chunks) - 1) + [True]
    text = "".join(c.message.content for c in chunks)
    assert text == "Hello! I am a test model. You said: say hello"
    assert chunks[1].message.content == "I "
    assert chunks[-1].done_reason == "stop" and chunks[-1].eval_count == len(chunks) - 1
    assert fake.requests[-1]["path"] == "/api/chat" and fake.requests[-1]["finished"]


def test_stream_is_ndjson_sent_chunked():
    # Raw HTTP: the content type and framing a non-Python client would see.
    with (
        FakeOllama(models=["qwen3:8b"]) as fake,
        httpx.stream("POST", fake.url + "/api/generate", json={"model": "qwen3:8b", "prompt": "hi"}) as r,
    ):
        assert r.headers["content-type"] == "application/x-ndjson"
        assert r.headers["transfer-encoding"] == "chunked"
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert "".join(line["response"] for line in lines) == "Hello! I am a test model. You said: hi"
    assert lines[-1]["done"] is True and lines[-1]["response"] == ""


def test_num_predict_cuts_the_reply_with_done_reason_length(fake):
    fake.replies.append("one two three four five")
    response = ollama.Client(host=fake.url).generate(
        model="qwen3:8b", prompt="count", stream=False, options={"num_predict": 2}
    )
    assert response.response == "one two " and response.done_reason == "length"


def test_unknown_model_is_a_404_that_says_to_pull_it(fake):
    with pytest.raises(ollama.ResponseError) as err:
        ollama.Client(host=fake.url).chat(model="llama3.2", messages=[{"role": "user", "content": "hi"}])
    assert err.value.status_code == 404
    assert err.value.error == 'model "llama3.2" not found, try pulling it first'


@pytest.mark.parametrize("body", [b"{not json", b'{"messages": []}', b"[1, 2]"])
def test_bad_bodies_are_400_with_an_error_field(fake, body):
    request = urllib.request.Request(fake.url + "/api/chat", data=body, method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request)
    assert err.value.code == 400
    assert json.load(err.value)["error"]


def test_dying_mid_stream_makes_the_client_raise(fake):
    fake.fail_after_tokens = 3
    received = []
    with pytest.raises(httpx.RemoteProtocolError):
        for chunk in ollama.Client(host=fake.url).chat(
            model="qwen3:8b", stream=True, messages=[{"role": "user", "content": "tell me a long story"}]
        ):
            received.append(chunk.message.content)
    assert len(received) == 3


def test_an_error_line_mid_stream_raises_response_error(fake):
    fake.error_after_tokens = 2
    with pytest.raises(ollama.ResponseError, match="error was encountered"):
        list(
            ollama.Client(host=fake.url).chat(
                model="qwen3:8b", stream=True, messages=[{"role": "user", "content": "hi"}]
            )
        )


def test_embed_gives_deterministic_unit_vectors(fake):
    client = ollama.Client(host=fake.url)
    first = client.embed(model="all-minilm", input=["the sky is blue", "grass is green"]).embeddings
    again = client.embed(model="all-minilm", input="the sky is blue").embeddings
    assert len(first) == 2 and len(first[0]) == 384
    assert first[0] == again[0] and first[0] != first[1]
    assert abs(sum(v * v for v in first[0]) - 1.0) < 1e-6


def test_ps_lists_models_that_were_used(fake):
    client = ollama.Client(host=fake.url)
    assert client.ps().models == []
    client.chat(model="qwen3:0.6b", messages=[{"role": "user", "content": "hi"}])
    assert [m.model for m in client.ps().models] == ["qwen3:0.6b"]


def test_set_down_refuses_connections_and_comes_back_on_the_same_port(fake):
    client = ollama.Client(host=fake.url)
    port = fake.port
    fake.set_down(True)
    with pytest.raises(ConnectionError):
        client.list()
    fake.set_down(False)
    assert fake.port == port
    assert len(client.list().models) == 3


def test_models_can_change_while_running(fake):
    fake.models = ["qwen3:8b"]
    assert [m.model for m in ollama.Client(host=fake.url).list().models] == ["qwen3:8b"]


def test_default_responder_behaves_like_a_small_grounded_model():
    sources = (
        "Use these sources.\n[S1] (tower.md) The Eiffel Tower is 330 metres tall. It was built in 1889.\n"
        "[S2] (fruit.md) Bananas are yellow when ripe."
    )
    ask = [{"role": "system", "content": sources}, {"role": "user", "content": "What colour are bananas?"}]
    assert default_responder("m", ask, {}) == "According to the sources, Bananas are yellow when ripe [S2]."
    check = [{"role": "user", "content": "Do the documents cover it?\nAnswer YES or NO."}]
    assert default_responder("m", check, {}) == "YES"
    rewrite = [
        {
            "role": "user",
            "content": "Rewrite the last question as a standalone question.\nQuestion: and how tall is it?",
        }
    ]
    assert default_responder("m", rewrite, {}) == "and how tall is it?"
    assert (
        default_responder("m", [{"role": "user", "content": "hi"}], {})
        == "Hello! I am a test model. You said: hi"
    )


def test_default_responder_reads_the_workers_source_layout():
    sources = (
        "Sources for the user's latest question (cite them as [S1], [S2], ...):\n\n"
        "[S1] tower.md, page 2\nThe Eiffel Tower is 330 metres tall. It was finished in 1889.\n\n"
        "[S2] fruit.md\nBananas are yellow when ripe."
    )
    messages = [
        {"role": "system", "content": "Cite sources as [S1], [S2], ..."},
        {"role": "user", "content": "How tall is the Eiffel Tower?"},
        {"role": "system", "content": sources},
    ]
    assert (
        default_responder("m", messages, {})
        == "According to the sources, The Eiffel Tower is 330 metres tall [S1]."
    )
