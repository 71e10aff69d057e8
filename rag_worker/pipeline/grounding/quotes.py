"""Quotes, the extractive answer: the passage sentences that best answer the question, quoted with their citations.

Needs no generator and is grounded by construction. Sentences are chosen by similarity to the question (plus a
small bonus for the question's own content words), greedily with a diversity penalty (maximal marginal
relevance) so two near-identical sentences never both appear, then quoted per passage in document order under a
one-line lead naming the file ("From README.md:").
"""

from __future__ import annotations

import re

import numpy as np

from ..turn import Turn
from .sentences import content_words, passage_sentences

MAX_SENTENCES = 3
DIVERSITY = 0.6  # weight of the similarity to an already chosen sentence (MMR)
WORD_BONUS = 0.2  # weight of the share of the question's content words a sentence contains
FALL_BEHIND = 0.2  # a sentence scoring this far below the best one is not quoted
MAX_QUOTE_CHARS = 500


def answer(
    turn: Turn, question: str, passages: dict[str, str], documents: list[dict], caveat: str = ""
) -> str:
    """Markdown: an optional caveat line, then per passage "From <file>:" and its quoted sentences with [Sn]."""
    cands = [p for ref, text in passages.items() for p in passage_sentences(ref, text, prose_only=True)]
    cands = [p for p in cands if len(p.text) <= MAX_QUOTE_CHARS]
    if not cands:
        return caveat or turn.message("no_quote")
    q = turn.embed_query(question)
    vecs = turn.embed_texts([p.text for p in cands])
    qwords = content_words(question)
    wanted = qwords | compounds(question)
    bonus = np.array(
        [min(1.0, len(wanted & p.words) / len(qwords)) if qwords else 0.0 for p in cands], dtype=np.float32
    )
    relevance = vecs @ q + WORD_BONUS * bonus
    chosen = select(relevance, vecs, MAX_SENTENCES)
    by_ref: dict[str, list[int]] = {}
    for j in chosen:  # passages in the order of their best sentence; sentences in document order inside one
        by_ref.setdefault(cands[j].ref, []).append(j)
    names = {d.get("ref"): (d.get("filename") or d.get("id") or d.get("ref")) for d in documents}
    blocks = [caveat] if caveat else []
    for ref, idx in by_ref.items():
        quoted = " ".join(cands[j].text for j in sorted(idx, key=lambda j: cands[j].start))
        blocks.append(f"{turn.message('quote_from', name=names.get(ref, ref))}\n\n> {quoted} [{ref}]")
    return "\n\n".join(blocks)


def compounds(text: str) -> set[str]:
    """Adjacent word pairs written as one ("back up" -> "backup", "data set" -> "dataset")."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    return {a + b for a, b in zip(words, words[1:], strict=False)}


def select(relevance: np.ndarray, vecs: np.ndarray, k: int) -> list[int]:
    """Maximal marginal relevance among the candidates within FALL_BEHIND of the best: up to k, best first."""
    best = float(relevance.max())
    left = {j for j in range(len(relevance)) if relevance[j] >= best - FALL_BEHIND}
    chosen: list[int] = []
    while left and len(chosen) < k:

        def mmr(j: int) -> float:
            redundancy = max((float(vecs[j] @ vecs[c]) for c in chosen), default=0.0)
            return float(relevance[j]) - DIVERSITY * redundancy

        j = max(left, key=mmr)
        left.discard(j)
        if chosen and max(float(vecs[j] @ vecs[c]) for c in chosen) > 0.9:
            continue  # a near-duplicate of a quoted sentence
        chosen.append(j)
    return chosen
