"""Each index's embedder and full-text language, as the gateway keeps them beside the index row.

Set when the index is created (the body's choice, or the defaults the worker then makes its table with). Rows
from before migration 12 have none: `backfill` reads the worker's marker of each (GET /indexes/<name>) and
stores it, or the defaults when the worker has no table for it yet (its first upload makes one with them).
It runs when the gateway starts, and again a minute later while the worker could not be asked."""

from __future__ import annotations

import asyncio
import logging

from sqlmodel import col, select

from contract.languages import DEFAULT_EMBEDDER, DEFAULT_INDEX_LANGUAGE

from ..context import Context, in_thread
from ..db import Database, Index
from ..errors import ApiError
from ..streams import WorkerNotFound

log = logging.getLogger("gateway.indexes")
RETRY_S = 60.0


def unknown(db: Database) -> list[tuple[int, str]]:
    """(id, worker table name) of the rows whose settings are not known yet."""
    with db.session() as s:
        rows = s.exec(select(Index.id, Index.worker_name).where(col(Index.embedder).is_(None))).all()
    return [(int(i), str(n)) for i, n in rows]


def store(db: Database, index_id: int, embedder: str, language: str) -> None:
    with db.session() as s:
        row = s.get(Index, index_id)
        if row is not None and row.embedder is None:
            row.embedder, row.language = embedder, language
            s.add(row)
            s.commit()


async def backfill(c: Context) -> int:
    """Fills what the worker can tell; the number of rows left unknown (the worker could not be asked)."""
    left = 0
    for index_id, worker_name in await in_thread(unknown, c.db):
        try:
            found = await c.worker.index_settings(worker_name)
            embedder, language = found["embedder"], found["language"]
        except WorkerNotFound:
            embedder, language = DEFAULT_EMBEDDER, DEFAULT_INDEX_LANGUAGE  # no table yet: it gets these
        except (ApiError, KeyError, TypeError) as exc:
            log.warning("could not read the settings of index %s from the worker: %s", index_id, exc)
            left += 1
            continue
        await in_thread(store, c.db, index_id, embedder, language)
    return left


async def backfill_forever(c: Context) -> None:
    while True:
        try:
            if await backfill(c) == 0:
                return
        except Exception:  # the database is away for a moment: try again later
            log.exception("backfilling index settings failed")
        await asyncio.sleep(RETRY_S)
