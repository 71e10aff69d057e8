"""The `upload` kind: files stored by `POST /api/indexes/{id}/documents` (JOBS_DIR, 0600), each sent to the
worker's /add_document and recorded as the index's document once the worker indexed it.

The worker keeps one copy per (dataset, name), and the same bytes again are a no-op there (their sha256 is the
document id): a file tried again after a crash (the gateway's, the worker's) is never indexed twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from pathlib import Path
from typing import Any

from sqlmodel import select

from ..context import Context, in_thread
from ..db import Index, IndexDocument, Job, JobFile, utcnow
from ..errors import ApiError, BadRequest, PayloadTooLarge
from ..indexes.reconcile import indexed_anyway
from ..indexes.records import refresh_counts
from ..settings import private_dir
from ..streams import WorkerRefused, WorkerStreamBroken
from . import store
from .runner import FileFailed, JobFailed, JobRun, Retry, register_kind

log = logging.getLogger("gateway.jobs")

CHUNK = 1024 * 1024


def store_file(c: Context, source, limit: int) -> tuple[str, Path, int]:
    """Copy an upload (a file object) into a new folder of JOBS_DIR, 0600, flushed to disk before the job that
    names it exists. Returns (folder name, path, size); over `limit` bytes or empty is refused, nothing kept."""
    name = uuid.uuid4().hex
    folder = private_dir(private_dir(c.settings.resolved_jobs_dir()) / name)
    path = folder / "0"
    size = 0
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            while True:
                block = source.read(CHUNK)
                if not block:
                    break
                size += len(block)
                if size > limit:
                    raise PayloadTooLarge(f"the file is larger than {limit} bytes", field="file")
                out.write(block)
            out.flush()
            os.fsync(out.fileno())
        if size == 0:
            raise BadRequest("the file is empty", code="empty_file", field="file")
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            path.unlink()
        with contextlib.suppress(OSError):
            folder.rmdir()
        raise
    return name, path, size


def queue_upload(
    c: Context, user_id: int, index_id: int, dataset: str, filename: str, content_type: str | None, source
) -> Job:
    """Store the file durably, then queue its job (in a thread: disk and database)."""
    folder, path, size = store_file(c, source, c.settings.max_upload_bytes)
    try:
        return store.create(
            c.db,
            "upload",
            index_id,
            user_id,
            {"stored_dir": folder},
            [
                {
                    "dataset": dataset,
                    "filename": filename,
                    "content_type": (content_type or "")[:255] or None,
                    "stored": str(path),
                    "bytes": size,
                }
            ],
            at_most=c.settings.max_uploads_per_user,
        )
    except BaseException:
        import shutil

        shutil.rmtree(path.parent, ignore_errors=True)
        raise


def worker_name_of(c: Context, index_id: int) -> str | None:
    with c.db.session() as s:
        index = s.get(Index, index_id)
        return index.worker_name if index else None


def record_document(s, job: Job, file: JobFile, result: dict) -> None:
    """The index's document row for what the worker indexed (in the transaction that marks the file done)."""
    index = s.get(Index, job.index_id)
    if index is None:
        raise JobFailed("the index was deleted", "index_not_found")
    name = str(result.get("filename") or file.filename)
    doc = s.exec(
        select(IndexDocument).where(
            IndexDocument.index_id == index.id,
            IndexDocument.dataset == file.dataset,
            IndexDocument.filename == name,
        )
    ).first()
    doc = doc or IndexDocument(index_id=index.id, dataset=file.dataset, filename=name)
    doc.document_id = str(result.get("document_id") or "")
    doc.chunks = int(result.get("chunks") or 0)
    doc.bytes = file.bytes
    doc.created_at = utcnow()
    s.add(doc)
    s.flush()
    detail = dict(file.detail or {})
    detail["document"] = doc.id
    file.detail = detail
    if name != file.filename:
        file.filename = name
    s.add(file)
    refresh_counts(s, index, None if index.status == "building" else "auto")


async def run_upload(run: JobRun) -> None:
    c = run.c
    worker_name = await in_thread(worker_name_of, c, run.job.index_id)
    if worker_name is None:
        raise JobFailed("the index was deleted", "index_not_found")

    async def process(file: JobFile) -> dict:
        path = Path(file.stored or "")
        try:
            content = await in_thread(path.read_bytes)
        except OSError as exc:
            raise FileFailed(
                f"the stored upload cannot be read ({exc.strerror})", "stored_file_lost"
            ) from None
        return await index_one(run, file, worker_name, content)

    def commit(s, file: JobFile, result: dict) -> None:
        record_document(s, run.job, file, result)

    current: dict[str, Any] = {}

    async def tracked(file: JobFile) -> dict:
        current["file"] = file
        return await process(file)

    try:
        await run.each_file(tracked, commit)
    except asyncio.CancelledError:
        # Cancelled while the worker had the file: if it finished writing before it saw the stream close, the
        # document is recorded, so both sides list the same documents (nothing is left half written).
        file = current.get("file")
        if run.cancelled.is_set() and not run.lost and file is not None and file.state == "running":
            with contextlib.suppress(Exception):
                await asyncio.shield(settle_cancelled(run, file, worker_name, commit))
        raise


async def settle_cancelled(run: JobRun, file: JobFile, worker_name: str, commit) -> None:
    content = await in_thread(Path(file.stored or "").read_bytes)
    result = await indexed_anyway(run.c, worker_name, file.dataset, file.filename, content)
    if result is not None:
        await run._commit_file(file, result, commit)


async def index_one(run: JobRun, file: JobFile, worker_name: str, content: bytes) -> dict:
    """One try: the worker's /add_document as a stream, its stages written as the file's progress."""
    c = run.c
    try:
        stream = await c.worker.add_document_stream(
            worker_name, file.dataset, file.filename, content, file.content_type
        )
    except WorkerRefused as exc:
        raise FileFailed(exc.message, exc.code, exc.status) from None
    except ApiError as exc:
        return await anyway_or_retry(run, file, worker_name, content, exc.message, exc.code, exc.status)
    try:
        async for f in stream.frames():
            data = f.data if isinstance(f.data, dict) else {}
            if f.event == "progress":
                await run.progress(file, str(data.get("stage") or "indexing"), data)
            elif f.event == "done":
                return data
            elif f.event == "error":
                code = str(data.get("code") or "indexing_failed")
                message = str(data.get("error") or "indexing failed")
                if code in ("interrupted", "worker_unavailable", "busy"):
                    raise Retry(message, code, 502)
                raise FileFailed(message, code, 422)
    except WorkerStreamBroken as exc:
        return await anyway_or_retry(run, file, worker_name, content, exc.message, "worker_unavailable")
    finally:
        await asyncio.shield(stream.aclose())
    return await anyway_or_retry(
        run, file, worker_name, content, "the worker's stream ended before indexing finished", "interrupted"
    )


async def anyway_or_retry(
    run: JobRun, file: JobFile, worker_name: str, content: bytes, message: str, code: str, status: int = 502
) -> dict:
    result = await indexed_anyway(run.c, worker_name, file.dataset, file.filename, content)
    if result is not None:
        return result
    raise Retry(message, code, status)


register_kind("upload", run_upload)
