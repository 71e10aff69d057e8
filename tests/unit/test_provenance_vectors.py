"""Provenance reuses the chunk vectors already in LanceDB instead of re-embedding every returned document."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import numpy as np
import pytest

from rag_worker.pipeline import provenance
from rag_worker.pipeline.turn import Turn
from tests.unit.test_store import CORPUS, filled, store  # noqa: F401 - fixtures


class CountingEmbedder:
    """The real embedder, counting the texts it is asked to embed."""

    def __init__(self, inner):
        self.inner, self.dim, self.embedded = inner, inner.dim, []

    def embed_documents(self, texts):
        self.embedded.extend(texts)
        return self.inner.embed_documents(texts)

    embed_cached = (
        embed_documents  # what a turn asks for; the cross-turn cache is the inner embedder's business
    )


def docs_for(table_store, query: str) -> list[dict]:
    from rag_worker.pipeline.expand import to_document

    hits = table_store.search("default", query, limit=3)
    return [to_document(h, rank=i + 1, ref=f"S{i + 1}") for i, h in enumerate(hits)]


def test_stored_vectors_come_back_by_id_and_unknown_ids_are_skipped(filled):  # noqa: F811
    hits = filled.search("default", "vacation days", limit=2)
    got = filled.vectors("default", [h.id for h in hits] + ["no-such-id", "x' OR 1=1 --"])
    assert set(got) == {h.id for h in hits}
    for h in hits:
        again = filled.embedder.embed_documents([h.text])[0]
        assert float(got[h.id] @ again) > 0.999  # the very vector ingestion stored for that chunk
    assert filled.vectors("no_such_index", [hits[0].id]) == {}
    assert filled.vectors("default", []) == {}


def _turn(chunks, embedder) -> SimpleNamespace:
    """The parts of a Turn provenance uses, with the Turn's own per-turn embedding cache."""
    turn = SimpleNamespace(
        services=SimpleNamespace(store=chunks, embedder=embedder, reranker=None),
        space=embedder,  # the turn's embedder (an index's own, or the worker's default)
        _vectors={},
        chunk_vectors={},
    )
    turn.embed_texts = partial(Turn.embed_texts, turn)
    return turn


def test_provenance_embeds_only_the_answer_for_indexed_documents(filled):  # noqa: F811
    docs = docs_for(filled, "how many vacation days do employees get")
    counting = CountingEmbedder(filled.embedder)
    turn = _turn(filled, counting)
    reply = "Employees are entitled to 25 days of paid vacation per calendar year [S1]."
    assert provenance.attribute(turn, reply, docs, "similarity") == "similarity"
    assert counting.embedded == ["Employees are entitled to 25 days of paid vacation per calendar year."]
    assert docs[0]["text"] == CORPUS[("hr", "leave.md")][0]
    assert docs[0]["provenance"] == max(d["provenance"] for d in docs) > 0.5
    assert sum(d["provenance"] for d in docs) == pytest.approx(1.0, abs=1e-3)


def test_documents_the_index_lacks_are_embedded_from_their_text(filled):  # noqa: F811
    docs = docs_for(filled, "when does the office open")
    outsider = {**docs[0], "id": "gone-from-the-index", "ref": "S9", "text": "Parking is free for visitors."}
    counting = CountingEmbedder(filled.embedder)
    turn = _turn(filled, counting)
    vecs = provenance.document_vectors(turn, [docs[0], outsider], [docs[0]["text"], outsider["text"]])
    assert counting.embedded == ["Parking is free for visitors."]
    assert vecs.shape == (2, filled.embedder.dim)
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-4)


def test_vectors_read_with_the_search_are_not_read_again(filled, monkeypatch):  # noqa: F811
    hits = filled.search("default", "how many vacation days do employees get", limit=3)
    assert all(h.vector is not None and "vector" not in h.to_dict() for h in hits)
    docs = docs_for(filled, "how many vacation days do employees get")
    counting = CountingEmbedder(filled.embedder)
    turn = _turn(filled, counting)
    turn.chunk_vectors = {(h.index, h.id): h.vector for h in hits}
    reads = []
    monkeypatch.setattr(filled, "vectors", lambda index, ids: reads.append(ids) or {})
    vecs = provenance.document_vectors(turn, docs, [d["text"] for d in docs])
    assert reads == [] and counting.embedded == []  # neither the store nor the model was asked
    for row, d in enumerate(docs):
        assert float(vecs[row] @ filled.embedder.embed_documents([d["text"]])[0]) > 0.999
