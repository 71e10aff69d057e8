"""The owner's beats of its running turns that have nothing to save, gathered: is each turn still this replica's,
is a stop asked for, and (every quarter of TURN_LOCK_STALE_S) its heartbeat written (gateway/lifecycle.py,
`check_turns`).

Every running turn beats once per TURN_HEARTBEAT_S, and a process's turns beat at about the same moments (a burst
starts them together; a turn waiting in the worker's queue beats for as long as it waits). The turns that beat
within a short window share one transaction and one trip to a thread, instead of one each: both cost the gateway
more CPU than the statements themselves (docs/benchmarks.md, the concurrency bench's sixth round).
"""

from __future__ import annotations

import asyncio

import anyio

from .. import lifecycle
from ..context import in_lane
from ..db import Database

WINDOW_S = 0.05  # at most this much later than the turn's own beat (a tenth of the beat, when shorter)


class TurnChecks:
    """One per process (Context.turn_checks)."""

    def __init__(self, db: Database, heartbeat_s: float, lane: anyio.CapacityLimiter):
        self.db, self.lane = db, lane
        self.window_s = min(WINDOW_S, heartbeat_s / 10)
        self.waiting: list[tuple[int, int, bool, asyncio.Future]] = []
        self.gathering: asyncio.Task | None = None

    async def check(self, chat_id: int, message_id: int, beat: bool = False) -> tuple[bool, bool]:
        """(still owned, stop requested), as `lifecycle.save_progress` with nothing to save; `beat`: the heartbeat
        written too. The error, if the statements fail."""
        answer: asyncio.Future = asyncio.get_running_loop().create_future()
        self.waiting.append((chat_id, message_id, beat, answer))
        if self.gathering is None:
            self.gathering = asyncio.create_task(self.read_together(), name="turn-checks")
            self.gathering.add_done_callback(self.cancelled_early)
        return await answer

    def cancelled_early(self, task: asyncio.Task) -> None:
        """A gathering cancelled before it ran (it never reached its own handler): its turns' waits end too."""
        if task.cancelled() and self.gathering is task:
            asked, self.waiting, self.gathering = self.waiting, [], None
            for *_turn, answer in asked:
                answer.cancel()

    async def read_together(self) -> None:
        asked: list = []

        def take() -> list:
            """The turns asking so far; the next one to ask starts the next gathering."""
            taken, self.waiting, self.gathering = self.waiting, [], None
            return taken

        try:
            await asyncio.sleep(self.window_s)
            asked = take()
            turns = [(chat, message) for chat, message, _b, _a in asked]
            beat = [chat for chat, _m, beats, _a in asked if beats]
            found = await in_lane(self.lane, lifecycle.check_turns, self.db, turns, beat)
        except BaseException as exc:
            # A failed read: every turn asking reports it and tries again at its next beat. This gathering
            # cancelled (the process stopping), in its window or in its read: so is each turn's wait, which never
            # hangs on an answer, and the next turn to ask starts a new gathering.
            if self.gathering is asyncio.current_task():
                asked = take()
            for *_turn, answer in asked:
                if not answer.done():
                    if isinstance(exc, Exception):
                        answer.set_exception(exc)
                    else:
                        answer.cancel()
            if not isinstance(exc, Exception):
                raise
            return
        for (*_turn, answer), result in zip(asked, found, strict=True):
            if not answer.done():  # not if its turn was cancelled meanwhile
                answer.set_result(result)
