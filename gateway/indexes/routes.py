"""The index and document routes (uploads.py has the upload itself)."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

from sqlalchemy.exc import IntegrityError
from sqlmodel import col, delete, select
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from contract.languages import DEFAULT_EMBEDDER, DEFAULT_INDEX_LANGUAGE

from .. import audit, ranges
from ..access import EDITOR, OWNER, READER, Access, index_access, read_index, readable_indexes, require_index
from ..context import Context, ctx, current_user, in_thread, path_id, read_json
from ..db import ChatIndex, Index, IndexDocument, IndexGrant, User, utcnow
from ..errors import Conflict
from ..jobs.views import JobOut
from ..responses import IndexFull, IndexOut, UploadedDocument
from ..routing import WORKER, ApiRoute, Operation, each, event_stream, json_content
from ..schemas import NAME_RE, IndexCreate, IndexUpdate
from ..streams import RelayedResponse, WorkerNotFound
from .names import content_disposition, worker_table_name
from .reconcile import confirm_gone
from .records import datasets_of, index_json, owned_document, refresh_counts
from .uploads import upload_document


async def list_indexes(request: Request) -> JSONResponse:
    user, c = await current_user(request), ctx(request)

    def load() -> list[dict]:
        with c.db.session() as s:
            return [index_json(s, a) for a in readable_indexes(s, user)]

    return JSONResponse(await in_thread(load))


async def create_index(request: Request) -> JSONResponse:
    user, c = await current_user(request), ctx(request)
    body = await read_json(request, IndexCreate)

    # One name for the row and the worker's table (a second call would draw another random suffix, and the
    # table made below with the chosen language would not be the one the index uses).
    worker_name = worker_table_name(user.id, body.name)

    def create() -> dict:
        with c.db.session() as s:
            if s.exec(select(Index.id).where(Index.owner_id == user.id, Index.name == body.name)).first():
                raise Conflict("you already have an index with this name", code="index_exists", field="name")
            index = Index(
                owner_id=user.id,
                name=body.name,
                description=body.description,
                worker_name=worker_name,
                # What the worker makes its table with: the choice, or its defaults (indexes/settings.py).
                embedder=body.embedder or DEFAULT_EMBEDDER,
                language=body.language or DEFAULT_INDEX_LANGUAGE,
            )
            s.add(index)
            try:
                s.commit()
            except IntegrityError:
                raise Conflict(
                    "you already have an index with this name", code="index_exists", field="name"
                ) from None
            return index_json(s, Access(index, OWNER, "owner"), with_documents=True)

    made = await in_thread(create)
    if body.embedder is not None or body.language is not None:
        # The worker's table is made now, with the embedder and full-text language it keeps for good; if it
        # cannot be, the index is not left half made.
        try:
            fixed = await c.worker.create_index(worker_name, body.embedder, body.language)
        except BaseException:
            await in_thread(lambda: _forget_index(c, user.id, made["id"]))
            raise
        made.update(embedder=fixed["embedder"], language=fixed["language"])
    return JSONResponse(made, status_code=201)


def _forget_index(c: Context, user_id: int, index_id: int) -> None:
    with c.db.session() as s:
        row = s.get(Index, index_id)
        if row is not None and row.owner_id == user_id:
            s.delete(row)
            s.commit()


async def get_index(request: Request) -> JSONResponse:
    user, c, index_id = await current_user(request), ctx(request), path_id(request)

    def load() -> dict:
        with c.db.session() as s:
            return index_json(s, index_access(s, user, index_id, READER), with_documents=True)

    return JSONResponse(await in_thread(load))


async def update_index(request: Request) -> JSONResponse:
    user, c, index_id = await current_user(request), ctx(request), path_id(request)
    body = await read_json(request, IndexUpdate)

    def change() -> dict:
        with c.db.session() as s:
            access = index_access(s, user, index_id, EDITOR)
            index = access.index
            if body.name is not None and body.name != index.name:
                taken = s.exec(
                    select(Index.id).where(Index.owner_id == index.owner_id, Index.name == body.name)
                ).first()
                if taken:
                    raise Conflict(
                        "the owner already has an index with this name", code="index_exists", field="name"
                    )
                index.name = body.name  # the worker table keeps its name: renaming is free
            if body.description is not None:
                index.description = body.description
            index.updated_at = utcnow()
            s.add(index)
            s.commit()
            return index_json(s, access, with_documents=True)

    return JSONResponse(await in_thread(change))


def _uploads_folder(c: Context, index: Index) -> Path | None:
    root = c.settings.uploads_dir.resolve()
    folder = (root / index.worker_name).resolve()
    return folder if folder.parent == root else None


async def delete_index(request: Request) -> Response:
    user, c, index_id = await current_user(request), ctx(request), path_id(request)

    index = await in_thread(read_index, c, user, index_id, OWNER)
    address = audit.address_of(request)
    # A table never built is fine; any other failure leaves everything as it was.
    with contextlib.suppress(WorkerNotFound):
        await c.worker.drop_index(index.worker_name)

    def remove() -> None:
        folder = _uploads_folder(c, index)
        if folder is not None and folder.exists():
            shutil.rmtree(folder, ignore_errors=True)
        with c.db.session() as s:
            s.exec(delete(ChatIndex).where(col(ChatIndex.index_id) == index.id))
            s.exec(delete(IndexGrant).where(col(IndexGrant.index_id) == index.id))
            s.exec(delete(IndexDocument).where(col(IndexDocument.index_id) == index.id))
            s.exec(delete(Index).where(col(Index.id) == index.id))
            audit.record(
                s,
                user,
                "index.delete",
                "index",
                index.id,
                {"index": index.name, "owner_id": index.owner_id, "documents": index.document_count},
                address,
            )
            s.commit()

    await in_thread(remove)
    return Response(status_code=204)


def _load_document(
    c: Context, user: User, index_id: int, document_id: int, need: str
) -> tuple[Index, IndexDocument]:
    with c.db.session() as s:
        index = require_index(s, user, index_id, need)
        return index, owned_document(s, index, document_id)


async def download_document(request: Request) -> Response:
    user, c = await current_user(request), ctx(request)
    index, doc = await in_thread(
        _load_document, c, user, path_id(request), path_id(request, "document_id"), READER
    )
    # One byte range (gateway/ranges.py) when asked: PDF.js opens a large PDF without fetching all of it.
    byte_range = ranges.parse(request.headers.get("range"))
    stream = await c.worker.get_document(index.worker_name, doc.dataset, doc.filename, byte_range)
    headers = {
        "Content-Disposition": content_disposition(doc.filename),
        "Accept-Ranges": "bytes",
        # A private file that a replacement changes under the same URL: never kept in the browser's cache.
        "Cache-Control": "no-store",
    }
    for name in ("content-length", "content-range"):
        if name in stream.headers:
            headers[name.title()] = stream.headers[name]
    # The worker's stream is closed however the download ends, the browser gone before its first byte included.
    return RelayedResponse(
        stream.raw(),
        on_end=[stream.aclose],
        status_code=206 if stream.status_code == 206 and "content-range" in stream.headers else 200,
        headers=headers,
        media_type=stream.headers.get("content-type", "application/octet-stream"),
    )


async def delete_document(request: Request) -> Response:
    user, c = await current_user(request), ctx(request)
    index, doc = await in_thread(
        _load_document, c, user, path_id(request), path_id(request, "document_id"), EDITOR
    )
    try:
        await c.worker.delete_document(index.worker_name, doc.dataset, doc.filename)
    except WorkerNotFound:
        await confirm_gone(c, index, doc)  # the worker has nothing under this name: is it really gone?

    address = audit.address_of(request)

    def remove() -> None:
        with c.db.session() as s:
            s.exec(delete(IndexDocument).where(col(IndexDocument.id) == doc.id))
            audit.record(
                s,
                user,
                "document.delete",
                "document",
                doc.id,
                {"index_id": index.id, "index": index.name, "dataset": doc.dataset, "filename": doc.filename},
                address,
            )
            current = s.get(Index, index.id)
            refresh_counts(s, current, None if current.status == "building" else "auto")
            s.commit()

    await in_thread(remove)
    return Response(status_code=204)


async def list_datasets(request: Request) -> JSONResponse:
    user, c, index_id = await current_user(request), ctx(request), path_id(request)

    def load() -> list[str]:
        with c.db.session() as s:
            return datasets_of(s, require_index(s, user, index_id, READER).id)

    return JSONResponse(await in_thread(load))


UPLOAD_PATH = r"/api/indexes/[0-9]+/documents"


# What a new index's and a new document's ids open (OpenAPI links: operationIds).
INDEX_OPS = [
    "get_api_indexes_id",
    "patch_api_indexes_id",
    "post_api_indexes_id_documents",
    "get_api_indexes_id_datasets",
    "post_api_indexes_id_build",
    "get_api_indexes_id_build",
    "delete_api_indexes_id",
]
DOCUMENT_OPS = [
    "get_api_indexes_id_documents_document_id_download",
    "delete_api_indexes_id_documents_document_id",
]
JOB_OPS = ["get_api_jobs_id", "get_api_jobs_id_events", "post_api_jobs_id_cancel"]
UPLOAD_EVENTS = event_stream(
    "With `Accept: text/event-stream`: queued (the job), then progress {file, dataset, stage} as each stage "
    "starts (converting, chunking, embedding, writing), then done (the stored document) or error {error, code}",
    ["queued", "progress", "done", "error"],
)
UPLOAD_FORM = {
    "multipart/form-data": {
        "schema": {
            "type": "object",
            "required": ["file"],
            "properties": {
                "file": {"type": "string", "format": "binary", "description": "the file, with its name"},
                "dataset": {"type": "string", "pattern": NAME_RE.pattern, "default": "default"},
            },
        },
        # The file part carries the file's name, whose extension decides how it is read.
        "encoding": {
            "file": {
                "headers": {
                    "Content-Disposition": {
                        "schema": {
                            "type": "string",
                            "example": 'form-data; name="file"; filename="notes.txt"',
                        }
                    }
                }
            }
        },
    }
}
DOCUMENT = "/api/indexes/{id:int}/documents/{document_id:int}"

routes = [
    ApiRoute(
        "POST",
        "/api/indexes/{id:int}/documents",
        upload_document,
        Operation(
            "Upload one file: it is stored and queued as a job (202 with the job), indexed in the background",
            UPLOAD_FORM,
            JobOut,
            status=202,
            links=each(JOB_OPS, {"id": "$response.body#/id"}),
            others={
                201: (UploadedDocument, "with ?wait=1: the stored document, once the job indexed it"),
                200: (UPLOAD_EVENTS, "with Accept: text/event-stream: the job's stages, then its end"),
            },
            query={
                "wait": (
                    {"type": "string", "enum": ["true", "false", "1", "0"]},
                    "answer once the file is indexed (201 with the document, or the refusal), as before jobs",
                )
            },
            # 415: a type the worker cannot read; 422: the file could not be converted within the limits (both
            # with ?wait=1; otherwise the job's failure); 429: too many uploads in flight for the account.
            errors=(404, 409, 415, 422, 429, *WORKER),
            tag="indexes",
        ),
    ),
    ApiRoute(
        "GET", "/api/indexes", list_indexes, Operation("The user's indexes", answer=[IndexOut], tag="indexes")
    ),
    ApiRoute(
        "POST",
        "/api/indexes",
        create_index,
        Operation(
            "A new, empty index",
            IndexCreate,
            IndexFull,
            status=201,
            errors=(409,),
            tag="indexes",
            links=each(INDEX_OPS, {"id": "$response.body#/id"}),
        ),
    ),
    ApiRoute(
        "GET",
        "/api/indexes/{id:int}",
        get_index,
        Operation(
            "One index with its documents (a list) and document_count",
            answer=IndexFull,
            errors=(404,),
            tag="indexes",
        ),
    ),
    ApiRoute(
        "PATCH",
        "/api/indexes/{id:int}",
        update_index,
        Operation(
            "Rename an index or change its description",
            IndexUpdate,
            IndexFull,
            errors=(404, 409),
            tag="indexes",
        ),
    ),
    ApiRoute(
        "DELETE",
        "/api/indexes/{id:int}",
        delete_index,
        Operation("Drop an index with its table and files", status=204, errors=(404, *WORKER), tag="indexes"),
    ),
    ApiRoute(
        "GET",
        "/api/indexes/{id:int}/datasets",
        list_datasets,
        Operation(
            "The dataset names of an index, for scoping a chat",
            answer=json_content({"type": "array", "items": {"type": "string"}}),
            errors=(404,),
            tag="indexes",
        ),
    ),
    ApiRoute(
        "GET",
        DOCUMENT + "/download",
        download_document,
        Operation(
            "The original file, as an attachment",
            # The file's own type (text/plain for a .txt, application/pdf, ...), application/octet-stream when unknown.
            answer={"*/*": {"schema": {"type": "string", "format": "binary"}}},
            errors=(404, *WORKER),
            tag="indexes",
        ),
    ),
    ApiRoute(
        "DELETE",
        DOCUMENT,
        delete_document,
        Operation(
            "Remove a file everywhere: its rows, vectors and the original",
            status=204,
            errors=(404, 409, *WORKER),
            tag="indexes",
        ),
    ),
]
