"""The passages' sentence vectors stored at ingestion (SENTENCE_VECTORS=ingest), given to the turn before a check.

Ingestion embeds each chunk's passage sentences (`store.rows.sentence_columns`, the check's own splitting) and
stores them with the chunk; here the turn reads them back for the chunks it read: the documents' own and the
neighbours context expansion added. They are keyed by the sentence's text, so a vector only ever stands for the
very text it was embedded from: a passage the generator read cut short, or a chunk written without them (a table
made before them, SENTENCE_VECTORS=turn) has sentences found nowhere here, and `Turn.embed_texts` embeds those
as before. Documents sent back by the client (a follow-up's `docs`) are looked up by their chunk id in the
request's own indexes; the client never supplies a vector.
"""

from __future__ import annotations

import logging
from collections import defaultdict

from ...errors import ApiError
from ..turn import Turn
from .sentences import passage_sentences

log = logging.getLogger("rag_worker.pipeline")


def load(turn: Turn, documents: list[dict], passages: list[str]) -> int:
    """Give `turn` the stored sentence vectors of the chunks it read (`passages`: the texts the check and the
    quotes read); returns how many sentences it got. None with SENTENCE_VECTORS=turn (the check embeds every
    passage sentence, as before them), nor when the embedder's cross-turn cache holds them all already (a small
    index's passages come back turn after turn: reading the table would cost more than the cache)."""
    if turn.settings.sentence_vectors != "ingest":
        return 0
    needed = {p.text for text in passages for p in passage_sentences("", text)}
    needed -= turn._vectors.keys()
    cached = getattr(turn.space, "cached_texts", None)
    if not needed or (cached is not None and not needed - cached(needed)):
        return 0
    allowed = set(turn.request.indexes)
    by_index: dict[str, list[str]] = defaultdict(list)
    for d in documents:
        if d.get("index") in allowed and isinstance(d.get("id"), str):
            by_index[d["index"]].append(d["id"])
    for index, chunk in sorted(turn.context_chunks):
        if index in allowed:
            by_index[index].append(chunk)
    # Context expansion's scan brought those of the documents it read (chat._retrieve); what is left is mostly
    # a follow-up's documents sent back by the client.
    by_index = {
        index: [c for c in ids if (index, c) not in turn.sentences_read] for index, ids in by_index.items()
    }
    by_index = {index: ids for index, ids in by_index.items() if ids}
    if not by_index:
        return 0
    store = turn.services.store
    got = 0
    for index, ids in by_index.items():
        try:
            if store.embedder_for(index) is not turn.space:  # another space: its vectors do not compare
                continue
            vectors = store.sentence_vectors_of(index, ids)
            turn.sentences_read.update((index, c) for c in ids)
            got += turn.know_vectors(vectors)
            remember = getattr(turn.space, "remember", None)
            if remember is not None:  # the next turns reading these chunks find them without a read
                remember(vectors)
        except ApiError as exc:  # the index went away meanwhile: the check embeds what it needs
            log.info("stored sentence vectors of %s not read: %s", index, exc)
    return got
