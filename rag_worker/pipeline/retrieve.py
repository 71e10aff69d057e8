"""Retrieval stages: optional HyDE, hybrid search, optional cross-encoder rerank."""

from __future__ import annotations

import numpy as np

from .turn import Turn


def hyde_vector(turn: Turn, query: str) -> np.ndarray | None:
    """Embed a hypothetical answer together with the query (HyDE); None when the model can't help."""
    messages = [{"role": "system", "content": turn.prompt("hyde")}, {"role": "user", "content": query}]
    passage = (turn.ask_utility(messages, max_tokens=160, failing="HyDE skipped") or "").strip()
    if not passage:
        return None
    mixed = turn.embed_query(query) + turn.embed_query(passage)
    return mixed / (np.linalg.norm(mixed) or 1.0)


def search(turn: Turn, query: str, vector: np.ndarray | None = None):
    return turn.services.store.search(
        turn.request.indexes,
        query,
        mode=turn.options.mode,
        datasets=turn.request.datasets or None,
        limit=max(turn.settings.candidates, turn.options.top_k),
        vector=vector if vector is not None else turn.embed_query(query),
        rrf_k=turn.settings.rrf_k,
        fusion=turn.settings.fusion,
        fusion_alpha=turn.settings.fusion_alpha,
    )


def rerank(turn: Turn, query: str, hits: list) -> list:
    """Order candidates by the cross-encoder; scores travel on each hit, never by list position."""
    reranker = turn.services.reranker
    if reranker is None or not hits:
        return hits
    scores = reranker.score(query, [h.text for h in hits])
    for hit, score in zip(hits, scores, strict=True):
        hit.rerank_score = float(score)
    return sorted(hits, key=lambda h: h.rerank_score, reverse=True)
