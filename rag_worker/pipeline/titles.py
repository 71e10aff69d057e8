"""Chat titles: a few words from the utility model, or the question's first words when it can't."""

from __future__ import annotations

import re

from ..services import Services
from . import utility
from .prompts import DEFAULTS

MAX_WORDS = 6


def fallback_title(question: str) -> str:
    words = re.sub(r"\s+", " ", question).strip().split(" ")
    title = " ".join(words[:MAX_WORDS]).rstrip("?.!,;:")
    return (title[:60] + ("…" if len(words) > MAX_WORDS else "")) or "New chat"


def make_title(services: Services, question: str) -> str:
    messages = [
        {"role": "system", "content": DEFAULTS["title"]},
        {"role": "user", "content": question[:2000]},
    ]
    raw = utility.ask(
        services.llm.resolve,
        messages,
        max_tokens=24,
        failing="title from the model failed, using the question's words",
    )
    if raw is None:
        return fallback_title(question)
    line = next((ln for ln in raw.strip().splitlines() if ln.strip()), "")
    title = re.sub(r"^(title\s*:\s*)", "", line.strip(), flags=re.IGNORECASE).strip().strip('"*#').strip()
    words = title.split()
    if not words or len(words) > 2 * MAX_WORDS:
        return fallback_title(question)
    return " ".join(words[: MAX_WORDS + 2])[:80]
