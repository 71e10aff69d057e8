"""The gateway's document rows made to match the worker's table: after a build (`sync_documents`), and after
the worker's 404 to a delete (`confirm_gone`)."""

from __future__ import annotations

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
