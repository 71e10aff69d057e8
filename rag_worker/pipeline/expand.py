"""Context expansion: give the generator each hit's neighbouring chunks, and turn hits into Documents."""

from __future__ import annotations

import logging
from collections import defaultdict

from .turn import Turn

log = logging.getLogger("rag_worker.pipeline")

WINDOW = 1


def to_document(hit, rank: int, ref: str) -> dict:
    return {
        "id": hit.id,
        "document_id": hit.document_id,
        "filename": hit.filename,
        "dataset": hit.dataset,
        "index": hit.index,
        "page": hit.page,
        "chunk_index": hit.chunk_index,
        "location": hit.metadata.get("location") or None,
        "text": hit.text,
        "context": None,
        "score": round(float(hit.score), 6),
        "vector_score": None if hit.vector_score is None else round(float(hit.vector_score), 4),
        "fts_score": None if hit.fts_score is None else round(float(hit.fts_score), 4),
        "rerank_score": None
        if getattr(hit, "rerank_score", None) is None
        else round(float(hit.rerank_score), 4),
        "provenance": None,
        "rank": rank,
        "ref": ref,
    }


def stored_sentences_wanted(turn: Turn) -> bool:
    return turn.settings.sentence_vectors == "ingest"


def expand(turn: Turn, docs: list[dict], row_ids: dict[tuple[str, str], int | None] | None = None) -> int:
    """Fill each document's `context` with its neighbours' text (same file, chunk_index ± WINDOW).

    Returns how many neighbour chunks were added. Neighbours that are themselves among the documents are
    left out of the context, so the generator never reads a passage twice. `row_ids` {(index, chunk id): row
    address} says where the search found the documents' chunks: their neighbours are looked for next to them
    first (`Store.neighbours_of`).
    """
    row_ids = row_ids or {}
    wanted: dict[tuple, set[int]] = defaultdict(set)
    present = {(d["index"], d["document_id"], d["dataset"], d["filename"], d["chunk_index"]) for d in docs}
    # The same scan brings the sentence vectors stored with the documents' own chunks and their neighbours, for
    # the grounding check (grounding.stored): the documents' chunks are read along for them, not for context.
    sentences = stored_sentences_wanted(turn)
    for d in docs:
        if d["chunk_index"] is None:
            continue
        key = (d["index"], d["document_id"], d["dataset"], d["filename"])
        for i in range(d["chunk_index"] - WINDOW, d["chunk_index"] + WINDOW + 1):
            if i >= 0 and (i != d["chunk_index"] or sentences) and ((*key, i) not in present or sentences):
                wanted[key].add(i)
    texts: dict[tuple, str] = {}
    by_index: dict[str, dict[tuple[str, str, str], list[int]]] = defaultdict(dict)
    anchors: dict[str, dict[tuple[str, str, str], list]] = defaultdict(lambda: defaultdict(list))
    for (index, document_id, dataset, filename), indexes in wanted.items():
        by_index[index][(document_id, dataset, filename)] = sorted(indexes)
    for d in docs:
        if d["chunk_index"] is not None and row_ids.get((d["index"], d["id"])) is not None:
            key = (d["document_id"], d["dataset"], d["filename"])
            anchors[d["index"]][key].append((d["chunk_index"], row_ids[(d["index"], d["id"])]))
    for index, docs_wanted in by_index.items():  # one read per index, not one per document
        same_space = sentences and turn.services.store.embedder_for(index) is turn.space
        for (document_id, dataset, filename), hits in turn.services.store.neighbours_of(
            index, docs_wanted, sentences=same_space, anchors=anchors.get(index)
        ).items():
            for hit in hits:
                turn.context_chunks.add((index, hit.id))
                if hit.sentence_vectors is not None:  # a table made before them has none: the check embeds
                    turn.stored_sentences += turn.know_vectors(hit.sentence_vectors)
                    turn.sentences_read.add((index, hit.id))
                    remember = getattr(turn.space, "remember", None)
                    if remember is not None:
                        remember(hit.sentence_vectors)
                if (index, document_id, dataset, filename, hit.chunk_index) not in present:
                    texts[(index, document_id, dataset, filename, hit.chunk_index)] = hit.text
    added = 0
    for d in docs:
        if d["chunk_index"] is None:
            continue
        key = (d["index"], d["document_id"], d["dataset"], d["filename"])
        before = texts.get((*key, d["chunk_index"] - 1))
        after = texts.get((*key, d["chunk_index"] + 1))
        if before or after:
            d["context"] = "\n\n".join(t for t in (before, d["text"], after) if t)
            added += bool(before) + bool(after)
    return added
