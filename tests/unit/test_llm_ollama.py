"""OllamaBackend against the protocol-faithful fake: replies, streaming, cancellation, failures."""

from __future__ import annotations

import time

import pytest

from rag_worker.errors import LLMUnavailable
from rag_worker.llm import CancelToken, OllamaBackend, ThinkFilter, strip_think
from rag_worker.settings import Settings
from tests.ollama_server import FakeOllama

ASK = [{"role": "user", "content": "tell me something"}]
LONG = " ".join(f"word{i}" for i in range(60))


@pytest.fixture
def fake():
    with FakeOllama(models=["qwen3:8b", "qwen3:0.6b"]) as server:
        yield server


def backend_for(fake: FakeOllama) -> OllamaBackend:
    return OllamaBackend(Settings(OLLAMA_HOST=fake.url, LLM_TIMEOUT_S=10))


def test_chat_returns_the_reply_and_passes_options(fake):
    fake.replies.append("Paris.")
    reply = backend_for(fake).chat(ASK, model="qwen3:8b", temperature=0.2, max_tokens=64)
    assert reply == "Paris."
    body = fake.requests[-1]["body"]
    assert body["stream"] is False and body["messages"] == ASK
    assert body["options"]["temperature"] == 0.2 and body["options"]["num_predict"] == 64
    assert "think" not in body


def test_stream_yields_the_reply_piece_by_piece(fake):
    pieces = list(backend_for(fake).stream(ASK, model="qwen3:8b"))
    assert len(pieces) > 5
    assert "".join(pieces) == "Hello! I am a test model. You said: tell me something"
    assert fake.requests[-1]["body"]["stream"] is True


def test_closing_the_stream_stops_ollama_early(fake):
    fake.token_delay_s = 0.02
    fake.replies.append(LONG)
    stream = backend_for(fake).stream(ASK, model="qwen3:8b")
    got = [next(stream) for _ in range(3)]
    stream.close()
    time.sleep(0.5)  # let the server notice the closed connection
    entry = fake.requests[-1]
    assert got == ["word0 ", "word1 ", "word2 "]
    assert not entry["finished"] and entry["pieces_sent"] < 15


def test_cancel_token_stops_the_stream(fake):
    fake.token_delay_s = 0.02
    fake.replies.append(LONG)
    cancel = CancelToken()
    got = []
    for piece in backend_for(fake).stream(ASK, model="qwen3:8b", cancel=cancel):
        got.append(piece)
        if len(got) == 4:
            cancel.cancel()
    time.sleep(0.5)
    assert len(got) == 4
    assert not fake.requests[-1]["finished"] and fake.requests[-1]["pieces_sent"] < 15


def test_think_blocks_are_stripped_in_chat_and_stream(fake):
    reply = "<think>\nThe user wants a city. Paris.\n</think>\n\nThe capital is Paris."
    fake.replies.extend([reply, reply])
    backend = backend_for(fake)
    assert backend.chat(ASK, model="qwen3:8b") == "The capital is Paris."
    streamed = list(backend.stream(ASK, model="qwen3:8b"))
    assert "".join(streamed) == "The capital is Paris."


@pytest.mark.parametrize("cut", range(1, 12))
def test_think_filter_handles_tags_split_across_pieces(cut):
    text = "<think>plan</think>\n\nAnswer <b>bold</b> done"
    f = ThinkFilter()
    out = "".join(f.feed(text[i : i + cut]) for i in range(0, len(text), cut)) + f.flush()
    assert out == "Answer <b>bold</b> done"


def test_strip_think_leaves_plain_text_alone_and_drops_an_unclosed_block():
    assert strip_think("no thinking here") == "no thinking here"
    assert strip_think("<think>ran out of tokens") == ""


def test_unknown_model_says_how_to_pull_it(fake):
    backend = backend_for(fake)
    for call in (
        lambda: backend.chat(ASK, model="llama3.2"),
        lambda: list(backend.stream(ASK, model="llama3.2")),
    ):
        with pytest.raises(LLMUnavailable) as err:
            call()
        assert err.value.status == 503 and err.value.code == "llm_unavailable"
        assert "run: ollama pull llama3.2" in err.value.message


def test_unreachable_ollama_is_llm_unavailable(fake):
    backend = backend_for(fake)
    fake.set_down(True)
    for call in (
        lambda: backend.chat(ASK, model="qwen3:8b"),
        lambda: list(backend.stream(ASK, model="qwen3:8b")),
    ):
        with pytest.raises(LLMUnavailable) as err:
            call()
        assert err.value.code == "llm_unavailable"
        assert f"Ollama not reachable at {fake.url}" in err.value.message
    health = backend.health()
    assert health["reachable"] is False and health["error"]


def test_ollama_dying_mid_stream_is_llm_failed_after_the_pieces_already_sent(fake):
    fake.fail_after_tokens = 3
    got = []
    with pytest.raises(LLMUnavailable) as err:
        for piece in backend_for(fake).stream(ASK, model="qwen3:8b"):
            got.append(piece)
    assert len(got) == 3
    assert err.value.code == "llm_failed" and err.value.status == 503


def test_an_error_line_mid_stream_is_llm_failed(fake):
    fake.error_after_tokens = 2
    with pytest.raises(LLMUnavailable) as err:
        list(backend_for(fake).stream(ASK, model="qwen3:8b"))
    assert err.value.code == "llm_failed" and "error was encountered" in err.value.message


def test_health_lists_the_pulled_models(fake):
    assert backend_for(fake).health() == {
        "host": fake.url,
        "reachable": True,
        "models": ["qwen3:8b", "qwen3:0.6b"],
    }
