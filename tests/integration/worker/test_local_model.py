"""The embedded default for real: no Ollama anywhere, the worker answers with SmolLM2 on llama.cpp in-process."""

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
    # No turn has run yet (this module's first test), and the model is loaded: the worker process loaded it before
    # it took requests (LOCAL_PRELOAD), so no stream of it waits on llama.cpp's GIL-holding load.
    assert llm["local"]["loaded"] is True and "error" not in llm["local"]


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


def test_embedded_model_on_an_unanswerable_question_quotes_with_a_caveat_or_refuses(local_worker):
    # The corpus has the Eiffel Tower's height, place and builder, nothing on tickets: retrieval finds the passage,
    # and whatever the tiny model drafts must not reach the user as an answer (the embedded default: `extract`).
    from rag_worker.pipeline.prompts import DEFAULTS

    body = {
        "prompt": "How much does a ticket to the top of the Eiffel Tower cost?",
        "index": "corpus",
        "options": {"route": "rag"},
    }
    status, events = post_events(local_worker.url + "/chat_stream", body, timeout=900)
    assert status == 200 and events[-1][0] == "done", events[-1]
    done = events[-1][1]
    draft = "".join(d["token"] for e, d in events if e == "token")
    print(f"\ndraft: {draft!r}\nreply: {done['reply']!r}\nflags: {done['flags']}")
    assert done["documents"] and done["model"] == "SmolLM2-135M-Instruct"
    g = done["grounding"]
    assert g["policy"] == "extract" and done["flags"]["grounding"] == g["action"]
    if g["action"] == "refused":
        assert done["abstained"] is True and done["reply"] == DEFAULTS["ungrounded"]
    else:
        assert g["action"] == "extracted", (g["action"], done["reply"])
        assert done["reply"].startswith(DEFAULTS["extract_caveat"]) and "From eiffel.md:" in done["reply"]
        assert g["supported_share"] == 1.0 and g["draft"]["supported_share"] < 0.8
