"""A turn's life in the database: write-ahead, periodic saves, heartbeat, stop requests and crash recovery.

A turn is stored before the worker is called: the user's message and an assistant message with status
`running`. While it runs, the replica reading it from the worker (its `turn_owner`) saves the answer so far into
that message in one short UPDATE (at least every second or every 50 tokens) and refreshes the chat's
`turn_heartbeat_at`. A heartbeat older than TURN_LOCK_STALE_S means the owner died: any replica that meets such
a turn (start-up sweep, periodic sweep, a new message, a read of the chat, stop, rejoin) marks it `interrupted`
with its partial text and releases the chat. A stop asked for on any replica is written to `turn_stop_at`; the
owner reads it with its heartbeat and acts on it.

Everything here is synchronous SQL for a thread (context.in_thread), portable between SQLite and Postgres, but
the sweep that runs `recover_stale` periodically.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

from sqlalchemy import ColumnElement, Connection, bindparam
from sqlmodel import Session, col, select, update

from .context import in_thread
from .db import Chat, Database, Message, utcnow

log = logging.getLogger("gateway.lifecycle")

CRASHED = "the gateway handling this answer stopped before it was complete"
STOPPED = "stopped by the user"


def aware(value: datetime | None) -> datetime | None:
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def is_stale(chat: Chat, stale_s: float, now: datetime | None = None) -> bool:
    """True when the chat's turn lock is held by a replica that stopped refreshing it."""
    if chat.turn_started_at is None:
        return False
    beat = aware(chat.turn_heartbeat_at) or aware(chat.turn_started_at)
    return beat < (now or utcnow()) - timedelta(seconds=stale_s)


def stale_cutoff(stale_s: float) -> datetime:
    """A heartbeat older than this is a dead owner's."""
    return utcnow() - timedelta(seconds=stale_s)


def free_or_stale(cutoff: datetime | ColumnElement) -> ColumnElement[bool]:
    """SQL: the lock is free or left by a replica that stopped refreshing it before `cutoff` (a value, or a
    parameter of a statement built once)."""
    return (
        col(Chat.turn_started_at).is_(None)
        | (col(Chat.turn_heartbeat_at).is_not(None) & (col(Chat.turn_heartbeat_at) < cutoff))
        | (col(Chat.turn_heartbeat_at).is_(None) & (col(Chat.turn_started_at) < cutoff))
    )


def alive_since(cutoff: datetime | ColumnElement) -> ColumnElement[bool]:
    """SQL: a turn runs in the chat, its owner alive (the lock is held and refreshed since `cutoff`)."""
    return col(Chat.turn_started_at).is_not(None) & (
        (col(Chat.turn_heartbeat_at).is_not(None) & (col(Chat.turn_heartbeat_at) >= cutoff))
        | (col(Chat.turn_heartbeat_at).is_(None) & (col(Chat.turn_started_at) >= cutoff))
    )


def stale_condition(stale_s: float) -> ColumnElement[bool]:
    return free_or_stale(stale_cutoff(stale_s))


# The statements every turn runs, built once. Building a statement costs more CPU than running it on SQLite;
# a statement built once also keeps its cache key (docs/benchmarks.md, the concurrency bench's sixth round).
# The UPDATEs without `values()` take their SET columns from the parameters they run with.
CHATS, MESSAGES = Chat.__table__, Message.__table__
BEAT = (
    CHATS.update()
    .where(CHATS.c.id == bindparam("b_chat"), CHATS.c.turn_message_id == bindparam("b_message"))
    .returning(CHATS.c.turn_stop_at)
)
RUNNING_ANSWER = MESSAGES.update().where(
    MESSAGES.c.id == bindparam("b_message"), MESSAGES.c.status == "running"
)
INTERRUPT = MESSAGES.update().where(MESSAGES.c.chat_id == bindparam("b_chat"), MESSAGES.c.status == "running")
BEATS = CHATS.update().where(
    CHATS.c.id.in_(bindparam("b_chats", expanding=True)),
    CHATS.c.turn_message_id.in_(bindparam("b_messages", expanding=True)),
)
TURNS_OF = select(CHATS.c.id, CHATS.c.turn_message_id, CHATS.c.turn_stop_at).where(
    CHATS.c.id.in_(bindparam("b_chats", expanding=True))
)


def interrupt_running(s: Session | Connection, chat_id: int, reason: str = CRASHED) -> int:
    """Mark the chat's `running` messages interrupted, keeping their partial text. Returns how many."""
    result = s.execute(INTERRUPT, {"b_chat": chat_id, "status": "interrupted", "error": reason})
    return result.rowcount or 0


def clear_lock_values() -> dict:
    return {
        "turn_started_at": None,
        "turn_message_id": None,
        "turn_owner": None,
        "turn_heartbeat_at": None,
        "turn_stop_at": None,
    }


def recover_chat(s: Session, chat_id: int, stale_s: float) -> bool:
    """If the chat's turn was left by a dead replica: mark it interrupted and free the chat. Commits."""
    released = s.exec(
        update(Chat)
        .where(col(Chat.id) == chat_id, col(Chat.turn_started_at).is_not(None))
        .where(stale_condition(stale_s))
        .values(**clear_lock_values())
    )
    if (released.rowcount or 0) != 1:
        s.rollback()
        return False
    n = interrupt_running(s, chat_id)
    s.commit()
    log.warning("chat %s: turn left by a stopped gateway marked interrupted (%d messages)", chat_id, n)
    return True


def recover_stale(db: Database, stale_s: float, owner: str | None = None) -> int:
    """Every turn whose owner stopped refreshing it (or, at start-up, that no live replica owns) is
    marked interrupted and its chat released. Also repairs `running` messages whose chat holds no lock."""
    cutoff = stale_cutoff(stale_s)
    recovered = 0
    with db.session() as s:
        ids = s.exec(
            select(Chat.id).where(col(Chat.turn_started_at).is_not(None)).where(stale_condition(stale_s))
        ).all()
    for chat_id in ids:
        with db.session() as s:
            recovered += recover_chat(s, chat_id, stale_s)
    with db.session() as s:
        # Running messages no lock points at (a crash between two writes): old enough, they are orphans.
        orphans = s.exec(
            select(Message.id, Message.chat_id)
            .join(Chat, col(Chat.id) == col(Message.chat_id))
            .where(col(Message.status) == "running", col(Message.created_at) < cutoff)
            .where(col(Chat.turn_started_at).is_(None))
        ).all()
        for message_id, _chat_id in orphans:
            s.exec(
                update(Message)
                .where(col(Message.id) == message_id, col(Message.status) == "running")
                .values(status="interrupted", error=CRASHED)
            )
        s.commit()
    return recovered + len(orphans)


def save_progress(
    db: Database,
    chat_id: int,
    message_id: int,
    content: str | None,
    steps: list | None,
    documents: list | None,
) -> tuple[bool, bool]:
    """The owner's periodic write: the heartbeat and the answer so far (only what changed), nothing when the turn
    is no longer this one's. Returns (still_owned, stop_requested).

    The chat row is written before the message, the order in which the turn's final save (`turns/stored.py`: `save_complete`,
    `save_failed`: SQLAlchemy flushes the chats table first) takes them: one still running when the other
    starts waits for it, where the opposite order deadlocked on Postgres and lost one of the two writes."""
    with db.write() as conn:
        # One statement for the heartbeat, the ownership check and the stop request (RETURNING: SQLite 3.35+,
        # Postgres), one for what changed in the answer, none when nothing did.
        row = conn.execute(
            BEAT, {"b_chat": chat_id, "b_message": message_id, "turn_heartbeat_at": utcnow()}
        ).first()
        if row is None:
            return False, False
        values: dict = {}
        if content is not None:
            values["content"] = content
        if steps is not None:
            values["steps"] = steps
        if documents is not None:
            values["documents"] = documents
        if values:
            conn.execute(RUNNING_ANSWER, {"b_message": message_id, **values})
    return True, row[0] is not None


def check_turns(
    db: Database, turns: list[tuple[int, int]], beat: list[int] | None = None
) -> list[tuple[bool, bool]]:
    """`save_progress` with nothing to save, for several turns at once: for each (chat id, answer's message id),
    the same answer (still owned, stop requested). The chats in `beat` get their heartbeat written (those still
    owned: a turn's answer message names one chat), in one write; without any, one read without the write lock."""
    chats = sorted({chat for chat, _ in turns})
    beating = set(beat or ())
    if beating:
        with db.write() as conn:
            messages = sorted({message for chat, message in turns if chat in beating})
            now = utcnow()
            conn.execute(
                BEATS, {"b_chats": sorted(beating), "b_messages": messages, "turn_heartbeat_at": now}
            )
            found = {row[0]: row for row in conn.execute(TURNS_OF, {"b_chats": chats})}
    else:
        with db.read_engine.connect() as conn:
            found = {row[0]: row for row in conn.execute(TURNS_OF, {"b_chats": chats})}
    out = []
    for chat_id, message_id in turns:
        row = found.get(chat_id)
        owned = row is not None and row[1] == message_id
        out.append((owned, owned and row[2] is not None))
    return out


def request_stop(db: Database, chat_id: int) -> int | None:
    """Record a stop for the chat's running turn; returns its message id, or None when none runs."""
    with db.session() as s:
        result = s.exec(
            update(Chat)
            .where(col(Chat.id) == chat_id, col(Chat.turn_message_id).is_not(None))
            .values(turn_stop_at=utcnow())
        )
        if (result.rowcount or 0) != 1:
            s.rollback()
            return None
        message_id = s.exec(select(Chat.turn_message_id).where(col(Chat.id) == chat_id)).first()
        s.commit()
        return message_id


async def sweep_forever(db: Database, stale_s: float) -> None:
    """At start-up and then periodically: turns whose owner stopped refreshing them become interrupted."""
    while True:
        try:
            n = await in_thread(recover_stale, db, stale_s)
            if n:
                log.warning("marked %d turns left by a stopped gateway as interrupted", n)
        except Exception:
            log.exception("recovering abandoned turns failed; trying again")
        await asyncio.sleep(max(1.0, stale_s / 2))
