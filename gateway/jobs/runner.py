"""The job runner of one replica: claims jobs from the database (gateway/jobs/store.py), runs each under a
heartbeat, and gives its kind's handler a `JobRun`: the job's row, its files, a progress callback, and
`each_file`, which processes the files not yet committed, one by one, each committed on its own."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from sqlmodel import col, update

from ..context import in_thread
from ..db import Job, JobFile, utcnow
from . import store

log = logging.getLogger("gateway.jobs")

POLL_S = 1.0  # how often a replica looks for jobs it may take (queued elsewhere, or left by a dead owner)
SWEEP_S = 600.0  # how often finished jobs past their retention, and stored files no job needs, are removed
RETRY_PAUSE_S = 1.0  # the pause before a file's second try; it doubles for each further one (at most 10 s)
ORPHAN_AGE_S = 3600.0  # a stored upload no unfinished job names is removed once this old
PROGRESS_WRITE_S = 0.5
FEED_HISTORY = 500  # progress events of a running job kept for followers on this replica that join late  # progress of one file (not its stage changes) is written at most this often


class Retry(Exception):
    """This try of the file broke for a reason that may pass (the worker died, its stream broke): try again,
    up to JOB_FILE_RETRIES tries in all, then the file fails with this reason."""

    def __init__(self, message: str, code: str = "worker_unavailable", status: int | None = 503):
        super().__init__(message)
        self.message, self.code, self.status = message, code, status


class FileFailed(Exception):
    """The file cannot be processed (the worker refused it, it does not convert): it fails for good, now; the
    job goes on with the next file."""

    def __init__(self, message: str, code: str = "failed", status: int | None = None):
        super().__init__(message)
        self.message, self.code, self.status = message, code, status


class JobFailed(Exception):
    """The whole job cannot go on (its index is gone, the source cannot be listed)."""

    def __init__(self, message: str, code: str = "failed"):
        super().__init__(message)
        self.message, self.code = message, code


class LostJob(Exception):
    """Another replica took the job over (this one's heartbeat went stale), or the job's row is gone."""


Handler = Callable[["JobRun"], Awaitable[None]]
KINDS: dict[str, Handler] = {}


def register_kind(kind: str, handler: Handler) -> None:
    """Make `kind` runnable: `handler(run)` is awaited each time a replica starts (or resumes) such a job."""
    if not kind or len(kind) > 32:
        raise ValueError("a job kind is 1 to 32 characters")
    KINDS[kind] = handler


class JobRun:
    """One run of one job on this replica (a resumed job gets a new one)."""

    def __init__(self, runner: JobRunner, job: Job):
        self.runner = runner
        self.c = runner.c
        self.job = job
        self.cancelled = asyncio.Event()
        self.lost = False
        self._last_write = 0.0

    @property
    def resumed(self) -> bool:
        """True when an earlier run of this job was started (and did not end: its replica died)."""
        return self.job.attempts > 1

    async def files(self) -> list[JobFile]:
        return await in_thread(store.files, self.c.db, self.job.id)

    async def add_files(self, entries: list[dict]) -> list[JobFile]:
        """Append files (dicts of JobFile's fields: filename, dataset, bytes, detail...) to the job."""

        def add() -> list[JobFile]:
            with self.c.db.session() as s:
                last = s.exec(select_max_position(self.job.id)).first()
                start = -1 if last is None else last
                rows = [
                    JobFile(job_id=self.job.id, position=start + 1 + i, **entry)
                    for i, entry in enumerate(entries)
                ]
                s.add_all(rows)
                s.flush()
                counts = store.recount(s, self.job.id)
                if not store.owned_update(s, self.job.id, self.runner.replica, **counts):
                    s.rollback()
                    raise LostJob()
                s.commit()
                return rows

        return await in_thread(add)

    async def progress(
        self, file: JobFile | None, stage: str, detail: dict | None = None, force: bool = False
    ):
        """The file's stage (converting, embedding, ...), and the job's, for every reader of the job. A new stage
        is written at once; the same stage with new detail (page 3 of 120) at most every PROGRESS_WRITE_S."""
        loop = asyncio.get_running_loop()
        changed = force or file is None or file.stage != stage
        stage = stage[:64]

        def write() -> None:
            with self.c.db.session() as s:
                if not store.owned_update(s, self.job.id, self.runner.replica, stage=stage):
                    s.rollback()
                    raise LostJob()
                if file is not None:
                    values: dict[str, Any] = {"stage": stage, "updated_at": utcnow()}
                    if detail is not None:
                        values["detail"] = detail
                    s.exec(update(JobFile).where(col(JobFile.id) == file.id).values(**values))
                s.commit()

        if file is not None:
            file.stage = stage
            self.runner.publish(
                self.job.id,
                {
                    "position": file.position,
                    "filename": file.filename,
                    "dataset": file.dataset,
                    "stage": stage,
                    "progress": detail or {},
                },
            )
        if not changed and loop.time() - self._last_write < PROGRESS_WRITE_S:
            return  # every follower on this replica has it; the database gets it with the next write
        self._last_write = loop.time()
        await in_thread(write)

    async def each_file(
        self,
        process: Callable[[JobFile], Awaitable[dict]],
        commit: Callable[[Any, JobFile, dict], None] | None = None,
    ) -> None:
        """Process the job's files not yet committed, in order. `process(file)` does the work and returns its
        result ({"document_id", "chunks", ...}); `commit(session, file, result)`, if given, writes what the
        file's success means (the document's row) in the same transaction that marks the file done, so a crash
        either side of it never leaves one without the other. A file is tried at most JOB_FILE_RETRIES times
        (tries are counted before each one, so a try the gateway died in counts); `Retry` tries again,
        `FileFailed` fails it and goes on."""
        retries = self.c.settings.job_file_retries
        for file in await self.files():
            if file.state not in store.OPEN_FILE:
                continue
            while True:
                self.check()
                if file.attempts >= retries:  # its last try was cut short (the gateway died in it)
                    reason = file.error or "a gateway stopped during each of them"
                    await self._give_up(file, reason)
                    break
                file.attempts += 1
                await self._start_file(file)
                try:
                    result = await self.guard(process(file))
                except Retry as exc:
                    log.warning(
                        "job %s, %s: try %d broke: %s", self.job.id, file.filename, file.attempts, exc
                    )
                    file.error, file.code, file.status = exc.message, exc.code, exc.status
                    if file.attempts >= retries:
                        await self._give_up(file, exc.message)
                        break
                    await self._note(file, exc.message, exc.code)
                    await asyncio.sleep(min(RETRY_PAUSE_S * 2.0 ** (file.attempts - 1), 10.0))
                    continue
                except FileFailed as exc:
                    await self._end_file(file, "failed", exc.message, exc.code, exc.status)
                    break
                await self._commit_file(file, result, commit)
                break

    async def _give_up(self, file: JobFile, reason: str) -> None:
        tries = f"{file.attempts} tries" if file.attempts != 1 else "1 try"
        await self._end_file(
            file, "failed", f"gave up after {tries}: {reason}", file.code or "retries", file.status
        )

    def check(self) -> None:
        if self.lost:
            raise LostJob()
        if self.cancelled.is_set():
            raise asyncio.CancelledError("cancelled")

    async def guard(self, work: Awaitable[Any]) -> Any:
        """Await `work`, ending it (a cancelled task: its worker stream closes, the worker's conversion ends) as
        soon as the job is cancelled or lost."""
        task = asyncio.ensure_future(work)
        stop = asyncio.ensure_future(self.cancelled.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            self.check()
            raise asyncio.CancelledError("cancelled")
        return task.result()

    async def _start_file(self, file: JobFile) -> None:
        def write() -> None:
            with self.c.db.session() as s:
                if not store.owned_update(s, self.job.id, self.runner.replica, stage="starting"):
                    s.rollback()
                    raise LostJob()
                s.exec(
                    update(JobFile)
                    .where(col(JobFile.id) == file.id)
                    .values(state="running", attempts=file.attempts, stage="starting", updated_at=utcnow())
                )
                s.commit()

        file.state, file.stage = "running", "starting"
        await in_thread(write)

    async def _note(self, file: JobFile, error: str, code: str) -> None:
        def write() -> None:
            with self.c.db.session() as s:
                s.exec(
                    update(JobFile)
                    .where(col(JobFile.id) == file.id)
                    .values(error=error, code=code[:64], stage="retrying", updated_at=utcnow())
                )
                s.commit()

        await in_thread(write)

    async def _end_file(
        self, file: JobFile, state: str, error: str | None, code: str | None, status: int | None = None
    ) -> None:
        def write() -> None:
            with self.c.db.session() as s:
                s.exec(
                    update(JobFile)
                    .where(col(JobFile.id) == file.id)
                    .values(
                        state=state,
                        error=error,
                        code=(code or "")[:64] or None,
                        status=status,
                        updated_at=utcnow(),
                    )
                )
                if not store.owned_update(
                    s, self.job.id, self.runner.replica, **store.recount(s, self.job.id)
                ):
                    s.rollback()
                    raise LostJob()
                s.commit()

        file.state, file.error, file.code, file.status = state, error, code, status
        await in_thread(write)

    async def _commit_file(self, file: JobFile, result: dict, commit) -> None:
        def write() -> None:
            with self.c.db.session() as s:
                row = s.get(JobFile, file.id)
                if row is None:
                    raise LostJob()
                row.state, row.stage, row.error, row.code = "done", "done", None, None
                row.document_id = str(result.get("document_id") or "") or None
                row.chunks = int(result.get("chunks") or 0)
                row.replaced = bool(result.get("replaced"))
                row.updated_at = utcnow()
                s.add(row)
                s.flush()
                if not store.owned_update(
                    s, self.job.id, self.runner.replica, **store.recount(s, self.job.id)
                ):
                    s.rollback()
                    raise LostJob()
                if commit is not None:
                    commit(s, row, result)
                s.commit()
                return row

        row = await in_thread(write)
        file.state, file.document_id, file.chunks = "done", row.document_id, row.chunks


def select_max_position(job_id: int):
    from sqlalchemy import func
    from sqlmodel import select

    return select(func.max(JobFile.position)).where(JobFile.job_id == job_id)


class Feed:
    """A running job's progress events on this replica: the history (for a follower that comes late) and the
    followers' queues."""

    def __init__(self) -> None:
        self.queues: set[asyncio.Queue] = set()
        self.history: deque[dict] = deque(maxlen=FEED_HISTORY)


class JobRunner:
    """Claims and runs jobs in this process: at most JOB_PARALLEL at once, one per index."""

    def __init__(self, c):
        self.c = c
        self.replica: str = c.replica
        self.running: dict[int, tuple[asyncio.Task, JobRun]] = {}  # by job id
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.sweeper: asyncio.Task | None = None
        self.watchers: dict[int, asyncio.Event] = {}
        # Followers on this replica of a job's progress events (every one, from the first; routes.follow).
        self.feeds: dict[int, Feed] = {}

    def listen(self, job_id: int) -> asyncio.Queue:
        feed = self.feeds.setdefault(job_id, Feed())
        q: asyncio.Queue = asyncio.Queue()
        for item in feed.history:
            q.put_nowait(item)
        feed.queues.add(q)
        return q

    def unlisten(self, job_id: int, q: asyncio.Queue) -> None:
        feed = self.feeds.get(job_id)
        if feed is None:
            return
        feed.queues.discard(q)
        if not feed.queues and job_id not in self.running:
            del self.feeds[job_id]

    def publish(self, job_id: int, item: dict) -> None:
        feed = self.feeds.setdefault(job_id, Feed())
        feed.history.append(item)
        for q in list(feed.queues):
            q.put_nowait(item)

    @property
    def folder(self) -> Path:
        return self.c.settings.resolved_jobs_dir()

    def start(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._loop(), name="job-runner")
        if self.sweeper is None or self.sweeper.done():
            self.sweeper = asyncio.create_task(self._sweep_forever(), name="job-sweeper")

    def poke(self) -> None:
        """A job was queued (or cancelled) here: look now rather than at the next poll."""
        self.start()
        self.wake.set()

    def cancel_local(self, job_id: int) -> bool:
        entry = self.running.get(job_id)
        if entry is None:
            return False
        entry[1].cancelled.set()
        return True

    async def stop(self) -> None:
        for task in (self.task, self.sweeper):
            if task is not None:
                task.cancel()
        for task, _run in list(self.running.values()):
            task.cancel()
        pending = [t for t, _r in self.running.values()]
        if pending:
            await asyncio.wait(pending, timeout=5)

    async def _loop(self) -> None:
        while True:
            try:
                await self._claim_some()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("looking for jobs failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=POLL_S)
            self.wake.clear()

    async def _claim_some(self) -> None:
        s = self.c.settings
        while len(self.running) < s.job_parallel:
            busy = {run.job.index_id for _t, run in self.running.values()}
            job = await in_thread(store.claim, self.c.db, self.replica, s.job_stale_s, busy, list(KINDS))
            if job is None:
                return
            run = JobRun(self, job)
            task = asyncio.create_task(self._run(run), name=f"job-{job.id}")
            self.running[job.id] = (task, run)
            self.c.running.add(task)
            task.add_done_callback(self.c.running.discard)

    async def _run(self, run: JobRun) -> None:
        job = run.job
        log.info("job %s (%s, index %s): run %d starts", job.id, job.kind, job.index_id, job.attempts)
        beat = asyncio.create_task(self._heartbeat(run), name=f"job-{job.id}-heartbeat")
        state, error, code = "done", None, None
        try:
            handler = KINDS.get(job.kind)
            if handler is None:
                raise JobFailed(f"this gateway cannot run jobs of kind '{job.kind}'", "unknown_kind")
            await handler(run)
            run.check()
            # A file a sync did not try again (it failed before and has not changed) fails nothing new.
            files = [f for f in await run.files() if (f.detail or {}).get("tried") is not False]
            failed = [f for f in files if f.state == "failed"]
            if files and len(failed) == len(files):
                state = "failed"
                error = failed[0].error if len(files) == 1 else f"all {len(files)} files failed"
                code = failed[0].code if len(files) == 1 else "all_failed"
        except LostJob:
            log.warning("job %s: taken over by another replica (or deleted); this run ends", job.id)
            state = None
        except JobFailed as exc:
            state, error, code = "failed", exc.message, exc.code
        except asyncio.CancelledError:
            if run.cancelled.is_set() and not run.lost:
                state, error, code = "cancelled", "cancelled by a user", "cancelled"
            else:
                state = None  # the gateway stops: the job is handed back, queued, to be resumed
                if not run.lost:
                    with contextlib.suppress(Exception):
                        await asyncio.shield(in_thread(store.release, self.c.db, job.id, self.replica))
                    raise
        except Exception as exc:
            log.exception("job %s failed", job.id)
            state, error, code = "failed", f"the job failed: {exc}", "internal"
        finally:
            beat.cancel()
            if state is not None:
                try:
                    await asyncio.shield(
                        in_thread(store.finish, self.c.db, job.id, self.replica, state, error, code)
                    )
                    await asyncio.shield(self._forget_files(job))
                except Exception:
                    log.exception("job %s: could not record its end", job.id)
                log.info("job %s ended: %s%s", job.id, state, f" ({error})" if error else "")
            self.running.pop(job.id, None)
            feed = self.feeds.get(job.id)
            if feed is not None and not feed.queues:
                del self.feeds[job.id]
            elif feed is not None:
                feed.history.clear()
            self.wake.set()
            for event in list(self.watchers.values()):
                event.set()

    async def _heartbeat(self, run: JobRun) -> None:
        s = self.c.settings
        while True:
            await asyncio.sleep(s.job_heartbeat_s)
            try:
                owned, cancel = await in_thread(store.beat, self.c.db, run.job.id, self.replica)
            except Exception:
                log.exception("job %s: heartbeat failed", run.job.id)
                continue
            if not owned:
                run.lost = True
                run.cancelled.set()
                return
            if cancel:
                run.cancelled.set()

    async def _forget_files(self, job: Job) -> None:
        """The job ended: its stored uploads are no longer needed (the worker keeps its own copy)."""
        name = str(job.params.get("stored_dir") or "")
        if name and name.isalnum():
            await in_thread(shutil.rmtree, self.folder / name, True)

    async def _sweep_forever(self) -> None:
        while True:
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("sweeping finished jobs failed")
            await asyncio.sleep(SWEEP_S)

    async def sweep(self) -> None:
        """Finished jobs past JOB_RETENTION_DAYS are deleted; stored files whose job ended or is gone too."""
        await in_thread(store.expired, self.c.db, self.c.settings.job_retention_days)
        folder = self.folder
        if not folder.is_dir():
            return
        keep = await in_thread(store.active_stored_dirs, self.c.db)
        cutoff = time.time() - ORPHAN_AGE_S
        for path in folder.iterdir():
            # A folder younger than ORPHAN_AGE_S may belong to an upload whose job row is being written.
            if path.is_dir() and path.name not in keep and path.stat().st_mtime < cutoff:
                await in_thread(shutil.rmtree, path, True)
