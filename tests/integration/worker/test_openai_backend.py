"""LLM_BACKEND=openai end to end: the real worker generating through an OpenAI-compatible server (the fake)."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from tests.openai_server import FakeOpenAI
from tests.servers import worker_process


@pytest.fixture(scope="module")
def model_server():
    with FakeOpenAI(models=["served-8b", "served-small"], api_key="model-key") as fake:
        yield fake


@pytest.fixture(scope="module")
def openai_worker(corpus_root, model_server):
    env = {
        "LLM_BACKEND": "openai",
        "OPENAI_BASE_URL": model_server.base_url,
        "OPENAI_API_KEY": "model-key",
        "GENERATION_MODEL": "served-8b",
        "UTILITY_MODEL": "served-small",
    }
    with worker_process(corpus_root, env=env) as proc:
        yield proc


@pytest.fixture
def server(model_server):
    yield model_server
    model_server.reset()


def test_health_names_the_server_and_its_models(openai_worker, server):
    body = httpx.get(openai_worker.url + "/health").json()
    llm = body["llm"]
    assert body["status"] == "ok" and llm["backend"] == "openai" and llm["ok"] is True
    assert llm["generation_model"] == "served-8b" and llm["utility_model"] == "served-small"
    assert llm["openai"]["base_url"] == server.base_url and llm["openai"]["reachable"] is True
    config = httpx.get(openai_worker.url + "/config").json()["settings"]
    assert config["openai_api_key"] == "***", "the key is never shown"


def test_a_turn_is_generated_by_the_server_with_citations(openai_worker, server):
    answer = httpx.post(
        openai_worker.url + "/chat", json={"prompt": "What do ducks eat?", "index": "corpus"}, timeout=120
    ).json()
    assert answer["llm_backend"] == "openai" and answer["model"] == "served-8b"
    assert "aquatic plants" in answer["reply"] and answer["citations"][0]["ref"] == "S1"
    generation = [r for r in server.requests if r["body"].get("stream")][-1]["body"]
    assert generation["model"] == "served-8b" and "[S1]" in generation["messages"][0]["content"]


def test_openai_in_and_out_with_a_cancelled_stream(openai_worker, server):
    server.token_delay_s = 0.05
    server.replies.append(" ".join(f"word{i}" for i in range(2000)))
    with openai.OpenAI(base_url=openai_worker.url + "/v1", api_key="x", max_retries=0) as client:
        stream = client.chat.completions.create(
            model="direct", messages=[{"role": "user", "content": "talk"}], stream=True
        )
        seen = 0
        for chunk in stream:
            seen += bool(chunk.choices[0].delta.content)
            if seen >= 5:
                break
        stream.close()
    entry = [r for r in server.requests if r["body"].get("stream")][-1]
    deadline = time.monotonic() + 90
    while not (entry["aborted"] or entry["finished"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert entry["aborted"] and not entry["finished"], "the worker kept the server generating"


def test_a_server_that_is_gone_is_a_503_that_says_so(corpus_root):
    from tests.servers import free_port

    env = {"LLM_BACKEND": "openai", "OPENAI_BASE_URL": f"http://127.0.0.1:{free_port()}/v1"}
    with worker_process(corpus_root, env=env) as proc:
        health = httpx.get(proc.url + "/health")
        assert health.status_code == 503 and "not reachable" in health.json()["llm"]["reason"]
        resp = httpx.post(
            proc.url + "/chat",
            json={"prompt": "hi", "index": "corpus", "options": {"route": "direct"}},
            timeout=60,
        )
        assert resp.status_code == 503 and "not reachable" in resp.json()["error"]
