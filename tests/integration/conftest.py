"""Session fixtures for integration tests: the fake Ollama and a real worker (gunicorn + gevent) on loopback."""

from __future__ import annotations

import os

import pytest

from tests.corpus import corpus_copy
from tests.ollama_server import OLLAMA_ENV, FakeOllama
from tests.servers import worker_process

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def fake_ollama_server():
    with FakeOllama() as fake:
        yield fake


@pytest.fixture
def fake_ollama(fake_ollama_server):
    """The session's fake Ollama, reset to its defaults after each test that tweaks it."""
    yield fake_ollama_server
    fake_ollama_server.reset()


@pytest.fixture(scope="session")
def corpus_root(tmp_path_factory):
    """An index store holding the test corpus in the index `corpus` (real LanceDB, real embeddings)."""
    return corpus_copy(tmp_path_factory, "worker")


@pytest.fixture(scope="session")
def worker(corpus_root, fake_ollama_server):
    """The real worker on the corpus, talking to the fake Ollama through the real `ollama` client."""
    proc = worker_process(
        corpus_root, env={"OLLAMA_HOST": fake_ollama_server.url, "SSE_KEEPALIVE_S": "1", **OLLAMA_ENV}
    )
    with proc:
        yield proc
