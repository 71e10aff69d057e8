"""The jobs' rows: create, claim (with the heartbeat rule), progress, finish, cancel. Synchronous SQL for a thread
(context.in_thread), portable between SQLite and Postgres."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import func
from sqlmodel import col, select, update

from ..db import Database, Job, JobFile, User, utcnow
from ..errors import TooManyRequests

ACTIVE = ("queued", "running")
FINISHED = ("done", "failed", "cancelled")
OPEN_FILE = ("pending", "running")


def create(
    db: Database,
    kind: str,
    index_id: int,
    user_id: int | None,
    params: dict,
    files: list[dict],
    at_most: int | None = None,
) -> Job:
    """A queued job and its files (each a dict of JobFile's fields), in one transaction. `at_most`: a 429 when the
    user already has that many unfinished jobs of this kind, counted in the same transaction (one account's
    jobs are created one at a time: its user row is locked on Postgres, and SQLite writes one at a time), so
    gateway processes and replicas receiving at once never queue more."""
    with db.session() as s:
        if at_most is not None and user_id is not None:
            s.exec(select(User.id).where(col(User.id) == user_id).with_for_update())
            unfinished = s.exec(
                select(func.count())
                .select_from(Job)
                .where(col(Job.user_id) == user_id, col(Job.kind) == kind, col(Job.state).in_(ACTIVE))
            ).one()
            if unfinished >= at_most:
                raise TooManyRequests(
                    f"you already have {at_most} files being indexed: wait for one to finish",
                    code="too_many_uploads",
                    headers={"Retry-After": "5"},
                )
        job = Job(kind=kind, index_id=index_id, user_id=user_id, params=params, total=len(files))
        s.add(job)
        s.flush()
        for position, f in enumerate(files):
            s.add(JobFile(job_id=job.id, position=position, **f))
        s.commit()
        s.refresh(job)
        return job


def stale_cutoff(stale_s: float):
    return utcnow() - timedelta(seconds=stale_s)


def claim(
    db: Database, replica: str, stale_s: float, busy_indexes: set[int], kinds: list[str] | None = None
) -> Job | None:
    """Take the next job this replica may run: the oldest unfinished job of an index (so one index runs one job
    at a time, on every replica), queued or left by an owner whose heartbeat is older than `stale_s`, of one of
    `kinds` (those this replica knows: during an upgrade, a job of a newer kind waits for a replica that has it).
    The claim is one conditional UPDATE: of two replicas racing for a job, one gets it."""
    cutoff = stale_cutoff(stale_s)
    with db.session() as s:
        first = select(func.min(Job.id)).where(col(Job.state).in_(ACTIVE)).group_by(Job.index_id)
        query = select(Job.id, Job.index_id, Job.state, Job.heartbeat_at).where(col(Job.id).in_(first))
        if kinds is not None:
            query = query.where(col(Job.kind).in_(kinds))
        candidates = s.exec(query.order_by(col(Job.id)).limit(50)).all()
    for job_id, index_id, _state, _beat in candidates:
        if index_id in busy_indexes:
            continue
        now = utcnow()
        with db.session() as s:
            taken = s.exec(
                update(Job)
                .where(col(Job.id) == job_id)
                .where(
                    (col(Job.state) == "queued")
                    | (
                        (col(Job.state) == "running")
                        & (col(Job.heartbeat_at).is_(None) | (col(Job.heartbeat_at) < cutoff))
                    )
                )
                .values(
                    state="running",
                    owner=replica,
                    heartbeat_at=now,
                    started_at=func.coalesce(Job.started_at, now),
                    attempts=Job.attempts + 1,
                    updated_at=now,
                )
            )
            if (taken.rowcount or 0) != 1:
                s.rollback()
                continue
            s.commit()
            job = s.get(Job, job_id)
            return job
    return None


def beat(db: Database, job_id: int, replica: str) -> tuple[bool, bool]:
    """The owner's heartbeat. Returns (still_owned, cancel_requested)."""
    with db.session() as s:
        done = s.exec(
            update(Job)
            .where(col(Job.id) == job_id, col(Job.owner) == replica, col(Job.state) == "running")
            .values(heartbeat_at=utcnow())
        )
        owned = (done.rowcount or 0) == 1
        cancel = False
        if owned:
            cancel = s.exec(select(Job.cancel_at).where(col(Job.id) == job_id)).first() is not None
        s.commit()
        return owned, cancel


def files(db: Database, job_id: int) -> list[JobFile]:
    with db.session() as s:
        return list(s.exec(select(JobFile).where(JobFile.job_id == job_id).order_by(col(JobFile.position))))


def owned_update(s, job_id: int, replica: str, **values) -> bool:
    """Change the job's row only while this replica owns it (a replica that took it over as stale keeps it)."""
    done = s.exec(
        update(Job)
        .where(col(Job.id) == job_id, col(Job.owner) == replica, col(Job.state) == "running")
        .values(updated_at=utcnow(), **values)
    )
    return (done.rowcount or 0) == 1


def recount(s, job_id: int) -> dict:
    rows = s.exec(select(JobFile.state, func.count()).where(JobFile.job_id == job_id).group_by(JobFile.state))
    counts = dict(rows.all())
    return {
        "total": sum(counts.values()),
        "done": counts.get("done", 0),
        "failed": counts.get("failed", 0),
    }


def finish(db: Database, job_id: int, replica: str, state: str, error: str | None, code: str | None) -> bool:
    with db.session() as s:
        now = utcnow()
        counts = recount(s, job_id)
        ok = owned_update(
            s,
            job_id,
            replica,
            state=state,
            error=error,
            code=code,
            finished_at=now,
            stage="",
            owner=None,
            **counts,
        )
        if ok:
            s.exec(
                update(JobFile)
                .where(col(JobFile.job_id) == job_id, col(JobFile.state).in_(OPEN_FILE))
                .values(state="cancelled" if state == "cancelled" else "failed", updated_at=now)
            )
        s.commit()
        return ok


def release(db: Database, job_id: int, replica: str) -> None:
    """A replica that stops hands its running job back: queued again (its committed files stay done)."""
    with db.session() as s:
        s.exec(
            update(Job)
            .where(col(Job.id) == job_id, col(Job.owner) == replica, col(Job.state) == "running")
            .values(state="queued", owner=None, heartbeat_at=None, stage="", updated_at=utcnow())
        )
        s.exec(
            update(JobFile)
            .where(col(JobFile.job_id) == job_id, col(JobFile.state) == "running")
            .values(state="pending", updated_at=utcnow())
        )
        s.commit()


def request_cancel(db: Database, job_id: int) -> str:
    """A queued job is cancelled at once; a running one is asked to stop (its owner does, with its next
    heartbeat or sooner). Returns the job's state after this."""
    with db.session() as s:
        now = utcnow()
        queued = s.exec(
            update(Job)
            .where(col(Job.id) == job_id, col(Job.state) == "queued")
            .values(state="cancelled", cancel_at=now, finished_at=now, updated_at=now)
        )
        if (queued.rowcount or 0) == 1:
            s.exec(
                update(JobFile)
                .where(col(JobFile.job_id) == job_id, col(JobFile.state).in_(OPEN_FILE))
                .values(state="cancelled", updated_at=now)
            )
            s.commit()
            return "cancelled"
        s.exec(
            update(Job)
            .where(col(Job.id) == job_id, col(Job.state) == "running", col(Job.cancel_at).is_(None))
            .values(cancel_at=now, updated_at=now)
        )
        s.commit()
        job = s.get(Job, job_id)
        return job.state if job else "cancelled"


def expired(db: Database, retention_days: float) -> list[int]:
    """Finished jobs older than the retention: deleted (their files with them). Returns their ids."""
    cutoff = utcnow() - timedelta(days=retention_days)
    with db.session() as s:
        ids = list(
            s.exec(select(Job.id).where(col(Job.state).in_(FINISHED), col(Job.finished_at) < cutoff)).all()
        )
        for job_id in ids:
            s.exec(JobFile.__table__.delete().where(JobFile.__table__.c.job_id == job_id))
            s.exec(Job.__table__.delete().where(Job.__table__.c.id == job_id))
        s.commit()
        return ids


def active_stored_dirs(db: Database) -> set[str]:
    """The folders (under JOBS_DIR) of the stored uploads of unfinished jobs."""
    with db.session() as s:
        params = s.exec(select(Job.params).where(col(Job.state).in_(ACTIVE))).all()
    return {str(p.get("stored_dir")) for p in params if isinstance(p, dict) and p.get("stored_dir")}


def existing_ids(db: Database, ids: list[int]) -> set[int]:
    with db.session() as s:
        return set(s.exec(select(Job.id).where(col(Job.id).in_(ids))).all())


def unfinished_ids(db: Database, ids: list[int]) -> set[int]:
    with db.session() as s:
        return set(s.exec(select(Job.id).where(col(Job.id).in_(ids), col(Job.state).in_(ACTIVE))).all())
