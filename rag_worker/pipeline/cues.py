"""Model-free signals about a user message: does it lean on the conversation before it?"""

from __future__ import annotations

import re

import numpy as np

WORD_RE = re.compile(r"[\w']+", re.UNICODE)

# Words and openings that make a message depend on earlier turns ("and what about it?", "explain more").
FOLLOW_UP_WORDS = {
    "it",
    "its",
    "that",
    "this",
    "these",
    "those",
    "they",
    "them",
    "their",
    "he",
    "she",
    "his",
    "her",
    "there",
    "same",
    "more",
    "again",
    "further",
    "elaborate",
    "explain",
    "also",
    "above",
    "earlier",
    "previous",
    "former",
    "latter",
    "second",
    "first",
    "third",
    "last",
    "other",
    "else",
    "why",
    "how",
}
FOLLOW_UP_OPENINGS = ("and ", "but ", "so ", "what about", "how about", "why ", "then ", "also ")


def words(text: str) -> list[str]:
    return [w.lower() for w in WORD_RE.findall(text)]


def is_follow_up(text: str) -> bool:
    """A short message with a back-reference, or one that opens like a continuation."""
    ws = words(text)
    if not ws:
        return False
    lowered = text.strip().lower()
    if lowered.startswith(FOLLOW_UP_OPENINGS):
        return True
    return len(ws) <= 12 and any(w in FOLLOW_UP_WORDS for w in ws)


def max_similarity(query: np.ndarray, vectors: np.ndarray) -> float:
    if vectors.size == 0:
        return 0.0
    return float(np.max(vectors @ query))
