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
    # How often a waiting turn reads its place in line and says it when it moved. Only the turn at the head is
    # woken when a slot frees: a hundred waiting turns all woken, each sending a step, at every slot handed over
    # was a tenth of a RAG turn's CPU in a burst (docs/benchmarks.md, "Sixth round").
    REPORT_S = 1.0
    # A turn that has its answer already (back for its grounding check or provenance) waits as if it had arrived
    # this much later: turns that arrived up to this long after it reach their first token first, and none that
    # arrived later passes it. In a burst that is the difference between the last first token coming after every
    # turn's check and coming after every turn's search (docs/benchmarks.md, "Eleventh round").
    ANSWERED_DEFER_S = 2.0

    def __init__(self, slots: int, max_queued: int):
        self.slots = max(1, slots)
        self.max_queued = max(0, max_queued)
        # threading primitives are greenlet-aware once gevent has patched the process.
        self._lock = threading.Lock()
        # (turn start, arrival number): waiting in order of the turns' arrival (a turn back with its answer as if
        # it had arrived ANSWERED_DEFER_S later), so a turn coming back for its provenance goes ahead of turns that
        # came in well after it.
        self._waiting: list[tuple[float, int]] = []
        self._wakers: dict[tuple[float, int], threading.Event] = {}  # set: a slot may be yours, look
        self._seq = itertools.count()
        self._busy = 0
        self._hold_s = 0.2  # running mean of how long a turn holds a slot, for Retry-After
        metrics.QUEUE_SLOTS.set(self.slots)

    def _gauges(self) -> None:
        """The queue's depth for /metrics; called with the lock held, after each change."""
        metrics.QUEUE_WAITING.set(len(self._waiting))
        metrics.QUEUE_BUSY.set(self._busy)

    def _wake_head(self) -> None:
        """Called with the lock held: the first in line is told when a slot is free for it."""
        if self._waiting and self._busy < self.slots:
            self._wakers[self._waiting[0]].set()

    def stats(self) -> dict:
        with self._lock:
            return {"slots": self.slots, "busy": self._busy, "waiting": len(self._waiting)}

    def admit(self) -> None:
        """Refuse a new turn (503) when the queue is already full; called before the stream starts."""
        with self._lock:
            waiting = len(self._waiting)
            if self._busy >= self.slots and waiting >= self.max_queued:
                retry = max(1, math.ceil((waiting + 1) * self._hold_s / self.slots))
                raise Busy(
                    f"the worker is at capacity ({self._busy} turns running, {waiting} waiting, "
                    f"MAX_QUEUED_TURNS={self.max_queued}); try again in {retry} s",
                    retry_after_s=retry,
                )

    def wait(self, since: float, *, answered: bool = False) -> Iterator[int]:
        """Queue a turn that started at `since` (monotonic) and wait for a slot, yielding its 1-based position
        at once, then when it has moved (read every REPORT_S) and every HEARTBEAT_S. Returns holding a slot;
        the caller must `release()` it. Closing the generator while it waits leaves the queue. `answered`: the
        turn has streamed its answer (its grounding check or provenance waits), see ANSWERED_DEFER_S."""
        with self._lock:
            if self._busy < self.slots and not self._waiting:
                self._busy += 1
                self._gauges()
                return
            ticket = (since + (self.ANSWERED_DEFER_S if answered else 0.0), next(self._seq))
            bisect.insort(self._waiting, ticket)
            waker = self._wakers[ticket] = threading.Event()
            self._gauges()
        acquired = False
        try:
            last, said = None, 0.0
            while True:
                with self._lock:
                    position = self._waiting.index(ticket) + 1
                    if position == 1 and self._busy < self.slots:
                        self._waiting.pop(0)
                        self._busy += 1
                        self._gauges()
                        acquired = True
                        self._wake_head()  # another free slot goes to the next in line
                        return
                    waker.clear()  # under the lock: a slot freed from now on sets it again
                now = time.monotonic()
                since_said = now - said
                if (
                    last is None
                    or since_said >= self.HEARTBEAT_S
                    or (position != last and since_said >= self.REPORT_S)
                ):
                    last, said = position, now
                    yield position
                    continue
                waker.wait(timeout=self.REPORT_S - since_said % self.REPORT_S)  # the next look is due
        finally:
            with self._lock:
                self._wakers.pop(ticket, None)
                if not acquired and ticket in self._waiting:
                    self._waiting.remove(ticket)
                    self._gauges()
                    self._wake_head()

    def release(self, held_s: float | None = None) -> None:
        with self._lock:
            self._busy -= 1
            self._gauges()
            if held_s is not None:
                self._hold_s = 0.9 * self._hold_s + 0.1 * held_s
            self._wake_head()

    @contextmanager
    def holding(self) -> Iterator[None]:
        """Hold a slot that `wait` acquired until the block ends."""
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.release(time.monotonic() - t0)


def queued(turn, *, answered: bool = False) -> Iterator:
    """`with (yield from queued(turn)):` waits in the worker's queue (in order of the turns' arrival; `answered`:
    the turn's answer is out, TurnQueue.ANSWERED_DEFER_S), yielding a `queued` step each time the turn's position
    changes, then holds a slot for the block."""
    q: TurnQueue = turn.services.turn_queue
    t0 = time.monotonic()
    for position in q.wait(turn.started, answered=answered):
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
