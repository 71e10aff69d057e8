"""The beats of this process's running turns that have nothing new to save, gathered: the turns whose beats come
within BATCH_S of each other share one statement (a read of their stop requests, or one heartbeat UPDATE for
all of them) instead of a transaction each. A burst of turns waiting in the worker's queue then costs the
database a statement per beat, not one per turn."""

from __future__ import annotations

import asyncio

from .. import lifecycle
from ..context import in_thread
from ..db import Database

BATCH_S = 0.05  # how long the first beat of a batch waits for others (a stop is picked up that much later)

Key = tuple[int, int]  # (chat id, the turn's message id)


class Beats:
    def __init__(self, db: Database):
        self.db = db
        self.pending: dict[bool, list[tuple[Key, asyncio.Future]]] = {True: [], False: []}
        self.flushes: dict[bool, asyncio.Task | None] = {True: None, False: None}

    async def beat(self, chat_id: int, message_id: int, write: bool) -> tuple[bool, bool]:
        """(still owned, stop requested), as `lifecycle.save_progress` answers; `write`: refresh the heartbeat."""
        fut = asyncio.get_running_loop().create_future()
        self.pending[write].append(((chat_id, message_id), fut))
        if self.flushes[write] is None:
            self.flushes[write] = asyncio.create_task(self._flush(write), name="turn-beats")
        return await fut

    async def _flush(self, write: bool) -> None:
        try:
            await asyncio.sleep(BATCH_S)
        finally:
            batch, self.pending[write], self.flushes[write] = self.pending[write], [], None
        keys = [key for key, _ in batch]
        try:
            found = await in_thread(lifecycle.beat_many if write else lifecycle.check_many, self.db, keys)
        except BaseException as exc:
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc if isinstance(exc, Exception) else RuntimeError("beat cancelled"))
            if not isinstance(exc, Exception):
                raise
            return
        for key, fut in batch:
            if not fut.done():
                fut.set_result((key in found, found.get(key, False)))
