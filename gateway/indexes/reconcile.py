"""The gateway's document rows made to match the worker's table: after a build (`sync_documents`), after an
upload whose answer was lost (`indexed_anyway`), and after the worker's 404 to a delete (`confirm_gone`)."""

from __future__ import annotations

import hashlib
import logging

from sqlmodel import select

from ..context import Context, in_thread
from ..db import Index, IndexDocument
from ..errors import ApiError, Conflict
from ..streams import WorkerNotFound
from .records import refresh_counts

log = logging.getLogger("gateway.indexes")


async def sync_documents(c: Context, index_id: int, failed: bool = False) -> None:
    """After a build: make the gateway's document rows match the worker's table, and set the status.

    Rows the worker does not list are deleted only after a build that finished: a failed or broken one says
    nothing reliable about what the table lacks, so it only adds and updates rows.
    """

    def name() -> str | None:
        with c.db.session() as s:
            index = s.get(Index, index_id)
            return index.worker_name if index else None

    worker_name = await in_thread(name)
    if worker_name is None:
        return
    try:
        listed: list[dict] | None = await c.worker.get_documents(worker_name)
    except ApiError as exc:
        log.warning("could not list the documents of index %s: %s", index_id, exc.message)
        listed = None

    def store() -> None:
        with c.db.session() as s:
            index = s.get(Index, index_id)
            if index is None:
                return
            if listed is not None:
                existing = {
                    (d.dataset, d.filename): d
                    for d in s.exec(select(IndexDocument).where(IndexDocument.index_id == index_id))
                }
                seen = set()
                for item in listed:
                    key = (str(item.get("dataset") or "default"), str(item.get("filename") or ""))
                    if not key[1]:
                        continue
                    seen.add(key)
                    doc = existing.get(key) or IndexDocument(
                        index_id=index_id, dataset=key[0], filename=key[1]
                    )
                    doc.document_id = str(item.get("document_id") or doc.document_id)
                    doc.chunks = int(item.get("chunks") or 0)
                    doc.bytes = int(item.get("bytes") or doc.bytes)
                    s.add(doc)
                for key, doc in existing.items():
                    if key not in seen and not failed:
                        s.delete(doc)
                s.flush()
            refresh_counts(s, index, "failed" if failed else "auto")
            s.commit()

    await in_thread(store)


async def confirm_gone(c: Context, index: Index, doc: IndexDocument) -> None:
    """After the worker's 404 to a delete: drop our record only when the worker holds no such document. One it
    still holds (the same bytes under another name, e.g. a record made before both sides used one name) was not
    deleted, and saying so keeps the record, so the user is not told a searchable document is gone."""
    try:
        listed = await c.worker.get_documents(index.worker_name)
    except WorkerNotFound:
        return  # no table at all: nothing of it is searchable

    def recorded() -> set[str]:
        with c.db.session() as s:
            rows = s.exec(
                select(IndexDocument.filename).where(
                    IndexDocument.index_id == index.id, IndexDocument.dataset == doc.dataset
                )
            )
            return set(rows)

    names = await in_thread(recorded)
    for item in listed:
        if str(item.get("dataset") or "default") != doc.dataset:
            continue
        name = str(item.get("filename") or "")
        same_bytes = bool(doc.document_id) and item.get("document_id") == doc.document_id
        if name == doc.filename or (same_bytes and name not in names):
            raise Conflict(
                f"the worker did not delete '{doc.filename}': it holds this document as '{name}'. Rebuild the "
                "index to bring the list in line, then delete it again",
                code="not_deleted",
            )


async def indexed_anyway(
    c: Context, worker_name: str, dataset: str, filename: str, content: bytes
) -> dict | None:
    """After an upload that failed without the worker's own refusal (the connection broke, a 5xx, a stream that
    ended early): the worker's entry for these bytes under this name when it indexed them all the same, so that
    the caller records it and both sides list the same documents; None when it holds no such document, or
    cannot be asked (nothing is recorded then, and the upload stays failed)."""
    digest = hashlib.sha256(content).hexdigest()  # the worker's document_id is the file's sha256
    try:
        listed = await c.worker.get_documents(worker_name)
    except ApiError as exc:
        log.warning(
            "after a failed upload of %s, the worker's list could not be read: %s", filename, exc.message
        )
        return None
    for item in listed:
        same = (str(item.get("dataset") or "default"), str(item.get("filename") or "")) == (dataset, filename)
        if same and item.get("document_id") == digest:
            log.warning(
                "the upload of %s failed on the way back, but the worker indexed it: recorded", filename
            )
            return {**item, "replaced": False}
    return None
