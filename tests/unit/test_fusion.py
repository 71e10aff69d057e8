"""Hybrid fusion: the fusion functions on hand-worked legs, through a real store, and the settings choosing them."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from rag_worker.errors import BadRequest
from rag_worker.settings import Settings
from rag_worker.store import FUSIONS, Store, fuse
from tests.unit.test_store import CORPUS, filled, rows_for, store  # noqa: F401  (fixtures: a real LanceDB table)


def row(cid: str, **scores) -> tuple[str, dict]:
    base = {
        "id": cid,
        "document_id": "d" * 64,
        "filename": f"{cid}.txt",
        "dataset": "ds",
        "page": None,
        "chunk_index": 0,
        "text": cid,
        "metadata": "{}",
    }
    return ("idx", {**base, **scores})


def unit(v) -> np.ndarray:
    v = np.asarray(v, dtype=np.float32)
    return v / np.linalg.norm(v)


# Vector leg: a (cos 0.9) far ahead of b (cos 0.3). FTS leg: b first (BM25 10), a a close second (9.9), then c,
# which the vector leg did not return.
VEC = [row("a", _distance=0.1), row("b", _distance=0.7)]
FTS = [row("b", _score=10.0), row("a", _score=9.9), row("c", _score=2.0)]


def test_rrf_sums_reciprocal_ranks_and_ignores_score_gaps():
    hits = {h.id: h for h in fuse(VEC, FTS, limit=10, fusion="rrf", rrf_k=60)}
    assert hits["a"].score == pytest.approx(1 / 61 + 1 / 62)
    assert hits["b"].score == pytest.approx(1 / 62 + 1 / 61)  # a tie: the cosine gap counts for nothing
    assert hits["c"].score == pytest.approx(1 / 63)
    assert hits["c"].vector_rank is None and hits["c"].fts_rank == 3


def test_theoretical_min_max_weighs_the_size_of_each_lead():
    hits = fuse(VEC, FTS, limit=10, fusion="tmm", alpha=0.5)
    by_id = {h.id: h for h in hits}
    # cos -> (cos + 1) / (0.9 + 1); bm25 -> bm25 / 10; a chunk missing from a leg scores its theoretical minimum.
    assert by_id["a"].score == pytest.approx(0.5 * 1.9 / 1.9 + 0.5 * 9.9 / 10)
    assert by_id["b"].score == pytest.approx(0.5 * 1.3 / 1.9 + 0.5 * 1.0)
    assert by_id["c"].score == pytest.approx(0.5 * 0.0 + 0.5 * 2.0 / 10)
    assert [h.id for h in hits] == ["a", "b", "c"]


def test_z_score_fusion():
    hits = {h.id: h for h in fuse(VEC, FTS, limit=10, fusion="zscore", alpha=0.3)}
    cos_mean, cos_std = np.mean([0.9, 0.3]), np.std([0.9, 0.3])
    bm_mean, bm_std = np.mean([10.0, 9.9, 2.0]), np.std([10.0, 9.9, 2.0])
    assert hits["a"].score == pytest.approx(0.3 * (0.9 - cos_mean) / cos_std + 0.7 * (9.9 - bm_mean) / bm_std)
    assert hits["c"].score == pytest.approx(
        0.3 * (-1.0 - cos_mean) / cos_std + 0.7 * (2.0 - bm_mean) / bm_std
    )


def test_robust_z_score_fusion():
    hits = {h.id: h for h in fuse(VEC, FTS, limit=10, fusion="robust", alpha=0.3)}
    # vector leg: median 0.6, MAD 0.3; FTS leg: median 9.9, MAD median(0.1, 0, 7.9) = 0.1; each MAD times 1.4826
    cos_mad, bm_mad = 1.4826 * 0.3, 1.4826 * 0.1
    assert hits["a"].score == pytest.approx(0.3 * (0.9 - 0.6) / cos_mad + 0.7 * (9.9 - 9.9) / bm_mad)
    assert hits["c"].score == pytest.approx(0.3 * (-1.0 - 0.6) / cos_mad + 0.7 * (2.0 - 9.9) / bm_mad)


def test_one_overwhelming_match_does_not_squeeze_the_rest_of_its_leg_under_the_robust_fusion():
    """p is well ahead of q in BM25 and a little behind in cosine. However far the FTS leg's best match x pulls
    ahead, the robust fusion scores p, q and the rest the same; the plain z-score's deviation grows with x, shrinks
    every other FTS difference and lets the vector leg alone order p and q."""
    rest = [row(c, _score=s) for c, s in (("p", 12.0), ("q", 9.0), ("r", 8.0), ("s", 7.0), ("t", 6.0))]
    vec = [row(c, _distance=d) for c, d in (("x", 0.3), ("q", 0.46), ("p", 0.52), ("r", 0.6), ("s", 0.62))]

    def others(fusion: str, best: float) -> list[tuple[str, float]]:
        hits = fuse(vec, [row("x", _score=best), *rest], limit=10, fusion=fusion, alpha=0.5)
        assert hits[0].id == "x"
        return [(h.id, round(h.score, 9)) for h in hits[1:]]

    robust = [others("robust", best) for best in (15.0, 50.0, 500.0)]
    assert robust[0] == robust[1] == robust[2] and [c for c, _ in robust[0]][:2] == ["p", "q"]
    plain = [[c for c, _ in others("zscore", best)][:2] for best in (15.0, 500.0)]
    assert plain == [["p", "q"], ["q", "p"]]


def test_the_robust_fusion_falls_back_to_the_deviation_when_most_scores_are_equal():
    fts = [row(c, _score=3.0) for c in "abc"] + [row("d", _score=9.0)]  # median 3, MAD 0
    hits = {h.id: h for h in fuse([], fts, limit=10, fusion="robust", alpha=0.0)}
    scores = [3.0, 3.0, 3.0, 9.0]
    assert hits["d"].score == pytest.approx((9.0 - np.mean(scores)) / np.std(scores))
    assert hits["a"].score == pytest.approx((3.0 - np.mean(scores)) / np.std(scores))


@pytest.mark.parametrize("fusion", ["tmm", "zscore", "robust"])
def test_alpha_moves_the_ranking_between_the_legs(fusion):
    assert [h.id for h in fuse(VEC, FTS, limit=10, fusion=fusion, alpha=1.0)][:2] == ["a", "b"]
    assert [h.id for h in fuse(VEC, FTS, limit=10, fusion=fusion, alpha=0.0)] == ["b", "a", "c"]


def test_a_chunk_only_the_fts_leg_found_gets_its_exact_cosine_from_its_stored_vector():
    q = unit([1.0, 0.0, 0.0])
    c_vec = unit([0.6, 0.8, 0.0])  # cosine 0.6 with q
    fts = [*FTS[:2], row("c", _score=2.0, vector=c_vec)]
    hits = {h.id: h for h in fuse(VEC, fts, q, limit=10, fusion="tmm", alpha=0.5)}
    assert hits["c"].vector_score == pytest.approx(0.6)
    assert hits["c"].vector_rank is None
    assert hits["c"].score == pytest.approx(0.5 * 1.6 / 1.9 + 0.5 * 2.0 / 10)


def test_one_leg_alone_keeps_its_order_and_the_limit_holds():
    for fusion in FUSIONS:
        assert [h.id for h in fuse([], FTS, limit=2, fusion=fusion)] == ["b", "a"]
        assert [h.id for h in fuse(VEC, [], limit=10, fusion=fusion)] == ["a", "b"]
        assert fuse([], [], limit=10, fusion=fusion) == []


def test_equal_scores_in_a_leg_do_not_divide_by_zero():
    vec = [row("a", _distance=0.5), row("b", _distance=0.5)]
    fts = [row("a", _score=3.0), row("b", _score=3.0)]
    for fusion in FUSIONS:
        hits = fuse(vec, fts, limit=10, fusion=fusion)
        assert all(np.isfinite(h.score) for h in hits)


@pytest.mark.parametrize("fusion", ["tmm", "zscore", "robust"])
def test_the_store_fuses_its_real_legs_by_normalised_scores(filled, fusion):  # noqa: F811
    hits = filled.search("default", "vacation days", mode="hybrid", limit=10, fusion=fusion, fusion_alpha=0.5)
    # The vacation chunk both legs rank first comes first, and every hit carries its cosine similarity, even
    # those only the FTS leg returned.
    assert "vacation" in hits[0].text and hits[0].vector_rank == 1 and hits[0].fts_rank == 1
    assert all(h.vector_score is not None for h in hits)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_an_unknown_fusion_is_a_400(filled):  # noqa: F811
    with pytest.raises(BadRequest) as err:
        filled.search("default", "vacation", mode="hybrid", fusion="borda")
    assert err.value.code == "bad_fusion"


def test_settings_choose_the_fusion_and_plain_rrf_stays_selectable(monkeypatch):
    monkeypatch.delenv("FUSION", raising=False)
    default = Settings()
    assert default.fusion in FUSIONS and 0.0 <= default.fusion_alpha <= 1.0
    monkeypatch.setenv("FUSION", "rrf")
    monkeypatch.setenv("RRF_K", "60")
    chosen = Settings()
    assert (chosen.fusion, chosen.rrf_k) == ("rrf", 60)


@pytest.mark.parametrize(
    "env", [{"FUSION": "borda"}, {"FUSION_ALPHA": "1.5"}, {"FUSION_ALPHA": "-0.1"}, {"RRF_K": "0"}]
)
def test_bad_fusion_settings_are_refused_at_startup(monkeypatch, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError):
        Settings()


def test_a_search_or_fusion_naming_no_parameters_fuses_as_the_settings_say(filled):  # noqa: F811
    """One source of the search defaults: a search and `fuse` that name no fusion fuse with the settings'
    FUSION, RRF_K and FUSION_ALPHA, exactly as the chat stage's search, which names them."""
    s = Settings.model_construct()  # the settings' defaults
    for query in ("vacation days", "contract liability"):
        plain = filled.search("default", query, mode="hybrid", limit=10)
        chosen = filled.search(
            "default",
            query,
            mode="hybrid",
            limit=10,
            fusion=s.fusion,
            rrf_k=s.rrf_k,
            fusion_alpha=s.fusion_alpha,
        )
        assert [h.to_dict() for h in plain] == [h.to_dict() for h in chosen]
    want = fuse(VEC, FTS, limit=10, fusion=s.fusion, rrf_k=s.rrf_k, alpha=s.fusion_alpha)
    assert [h.to_dict() for h in fuse(VEC, FTS, limit=10)] == [h.to_dict() for h in want]


def test_the_worker_store_searches_with_the_fusion_its_settings_choose(tmp_path, embedder):
    """The store the worker builds from its settings fuses as they say (here plain RRF, k 60) wherever a caller
    names no fusion: the triage probe, the benches."""
    settings = Settings(INDEX_STORE=str(tmp_path), FUSION="rrf", RRF_K="60", FUSION_ALPHA="0.5")
    worker_store = Store.from_settings(settings, embedder)
    for (dataset, filename), chunks in CORPUS.items():
        worker_store.add_chunks("default", rows_for(dataset, filename, chunks, embedder=embedder))
    hits = worker_store.search("default", "vacation days", mode="hybrid", limit=10)
    assert hits
    for h in hits:
        assert h.score == pytest.approx(
            sum(1 / (60 + r) for r in (h.vector_rank, h.fts_rank) if r is not None)
        )
