"""The job runner on a real SQLite database (gateway/jobs/): the claim rule across replicas (the oldest unfinished
job of an index, the heartbeat's takeover), per-file commits that a resumed run skips, bounded retries, cancel,
hand-back on a clean stop, retention, and the settings' own rule. A kind is registered as a new kind would be
(`register_kind`), with a handler that does no I/O."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

import pytest
from pydantic import ValidationError
from sqlmodel import select

from gateway.auth import LoginThrottle
from gateway.context import Context
from gateway.db import Database, Index, Job, JobFile, User, utcnow
from gateway.jobs import FileFailed, JobRun, Retry, queue_job, register_kind, store
from gateway.settings import Settings
from tests.integration.ops.postgres import database_urls, fresh_database


@pytest.fixture(params=database_urls(), ids=lambda url: url.split(":", 1)[0].split("+")[0])
def ctx(request, tmp_path):
    with contextlib.ExitStack() as stack:
        url = "" if request.param == "sqlite" else stack.enter_context(fresh_database(request.param))
        yield from make_ctx(tmp_path, url)


def make_ctx(tmp_path, url: str):
    settings = Settings(
        INDEX_STORE=tmp_path / "store",
        DATABASE_URL=url,
        JOB_HEARTBEAT_S=0.05,
        JOB_STALE_S=0.5,
        JOB_FILE_RETRIES=3,
        JOB_PARALLEL=2,
    )
    db = Database(settings.resolved_database_url())
    db.migrate()
    with db.session() as s:
        user = User(username="ann", password_hash="x")
        s.add(user)
        s.flush()
        for n in range(3):
            s.add(Index(owner_id=user.id, name=f"i{n}", worker_name=f"t{n}"))
        s.commit()
    c = Context(settings=settings, db=db, worker=None, jwt_secret="x", throttle=LoginThrottle())
    yield c
    db.dispose()


def files_of(c, job_id):
    return [(f.filename, f.state, f.attempts) for f in store.files(c.db, job_id)]


def job(c, job_id) -> Job:
    with c.db.session() as s:
        return s.get(Job, job_id)


def test_only_the_oldest_unfinished_job_of_an_index_is_claimed_and_a_stale_one_is_taken_over(ctx):
    first = queue_job(ctx, "upload", 1, 1, {}, [{"filename": "a.md"}])
    second = queue_job(ctx, "upload", 1, 1, {}, [{"filename": "b.md"}])
    other = queue_job(ctx, "upload", 2, 1, {}, [{"filename": "c.md"}])
    taken = store.claim(ctx.db, "replica-a", 0.5, set())
    assert taken.id == first.id and taken.owner == "replica-a" and taken.attempts == 1
    # Replica b gets the other index's job, never index 1's second job while its first runs.
    assert store.claim(ctx.db, "replica-b", 0.5, set()).id == other.id
    assert store.claim(ctx.db, "replica-b", 0.5, set()) is None
    # A live heartbeat keeps it; one older than the stale time gives it to whoever claims next.
    assert store.beat(ctx.db, first.id, "replica-a") == (True, False)
    with ctx.db.session() as s:
        row = s.get(Job, first.id)
        row.heartbeat_at = utcnow() - timedelta(seconds=5)
        s.add(row)
        s.commit()
    again = store.claim(ctx.db, "replica-b", 0.5, set())
    assert (again.id, again.owner, again.attempts) == (first.id, "replica-b", 2)
    assert store.beat(ctx.db, first.id, "replica-a") == (False, False)  # a no longer owns it
    assert job(ctx, second.id).state == "queued"


def test_a_replica_claims_only_the_kinds_it_knows(ctx):
    newer = queue_job(ctx, "from-a-newer-gateway", 1, 1, {}, [])
    behind = queue_job(ctx, "upload", 1, 1, {}, [])
    other = queue_job(ctx, "upload", 2, 1, {}, [])
    # The newer kind's job is first on index 1: it waits for a replica that knows it, and index 1 with it.
    assert store.claim(ctx.db, "old", 0.5, set(), ["upload"]).id == other.id
    assert store.claim(ctx.db, "old", 0.5, set(), ["upload"]) is None
    assert job(ctx, behind.id).state == "queued"
    assert store.claim(ctx.db, "new", 0.5, set(), ["upload", "from-a-newer-gateway"]).id == newer.id


def test_a_cancel_of_a_queued_job_is_at_once_and_of_a_running_one_is_read_with_the_heartbeat(ctx):
    running = queue_job(ctx, "upload", 1, 1, {}, [{"filename": "a.md"}])
    queued = queue_job(ctx, "upload", 1, 1, {}, [{"filename": "b.md"}])
    store.claim(ctx.db, "r", 0.5, set())
    assert store.request_cancel(ctx.db, queued.id) == "cancelled"
    assert files_of(ctx, queued.id) == [("b.md", "cancelled", 0)]
    assert store.request_cancel(ctx.db, running.id) == "running"
    assert store.beat(ctx.db, running.id, "r") == (True, True)


def test_a_replica_that_stops_hands_its_job_back_queued(ctx):
    j = queue_job(ctx, "upload", 1, 1, {}, [{"filename": "a.md"}])
    store.claim(ctx.db, "r", 0.5, set())
    with ctx.db.session() as s:
        f = s.exec(select(JobFile).where(JobFile.job_id == j.id)).one()
        f.state = "running"
        s.add(f)
        s.commit()
    store.release(ctx.db, j.id, "r")
    assert (job(ctx, j.id).state, job(ctx, j.id).owner) == ("queued", None)
    assert files_of(ctx, j.id) == [("a.md", "pending", 0)]


def test_finished_jobs_past_their_retention_are_deleted_with_their_files(ctx):
    old = queue_job(ctx, "upload", 1, 1, {}, [{"filename": "a.md"}])
    new = queue_job(ctx, "upload", 2, 1, {}, [{"filename": "b.md"}])
    with ctx.db.session() as s:
        for job_id, age in ((old.id, 40), (new.id, 1)):
            row = s.get(Job, job_id)
            row.state, row.finished_at = "done", utcnow() - timedelta(days=age)
            s.add(row)
        s.commit()
    assert store.expired(ctx.db, 30) == [old.id]
    assert job(ctx, old.id) is None and store.files(ctx.db, old.id) == []
    assert job(ctx, new.id) is not None


def test_job_stale_s_must_leave_room_for_heartbeats():
    with pytest.raises(ValidationError, match="JOB_STALE_S must be at least twice JOB_HEARTBEAT_S"):
        Settings(JOB_HEARTBEAT_S=5, JOB_STALE_S=6)


# --- a kind of its own, run by the runner ------------------------------------------------------------------------

TRIES: dict[str, int] = {}
COMMITTED: list[str] = []  # what the kind's commit saw, in the transaction that marked each file done


async def run_counting(run: JobRun) -> None:
    """A kind that 'indexes' each file: `flaky*` breaks on its first try, `bad*` is refused, the rest pass."""

    async def process(file: JobFile) -> dict:
        TRIES[file.filename] = TRIES.get(file.filename, 0) + 1
        await run.progress(file, "working", {"try": TRIES[file.filename]})
        if file.filename.startswith("flaky") and TRIES[file.filename] == 1:
            raise Retry("the worker went away")
        if file.filename.startswith("dead"):
            raise Retry("the worker is not there")
        if file.filename.startswith("bad"):
            raise FileFailed("not a document", "unsupported_type", 415)
        return {"document_id": f"id-{file.filename}", "chunks": len(file.filename)}

    def commit(session, file: JobFile, result: dict) -> None:
        assert session.get(JobFile, file.id).state == "done"  # the same transaction, not yet committed
        COMMITTED.append(file.filename)

    await run.each_file(process, commit)


register_kind("counting", run_counting)


async def until_ended(c, job_id: int, timeout: float = 20.0) -> Job:
    for _ in range(int(timeout / 0.05)):
        row = await asyncio.to_thread(job, c, job_id)
        if row.state in store.FINISHED:
            return row
        await asyncio.sleep(0.05)
    raise AssertionError(f"job {job_id} still {row.state}")


def test_a_resumed_job_skips_committed_files_retries_broken_ones_and_bounds_the_tries(ctx, monkeypatch):
    from gateway.jobs import runner as runner_mod

    monkeypatch.setattr(runner_mod, "RETRY_PAUSE_S", 0.0)  # no pause between tries
    TRIES.clear()
    COMMITTED.clear()
    names = ["done-before.md", "flaky.md", "bad.md", "dead.md", "plain.md"]
    j = queue_job(ctx, "counting", 1, 1, {}, [{"filename": n} for n in names])
    # An earlier run (on a replica that died) committed the first file and had begun the second.
    with ctx.db.session() as s:
        rows = s.exec(select(JobFile).where(JobFile.job_id == j.id).order_by(JobFile.position)).all()
        rows[0].state, rows[0].attempts = "done", 1
        rows[1].state, rows[1].attempts = "running", 1
        s.add_all(rows[:2])
        row = s.get(Job, j.id)
        row.state, row.owner, row.attempts = "running", "dead-replica", 1
        row.heartbeat_at = utcnow() - timedelta(seconds=10)
        s.add(row)
        s.commit()

    async def scenario() -> Job:
        ctx.jobs.start()
        try:
            return await until_ended(ctx, j.id)
        finally:
            await ctx.jobs.stop()

    end = asyncio.run(scenario())
    assert "done-before.md" not in TRIES  # committed before the crash: not processed again
    assert COMMITTED == ["flaky.md", "plain.md"]
    # flaky: its try in the dead run counted, this run's first broke, the next passed (3 tries in all).
    assert files_of(ctx, j.id) == [
        ("done-before.md", "done", 1),
        ("flaky.md", "done", 3),
        ("bad.md", "failed", 1),
        ("dead.md", "failed", 3),
        ("plain.md", "done", 1),
    ]
    rows = {f.filename: f for f in store.files(ctx.db, j.id)}
    assert rows["dead.md"].error == "gave up after 3 tries: the worker is not there"
    assert (rows["bad.md"].code, rows["bad.md"].status) == ("unsupported_type", 415)
    assert (rows["plain.md"].document_id, rows["plain.md"].chunks) == ("id-plain.md", 8)
    assert (end.state, end.total, end.done, end.failed, end.attempts) == ("done", 5, 3, 2, 2)
    assert end.owner is None and end.finished_at is not None


def test_a_follower_that_first_looks_after_the_job_ended_still_gets_every_stage_it_listened_for(ctx):
    """An upload's stream listens before the job can start, then looks: a small file can be indexed by then.
    The stages this replica ran still reach the follower (the upload stream showed none: CI, Postgres)."""
    from gateway.jobs.follow import follow

    TRIES.clear()
    j = queue_job(ctx, "counting", 1, 1, {}, [{"filename": "a.md"}, {"filename": "b.md"}])

    async def scenario() -> list[tuple[str, object]]:
        q = ctx.jobs.listen(j.id)
        ctx.jobs.start()
        try:
            await until_ended(ctx, j.id)
        finally:
            await ctx.jobs.stop()

        def load() -> dict:
            row = job(ctx, j.id)
            return {"state": row.state, "files": []}

        return [(event, data) async for event, data in follow(ctx, j.id, load, None, q)]

    seen = asyncio.run(scenario())
    assert seen[0] == ("job", {"state": "done", "files": []})
    assert [(d["filename"], d["stage"]) for e, d in seen if e == "progress"] == [
        ("a.md", "working"),
        ("b.md", "working"),
    ]
