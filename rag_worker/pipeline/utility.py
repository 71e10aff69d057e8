"""Ask the utility model, fall back on failure: how every helper step calls the small model.

The rewrite, triage, relevance and fetch checks, the retry query, HyDE and chat titles each ask the utility
model a short question (temperature 0) and have a model-free answer ready. A failure of any kind (a backend
down, a timeout, a model not pulled) must never sink the turn: it is logged as one warning saying what the step
does instead, and the caller's fallback stands in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from ..llm import Resolved

log = logging.getLogger("rag_worker.pipeline")


def chat(llm: Resolved, messages: list[dict], max_tokens: int) -> str:
    """One short call to the utility model; raises what the backend raises."""
    return llm.backend.chat(messages, model=llm.utility_model, temperature=0.0, max_tokens=max_tokens)


def ask(
    llm: Resolved | Callable[[], Resolved], messages: list[dict], *, max_tokens: int, failing: str
) -> str | None:
    """The utility model's reply, or None when it failed (logged as a warning: "<failing>: <error>").

    `llm` is the turn's resolved backend, or a function resolving one (resolving can fail too, e.g. for a chat
    title asked outside a turn)."""
    try:
        return chat(llm() if callable(llm) else llm, messages, max_tokens)
    except Exception as exc:  # a helper step must never sink the turn: the caller's fallback answers
        log.warning("%s: %s", failing, exc)
        return None
