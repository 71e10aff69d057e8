"""A new chat's name, asked of the worker once its first turn is stored (its first words if that fails)."""

from __future__ import annotations

import logging

from sqlmodel import col, update

from ..context import Context, in_lane
from ..db import Chat
from ..errors import ApiError
from .state import TurnPlan
from .stored import release

log = logging.getLogger("gateway.turns")

TITLE_WORDS = 6


def fallback_title(message: str) -> str:
    words = message.split()
    title = " ".join(words[:TITLE_WORDS])
    return (title[:80] + "…") if len(title) > 80 else title + ("…" if len(words) > TITLE_WORDS else "")


def store_title(c: Context, plan: TurnPlan, title: str) -> None:
    """Name the chat and end its turn. Only if still untitled: a title the user set meanwhile wins."""
    with c.db.session() as s:
        s.exec(
            update(Chat).where(col(Chat.id) == plan.chat_id, col(Chat.title).is_(None)).values(title=title)
        )
        release(s, plan)
        s.commit()


async def name_chat(c: Context, plan: TurnPlan) -> str:
    try:
        title = await c.worker.create_title(plan.message)
    except ApiError as exc:
        log.info("create_title failed (%s); using the first words", exc.message)
        title = ""
    title = " ".join(title.split())[:200] or fallback_title(plan.message)
    await in_lane(c.turn_lane, store_title, c, plan, title)
    return title
