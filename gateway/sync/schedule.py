"""Each replica's scheduler: sources whose `next_run_at` has passed are queued as sync jobs.

A due source is claimed with one conditional UPDATE (`next_run_at` moved on `every` minutes, only where it still
holds the value read), so of several replicas polling the same database exactly one queues the run; the others'
UPDATE matches no row. A source whose last run has not finished is not queued twice (`queue_sync`).
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy import update
from sqlmodel import col, select

from ..context import Context, in_thread
from ..db import IndexSource, utcnow
from .routes import queue_sync
from .sources import after

log = logging.getLogger("gateway.sync")


def claim_due(c: Context) -> list[int]:
    """Claim the sources due now; their ids (each claimed by this replica only)."""
    now = utcnow()
    claimed: list[int] = []
    with c.db.session() as s:
        due = s.exec(
            select(IndexSource.id, IndexSource.next_run_at, IndexSource.every)
            .where(col(IndexSource.every).is_not(None), col(IndexSource.next_run_at) <= now)
            .order_by(col(IndexSource.next_run_at))
            .limit(100)
        ).all()
        for source_id, was, every in due:
            result = s.exec(
                update(IndexSource)
                .where(col(IndexSource.id) == source_id, col(IndexSource.next_run_at) == was)
                .values(next_run_at=after(every, now))
            )
            if result.rowcount == 1:
                claimed.append(source_id)
        s.commit()
    return claimed


def queue_due(c: Context) -> int:
    queued = 0
    for source_id in claim_due(c):
        try:
            _job, created = queue_sync(c, source_id, None)
            queued += int(created)
        except Exception:
            log.exception("queueing the scheduled sync of source %s failed", source_id)
    return queued


async def schedule_forever(c: Context) -> None:
    while True:
        try:
            if await in_thread(queue_due, c):
                c.jobs.poke()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("the sync scheduler's round failed; it tries again")
        await asyncio.sleep(c.settings.sync_poll_s)
