"""Fetch check: does a follow-up need a new search, or do the documents sent back with it suffice?"""

from __future__ import annotations

from dataclasses import dataclass

from .cues import is_follow_up, max_similarity
from .turn import Turn, history_excerpt

REUSE_ABOVE = 0.55  # the message itself is about the documents already in hand
FOLLOW_UP_REUSE_ABOVE = 0.35
FETCH_BELOW = 0.20


@dataclass
class FetchDecision:
    fetch: bool
    method: str
    reason: str
    similarity: float | None = None


def last_user_question(turn: Turn) -> str:
    for msg in reversed(turn.request.history):
        if msg.role == "user":
            return msg.content
    return ""


def check(turn: Turn) -> FetchDecision:
    docs = turn.request.docs
    if not docs:
        return FetchDecision(True, "rule", "no documents from the previous turn")
    if not any(m.role == "user" for m in turn.request.history):
        return FetchDecision(True, "rule", "no conversation to follow up on")
    sim, follow_up = similarity(turn)
    if sim >= REUSE_ABOVE or (follow_up and sim >= FOLLOW_UP_REUSE_ABOVE):
        return FetchDecision(
            False, "similarity", f"the documents in hand match the question ({sim:.2f})", sim
        )
    if sim < FETCH_BELOW:
        return FetchDecision(
            True, "similarity", f"the documents in hand don't match the question ({sim:.2f})", sim
        )
    if not turn.model_judges("fetch_check"):
        return FetchDecision(
            True,
            "similarity",
            f"the documents in hand match the question only partly ({sim:.2f}): searching again (the embedded "
            "model is not asked)",
            sim,
        )
    verdict = ask_model(turn)
    if verdict is None:
        return FetchDecision(True, "fallback", f"unsure ({sim:.2f}) and no model answer: search again", sim)
    reason = "the model asked for a new search" if verdict else "the model found the documents in hand enough"
    return FetchDecision(verdict, "llm", reason, sim)


def similarity(turn: Turn) -> tuple[float, bool]:
    """(the best similarity between the message and the documents in hand, whether it reads as a follow-up)."""
    doc_vectors = turn.space.embed_documents([d.context or d.text for d in turn.request.docs])
    follow_up = is_follow_up(turn.request.prompt)
    text = turn.request.prompt
    if follow_up:
        # "Tell me more about that" says little by itself: judge it together with the question it follows.
        text = f"{last_user_question(turn)} {turn.request.prompt}"
    return max_similarity(turn.embed_query(text), doc_vectors), follow_up


def ask_model(turn: Turn) -> bool | None:
    """The utility model's YES/NO on whether the follow-up needs a new search (None: it can't say)."""
    listing = "\n".join(f"- {d.filename}: {(d.text or '')[:160]}" for d in turn.request.docs[:8])
    body = f"Sources already retrieved:\n{listing}\n\nConversation:\n{history_excerpt(turn)}\n\nFollow-up: {turn.request.prompt}"
    return turn.ask_yes_no(turn.prompt("fetch_check"), body)
