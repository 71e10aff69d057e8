"""The default embedded model, Qwen2.5-Coder-1.5B on llama.cpp, run for real: a grounded answer with its citation,
Stop, and the queue of turns. Slow tier (one load per module, short answers, small prompts: it writes 5-20
tokens/s on 2 cores); skipped, saying why, when its part packages are not installed (bash scripts/setup.sh
installs them). The file is assembled into MODEL_CACHE_DIR once (set it to share the copy between runs)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from rag_worker.llm import CancelToken, LocalBackend
from rag_worker.settings import Settings
from tests.embedded_models import requires_qwen

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    requires_qwen,
]

SOURCES = (
    "You are a careful assistant. Use only the numbered sources. Cite the source after each statement as [S1]. "
    "If the sources do not contain the answer, say so.\n\nSources:\n\n[S1] eiffel.md\nThe Eiffel Tower in Paris "
    "is 330 metres tall. It was completed in 1889."
)
ESSAY = [{"role": "user", "content": "Write a long essay about the history of Europe, century by century."}]


def ask(question: str) -> list[dict]:
    return [{"role": "system", "content": SOURCES}, {"role": "user", "content": question}]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory) -> LocalBackend:
    cache = os.environ.get("MODEL_CACHE_DIR") or str(tmp_path_factory.mktemp("models"))
    backend = LocalBackend(Settings(EMBEDDED_MODEL="qwen2.5-1.5b", LOCAL_N_CTX=1024, MODEL_CACHE_DIR=cache))
    backend.ensure_loaded()
    return backend


def wait_until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_answers_from_its_source_with_a_citation(qwen):
    # (Asked what the source does not say, e.g. a ticket's price, it may still invent an answer with a citation:
    # the grounding check is what catches that; docs/benchmarks.md, "Embedded models".)
    assert qwen.health()["embedded_model"] == "qwen2.5-1.5b" and Path(qwen.model_path).stat().st_size > 10**9
    pieces = list(qwen.stream(ask("How tall is the Eiffel Tower?"), model=qwen.name, max_tokens=32))
    answer = "".join(pieces)
    assert len(pieces) > 3 and "330" in answer and "[S1]" in answer, answer
    assert qwen.chat(ask("How tall is the Eiffel Tower?"), model=qwen.name, max_tokens=32) == answer  # greedy


def test_stop_and_the_queue(qwen):
    # Two turns fill both slots; a third waits in line, and one cancelled while waiting leaves without a token.
    running = [qwen.stream(ESSAY, model=qwen.name, max_tokens=300) for _ in range(2)]
    for stream in running:
        next(stream)
    cancel = CancelToken()
    got: dict = {}
    waiting = threading.Thread(
        target=lambda: got.setdefault("pieces", list(qwen.stream(ESSAY, model=qwen.name, cancel=cancel)))
    )
    waiting.start()
    assert wait_until(lambda: qwen.health()["generating"]["waiting"] == 1, 10), qwen.health()
    cancel.cancel()
    waiting.join(5)
    assert got["pieces"] == [] and qwen.health()["generating"]["waiting"] == 0
    # Closing a stream stops its generation at the next token (300 tokens would take a minute or more).
    stopped = time.monotonic()
    for stream in running:
        stream.close()
    assert wait_until(lambda: qwen.health()["generating"]["busy"] == 0, 10), qwen.health()
    assert time.monotonic() - stopped < 10
