"""One upload: `POST /api/indexes/{id}/documents` forwards the file to the worker's /add_document and records
the document. With `Accept: text/event-stream` it relays the worker's `progress` events (stage: converting,
chunking, embedding, writing) and ends with `done` (the stored document, as the JSON answer has it) or `error`.

A refusal before any work (not the user's index, too large, empty, unsupported type) is a JSON 4xx either way.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

from sqlmodel import select
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from ..access import EDITOR, read_index, require_index
from ..context import Context, ctx, current_user, in_thread, path_id
from ..db import IndexDocument, utcnow
from ..errors import ApiError, BadRequest, NotFound, PayloadTooLarge
from ..responses import UploadedDocument
from ..sse import event_response, frame
from ..streams import WorkerRefused, WorkerStreamBroken
from .names import check_dataset, check_filename
from .reconcile import indexed_anyway
from .records import document_json, refresh_counts

log = logging.getLogger("gateway.uploads")


async def read_upload(request: Request, c: Context) -> tuple[UploadFile, str]:
    content_type = request.headers.get("content-type", "")
    if not content_type.startswith("multipart/form-data"):
        raise BadRequest("send the file as multipart/form-data with a 'file' field", code="not_multipart")
    form = await request.form(max_files=1, max_fields=10)
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise BadRequest("the form has no 'file' field with a file", code="missing_file", field="file")
    dataset = form.get("dataset") or "default"
    if not isinstance(dataset, str):
        raise BadRequest("dataset must be a text field", field="dataset")
    if upload.size is not None and upload.size > c.settings.max_upload_bytes:
        raise PayloadTooLarge(f"the file is larger than {c.settings.max_upload_bytes} bytes", field="file")
    return upload, check_dataset(dataset.strip())


async def upload_document(request: Request) -> JSONResponse:
    user, c, index_id = await current_user(request), ctx(request), path_id(request)

    # Before reading the body: an index the user may not change is a 404, not a 413.
    index = await in_thread(read_index, c, user, index_id, EDITOR)
    upload, dataset = await read_upload(request, c)
    filename = check_filename(upload.filename)
    content = await upload.read()
    if len(content) > c.settings.max_upload_bytes:
        raise PayloadTooLarge(f"the file is larger than {c.settings.max_upload_bytes} bytes", field="file")
    if not content:
        raise BadRequest("the file is empty", code="empty_file", field="file")

    def record(result: dict) -> dict:
        # The worker's name for the file is the one both sides use from now on (list, download, delete).
        name = str(result.get("filename") or filename)
        with c.db.session() as s:
            current = require_index(s, user, index_id, EDITOR)
            doc = s.exec(
                select(IndexDocument).where(
                    IndexDocument.index_id == current.id,
                    IndexDocument.dataset == dataset,
                    IndexDocument.filename == name,
                )
            ).first()
            doc = doc or IndexDocument(index_id=current.id, dataset=dataset, filename=name)
            doc.document_id = str(result.get("document_id") or "")
            doc.chunks = int(result.get("chunks") or 0)
            doc.bytes = len(content)
            doc.created_at = utcnow()
            s.add(doc)
            s.flush()
            refresh_counts(s, current, None if current.status == "building" else "auto")
            s.commit()
            return UploadedDocument(**document_json(doc), replaced=bool(result.get("replaced"))).data()

    if wants_events(request):  # the web: the worker's stages as they happen, then the row
        return await relay(c, index.worker_name, dataset, filename, content, upload, record)
    try:
        result = await c.worker.add_document(
            index.worker_name, dataset, filename, content, upload.content_type
        )
    except WorkerRefused:
        raise  # the worker's own 4xx: it stored nothing
    except ApiError:
        # The answer was lost (the connection broke, a 5xx): the worker may have indexed the file all the same.
        result = await indexed_anyway(c, index.worker_name, dataset, filename, content)
        if result is None:
            raise
    return JSONResponse(await in_thread(record, result), status_code=201)


def wants_events(request: Request) -> bool:
    return "text/event-stream" in request.headers.get("accept", "")


async def relay(
    c: Context,
    worker_name: str,
    dataset: str,
    filename: str,
    content: bytes,
    upload: UploadFile,
    record: Callable[[dict], dict],
) -> StreamingResponse:
    # A 4xx from the worker is raised here, as JSON.
    try:
        stream = await c.worker.add_document_stream(
            worker_name, dataset, filename, content, upload.content_type
        )
    except WorkerRefused:
        raise
    except ApiError:  # no answer came: the worker may have indexed the file all the same
        result = await indexed_anyway(c, worker_name, dataset, filename, content)
        if result is None:
            raise
        document = await in_thread(record, result)
        return event_response(iter_once(frame("done", document)))

    async def recovered(failure: dict) -> str:
        """The `done` frame when the worker indexed the file although its stream broke, else `failure`'s error."""
        result = await indexed_anyway(c, worker_name, dataset, filename, content)
        if result is None:
            return frame("error", failure)
        try:
            return frame("done", await in_thread(record, result))
        except NotFound as exc:
            return frame("error", exc.to_dict())

    async def body() -> AsyncIterator[str]:
        ended = False
        try:
            async for f in stream.frames():
                data = f.data if isinstance(f.data, dict) else {}
                if f.event == "progress":
                    yield f.raw
                elif f.event == "done":
                    ended = True
                    try:
                        document = await in_thread(record, data)
                    except NotFound as exc:  # the index was deleted meanwhile
                        yield frame("error", exc.to_dict())
                        return
                    yield frame("done", document)
                    return
                elif f.event == "error":
                    ended = True
                    yield frame(
                        "error", {"error": str(data.get("error") or "indexing failed"), **_code(data)}
                    )
                    return
        except WorkerStreamBroken as exc:
            ended = True
            yield await recovered({"error": exc.message, "code": "worker_unavailable"})
        finally:
            await stream.aclose()
            if not ended:
                log.warning("the worker's indexing stream for %s ended without a result", filename)
        if not ended:
            yield await recovered(
                {"error": "the worker's stream ended before indexing finished", "code": "interrupted"}
            )

    return event_response(body())


async def iter_once(item: str) -> AsyncIterator[str]:
    yield item


def _code(data: dict) -> dict:
    out = {"code": str(data.get("code") or "indexing_failed")}
    if data.get("field"):
        out["field"] = str(data["field"])
    return out
