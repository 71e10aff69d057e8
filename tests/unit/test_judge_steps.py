"""Which YES/NO steps ask the utility model when their model-free signal is unsure: on the embedded model only
the steps its measurements chose (`Packaged.judges`), on Ollama or an OpenAI-compatible server all three. A step
that does not ask the model decides by its rule and says so in its step's method and reason."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from rag_worker.llm import CancelToken, LocalBackend
from rag_worker.llm.embedded import JUDGE_STEPS, MODELS
from rag_worker.pipeline import fetch_check, relevance, triage
from rag_worker.pipeline.turn import Turn, TurnOptions
from rag_worker.schemas import ChatRequest
from rag_worker.settings import Settings


class Backend:
    """A model that answers every question with `reply` and counts the calls."""

    def __init__(self, kind: str, judges: frozenset[str] | None = None, reply: str = "NO", **rules):
        self.backend, self.reply, self.calls = kind, reply, 0
        if judges is not None:
            self.judges = judges
        for name, value in rules.items():  # unsure_relevant, triage_direct_below: a packaged model's rules
            setattr(self, name, value)

    def chat(self, messages, **kwargs) -> str:
        self.calls += 1
        return self.reply


class Space:
    """An embedder whose query sits at cosine `sim` from every document."""

    def __init__(self, sim: float):
        self.sim = sim

    def embed_documents(self, texts):
        return np.tile(np.array([1.0, 0.0], dtype=np.float32), (len(texts), 1))

    def embed_query(self, text):
        return np.array([self.sim, math.sqrt(1 - self.sim**2)], dtype=np.float32)


class Store:
    """A collection whose closest passage to any question has similarity `sim`."""

    def __init__(self, sim: float):
        self.sim = sim

    def search(self, *args, **kwargs):
        return [SimpleNamespace(vector_score=self.sim)]

    def list_documents(self, index):
        return [{"filename": "README.md"}]


def make_turn(backend: Backend, tmp_path, sim: float = 0.4, **request) -> Turn:
    services = SimpleNamespace(
        settings=Settings(INDEX_STORE=str(tmp_path)), embedder=Space(sim), store=Store(sim)
    )
    opts = TurnOptions("auto", True, False, False, "hybrid", 5, "similarity", None, None, None, {})
    llm = SimpleNamespace(backend=backend, generation_model="m", utility_model="m")
    return Turn(services, ChatRequest(index="docs", **request), opts, llm, CancelToken())


def hits(score: float) -> list:
    return [SimpleNamespace(text="The gateway listens on port 8000.", vector_score=score)]


FOLLOW_UP = {
    "prompt": "What else does it say about ports?",
    "history": [{"role": "user", "content": "Which port does the gateway use?"}],
    "docs": [{"id": "1", "filename": "README.md", "text": "The gateway listens on port 8000."}],
}
NOT_JUDGING = frozenset()


# -- the embedded model, not asked -------------------------------------------------------------------------------


@pytest.mark.parametrize(("score", "relevant"), [(0.42, True), (0.37, False)])
def test_relevance_in_the_unsure_band_goes_by_the_score_when_the_embedded_model_does_not_judge(
    tmp_path, score, relevant
):
    model = Backend("local", NOT_JUDGING, reply="YES")
    verdict = relevance.judge(make_turn(model, tmp_path, prompt="Which port?"), "Which port?", hits(score))
    assert verdict.relevant is relevant and verdict.method == "retrieval_score"
    assert "not asked" in verdict.reason and f"{score:.2f}" in verdict.reason
    assert model.calls == 0


def test_the_fetch_check_searches_again_when_the_embedded_model_does_not_judge(tmp_path):
    model = Backend("local", NOT_JUDGING)
    decision = fetch_check.check(make_turn(model, tmp_path, sim=0.3, **FOLLOW_UP))
    assert decision.fetch is True and decision.method == "similarity" and "not asked" in decision.reason
    assert model.calls == 0


def test_triage_searches_when_the_embedded_model_does_not_judge(tmp_path):
    model = Backend("local", NOT_JUDGING)
    decision = triage.triage(
        make_turn(model, tmp_path, sim=0.2, prompt="Hi, what is 2 + 2?"), "Hi, what is 2 + 2?"
    )
    assert decision.route == "rag" and decision.method == "retrieval_score" and "not asked" in decision.reason
    assert model.calls == 0


PACKAGED_RULES = {"unsure_relevant": False, "triage_direct_below": 0.25}


@pytest.mark.parametrize("score", [0.36, 0.43])
def test_a_packaged_embedded_model_counts_the_whole_unsure_band_as_off_topic(tmp_path, score):
    # Chosen on the train items: in the band, passages that answer were 5 of 41 (docs/benchmarks.md).
    model = Backend("local", NOT_JUDGING, reply="YES", **PACKAGED_RULES)
    verdict = relevance.judge(make_turn(model, tmp_path, prompt="Which port?"), "Which port?", hits(score))
    assert verdict.relevant is False and verdict.method == "retrieval_score"
    assert "off topic" in verdict.reason and "not asked" in verdict.reason and model.calls == 0
    # Above the band the passages stand, as for every model.
    assert relevance.judge(make_turn(model, tmp_path, prompt="q"), "q", hits(0.5)).relevant is True


def test_a_packaged_embedded_model_answers_a_message_far_from_every_passage_directly(tmp_path):
    model = Backend("local", NOT_JUDGING, reply="YES", **PACKAGED_RULES)
    far = triage.triage(make_turn(model, tmp_path, sim=0.14, prompt="Thanks a lot!"), "Thanks a lot!")
    assert far.route == "direct" and far.method == "retrieval_score" and "0.14" in far.reason
    near = triage.triage(make_turn(model, tmp_path, sim=0.3, prompt="Which port?"), "Which port?")
    assert near.route == "rag" and "not asked" in near.reason
    assert model.calls == 0


def test_outside_the_unsure_band_no_step_asks_any_model(tmp_path):
    model = Backend("ollama")
    assert relevance.judge(make_turn(model, tmp_path, prompt="q"), "q", hits(0.8)).relevant is True
    assert fetch_check.check(make_turn(model, tmp_path, sim=0.9, **FOLLOW_UP)).fetch is False
    assert triage.triage(make_turn(model, tmp_path, sim=0.9, prompt="q"), "q").route == "rag"
    assert model.calls == 0


@pytest.mark.parametrize(
    ("model", "score", "asked"),
    [
        (Backend("ollama"), 0.8, False),
        (Backend("ollama"), 0.2, False),
        (Backend("ollama"), 0.42, True),
        (Backend("local", NOT_JUDGING, reply="YES"), 0.42, False),
        (Backend("local", NOT_JUDGING, reply="YES", **PACKAGED_RULES), 0.42, False),
    ],
)
def test_the_verdict_by_score_alone_is_the_relevance_checks_own_and_none_only_when_the_model_is_asked(
    tmp_path, model, score, asked
):
    # The worker frees its CPU slot before the model's YES/NO (rag_worker/pipeline/chat.py) on this answer.
    turn = make_turn(model, tmp_path, prompt="Which port?")
    decided = relevance.by_score(turn, hits(score), score)
    assert model.calls == 0
    if asked:
        assert decided is None
        assert relevance.judge(turn, "Which port?", hits(score), score=score).method == "llm"
        assert model.calls == 1
    else:
        assert decided == relevance.judge(turn, "Which port?", hits(score), score=score)
        assert model.calls == 0
    assert relevance.by_score(turn, [], 0.0).relevant is False  # nothing found: no model either


# -- a model that judges: Ollama (or OpenAI), or the embedded model for the steps it was chosen for ---------------


@pytest.mark.parametrize("model", [Backend("ollama"), Backend("openai"), Backend("local", JUDGE_STEPS)])
def test_a_model_that_judges_is_asked_in_the_band_and_its_no_is_the_verdict(tmp_path, model):
    verdict = relevance.judge(make_turn(model, tmp_path, prompt="Which port?"), "Which port?", hits(0.42))
    assert (verdict.relevant, verdict.method) == (False, "llm") and "off topic" in verdict.reason
    decision = fetch_check.check(make_turn(model, tmp_path, sim=0.3, **FOLLOW_UP))
    assert (decision.fetch, decision.method) == (False, "llm")
    tri = triage.triage(make_turn(model, tmp_path, sim=0.2, prompt="What is 2 + 2?"), "What is 2 + 2?")
    assert (tri.route, tri.method) == ("direct", "llm")
    assert model.calls == 3


def test_the_embedded_model_is_asked_only_in_the_steps_it_judges(tmp_path):
    model = Backend("local", frozenset({"triage"}))
    relevance.judge(make_turn(model, tmp_path, prompt="q"), "q", hits(0.42))
    fetch_check.check(make_turn(model, tmp_path, sim=0.3, **FOLLOW_UP))
    assert model.calls == 0
    assert triage.triage(make_turn(model, tmp_path, sim=0.2, prompt="q"), "q").method == "llm"
    assert model.calls == 1


# -- the per-model choice ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(MODELS))
def test_the_packaged_models_judge_no_step_and_carry_their_rules(key):
    backend = LocalBackend(Settings(EMBEDDED_MODEL=key))
    # Qwen's parts may be missing on this machine: then SmolLM2 runs, with its own choice.
    assert backend.judges == backend.choice.model.judges == frozenset()
    assert backend.unsure_relevant is False and backend.triage_direct_below == 0.25


def test_a_gguf_file_of_ones_own_is_asked_in_every_step(tmp_path):
    backend = LocalBackend(Settings(LOCAL_MODEL=str(tmp_path / "mine.gguf")))
    assert backend.judges == JUDGE_STEPS
    assert backend.unsure_relevant is None and backend.triage_direct_below is None
