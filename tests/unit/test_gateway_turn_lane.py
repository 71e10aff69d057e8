"""The turn lane (gateway/context.py, `in_lane`): a turn's database work runs on at most TURN_DB_THREADS threads
at once, sees the request's context (its log lines keep the request id), never starts when cancelled while it
waits its turn, and runs to its end when cancelled once started (a save is never cut in half; as in_thread, the
cancelled caller does not wait for it). TURN_DB_THREADS'
default follows the database: one thread on SQLite, four on Postgres."""

from __future__ import annotations

import asyncio
import threading
import time

import anyio
import pytest
from pydantic import ValidationError

from contract import observe
from gateway.context import in_lane
from gateway.settings import Settings


class Gauge:
    """How many calls run at once, and the most there ever were."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.most = 0

    def work(self, value: int, hold_s: float = 0.02) -> int:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(hold_s)
        with self.lock:
            self.now -= 1
        return value * 2


@pytest.mark.parametrize("threads", [1, 3])
def test_the_lane_runs_at_most_its_threads_at_once_and_every_call_gets_its_own_answer(threads: int) -> None:
    gauge = Gauge()

    async def main() -> list[int]:
        lane = anyio.CapacityLimiter(threads)
        return await asyncio.gather(*(in_lane(lane, gauge.work, i) for i in range(12)))

    assert asyncio.run(main()) == [i * 2 for i in range(12)]
    assert gauge.most == threads


def test_the_lane_runs_in_the_callers_context() -> None:
    async def one(lane: anyio.CapacityLimiter, rid: str) -> str | None:
        observe.request_id.set(rid)
        return await in_lane(lane, observe.request_id.get)

    async def main() -> list[str | None]:
        lane = anyio.CapacityLimiter(1)
        return await asyncio.gather(one(lane, "req-a"), one(lane, "req-b"))

    assert asyncio.run(main()) == ["req-a", "req-b"]


def test_a_call_cancelled_while_queued_never_runs_and_one_cancelled_while_running_finishes() -> None:
    ran: list[str] = []
    started = threading.Event()

    def save(name: str) -> None:
        started.set()
        time.sleep(0.2)
        ran.append(name)

    async def main() -> None:
        lane = anyio.CapacityLimiter(1)
        first = asyncio.create_task(in_lane(lane, save, "running"))
        await asyncio.to_thread(started.wait, 5)
        queued = asyncio.create_task(in_lane(lane, save, "queued"))
        await asyncio.sleep(0.02)
        queued.cancel()
        first.cancel()
        for task in (first, queued):
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(main())
    deadline = time.monotonic() + 5
    while not ran and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # time enough for the queued one, had it been started
    assert ran == ["running"]  # the started save ran to its end; the queued one never began


def test_turn_db_threads_defaults_to_the_database_and_refuses_nonsense(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("TURN_DB_THREADS", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv("INDEX_STORE", str(tmp_path))
    assert Settings().resolved_turn_db_threads() == 1  # SQLite: one writer at a time
    monkeypatch.setenv("DATABASE_URL", "postgresql+psycopg://u:p@127.0.0.1:5432/g")
    assert Settings().resolved_turn_db_threads() == 4
    monkeypatch.setenv("TURN_DB_THREADS", "2")
    assert Settings().resolved_turn_db_threads() == 2
    for bad in ("-1", "65", "two"):
        monkeypatch.setenv("TURN_DB_THREADS", bad)
        with pytest.raises(ValidationError, match="TURN_DB_THREADS"):
            Settings()
