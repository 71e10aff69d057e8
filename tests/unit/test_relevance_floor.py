"""The evidence floor on the passages shown (relevance.above_floor), with the real packaged embedder: a long chunk
whose vector its other topics dilute is kept for the one sentence that answers; a one-sentence chunk embedded from
its bare text is judged by its own score, without embedding it again; one embedded with headings is still checked
sentence by sentence."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from rag_worker.pipeline.relevance import above_floor

QUERY = "How do I back up the data?"
ANSWER = "To back up the data, copy the index store folder while the worker is stopped."
OTHERS = "The health endpoint reports each model. Logs are written under the logs folder every day."


def turn_with(embedder):
    calls: list[list[str]] = []

    def embed_texts(texts):
        calls.append(list(texts))
        return embedder.embed_documents(texts)

    return SimpleNamespace(embed_texts=embed_texts, embed_query=embedder.embed_query, flags={}), calls


def hit(text: str, score: float, metadata: dict | None = None):
    return SimpleNamespace(text=text, vector_score=score, metadata=metadata or {})


def similarity(embedder, text: str) -> float:
    return float(np.dot(embedder.embed_documents([text])[0], embedder.embed_query(QUERY)))


def test_a_diluted_long_chunk_is_kept_for_its_answering_sentence(embedder):
    floor = similarity(embedder, ANSWER) - 0.05  # the sentence alone clears it
    long = hit(f"{OTHERS} {ANSWER}", floor - 0.2)  # the whole chunk's vector does not
    turn, calls = turn_with(embedder)
    assert above_floor(turn, QUERY, [long], floor) == [long]
    assert turn.flags["rescued_passages"] == 1
    assert calls and ANSWER in calls[0]


def test_a_bare_one_sentence_chunk_below_the_floor_goes_without_a_pass(embedder):
    score = similarity(embedder, ANSWER)
    bare = hit(ANSWER, score)
    turn, calls = turn_with(embedder)
    assert above_floor(turn, QUERY, [bare], score + 0.01) == []
    assert calls == []  # its one sentence is the text its vector came from: nothing to embed
    assert "rescued_passages" not in turn.flags


def test_a_one_sentence_chunk_embedded_with_headings_is_still_checked(embedder):
    floor = similarity(embedder, ANSWER) - 0.05
    # Its stored vector came from "Operations\nBackup\n<sentence>", which scored below the floor; the sentence
    # alone clears it.
    headed = hit(ANSWER, floor - 0.2, {"headings": ["Operations", "Backup"]})
    turn, calls = turn_with(embedder)
    assert above_floor(turn, QUERY, [headed], floor) == [headed]
    assert calls == [[ANSWER]]


def test_chunks_at_or_above_the_floor_are_kept_as_they_are(embedder):
    turn, calls = turn_with(embedder)
    kept = [hit(ANSWER, 0.6), hit(OTHERS, 0.5), SimpleNamespace(text="x", vector_score=None, metadata={})]
    assert above_floor(turn, QUERY, kept, 0.5) == kept
    assert calls == []
