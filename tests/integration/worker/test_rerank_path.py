"""The cross-encoder path end to end: RERANKER_MODEL set, the turn reranks and measures provenance with it.

The model is a tiny random one built on disk (no weights ship in any package here, docs/design/MODELS.md), so
its order means nothing; what is checked is that the worker really runs it and reports it.
"""

from __future__ import annotations

import httpx
import pytest

from tests.ollama_server import OLLAMA_ENV
from tests.servers import worker_process
from tests.sse import post_events
from tests.tiny_models import build_cross_encoder


@pytest.fixture(scope="module")
def reranking_worker(corpus_root, fake_ollama_server, tmp_path_factory):
    model = build_cross_encoder(tmp_path_factory.mktemp("ce") / "tiny-cross-encoder")
    env = {"OLLAMA_HOST": fake_ollama_server.url, "RERANKER_MODEL": str(model), **OLLAMA_ENV}
    with worker_process(corpus_root, env=env) as proc:
        yield proc


def test_a_configured_reranker_scores_every_document_and_says_so(reranking_worker, fake_ollama):
    health = httpx.get(reranking_worker.url + "/health").json()
    assert health["reranker"]["model"].endswith("tiny-cross-encoder")
    status, events = post_events(
        reranking_worker.url + "/chat_stream", {"prompt": "What do ducks eat?", "index": "corpus"}
    )
    assert status == 200
    steps = [d["step"] for e, d in events if e == "step"]
    assert "reranking" in steps
    done = events[-1][1]
    assert done["documents"] and all(isinstance(d["rerank_score"], float) for d in done["documents"])
    scores = [d["rerank_score"] for d in done["documents"]]
    assert scores == sorted(scores, reverse=True), "documents are in the cross-encoder's order"
    assert done["flags"]["provenance_method"] == "rerank"


def test_rerank_can_be_switched_off_per_request(reranking_worker, fake_ollama):
    answer = httpx.post(
        reranking_worker.url + "/chat",
        timeout=120,
        json={
            "prompt": "What do ducks eat?",
            "index": "corpus",
            "options": {"rerank": False, "provenance": "similarity"},
        },
    ).json()
    assert all(d["rerank_score"] is None for d in answer["documents"])
    assert answer["flags"]["provenance_method"] == "similarity"


@pytest.fixture(scope="module")
def broken_reranker_worker(corpus_root, fake_ollama_server, tmp_path_factory):
    missing = tmp_path_factory.mktemp("ce") / "no-such-cross-encoder"
    env = {"OLLAMA_HOST": fake_ollama_server.url, "RERANKER_MODEL": str(missing), **OLLAMA_ENV}
    with worker_process(corpus_root, env=env) as proc:
        yield proc


def assert_reranker_degraded(url: str) -> None:
    resp = httpx.get(url + "/health")
    assert resp.status_code == 200, resp.text  # the worker answers turns, in the fusion's order
    health = resp.json()
    assert health["status"] == "degraded" and health["degraded"] == ["reranker"]
    assert health["reranker"]["ok"] is False and "no-such-cross-encoder" in health["reranker"]["error"]


def test_a_broken_reranker_is_skipped_with_a_warning_and_health_says_so(broken_reranker_worker, fake_ollama):
    url = broken_reranker_worker.url
    assert_reranker_degraded(url)  # before any turn has tried to load it
    status, events = post_events(url + "/chat_stream", {"prompt": "What do ducks eat?", "index": "corpus"})
    assert status == 200 and events[-1][0] == "done", events[-1]
    done = events[-1][1]
    assert done["reply"] and done["documents"]
    assert all(d["rerank_score"] is None for d in done["documents"])
    skipped = [d for e, d in events if e == "step" and d["step"] == "reranking"]
    assert len(skipped) == 1 and skipped[0]["method"] == "skipped" and "skipped" in skipped[0]["label"]
    assert "no-such-cross-encoder" in skipped[0]["detail"]["reason"]
    assert done["flags"]["provenance_method"] == "similarity"
    answer = httpx.post(url + "/chat", json={"prompt": "What do ducks eat?", "index": "corpus"}, timeout=120)
    assert answer.status_code == 200, answer.text
    assert_reranker_degraded(url)  # and after
