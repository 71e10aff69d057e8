"""Indexes and their documents, per owner. Another user's index is a 404.

Each gateway index maps to one worker table with a unique name (`u<owner>_<slug>_<random>`), so two users
may both call an index "contracts". Uploads are forwarded to the worker's /add_document, which stores the
original under UPLOADS_DIR/<table>/<dataset>/<file> on the shared volume and indexes it; the worker owns the
file (one writer, no double copy), the gateway keeps the record in its database. Deleting an index drops the
worker table, the folder and the rows.
"""

from __future__ import annotations

import logging
import re
import secrets
import shutil
import unicodedata
from pathlib import Path, PurePosixPath, PureWindowsPath

import httpx
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, delete, func, select
from starlette.background import BackgroundTask
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from . import upload_progress
from .context import Context, ctx, current_user, in_thread, path_id, read_json
from .db import ChatIndex, Index, IndexDocument, iso, utcnow
from .errors import ApiError, BadRequest, Conflict, NotFound, PayloadTooLarge
from .responses import DocumentOut, IndexFull, IndexOut, UploadedDocument
from .schemas import NAME_RE, IndexCreate, IndexUpdate

log = logging.getLogger("gateway.indexes")


def worker_table_name(owner_id: int, name: str) -> str:
    """A unique worker table name that still reads like the index: `u7_contracts-2024_3f9a1c2b`."""
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode().lower()
    slug = re.sub(r"[^a-z0-9-]+", "-", ascii_name).strip("-")[:32] or "index"
    return f"u{owner_id}_{slug}_{secrets.token_hex(4)}"


def check_dataset(value: str) -> str:
    if not NAME_RE.fullmatch(value):
        raise BadRequest(
            "dataset must be 1 to 64 letters, digits, '_' or '-'", code="bad_name", field="dataset"
        )
    return value


def check_filename(value: str | None) -> str:
    """A plain base name (unicode and spaces kept); any path in it is a 400, like the worker."""
    name = unicodedata.normalize("NFC", (value or "").strip())
    if not name:
        raise BadRequest("the upload has no file name", code="bad_filename", field="file")
    if len(name.encode("utf-8")) > 255:
        raise BadRequest("the file name is longer than 255 bytes", code="bad_filename", field="file")
    if any(ch in name for ch in "\x00\r\n") or name in {".", ".."}:
        raise BadRequest("the file name contains forbidden characters", code="bad_filename", field="file")
    if PurePosixPath(name).name != name or PureWindowsPath(name).name != name:
        raise BadRequest("the file name must not contain a path", code="path_in_filename", field="file")
    return name


def owned_index(s: Session, owner_id: int, index_id: int) -> Index:
    index = s.get(Index, index_id)
    if index is None or index.owner_id != owner_id:
        raise NotFound(f"no index {index_id}", code="index_not_found")
    return index


def owned_document(s: Session, index: Index, document_id: int) -> IndexDocument:
    doc = s.get(IndexDocument, document_id)
    if doc is None or doc.index_id != index.id:
        raise NotFound(f"no document {document_id} in this index", code="document_not_found")
    return doc


def document_json(d: IndexDocument) -> dict:
    return DocumentOut(
        **{
            "id": d.id,
            "filename": d.filename,
            "dataset": d.dataset,
            "document_id": d.document_id,
            "chunks": d.chunks,
            "bytes": d.bytes,
            "created_at": iso(d.created_at),
        }
    ).data()


def index_json(s: Session, index: Index, with_documents: bool = False) -> dict:
    data = {
        "id": index.id,
        "name": index.name,
        "description": index.description,
        "status": index.status,
        "document_count": index.document_count,
        "chunks": index.chunk_count,
        "created_at": iso(index.created_at),
        "updated_at": iso(index.updated_at),
        "datasets": datasets_of(s, index.id),
    }
    if with_documents:
        docs = s.exec(
            select(IndexDocument)
            .where(IndexDocument.index_id == index.id)
            .order_by(col(IndexDocument.dataset), col(IndexDocument.filename))
        ).all()
        return IndexFull(**data, documents=[document_json(d) for d in docs]).data()
    return IndexOut(**data).data()


def datasets_of(s: Session, index_id: int) -> list[str]:
    rows = s.exec(
        select(IndexDocument.dataset)
        .where(IndexDocument.index_id == index_id)
        .distinct()
        .order_by(col(IndexDocument.dataset))
    )
    return list(rows)


def refresh_counts(s: Session, index: Index, status: str | None = "auto") -> None:
    """Recount documents and chunks; `status` "auto" means ready/empty by count, None keeps the current one."""
    count, chunks = s.exec(
        select(func.count(), func.coalesce(func.sum(IndexDocument.chunks), 0)).where(
            IndexDocument.index_id == index.id
        )
    ).one()
    index.document_count, index.chunk_count = int(count), int(chunks)
    if status == "auto":
        index.status = "ready" if count else "empty"
    elif status is not None:
        index.status = status
    index.updated_at = utcnow()
    s.add(index)


async def list_indexes(request: Request) -> JSONResponse:
    user, c = await current_user(request), ctx(request)

    def load() -> list[dict]:
        with c.db.session() as s:
            rows = s.exec(select(Index).where(Index.owner_id == user.id).order_by(col(Index.name))).all()
            return [index_json(s, i) for i in rows]

    return JSONResponse(await in_thread(load))


async def create_index(request: Request) -> JSONResponse:
    user, c = await current_user(request), ctx(request)
    body = await read_json(request, IndexCreate)

    def create() -> dict:
        with c.db.session() as s:
            if s.exec(select(Index.id).where(Index.owner_id == user.id, Index.name == body.name)).first():
                raise Conflict("you already have an index with this name", code="index_exists", field="name")
            index = Index(
                owner_id=user.id,
                name=body.name,
                description=body.description,
                worker_name=worker_table_name(user.id, body.name),
            )
            s.add(index)
            try:
                s.commit()
            except IntegrityError:
                raise Conflict(
                    "you already have an index with this name", code="index_exists", field="name"
                ) from None
            return index_json(s, index, with_documents=True)

    return JSONResponse(await in_thread(create), status_code=201)


async def get_index(request: Request) -> JSONResponse:
    user, c, index_id = await current_user(request), ctx(request), path_id(request)

    def load() -> dict:
        with c.db.session() as s:
            return index_json(s, owned_index(s, user.id, index_id), with_documents=True)

    return JSONResponse(await in_thread(load))


async def update_index(request: Request) -> JSONResponse:
    user, c, index_id = await current_user(request), ctx(request), path_id(request)
    body = await read_json(request, IndexUpdate)

    def change() -> dict:
        with c.db.session() as s:
            index = owned_index(s, user.id, index_id)
            if body.name is not None and body.name != index.name:
                taken = s.exec(
                    select(Index.id).where(Index.owner_id == user.id, Index.name == body.name)
                ).first()
                if taken:
                    raise Conflict(
                        "you already have an index with this name", code="index_exists", field="name"
                    )
                index.name = body.name  # the worker table keeps its name: renaming is free
            if body.description is not None:
                index.description = body.description
            index.updated_at = utcnow()
            s.add(index)
            s.commit()
            return index_json(s, index, with_documents=True)

    return JSONResponse(await in_thread(change))


def _uploads_folder(c: Context, index: Index) -> Path | None:
    root = c.settings.uploads_dir.resolve()
    folder = (root / index.worker_name).resolve()
    return folder if folder.parent == root else None


async def delete_index(request: Request) -> Response:
    user, c, index_id = await current_user(request), ctx(request), path_id(request)

    def load() -> Index:
        with c.db.session() as s:
            return owned_index(s, user.id, index_id)

    index = await in_thread(load)
    try:
        await c.worker.drop_index(index.worker_name)
    except ApiError as exc:
        if exc.status != 404:  # a table never built is fine; anything else leaves everything as it was
            raise

    def remove() -> None:
        folder = _uploads_folder(c, index)
        if folder is not None and folder.exists():
            shutil.rmtree(folder, ignore_errors=True)
        with c.db.session() as s:
            s.exec(delete(ChatIndex).where(col(ChatIndex.index_id) == index.id))
            s.exec(delete(IndexDocument).where(col(IndexDocument.index_id) == index.id))
            s.exec(delete(Index).where(col(Index.id) == index.id))
            s.commit()

    await in_thread(remove)
    return Response(status_code=204)


async def _read_upload(request: Request, c: Context) -> tuple[UploadFile, str]:
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

    def load() -> Index:
        with c.db.session() as s:
            return owned_index(s, user.id, index_id)

    index = await in_thread(load)  # before reading the body: another user's index is a 404, not a 413
    upload, dataset = await _read_upload(request, c)
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
            current = owned_index(s, user.id, index_id)
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

    if upload_progress.wants_events(request):  # the web: the worker's stages as they happen, then the row
        return await upload_progress.relay(c, index.worker_name, dataset, filename, content, upload, record)
    result = await c.worker.add_document(index.worker_name, dataset, filename, content, upload.content_type)
    return JSONResponse(await in_thread(record, result), status_code=201)


def _load_document(c: Context, user_id: int, index_id: int, document_id: int) -> tuple[Index, IndexDocument]:
    with c.db.session() as s:
        index = owned_index(s, user_id, index_id)
        return index, owned_document(s, index, document_id)


async def download_document(request: Request) -> Response:
    user, c = await current_user(request), ctx(request)
    index, doc = await in_thread(
        _load_document, c, user.id, path_id(request), path_id(request, "document_id")
    )
    params = {"index": index.worker_name, "dataset": doc.dataset, "filename": doc.filename}
    stream = c.worker.stream("GET", "/get_document", params=params)
    resp = await stream.__aenter__()
    headers = {"Content-Disposition": content_disposition(doc.filename)}
    if "content-length" in resp.headers:
        headers["Content-Length"] = resp.headers["content-length"]

    async def close() -> None:
        await stream.__aexit__(None, None, None)

    return StreamingResponse(
        resp.aiter_raw(),
        headers=headers,
        media_type=resp.headers.get("content-type", "application/octet-stream"),
        background=BackgroundTask(close),
    )


def content_disposition(filename: str) -> str:
    """An attachment named exactly `filename` (RFC 6266 `filename*`), with a plain ASCII fallback for old
    clients; a name such as `per%22cent.md` survives, where a quoted `filename=` would be read as `per"cent.md`."""
    from urllib.parse import quote

    fallback = "".join(ch if 32 <= ord(ch) < 127 and ch not in '"\\%' else "_" for ch in filename)
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(filename, safe='')}"


async def delete_document(request: Request) -> Response:
    user, c = await current_user(request), ctx(request)
    index, doc = await in_thread(
        _load_document, c, user.id, path_id(request), path_id(request, "document_id")
    )
    try:
        await c.worker.delete_document(index.worker_name, doc.dataset, doc.filename)
    except ApiError as exc:
        if exc.status != 404:
            raise
        await _confirm_gone(c, index, doc)  # the worker has nothing under this name: is it really gone?

    def remove() -> None:
        with c.db.session() as s:
            s.exec(delete(IndexDocument).where(col(IndexDocument.id) == doc.id))
            current = s.get(Index, index.id)
            refresh_counts(s, current, None if current.status == "building" else "auto")
            s.commit()

    await in_thread(remove)
    return Response(status_code=204)


async def _confirm_gone(c: Context, index: Index, doc: IndexDocument) -> None:
    """After the worker's 404 to a delete: drop our record only when the worker holds no such document. One it
    still holds (the same bytes under another name, e.g. a record made before both sides used one name) was not
    deleted, and saying so keeps the record, so the user is not told a searchable document is gone."""
    try:
        listed = await c.worker.get_documents(index.worker_name)
    except ApiError as exc:
        if exc.status == 404:
            return  # no table at all: nothing of it is searchable
        raise

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


async def list_datasets(request: Request) -> JSONResponse:
    user, c, index_id = await current_user(request), ctx(request), path_id(request)

    def load() -> list[str]:
        with c.db.session() as s:
            return datasets_of(s, owned_index(s, user.id, index_id).id)

    return JSONResponse(await in_thread(load))


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


UPLOAD_PATH = r"/api/indexes/[0-9]+/documents"

routes = [
    Route("/api/indexes/{id:int}/documents", upload_document, methods=["POST"]),
    Route("/api/indexes", list_indexes, methods=["GET"]),
    Route("/api/indexes", create_index, methods=["POST"]),
    Route("/api/indexes/{id:int}", get_index, methods=["GET"]),
    Route("/api/indexes/{id:int}", update_index, methods=["PATCH"]),
    Route("/api/indexes/{id:int}", delete_index, methods=["DELETE"]),
    Route("/api/indexes/{id:int}/datasets", list_datasets, methods=["GET"]),
    Route("/api/indexes/{id:int}/documents/{document_id:int}/download", download_document, methods=["GET"]),
    Route("/api/indexes/{id:int}/documents/{document_id:int}", delete_document, methods=["DELETE"]),
]


DEMO_TABLE = "demo"


async def adopt_demo_index(c: Context, owner_id: int) -> None:
    """Give the first (admin) user the `demo` index that run_system.py builds from the project's own docs.

    The worker table exists before anyone has registered, so no gateway row points at it; without this the
    newcomer the demo is for could not find it in the web chat. A worker without a demo table is fine.
    """
    try:
        listed = await c.worker.get_documents(DEMO_TABLE)
    except (ApiError, httpx.HTTPError):
        return
    if not listed:
        return

    def create() -> int | None:
        with c.db.session() as s:
            if s.exec(select(Index.id).where(Index.worker_name == DEMO_TABLE)).first():
                return None
            index = Index(
                owner_id=owner_id,
                name="demo",
                worker_name=DEMO_TABLE,
                status="ready",
                description="This project's own README and docs, indexed on first start",
            )
            s.add(index)
            try:
                s.commit()
            except IntegrityError:
                return None
            s.refresh(index)
            return index.id

    index_id = await in_thread(create)
    if index_id is not None:
        await sync_documents(c, index_id)
