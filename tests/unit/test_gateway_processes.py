"""What several gateway processes rely on, on one SQLite file: GATEWAY_WORKERS, migrations applied once however
many start together, and rate limits counted in the database (two Database objects are two processes' pools)."""

from __future__ import annotations

import threading

import pytest
from pydantic import ValidationError
from sqlmodel import select

from gateway.db import MIGRATIONS, SCHEMA_VERSION, Database, RateEvent, SchemaMigration
from gateway.errors import TooManyRequests
from gateway.ratelimits import RateLimit
from gateway.settings import Settings, cpu_count


def test_gateway_workers_defaults_to_the_cpus_and_refuses_nonsense(monkeypatch):
    monkeypatch.delenv("GATEWAY_WORKERS", raising=False)
    assert Settings().gateway_workers == min(cpu_count(), 64)
    monkeypatch.setenv("GATEWAY_WORKERS", "")  # compose's ${GATEWAY_WORKERS:-}
    assert Settings().gateway_workers == min(cpu_count(), 64)
    monkeypatch.setenv("GATEWAY_WORKERS", "3")
    assert Settings().gateway_workers == 3
    for bad in ("0", "65", "two", "-1"):
        monkeypatch.setenv("GATEWAY_WORKERS", bad)
        with pytest.raises(ValidationError, match="GATEWAY_WORKERS"):
            Settings()


def test_processes_starting_together_apply_each_migration_once(tmp_path):
    url = f"sqlite:///{tmp_path / 'gateway.db'}"
    dbs = [Database(url) for _ in range(4)]
    versions: list[int] = []
    errors: list[BaseException] = []
    gate = threading.Barrier(len(dbs))

    def start(db: Database) -> None:
        try:
            gate.wait()
            versions.append(db.migrate())
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(db,)) for db in dbs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert versions == [SCHEMA_VERSION] * len(dbs)
    with dbs[0].read() as s:
        applied = s.exec(select(SchemaMigration.version)).all()
    assert sorted(applied) == [v for v, _, _ in MIGRATIONS]
    for db in dbs:
        db.dispose()


def test_a_rate_limit_is_one_sliding_window_for_every_process(tmp_path):
    url = f"sqlite:///{tmp_path / 'gateway.db'}"
    one, other = Database(url), Database(url)
    one.migrate()
    limit = RateLimit(limit=3, window_s=10.0)
    limit.hit(one, "key:1", now=100.0)
    limit.hit(other, "key:1", now=101.0)
    limit.hit(one, "key:1", now=102.0)
    with pytest.raises(TooManyRequests) as refused:
        limit.hit(other, "key:1", now=105.5)
    assert refused.value.code == "rate_limited"
    assert refused.value.headers == {"Retry-After": "5"}  # the first event leaves the window at 110
    limit.hit(other, "key:2", now=105.5)  # another key has its own allowance
    limit.hit(other, "key:1", now=110.0)  # the first event has left the window: one more fits
    with pytest.raises(TooManyRequests):
        limit.hit(one, "key:1", now=110.5)
    # A refused hit is not counted, and a key starting afresh prunes every ended window's rows.
    limit.hit(one, "key:3", now=200.0)
    with one.read() as s:
        assert [r.key for r in s.exec(select(RateEvent))] == ["key:3"]
    one.dispose()
    other.dispose()


def test_v1_turns_are_counted_for_every_process_while_their_process_beats(tmp_path, monkeypatch):
    from gateway.auth import LoginThrottle
    from gateway.context import Context
    from gateway.db import RunningTurn, User
    from gateway.turns import running

    url = f"sqlite:///{tmp_path / 'gateway.db'}"
    settings = Settings(INDEX_STORE=tmp_path, TURN_LOCK_STALE_S=3.0, MAX_TURNS_PER_USER=3)
    one, other = (
        Context(settings=settings, db=Database(url), worker=None, jwt_secret="x", throttle=LoginThrottle())
        for _ in range(2)
    )
    one.db.migrate()
    with one.db.session() as s:
        user = User(username="gina", password_hash="x")
        s.add(user)
        s.commit()
        uid = user.id
    first = running.take_v1(one, uid)
    running.take_v1(other, uid)
    running.take_v1(one, uid)
    for ctx in (one, other):  # three running: the next is refused on either process
        with pytest.raises(TooManyRequests) as refused:
            running.take_v1(ctx, uid)
        assert refused.value.code == "too_many_turns"
    running.release_v1(one, first)
    running.take_v1(other, uid)  # one came back

    # `other` dies (it beats no more); `one` keeps beating: only other's rows stop counting.
    clock = [1_000_000.0]
    monkeypatch.setattr(running.time, "time", lambda: clock[0])
    with one.db.write() as conn:
        conn.execute(RunningTurn.__table__.update().values(expires_at=clock[0] + 3.0))
    clock[0] += 2.0
    running.beat_v1(one)
    clock[0] += 2.0
    with one.db.write() as conn:
        assert running.live_turns(conn, one, uid) == 1  # one's row, beaten; other's two expired
    running.take_v1(one, uid)
    running.take_v1(one, uid)
    with pytest.raises(TooManyRequests):
        running.take_v1(other, uid)
    for ctx in (one, other):
        ctx.db.dispose()
