"""The embedded default for real: no Ollama anywhere, the worker answers with SmolLM2 through transformers."""

from __future__ import annotations

import os

import httpx
import pytest

from tests.servers import ROOT, free_port, worker_process
from tests.sse import post_events

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_worker(corpus_root):
    cache = os.environ.get("MODEL_CACHE_DIR", str(ROOT / ".cache" / "models"))
    # Nothing listens on this port: `auto` must notice and fall back to the embedded model.
    env = {"LLM_BACKEND": "auto", "OLLAMA_HOST": f"http://127.0.0.1:{free_port()}", "MODEL_CACHE_DIR": cache}
    with worker_process(corpus_root, env=env) as proc:
        yield proc


def test_auto_falls_back_to_the_embedded_model_and_says_why(local_worker):
    llm = httpx.get(local_worker.url + "/health").json()["llm"]
    assert llm["backend"] == "local" and "not reachable" in llm["reason"]


def test_embedded_model_streams_a_grounded_answer(local_worker):
    body = {
        "prompt": "How tall is the Eiffel Tower?",
        "index": "corpus",
        "options": {"max_tokens": 48, "route": "rag"},
    }
    status, events = post_events(local_worker.url + "/chat_stream", body, timeout=600)
    assert status == 200
    names = [e for e, _ in events if e != ":"]
    assert names[-1] == "done", events[-1]
    tokens = [d["token"] for e, d in events if e == "token"]
    done = events[-1][1]
    assert len(tokens) > 3 and done["model"] == "SmolLM2-135M-Instruct"
    assert done["documents"][0]["filename"] == "eiffel.md"
    assert "330" in done["reply"], done["reply"]
