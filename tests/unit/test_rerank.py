"""Cross-encoder plumbing with tiny, randomly initialised BERT classifiers built on disk (no download).

Their scores carry no meaning; what is checked is what the pipeline relies on: one 0..1 score per text, in the
order given, independent of batching, for 1-logit and 2-logit heads, and clear errors for unusable models.
"""

from __future__ import annotations

import math

import pytest

from rag_worker.errors import Unavailable
from rag_worker.rerank import Reranker, RerankerSlot
from tests.tiny_models import build_cross_encoder


@pytest.fixture(scope="module", params=[1, 2], ids=["one-logit", "two-logits"])
def reranker(request, tmp_path_factory) -> Reranker:
    path = build_cross_encoder(
        tmp_path_factory.mktemp(f"ce{request.param}") / "tiny-cross-encoder", request.param
    )
    return Reranker(str(path), max_length=512)


PASSAGES = [
    "Employees get 25 days of paid vacation.",
    "Short.",
    "The contract may be terminated with three months notice by either party, in writing, to the address given.",
    "",
    "Deployments happen on Tuesdays. " * 200,  # longer than max_length: truncated, not an error
]


def test_one_probability_per_text_in_order(reranker):
    scores = reranker.score("how many vacation days?", PASSAGES)
    assert len(scores) == len(PASSAGES)
    assert all(isinstance(s, float) and 0.0 <= s <= 1.0 and math.isfinite(s) for s in scores)
    # Scoring each text alone gives the same number: batching and length sorting do not shuffle scores.
    for text, score in zip(PASSAGES, scores, strict=True):
        assert reranker.score("how many vacation days?", [text])[0] == pytest.approx(score, abs=1e-5)


def test_batches_smaller_than_the_input(reranker, monkeypatch):
    whole = reranker.score("q", PASSAGES)
    monkeypatch.setattr(reranker, "batch_size", 2)
    assert reranker.score("q", PASSAGES) == pytest.approx(whole, abs=1e-5)


def test_long_query_and_no_texts(reranker):
    assert reranker.score("anything", []) == []
    assert len(reranker.score("why " * 2000, ["a passage"])) == 1


def test_identity(reranker):
    assert reranker.model_id == "tiny-cross-encoder"
    assert reranker.num_labels in (1, 2)
    # Asked for 512 tokens, but the tiny model has 128 positions: inputs are cut to what it can take.
    assert reranker.max_length == 128


def test_three_label_models_are_refused(tmp_path):
    path = build_cross_encoder(tmp_path / "nli", 3)
    with pytest.raises(Unavailable, match="3 labels"):
        Reranker(str(path))


def test_missing_model_is_a_503(tmp_path):
    with pytest.raises(Unavailable) as info:
        Reranker(str(tmp_path / "absent"))
    assert info.value.status == 503


def test_a_model_that_cannot_load_is_skipped_and_reported_before_any_turn(tmp_path):
    nli = RerankerSlot(str(build_cross_encoder(tmp_path / "nli", 3)))
    assert nli.health()["ok"] is False and "3 labels" in nli.health()["error"]  # read from its config only
    assert nli.get() is None and "3 labels" in nli.error
    absent = RerankerSlot(str(tmp_path / "absent"))
    assert absent.get() is None and "absent" in absent.error
    assert absent.health() == {"ok": False, "model": str(tmp_path / "absent"), "error": absent.error}


def test_a_working_model_is_reported_ok_and_loaded_on_first_use(tmp_path):
    slot = RerankerSlot(str(build_cross_encoder(tmp_path / "ce", 1)))
    assert slot.health() == {"ok": True, "model": slot.model, "loaded": False}
    assert slot.get() is slot.get() is not None
    assert slot.health()["loaded"] is True
