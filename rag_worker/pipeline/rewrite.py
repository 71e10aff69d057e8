"""History-aware rewrite of a follow-up into a standalone search query."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .cues import is_follow_up, words
from .fetch_check import last_user_question
from .turn import Turn, history_excerpt

PREFIX_RE = re.compile(r"^(rewritten|standalone)?\s*(question|query)\s*:\s*", re.IGNORECASE)


@dataclass
class Rewrite:
    query: str
    rewritten: str | None
    method: str


def rewrite(turn: Turn) -> Rewrite:
    prompt = turn.request.prompt.strip()
    has_conversation = any(m.role == "user" for m in turn.request.history)
    if not turn.options.rewrite or not has_conversation:
        return Rewrite(prompt, None, "skipped")
    if not is_follow_up(prompt) and len(words(prompt)) >= 4:
        return Rewrite(prompt, None, "heuristic")
    messages = [
        {"role": "system", "content": turn.prompt("rewrite")},
        {
            "role": "user",
            "content": (
                f"Conversation:\n{history_excerpt(turn)}\n\n"
                f"Rewrite the question below as a standalone question.\nQuestion: {prompt}"
            ),
        },
    ]
    reply = turn.ask_utility(messages, max_tokens=96, failing="rewrite fell back to concatenation")
    candidate = clean(reply or "")
    if plausible(candidate, prompt):
        if candidate.casefold() == prompt.casefold():
            return Rewrite(prompt, None, "llm")
        return Rewrite(candidate, candidate, "llm")
    # Model-free fallback: the follow-up read together with the question it follows.
    combined = f"{last_user_question(turn).strip()} {prompt}".strip()
    return Rewrite(combined, combined if combined != prompt else None, "fallback")


def clean(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    first = PREFIX_RE.sub("", lines[0]).strip().strip('"').strip("'").strip()
    return first


def plausible(candidate: str, prompt: str) -> bool:
    if not candidate or len(candidate) < 3:
        return False
    if len(candidate) > max(400, 4 * len(prompt)):
        return False
    return not candidate.lower().startswith(("i cannot", "i can't", "sorry", "as an ai"))
