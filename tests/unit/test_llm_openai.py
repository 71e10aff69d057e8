"""OpenAIBackend (LLM_BACKEND=openai) against the protocol-faithful fake: replies, streaming, cancellation,
timeouts, failures, and how the router and health report it."""

from __future__ import annotations

import time

import pytest

from rag_worker.errors import LLMUnavailable
from rag_worker.llm import CancelToken, LLMRouter, OpenAIBackend
from rag_worker.settings import Settings
from tests.openai_server import FakeOpenAI
from tests.servers import free_port

ASK = [{"role": "user", "content": "tell me something"}]
LONG = " ".join(f"word{i}" for i in range(3000))


@pytest.fixture
def fake():
    with FakeOpenAI(models=["qwen3:8b", "qwen3:0.6b"], api_key="k") as server:
        yield server


def settings_for(fake: FakeOpenAI | None, **extra) -> Settings:
    base = {
        "LLM_BACKEND": "openai",
        "OPENAI_BASE_URL": fake.base_url if fake else f"http://127.0.0.1:{free_port()}/v1",
        "OPENAI_API_KEY": "k",
        "LLM_TIMEOUT_S": 10,
    }
    return Settings(**{**base, **extra})


def wait_for(entry: dict, deadline_s: float = 30) -> None:
    deadline = time.monotonic() + deadline_s
    while not (entry["aborted"] or entry["finished"]) and time.monotonic() < deadline:
        time.sleep(0.05)


def test_chat_passes_options_and_strips_thinking(fake):
    fake.replies.append("<think>hmm, Paris I guess</think>\n\nParis.")
    reply = OpenAIBackend(settings_for(fake)).chat(ASK, model="qwen3:8b", temperature=0.2, max_tokens=64)
    assert reply == "Paris."
    body = fake.requests[-1]["body"]
    assert body["messages"] == ASK and body["temperature"] == 0.2 and body["max_tokens"] == 64
    assert body["stream"] is False


def test_stream_yields_the_reply_piece_by_piece(fake):
    pieces = list(OpenAIBackend(settings_for(fake)).stream(ASK, model="qwen3:8b"))
    assert len(pieces) > 5 and "".join(pieces) == "Hello! I am a test model. You said: tell me something"


def test_closing_the_stream_stops_the_server(fake):
    fake.token_delay_s = 0.02
    fake.replies.append(LONG)
    stream = OpenAIBackend(settings_for(fake)).stream(ASK, model="qwen3:8b")
    got = [next(stream) for _ in range(3)]
    stream.close()
    entry = fake.requests[-1]
    wait_for(entry)
    assert got == ["word0 ", "word1 ", "word2 "] and entry["aborted"] and not entry["finished"]


def test_the_cancel_token_stops_the_stream(fake):
    fake.token_delay_s = 0.02
    fake.replies.append(LONG)
    cancel = CancelToken()
    got = []
    for piece in OpenAIBackend(settings_for(fake)).stream(ASK, model="qwen3:8b", cancel=cancel):
        got.append(piece)
        if len(got) == 3:
            cancel.cancel()
    entry = fake.requests[-1]
    wait_for(entry)
    assert len(got) == 3 and entry["aborted"] and not entry["finished"]


def test_a_server_slower_than_the_timeout_is_a_clear_503(fake):
    fake.response_delay_s = 3
    backend = OpenAIBackend(settings_for(fake, LLM_TIMEOUT_S=0.3))
    with pytest.raises(LLMUnavailable) as caught:
        list(backend.stream(ASK, model="qwen3:8b"))
    assert caught.value.status == 503 and "LLM_TIMEOUT_S" in caught.value.message


def test_failures_say_what_to_fix(fake):
    with pytest.raises(LLMUnavailable) as caught:
        OpenAIBackend(settings_for(None)).chat(ASK, model="qwen3:8b")
    assert "not reachable" in caught.value.message and caught.value.code == "llm_unavailable"
    with pytest.raises(LLMUnavailable) as caught:
        OpenAIBackend(settings_for(fake, OPENAI_API_KEY="wrong")).chat(ASK, model="qwen3:8b")
    assert "OPENAI_API_KEY" in caught.value.message
    with pytest.raises(LLMUnavailable) as caught:
        list(OpenAIBackend(settings_for(fake)).stream(ASK, model="llama-nothing"))
    assert "'llama-nothing' is not served" in caught.value.message
    fake.error_after_tokens = 2
    with pytest.raises(LLMUnavailable) as caught:
        list(OpenAIBackend(settings_for(fake)).stream(ASK, model="qwen3:8b"))
    assert caught.value.code == "llm_failed"
    with pytest.raises(LLMUnavailable) as caught:
        OpenAIBackend(settings_for(fake, OPENAI_BASE_URL="")).chat(ASK, model="qwen3:8b")
    assert "OPENAI_BASE_URL" in caught.value.message


def test_the_router_uses_the_server_and_health_reports_it(fake):
    router = LLMRouter(settings_for(fake, GENERATION_MODEL="qwen3:8b", UTILITY_MODEL="tiny:1b"))
    resolved = router.resolve()
    assert resolved.backend.backend == "openai" and resolved.generation_model == "qwen3:8b"
    assert resolved.utility_model == "qwen3:8b", (
        "an unserved utility model falls back to the generation model"
    )
    health = router.health()
    assert health["ok"] is True and health["backend"] == "openai"
    assert health["openai"] == {
        "base_url": fake.base_url,
        "reachable": True,
        "models": ["qwen3:8b", "qwen3:0.6b"],
    }
    down = LLMRouter(settings_for(None)).health()
    assert down["ok"] is False and "not reachable" in down["reason"]
    missing = LLMRouter(settings_for(fake, GENERATION_MODEL="big:70b")).health()
    assert missing["ok"] is False and "'big:70b' is not served" in missing["reason"]


def test_auto_keeps_preferring_ollama_then_the_embedded_model(fake):
    router = LLMRouter(
        Settings(
            LLM_BACKEND="auto",
            OPENAI_BASE_URL=fake.base_url,
            OLLAMA_HOST=f"http://127.0.0.1:{free_port()}",
        )
    )
    assert router.openai is None
    assert router.resolve().backend.backend == "local"
    assert fake.requests == []


def test_run_system_health_reports_the_openai_server(fake):
    from launcher.health import openai_row
    from launcher.probes import describe_llm

    row = openai_row(settings_for(fake))
    assert (row.component, row.state, row.healthy) == ("openai", "ok", True)
    down = openai_row(settings_for(None))
    assert (down.state, down.healthy) == ("down", False)
    missing = openai_row(settings_for(fake, GENERATION_MODEL="big:70b"))
    assert missing.state == "degraded" and "does not serve big:70b" in missing.detail
    line = describe_llm(LLMRouter(settings_for(fake)).health())
    assert line.startswith("OpenAI-compatible server, model qwen3:8b at " + fake.base_url)
