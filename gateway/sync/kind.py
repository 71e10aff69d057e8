"""The `sync` job kind: one run of contract/sync.py for one source, with the gateway as its target.

The run lists the source and compares it with the index's documents (the gateway's rows) and the source's
records (`index_source_files`), in a thread. Each file it acts on becomes a file of the job: an added or changed
one is sent to the worker's /add_document (its stages are the file's progress) and recorded as the index's
document in the transaction that marks it done; a removed one is deleted on the worker and its row dropped;
unchanged files are counted, not listed. A gateway that dies mid-run: the job is taken up again and the sync
runs once more from the listing, which finds what was already sent (same bytes under the same name) unchanged,
so nothing is indexed twice.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path

from sqlmodel import col, delete, select, update

from contract.sync import MemoryState, Summary, SyncError, run_to_end, sync

from ..context import in_thread
from ..db import Index, IndexDocument, IndexSource, IndexSourceFile, JobFile
from ..errors import ApiError
from ..indexes.names import check_dataset, check_filename
from ..indexes.records import refresh_counts
from ..jobs.runner import FileFailed, JobFailed, JobRun, Retry, register_kind
from ..jobs.upload import index_one, record_document
from ..streams import WorkerNotFound
from .sources import open_source

log = logging.getLogger("gateway.sync")


class DbState(MemoryState):
    """The source's records in `index_source_files`; a save writes only what changed since the last one."""

    def __init__(self, db, source_id: int):
        self.db = db
        self.source_id = source_id
        with db.session() as s:
            rows = s.exec(select(IndexSourceFile).where(IndexSourceFile.source_id == source_id)).all()
            state = {
                r.path: {
                    "size": r.size,
                    "stamp": r.stamp,
                    "sha256": r.sha256,
                    "dataset": r.dataset,
                    "filename": r.filename,
                    **({"failure": r.failure} if r.failure else {}),
                }
                for r in rows
            }
        super().__init__(state)
        self.saved = dict(state)

    def save(self, state: dict[str, dict]) -> None:
        gone = [p for p in self.saved if p not in state]
        changed = {p: r for p, r in state.items() if self.saved.get(p) != r}
        if not gone and not changed:
            return
        with self.db.session() as s:
            stale = gone + list(changed)
            for start in range(0, len(stale), 500):
                s.exec(
                    delete(IndexSourceFile).where(
                        IndexSourceFile.source_id == self.source_id,
                        col(IndexSourceFile.path).in_(stale[start : start + 500]),
                    )
                )
            s.add_all(
                IndexSourceFile(
                    source_id=self.source_id,
                    path=p,
                    size=int(r.get("size") or 0),
                    stamp=str(r.get("stamp") or "")[:200],
                    sha256=str(r.get("sha256") or ""),
                    dataset=str(r.get("dataset") or "default"),
                    filename=str(r.get("filename") or ""),
                    failure=_failure(r.get("failure")),
                )
                for p, r in changed.items()
            )
            s.commit()
        self.state = dict(state)
        self.saved = dict(state)


class GatewayTarget:
    """The index as the gateway knows it; adds and removals go through the worker, on the event loop."""

    def __init__(self, run: JobRun, index: Index, loop: asyncio.AbstractEventLoop):
        self.run = run
        self.c = run.c
        self.index_id = index.id
        self.worker_name = index.worker_name
        self.loop = loop
        self.wrote_failure = False  # the file that just failed has its job file row already (an add's)

    def _on_loop(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def documents(self) -> dict[tuple[str, str], str]:
        with self.c.db.session() as s:
            rows = s.exec(select(IndexDocument).where(IndexDocument.index_id == self.index_id)).all()
            return {(d.dataset, d.filename): d.document_id for d in rows}

    def check(self, dataset: str, filename: str) -> tuple[str, str]:
        try:
            return check_dataset(dataset), check_filename(filename)
        except ApiError as err:
            raise SyncError(err.code, err.message) from err

    def supported(self, filename: str) -> bool:
        return not filename.startswith(".")  # the worker decides the rest (a type it cannot read: 415)

    def add(self, dataset: str, filename: str, path: Path) -> None:
        limit = self.c.settings.max_upload_bytes
        size = path.stat().st_size
        if size > limit:
            raise SyncError(
                "too_large", f"the file is {size} bytes, over MAX_UPLOAD_BYTES ({limit})", lasting=True
            )
        content = path.read_bytes()
        self._on_loop(self._add(dataset, filename, content))

    async def _add(self, dataset: str, filename: str, content: bytes) -> None:
        run = self.run
        [file] = await run.add_files(
            [
                {
                    "dataset": dataset,
                    "filename": filename,
                    "bytes": len(content),
                    "state": "running",
                    "attempts": 1,
                }
            ]
        )
        try:
            result = await run.guard(index_one(run, file, self.worker_name, content))
        except (Retry, FileFailed) as exc:
            await run._end_file(file, "failed", exc.message, exc.code, exc.status)
            self.wrote_failure = True
            # The worker refused these bytes (415: a type it cannot read; 422: they do not convert): the
            # same bytes fail the same way, so later runs do not send them again until the file changes.
            # A worker that was away or busy (Retry, 408, 429, 5xx) is tried again next run.
            lasting = (
                isinstance(exc, FileFailed)
                and (exc.status or 422) < 500
                and exc.status not in (404, 408, 429)
            )
            raise SyncError(exc.code, exc.message, lasting=lasting) from None

        def commit(s, row: JobFile, result: dict) -> None:
            record_document(s, run.job, row, result)

        await run._commit_file(file, result, commit)

    def remove(self, dataset: str, filename: str) -> None:
        self._on_loop(self._remove(dataset, filename))

    async def _remove(self, dataset: str, filename: str) -> None:
        try:
            await self.c.worker.delete_document(self.worker_name, dataset, filename)
        except WorkerNotFound:
            pass  # already gone there
        except ApiError as exc:
            raise SyncError(exc.code, exc.message) from None

        def forget() -> None:
            with self.c.db.session() as s:
                s.exec(
                    delete(IndexDocument).where(
                        IndexDocument.index_id == self.index_id,
                        IndexDocument.dataset == dataset,
                        IndexDocument.filename == filename,
                    )
                )
                index = s.get(Index, self.index_id)
                if index is not None:
                    refresh_counts(s, index, None if index.status == "building" else "auto")
                s.commit()

        await in_thread(forget)


async def run_sync(run: JobRun) -> None:
    c = run.c
    source_id = (run.job.params or {}).get("source")

    def load():
        with c.db.session() as s:
            row = s.get(IndexSource, source_id) if isinstance(source_id, int) else None
            index = s.get(Index, run.job.index_id)
            return row, index

    row, index = await in_thread(load)
    if row is None or index is None or row.index_id != index.id:
        raise JobFailed("the source was deleted", "source_not_found")
    if run.resumed:  # files an earlier run left open: the sync lists again and finds them done or not
        await in_thread(_close_open_files, c, run.job.id)
    try:
        source = await in_thread(open_source, c.settings, row)
    except SyncError as err:
        raise JobFailed(err.message, err.code) from None
    loop = asyncio.get_running_loop()
    target = GatewayTarget(run, index, loop)
    state = await in_thread(DbState, c.db, row.id)
    stop = threading.Event()

    def on_event(event) -> None:
        if event.stage in ("added", "changed"):
            return  # the add wrote its own file row
        if event.stage == "failed" and target.wrote_failure:
            target.wrote_failure = False  # the add's own file row says why
            return
        entry = {
            "dataset": event.dataset,
            "filename": (event.file.rsplit("/", 1)[-1] or event.file or "(source)")[:255],
            "state": "failed" if event.stage == "failed" else "done",
            # A file that failed before and has not changed: not sent again, its earlier error kept.
            "stage": "unchanged" if event.tried is False else event.stage,
            "error": event.error,
            "code": (event.code or "")[:64] or None,
            "detail": {"path": event.file[:1024], "action": event.stage}
            | ({"tried": False} if event.tried is False else {}),
        }
        asyncio.run_coroutine_threadsafe(run.add_files([entry]), loop).result()

    def work() -> Summary:
        return run_to_end(
            sync(source, target, state, should_stop=lambda: stop.is_set() or run.cancelled.is_set()), on_event
        )

    await run.progress(None, "listing")
    try:
        summary = await in_thread(work)
    finally:
        stop.set()
    counts = {
        "added": summary.added,
        "changed": summary.changed,
        "removed": summary.removed,
        "unchanged": summary.unchanged,
        "failed": len(summary.failed),
        "failed_unchanged": summary.failed_unchanged,
        "job_id": run.job.id,
        "seconds": summary.seconds,
    }
    await in_thread(_record_summary, c, row.id, counts)
    await run.progress(None, "synced", force=True)
    if not summary.listed:
        problem = summary.failed[0] if summary.failed else {"error": "the source could not be listed"}
        raise JobFailed(problem["error"], problem.get("code") or "source_unreachable")


def _failure(value) -> dict | None:
    """A remembered failure as stored: its size, stamp and hash, and the code and error (cut to fit)."""
    if not isinstance(value, dict):
        return None
    return {
        "size": int(value.get("size") or 0),
        "stamp": str(value.get("stamp") or "")[:200],
        "sha256": str(value.get("sha256") or "")[:64],
        "code": str(value.get("code") or "failed")[:64],
        "error": str(value.get("error") or "")[:1000],
    }


def _close_open_files(c, job_id: int) -> None:
    with c.db.session() as s:
        s.exec(
            update(JobFile)
            .where(JobFile.job_id == job_id, col(JobFile.state).in_(("pending", "running")))
            .values(state="cancelled", stage="interrupted")
        )
        s.commit()


def _record_summary(c, source_id: int, counts: dict) -> None:
    with c.db.session() as s:
        row = s.get(IndexSource, source_id)
        if row is not None:
            row.last_summary = counts
            row.last_job_id = counts["job_id"]
            s.add(row)
            s.commit()


register_kind("sync", run_sync)
