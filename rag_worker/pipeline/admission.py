"""A fair (FIFO) queue in front of a turn's CPU-bound stages: embedding, retrieval, reranking, provenance.

Under gevent every greenlet shares the process's CPUs; a hundred turns embedding and searching at once make each
take a hundred times longer and stretch the token gaps of the answers already streaming. So at most `slots`
turns run those stages at a time and the rest wait in arrival order, told where they stand (a `queued` step).
Token streaming from the model is I/O and never waits here. Beyond `max_queued` waiting turns a new turn is
refused up front with 503 and a Retry-After estimate instead of stalling.
"""

from __future__ import annotations

import bisect
import itertools
import math
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from .. import metrics
from ..errors import Unavailable


def default_slots() -> int:
    """One slot per CPU this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


class Busy(Unavailable):
    code = "busy"

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def to_dict(self) -> dict:
        return {**super().to_dict(), "retry_after_s": self.retry_after_s}


class TurnQueue:
    # How often a waiting turn repeats its position when it has not moved: keeps the stream alive and lets a
    # closed stream notice its client went away.
    HEARTBEAT_S = 2.0

    def __init__(self, slots: int, max_queued: int):
        self.slots = max(1, slots)
        self.max_queued = max(0, max_queued)
        # threading primitives are greenlet-aware once gevent has patched the process.
        self._cond = threading.Condition()
        # (turn start, arrival number): waiting in order of the turns' arrival, so a turn coming back for its
        # provenance goes ahead of turns that came in after it.
        self._waiting: list[tuple[float, int]] = []
        self._seq = itertools.count()
        self._busy = 0
        self._hold_s = 0.2  # running mean of how long a turn holds a slot, for Retry-After
        metrics.QUEUE_SLOTS.set(self.slots)

    def _gauges(self) -> None:
        """The queue's depth for /metrics; called with the lock held, after each change."""
        metrics.QUEUE_WAITING.set(len(self._waiting))
        metrics.QUEUE_BUSY.set(self._busy)

    def stats(self) -> dict:
        with self._cond:
            return {"slots": self.slots, "busy": self._busy, "waiting": len(self._waiting)}

    def admit(self) -> None:
        """Refuse a new turn (503) when the queue is already full; called before the stream starts."""
        with self._cond:
            waiting = len(self._waiting)
            if self._busy >= self.slots and waiting >= self.max_queued:
                retry = max(1, math.ceil((waiting + 1) * self._hold_s / self.slots))
                raise Busy(
                    f"the worker is at capacity ({self._busy} turns running, {waiting} waiting, "
                    f"MAX_QUEUED_TURNS={self.max_queued}); try again in {retry} s",
                    retry_after_s=retry,
                )

    def wait(self, since: float) -> Iterator[int]:
        """Queue a turn that started at `since` (monotonic) and wait for a slot, yielding its 1-based position whenever it changes (and every
        HEARTBEAT_S). Returns holding a slot; the caller must `release()` it. Closing the generator while it
        waits leaves the queue."""
        with self._cond:
            if self._busy < self.slots and not self._waiting:
                self._busy += 1
                self._gauges()
                return
            ticket = (since, next(self._seq))
            bisect.insort(self._waiting, ticket)
            self._gauges()
        acquired = False
        try:
            last, said = None, 0.0
            while True:
                with self._cond:
                    position = self._waiting.index(ticket) + 1
                    if position == 1 and self._busy < self.slots:
                        self._waiting.pop(0)
                        self._busy += 1
                        self._gauges()
                        acquired = True
                        self._cond.notify_all()  # everyone behind moves up one
                        return
                    if position == last and time.monotonic() - said < self.HEARTBEAT_S:
                        self._cond.wait(timeout=self.HEARTBEAT_S)
                        continue
                last, said = position, time.monotonic()
                yield position
        finally:
            if not acquired:
                with self._cond:
                    if ticket in self._waiting:
                        self._waiting.remove(ticket)
                        self._gauges()
                        self._cond.notify_all()

    def release(self, held_s: float | None = None) -> None:
        with self._cond:
            self._busy -= 1
            self._gauges()
            if held_s is not None:
                self._hold_s = 0.9 * self._hold_s + 0.1 * held_s
            self._cond.notify_all()

    @contextmanager
    def holding(self) -> Iterator[None]:
        """Hold a slot that `wait` acquired until the block ends."""
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.release(time.monotonic() - t0)


def queued(turn) -> Iterator:
    """`with (yield from queued(turn)):` waits in the worker's queue (in order of the turns' arrival), yielding a `queued` step each time the
    turn's position changes, then holds a slot for the block."""
    q: TurnQueue = turn.services.turn_queue
    t0 = time.monotonic()
    for position in q.wait(turn.started):
        yield turn.step(
            "queued",
            f"Waiting for a free slot: {_ordinal(position)} in line",
            position=position,
            running=q.slots,
        )
    waited = time.monotonic() - t0
    turn.timings["queued_ms"] = turn.timings.get("queued_ms", 0) + int(waited * 1000)
    metrics.QUEUE_WAIT.observe(waited)
    return q.holding()


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
