"""The `rebuild` kind: the worker's `/index` over the index's uploads folder, its per-file progress written as the
job's files (added as the worker names them; stage converting, chunking, embedding, then indexed, unchanged or
failed). An incremental build (`rebuild: false`) commits each file as it goes and skips a file whose bytes the
worker already holds, so a pass run again (the gateway died, the worker's stream broke) picks up at the first
file not yet committed. A full rebuild writes a new table that the worker swaps in only when it is complete
(rag_worker/ingest/rebuild.py): a pass that broke left the index as it was, and is run again whole."""

from __future__ import annotations

import asyncio
import logging

from sqlmodel import col, update

from .. import metrics
from ..context import in_thread
from ..db import Index, JobFile, utcnow
from ..errors import ApiError
from ..indexes.reconcile import sync_documents
from ..streams import WorkerRefused, WorkerStreamBroken
from .runner import JobFailed, JobRun, register_kind

log = logging.getLogger("gateway.jobs")

END_STAGES = {"indexed": "done", "unchanged": "done", "failed": "failed"}


def mark_building(c, index_id: int) -> str | None:
    with c.db.session() as s:
        index = s.get(Index, index_id)
        if index is None:
            return None
        index.status = "building"
        s.add(index)
        s.commit()
        return index.worker_name


async def run_rebuild(run: JobRun) -> None:
    c = run.c
    worker_name = await in_thread(mark_building, c, run.job.index_id)
    if worker_name is None:
        raise JobFailed("the index was deleted", "index_not_found")
    params = run.job.params or {}
    rebuild = bool(params.get("rebuild"))
    prune = bool(params.get("prune", True))
    known: dict[tuple[str, str], JobFile] = {(f.dataset, f.filename): f for f in await run.files()}
    succeeded = False
    metrics.BUILDS_RUNNING.inc()
    try:
        tries = c.settings.job_file_retries  # passes, for a build
        for attempt in range(1, tries + 1):
            run.check()
            try:
                ended = await run.guard(one_pass(run, worker_name, rebuild, prune, known))
            except WorkerRefused as exc:
                raise JobFailed(exc.message, exc.code) from None
            except (ApiError, WorkerStreamBroken) as exc:
                message = getattr(exc, "message", str(exc))
                log.warning("job %s: build pass %d broke: %s", run.job.id, attempt, message)
                if attempt == tries:
                    raise JobFailed(
                        f"gave up after {attempt} tries: {message}", "worker_unavailable"
                    ) from None
                await asyncio.sleep(min(2.0**attempt, 10.0))
                continue
            if ended is None:  # the stream ended without done/error: the worker went away
                if attempt == tries:
                    raise JobFailed("the worker's stream ended before the build finished", "interrupted")
                continue
            if ended.get("error"):
                raise JobFailed(str(ended["error"]), str(ended.get("code") or "build_failed"))
            succeeded = True
            return
    finally:
        metrics.BUILDS_RUNNING.dec()
        metrics.BUILDS.labels("done" if succeeded else "failed").inc()
        try:
            await asyncio.shield(sync_documents(c, run.job.index_id, failed=not succeeded))
        except Exception:
            log.exception("syncing index %s after its build", run.job.index_id)


async def one_pass(run: JobRun, worker_name: str, rebuild: bool, prune: bool, known: dict) -> dict | None:
    stream = await run.c.worker.build_index(worker_name, rebuild, prune)
    try:
        async for f in stream.frames():
            data = f.data if isinstance(f.data, dict) else {}
            if f.event == "progress":
                await see(run, data, known)
            elif f.event == "done":
                return {"done": data}
            elif f.event == "error":
                return {"error": data.get("error") or "the build failed", "code": data.get("code")}
    finally:
        await asyncio.shield(stream.aclose())
    return None


async def see(run: JobRun, data: dict, known: dict) -> None:
    name = str(data.get("file") or "")[:255]
    if not name:
        return
    key = (str(data.get("dataset") or "default")[:64], name)
    file = known.get(key)
    stage = str(data.get("stage") or "")
    added = file is None
    if file is None:
        # The row is made with its first stage and detail (the worker's done/total), in one commit: a stream
        # rejoined between the row and its first progress write showed the job's file count as the total.
        (file,) = await run.add_files(
            [{"dataset": key[0], "filename": key[1], "state": "running", "stage": stage[:64], "detail": data}]
        )
        known[key] = file
    end = END_STAGES.get(stage)
    await run.progress(file, stage, data, force=added or end is not None)
    if end is not None and file.state != end:
        file.state = end

        def write() -> None:
            with run.c.db.session() as s:
                s.exec(
                    update(JobFile)
                    .where(col(JobFile.id) == file.id)
                    .values(
                        state=end,
                        error=(str(data.get("error")) if data.get("error") else None),
                        code=(str(data.get("code"))[:64] if data.get("code") else None),
                        updated_at=utcnow(),
                    )
                )
                from . import store

                counts = store.recount(s, run.job.id)
                store.owned_update(s, run.job.id, run.runner.replica, **counts)
                s.commit()

        await in_thread(write)


register_kind("rebuild", run_rebuild)
