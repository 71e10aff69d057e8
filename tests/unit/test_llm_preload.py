"""The embedded model is loaded when a worker process starts, before it serves, when it is the model that would
answer (LOCAL_PRELOAD): llama.cpp holds the GIL while it loads, which froze every stream of the process at its
first embedded turn (about 2.7 s for the 1.5B model). Run for real on SmolLM2 (it loads in about a second)."""

from __future__ import annotations

import pytest

from rag_worker.pipeline.generate import warm_messages
from rag_worker.services import Services
from rag_worker.settings import Settings
from tests.ollama_server import MODELS, FakeOllama
from tests.servers import free_port


def services(tmp_path, **env) -> Services:
    return Services(
        Settings(
            INDEX_STORE=str(tmp_path / "index_store"),
            EMBEDDED_MODEL="smollm2",
            MODEL_CACHE_DIR=str(tmp_path / "models"),
            **env,
        )
    )


def test_with_no_ollama_the_embedded_model_is_loaded_and_warmed_before_the_first_turn(tmp_path):
    s = services(tmp_path, LLM_BACKEND="auto", OLLAMA_HOST=f"http://127.0.0.1:{free_port()}")
    assert s.llm.health()["local"]["loaded"] is False
    s.preload_llm()
    local = s.llm.health()["local"]
    assert local["loaded"] is True and "error" not in local
    # The warm-up was its one call so far, and a turn now starts at generating (nothing left to load).
    assert local["generating"] == {"slots": 2, "busy": 0, "waiting": 0}


def test_nothing_is_loaded_when_ollama_answers_or_when_preloading_is_off(tmp_path):
    with FakeOllama() as fake:
        s = services(
            tmp_path,
            LLM_BACKEND="auto",
            OLLAMA_HOST=fake.url,
            GENERATION_MODEL=MODELS[0],
            UTILITY_MODEL=MODELS[1],
        )
        s.preload_llm()
        assert s.llm.health()["backend"] == "ollama" and s.llm.health()["local"]["loaded"] is False
    off = services(tmp_path, LLM_BACKEND="local", LOCAL_PRELOAD="false")
    off.preload_llm()
    assert off.llm.local.loaded is False


def test_a_model_still_to_be_assembled_is_left_to_its_first_turn(tmp_path):
    # The Qwen copy is assembled from its parts once (1.1 GB, tens of seconds): never while a process starts.
    s = Services(
        Settings(
            INDEX_STORE=str(tmp_path / "index_store"),
            LLM_BACKEND="local",
            EMBEDDED_MODEL="qwen2.5-1.5b",
            MODEL_CACHE_DIR=str(tmp_path / "empty-cache"),
        )
    )
    local = s.llm.local
    if local.choice.model is None or local.choice.model.key != "qwen2.5-1.5b":
        pytest.skip("the Qwen2.5-1.5B part packages are not installed (bash scripts/setup.sh installs them)")
    s.preload_llm()
    assert local.loaded is False and not (tmp_path / "empty-cache").exists()


def test_the_warm_up_is_the_start_every_answer_shares():
    from rag_worker.pipeline.prompts import text_in

    head = warm_messages("en")[0]["content"]
    # What a turn's system message begins with (generate.llm_messages: instructions, then the sources message).
    assert head == f"{text_in('system', 'en')}\n\n{text_in('sources', 'en')}"
    assert "Answer in English" in head
