"""The beats of a process's running turns, gathered (gateway/turns/checks.py), against a real SQLite database:
each turn asking in the same window gets its own answer (still owned, stop asked) from one read, the heartbeat
is written for the turns that beat, a failed read reaches every turn asking, and a gathering cancelled (the
process stopping) leaves no turn waiting for ever."""

from __future__ import annotations

import asyncio

import anyio
import pytest
from sqlmodel import select

from gateway import lifecycle
from gateway.db import Chat, Database, User
from gateway.turns.checks import TurnChecks
from tests.unit.test_gateway_db_sessions import running_turn


@pytest.fixture
def db(tmp_path):
    database = Database(f"sqlite:///{tmp_path / 'g.db'}")
    database.migrate()
    yield database
    database.dispose()


def test_turns_checked_together_each_get_their_own_answer_and_their_heartbeat(db) -> None:
    with db.session() as s:
        user = User(username="beats", password_hash="x")
        s.add(user)
        s.commit()
        owner = user.id
    plain, stopped, beating = (
        running_turn(db, owner),
        running_turn(db, owner, stop=True),
        running_turn(db, owner),
    )
    with db.session() as s:
        before = s.get(Chat, beating[0]).turn_heartbeat_at
    gone = (plain[0], plain[1] + 1000)  # a message that no longer holds its chat (taken over, or ended)

    async def main():
        checks = TurnChecks(db, heartbeat_s=5.0, lane=anyio.CapacityLimiter(1))
        return await asyncio.gather(
            checks.check(*plain),
            checks.check(*stopped),
            checks.check(*beating, beat=True),
            checks.check(*gone),
        )

    assert asyncio.run(main()) == [(True, False), (True, True), (True, False), (False, False)]
    with db.session() as s:
        assert s.get(Chat, beating[0]).turn_heartbeat_at > before  # written for the turn that beat
        assert s.exec(select(Chat.turn_message_id).where(Chat.id == plain[0])).one() == plain[1]


def test_a_failed_read_reaches_every_turn_asking_and_a_cancelled_gathering_leaves_none_waiting(
    db, monkeypatch
) -> None:
    def broken(*_args, **_kwargs):
        raise RuntimeError("database is locked")

    monkeypatch.setattr(lifecycle, "check_turns", broken)

    async def failing():
        checks = TurnChecks(db, heartbeat_s=5.0, lane=anyio.CapacityLimiter(1))
        return await asyncio.gather(checks.check(1, 2), checks.check(3, 4), return_exceptions=True)

    assert [str(e) for e in asyncio.run(failing())] == ["database is locked"] * 2

    async def cancelled(pause: float):
        checks = TurnChecks(db, heartbeat_s=5.0, lane=anyio.CapacityLimiter(1))
        waits = [asyncio.ensure_future(checks.check(1, 2)), asyncio.ensure_future(checks.check(3, 4))]
        await asyncio.sleep(pause)  # 0: the gathering made, not started; 0.01: inside its 50 ms window
        checks.gathering.cancel()
        done, pending = await asyncio.wait(waits, timeout=5)
        after = await asyncio.gather(checks.check(5, 6), return_exceptions=True)  # a new gathering reads
        return [w.cancelled() for w in done], len(pending), [str(e) for e in after]

    for pause in (0, 0.01):
        assert asyncio.run(cancelled(pause)) == ([True, True], 0, ["database is locked"]), pause
