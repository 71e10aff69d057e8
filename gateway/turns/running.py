"""Turns running for one account, counted in the database on every gateway process and replica
(MAX_TURNS_PER_USER): its chats with a live turn lock, and its `/v1` turns.

A `/v1` turn stores no chat, so it holds a row of `running_turns` while the worker's answer is relayed: taken in a
transaction that counts both kinds under the account's lock (its user row, locked on Postgres; SQLite writes one
transaction at a time), deleted when the relay ends, and kept alive by its process's heartbeat (every quarter of
TURN_LOCK_STALE_S): the row of a process that died stops counting once its `expires_at` has passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from sqlalchemy import Connection, bindparam, func
from sqlmodel import col, delete, select, update

from .. import lifecycle
from ..context import Context, in_thread
from ..db import Chat, RunningTurn, User
from ..errors import TooManyRequests

log = logging.getLogger("gateway.turns")


# Built once (lifecycle.py says why): the account's row locked, and both kinds of running turns in one query.
LOCK_ACCOUNT = select(User.id).where(col(User.id) == bindparam("b_user")).with_for_update()
_CHAT_TURNS = (
    select(func.count())
    .select_from(Chat)
    .where(col(Chat.owner_id) == bindparam("b_user"), col(Chat.id) != bindparam("b_but"))
    .where(lifecycle.alive_since(bindparam("b_cutoff")))
)
_V1_TURNS = (
    select(func.count())
    .select_from(RunningTurn)
    .where(col(RunningTurn.user_id) == bindparam("b_user"), col(RunningTurn.expires_at) > bindparam("b_now"))
)
LIVE_TURNS = select(_CHAT_TURNS.scalar_subquery() + _V1_TURNS.scalar_subquery())


def lock_account(conn: Connection, user_id: int) -> None:
    """One start per account at a time, to the end of the transaction. Not on SQLite, which has no row locks
    and runs one write transaction at a time already."""
    if conn.dialect.name != "sqlite":
        conn.execute(LOCK_ACCOUNT, {"b_user": user_id})


def live_turns(conn: Connection, c: Context, user_id: int, but: int | None = None) -> int:
    """The account's running turns on any process: chats with a live turn (`but`: except this chat) and
    `/v1` turns whose heartbeat is fresh."""
    params = {
        "b_user": user_id,
        "b_but": 0 if but is None else but,  # ids start at 1: 0 excludes no chat
        "b_cutoff": lifecycle.stale_cutoff(c.settings.turn_lock_stale_s),
        "b_now": time.time(),
    }
    return int(conn.execute(LIVE_TURNS, params).scalar_one())


def refuse_past_limit(c: Context, running: int) -> None:
    limit = c.settings.max_turns_per_user
    if running >= limit:
        raise TooManyRequests(
            f"you already have {limit} answers being written: wait for one to finish",
            code="too_many_turns",
            headers={"Retry-After": "5"},
        )


def take_v1(c: Context, user_id: int) -> int:
    """A `/v1` turn's row (run in a thread), or the 429 of MAX_TURNS_PER_USER."""
    with c.db.write() as conn:
        lock_account(conn, user_id)
        refuse_past_limit(c, live_turns(conn, c, user_id))
        table = RunningTurn.__table__
        row = conn.execute(
            table.insert()
            .values(user_id=user_id, expires_at=time.time() + c.settings.turn_lock_stale_s)
            .returning(table.c.id)
        ).one()
    turn_id = int(row[0])
    c.v1_turns.add(turn_id)
    return turn_id


def release_v1(c: Context, turn_id: int) -> None:
    """The relay ended (run in a thread): the row goes (idempotent)."""
    if turn_id not in c.v1_turns:
        return
    c.v1_turns.discard(turn_id)
    with c.db.write() as conn:
        conn.execute(delete(RunningTurn).where(col(RunningTurn.id) == turn_id))


def beat_v1(c: Context) -> None:
    """Keep this process's `/v1` rows alive; drop every row whose process stopped beating."""
    now = time.time()
    held = list(c.v1_turns)
    with c.db.write() as conn:
        if held:
            conn.execute(
                update(RunningTurn)
                .where(col(RunningTurn.id).in_(held))
                .values(expires_at=now + c.settings.turn_lock_stale_s)
            )
        conn.execute(delete(RunningTurn).where(col(RunningTurn.expires_at) <= now))


async def beat_v1_forever(c: Context) -> None:
    every = max(c.settings.turn_heartbeat_s, c.settings.turn_lock_stale_s / 4)
    while True:
        await asyncio.sleep(every)
        if not c.v1_turns:
            continue
        with contextlib.suppress(
            Exception
        ):  # a busy database: the next beat comes well within the stale time
            await in_thread(beat_v1, c)
