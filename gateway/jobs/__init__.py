"""Background jobs: every upload, rebuild and sync run is a row of `jobs` (with its files in `job_files`) that any
replica can show, and that survives the gateway that started it.

Life of a job: created `queued` (an upload's file is stored in JOBS_DIR, 0600, before the row exists); a replica's
runner claims it (`store.claim`: one conditional UPDATE, so of two replicas one wins) and it is `running` with
that replica as `owner`, which refreshes `heartbeat_at` every JOB_HEARTBEAT_S. A heartbeat older than
JOB_STALE_S means the owner died (kill -9, a lost machine): any replica, the restarted one included, claims the
job again and its kind's handler runs once more, skipping the files already committed. It ends `done`, `failed`
(the job could not go on, or every file failed) or `cancelled` (`POST /api/jobs/{id}/cancel`: a queued job at
once, a running one through `cancel_at`, which its owner reads with its heartbeat). Only the oldest unfinished job
of an index is ever claimed, so one index runs one job at a time on all replicas together; a replica runs at
most JOB_PARALLEL jobs (of different indexes) at once. A replica claims only the kinds registered in it (during
a rolling upgrade, a job of a newer kind waits for a replica that has it).

How a new kind plugs in (the `sync` kind is one):

    from gateway.jobs import JobRun, Retry, FileFailed, JobFailed, register_kind, queue_job

    async def run_sync(run: JobRun) -> None:
        # run.job is the row (run.job.params: what the kind was queued with; run.resumed: an earlier run died).
        if not run.resumed:                      # list once; a resumed run finds its files already there
            await run.add_files([{"filename": name, "dataset": "default", "detail": {...}} for name in ...])

        async def process(file):                 # one try of one file; returns its result
            await run.progress(file, "converting", {"page": 3})   # the stage every reader of the job sees
            ...                                  # raise Retry(msg) for a broken try (bounded: JOB_FILE_RETRIES),
            return {"document_id": ..., "chunks": ...}  # FileFailed(msg, code) to fail this file and go on

        def commit(session, file, result):       # optional: in the transaction that marks the file done
            ...                                  # e.g. the index's document row

        await run.each_file(process, commit)     # the files not yet committed, in order, one by one

    register_kind("sync", run_sync)              # at import time; import the module in gateway/jobs/kinds.py
    job = await in_thread(queue_job, c, "sync", index_id, user_id, {"source": 3}, files=[])
    c.jobs.poke()                                # run it now rather than at the next poll

`run.guard(awaitable)` ends the awaitable when the job is cancelled (or taken over), closing a worker stream
inside it, so the worker's conversion child ends. Raise `JobFailed` to end the whole job as failed. A file's
state is pending | running | done | failed | cancelled; `run.each_file` commits each file on its own, so a run
that dies mid-job resumes from the first file not done.

store.py (the rows), runner.py (claiming, heartbeats, JobRun), upload.py and rebuild.py (the kinds), routes.py
(GET /api/jobs, GET /api/jobs/{id}, its SSE events, cancel).
"""

from __future__ import annotations

from .runner import FileFailed, JobFailed, JobRun, JobRunner, Retry, register_kind
from .store import create as queue_job_rows


def queue_job(
    c, kind: str, index_id: int, user_id: int | None, params: dict, files: list[dict] | None = None
):
    """Queue a job (synchronous: call it in a thread). `files`: dicts of JobFile's fields, in order."""
    return queue_job_rows(c.db, kind, index_id, user_id, params, list(files or []))


__all__ = ["FileFailed", "JobFailed", "JobRun", "JobRunner", "Retry", "queue_job", "register_kind"]
