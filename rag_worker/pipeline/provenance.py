"""Provenance: each document's share in the answer, carried on the document itself."""

from __future__ import annotations

import logging
import re

import numpy as np

from .citations import GROUP_RE, REF_RE
from .turn import Turn

log = logging.getLogger("rag_worker.pipeline")

SENTENCE_RE = re.compile(r"(?<=[.!?])\s+|\n+")
FLOOR = 0.2  # similarity below this is noise for MiniLM-sized embedders: it earns no share


def sentences(text: str) -> list[tuple[str, set[str]]]:
    """The answer's sentences without citation markers, each with the refs it cites."""
    out = []
    for raw in SENTENCE_RE.split(text):
        refs = {r for group in GROUP_RE.findall(raw) for r in REF_RE.findall(group)}
        plain = re.sub(r"\s+([.,;:!?])", r"\1", GROUP_RE.sub("", raw)).strip()
        if len(plain) >= 12:
            out.append((plain, refs))
    return out


def document_vectors(turn: Turn, documents: list[dict], texts: list[str]) -> np.ndarray:
    """Each document's vector: its chunk's, as stored in the index (no forward pass), or embedded from `texts`
    for documents the index no longer holds (or that came from a client without one)."""
    out = np.zeros((len(documents), turn.space.dim), dtype=np.float32)
    found: dict[tuple[str, str], np.ndarray] = {}
    by_index: dict[str, list[str]] = {}
    for d in documents:
        if isinstance(d.get("index"), str) and isinstance(d.get("id"), str):
            key = (d["index"], d["id"])
            if key in turn.chunk_vectors:  # read with the search results
                found[key] = turn.chunk_vectors[key]
            else:
                by_index.setdefault(d["index"], []).append(d["id"])
    for index, ids in by_index.items():
        try:
            stored = turn.services.store.vectors(index, ids)
        except Exception as exc:  # an index dropped meanwhile: embed instead
            log.info("stored vectors of %s unavailable (%s); embedding", index, exc)
            stored = {}
        found.update({(index, i): v for i, v in stored.items()})
    missing = []
    for row, d in enumerate(documents):
        vec = found.get((d.get("index"), d.get("id")))
        if vec is not None and vec.shape == out.shape[1:]:
            out[row] = vec / (np.linalg.norm(vec) or 1.0)
        else:
            missing.append(row)
    if missing:
        out[missing] = turn.embed_texts([texts[i] for i in missing])
    return out


def attribute(turn: Turn, reply: str, documents: list[dict], mode: str) -> str:
    """Set documents[i]["provenance"] (shares summing to 1, or 0 each when nothing matches). Returns the method."""
    found = sentences(reply)
    parts = [text for text, _ in found]
    if not documents or not parts:
        for d in documents:
            d["provenance"] = 0.0
        return "none"
    texts = [d.get("context") or d["text"] for d in documents]
    reranker = turn.services.reranker
    if mode == "rerank" and reranker is not None:
        scores = np.array([reranker.score(s, texts) for s in parts], dtype=np.float32)
        method = "rerank"
        floor = 0.5
    else:
        # Stored chunk vectors where the index has them; the answer's sentences through the turn's cache (the
        # grounding check embedded most of them already).
        doc_vecs = document_vectors(turn, documents, texts)
        sent_vecs = turn.embed_texts(parts)
        scores = sent_vecs @ doc_vecs.T
        method = "similarity"
        floor = FLOOR
    # Each sentence credits the documents it is closest to, in proportion to how far above the floor they are.
    credit = np.clip(scores - floor, 0.0, None)
    best = scores.max(axis=1, keepdims=True)
    credit = np.where(scores >= best - 0.05, credit, 0.0)
    # A sentence that cites sources credits those sources, when they are similar to it at all: the model's own
    # attribution, checked by similarity rather than taken on trust.
    refs = [d.get("ref") for d in documents]
    for row, (_, cited) in enumerate(found):
        mask = np.array([r in cited for r in refs])
        if mask.any():
            cited_credit = np.where(mask, np.clip(scores[row] - floor, 0.0, None), 0.0)
            if cited_credit.sum() > 0:
                credit[row] = cited_credit
    totals = credit.sum(axis=0)
    whole = float(totals.sum())
    for d, share in zip(documents, totals, strict=True):
        d["provenance"] = round(float(share) / whole, 4) if whole > 0 else 0.0
    return method
