"""The store builds its ANN vector index by itself once a table reaches ANN_MIN_ROWS, and search stays right."""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import pytest

from rag_worker.settings import Settings
from rag_worker.store import AnnParams, Store, fuse


def ann_params(**changes) -> AnnParams:
    """The settings' default ANN parameters, but `changes`."""
    return dataclasses.replace(AnnParams.from_settings(Settings.model_construct()), **changes)


def rows(start: int, count: int, dim: int, rng: np.random.Generator) -> list[dict]:
    vecs = rng.standard_normal((count, dim)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    out = []
    for i in range(start, start + count):
        out.append(
            {
                "document_id": hashlib.sha256(str(i).encode()).hexdigest(),
                "filename": f"doc{i}.txt",
                "dataset": "synthetic",
                "page": None,
                "chunk_index": 0,
                "text": f"passage number {i} about topic {i % 17}",
                "vector": vecs[i - start],
            }
        )
    return out


def test_ann_index_appears_past_the_threshold_and_finds_rows_written_before_and_after(tmp_path, embedder):
    rng = np.random.default_rng(7)
    store = Store(tmp_path / "db", embedder, ann_params=ann_params(min_rows=600))
    first = rows(0, 400, embedder.dim, rng)
    store.add_chunks("big", first)
    assert not store.has_ann("big")  # below the threshold: exact search only

    second = rows(400, 300, embedder.dim, rng)
    store.add_chunks("big", second)
    assert store.has_ann("big")

    later = rows(700, 5, embedder.dim, rng)  # written after the index was trained
    store.add_chunks("big", later)
    for row in (first[3], second[10], later[2]):
        hits = store.search("big", row["text"], mode="vector", vector=row["vector"], limit=5)
        assert hits[0].filename == row["filename"]
        assert hits[0].vector_score is not None and hits[0].vector_score > 0.99
    hybrid = store.search("big", "passage number 42", vector=first[42]["vector"], limit=5)
    assert hybrid[0].filename == "doc42.txt"


def test_no_ann_index_when_disabled(tmp_path, embedder):
    rng = np.random.default_rng(8)
    store = Store(tmp_path / "db", embedder, ann_params=ann_params(min_rows=0))
    store.add_chunks("big", rows(0, 700, embedder.dim, rng))
    assert not store.has_ann("big")


@pytest.mark.parametrize("refine", [1, 0], ids=["refined", "not-refined"])
def test_hybrid_hits_over_an_ann_index_are_those_whole_row_legs_give(tmp_path, embedder, refine):
    """Over an ANN index a hybrid search's vector leg brings the vectors its exact re-scoring has read (refine), or
    leaves them to the read of the fused top (no refine). Either way every hit carries every field, and its own
    stored vector, as fusing legs that read whole rows gives them."""
    rng = np.random.default_rng(9)
    store = Store(tmp_path / "db", embedder, ann_params=ann_params(min_rows=600, refine_factor=refine))
    written = rows(0, 700, embedder.dim, rng)
    store.add_chunks("big", written)
    assert store.has_ann("big")
    stored = {r["filename"]: r["vector"] for r in written}
    for n in (42, 99, 650):
        query = str(n)  # one text has the word: the other hits come from the vector leg alone
        qvec = written[n]["vector"] + 0.5 * written[n + 1]["vector"]
        got = store.search("big", query, vector=qvec, limit=8, fusion="robust")
        vec_rows, fts_rows = store.legs(store.snapshots(store.open_tables(["big"])), qvec, query, None, 100)
        want = fuse(vec_rows, fts_rows, qvec, limit=8, fusion="robust", rrf_k=10, alpha=0.5)
        assert got[0].filename == f"doc{n}.txt"
        # Hits only the vector leg found, whose vectors it may not bring:
        assert any(h.fts_rank is None for h in got)
        assert [h.to_dict() for h in got] == [h.to_dict() for h in want]
        for hit in got:
            assert np.array_equal(hit.vector, stored[hit.filename])
