"""The worker's start-up preflight against a real HTTP Ollama (the fake server): what it logs is what an
operator reads in `docker compose logs worker` to find out why answers come from the embedded model."""

from __future__ import annotations

import logging

import pytest

from rag_worker.preflight import advice, probe_ollama, run_preflight
from rag_worker.settings import Settings
from tests.ollama_server import FakeOllama
from tests.servers import free_port


@pytest.fixture
def fake():
    server = FakeOllama(models=["qwen3:8b", "nomic-embed-text:latest"]).start()
    yield server
    server.stop()


def settings(**env) -> Settings:
    return Settings(
        **{"LLM_BACKEND": "auto", "GENERATION_MODEL": "qwen3:8b", "UTILITY_MODEL": "qwen3:0.6b", **env}
    )


def test_ready_when_every_configured_model_is_pulled(fake, caplog):
    caplog.set_level(logging.INFO)
    status = run_preflight(settings(OLLAMA_HOST=fake.url, UTILITY_MODEL="nomic-embed-text"))
    assert status is not None and status.ready  # an untagged name means :latest, as in Ollama
    assert "models ready: qwen3:8b, nomic-embed-text" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_missing_model_says_which_pull_to_run(fake, caplog):
    status = run_preflight(settings(OLLAMA_HOST=fake.url))
    assert status is not None and status.reachable and status.missing == ["qwen3:0.6b"]
    assert "ollama pull qwen3:0.6b" in caplog.text


def test_unreachable_ollama_in_a_container_explains_the_host_setup(caplog):
    host = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    status = probe_ollama(host, ["qwen3:8b"], timeout=1)
    assert not status.reachable and status.error
    tips = "\n".join(advice(status, "auto", container=True))
    assert "OLLAMA_HOST=0.0.0.0" in tips and "host.docker.internal:host-gateway" in tips
    assert "--profile ollama" in tips
    assert "embedded local model" in tips

    run_preflight(settings(OLLAMA_HOST=host, LLM_BACKEND="ollama"))
    assert f"Ollama not reachable at {host}" in caplog.text
    assert "chat turns fail until Ollama is reachable" in caplog.text


def test_local_backend_does_not_consult_ollama(caplog):
    caplog.set_level(logging.INFO)
    assert run_preflight(settings(LLM_BACKEND="local", OLLAMA_HOST="http://127.0.0.1:9")) is None
    assert "Ollama is not consulted" in caplog.text
