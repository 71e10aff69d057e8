"""Document and index lifecycle: upload, list, download, delete, bulk (re)index, drop (docs/design/WORKER_API.md).

Uploaded originals live at `uploads_dir/<index>/<dataset>/<filename>`; that folder is also what `POST /index`
indexes, so a rebuild re-reads exactly what was uploaded. An upload is written to a private temporary file
first and moved into place only once its rows are in the index: a refused or failed upload changes nothing.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

from flask import jsonify, request, send_file
from pydantic import BaseModel, ConfigDict

from ..errors import ApiError, BadRequest, DocumentNotFound, IndexNotFound, PayloadTooLarge
from ..ingest import overviews, removal
from ..ingest.document import ingest_file, ingest_steps, uploads_path
from ..ingest.folder import index_folder
from ..ingest.formats import kind_of
from ..ingest.records import Progress, stage_detail
from ..names import check_filename, check_name
from ..openapi import FILENAME_SCHEMA, NAME_SCHEMA, json_content, link, path_param, query_param, sse
from ..responses import Added, Deleted, Dropped, FileInfo, IndexCreated, IndexSettings
from ..schemas import FileName, Name, parse
from ..services import Services
from ..sse import frame, sse_response
from . import json_body, services
from .table import Routes

routes = Routes("documents", __name__)
log = logging.getLogger("rag_worker")

INCOMING = ".incoming"  # not a valid index name, so never mistaken for an index's uploads folder
COPY_BLOCK = 1 << 20


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class DeleteRequest(_Body):
    index: Name = "default"
    dataset: Name = "default"
    filename: FileName


class CreateIndexRequest(_Body):
    embedder: str | None = None  # rag_worker/embedders.py: "default" or "multilingual-e5-small"
    language: str | None = None  # the full-text index's language (rag_worker/store/fts.py), "en" by default


class IndexRequest(_Body):
    index: Name = "default"
    rebuild: bool = False
    prune: bool = False


INDEX_Q = query_param("index", required=False)
UPLOAD = {
    "multipart/form-data": {
        "schema": {
            "type": "object",
            "required": ["file"],
            "properties": {
                "file": {"type": "string", "format": "binary"},
                "dataset": NAME_SCHEMA,
                "index": NAME_SCHEMA,
                # The file's name, when the multipart header can't carry it verbatim (it wins over it).
                "filename": FILENAME_SCHEMA,
            },
        }
    }
}
UPLOAD_EVENTS = sse(
    "progress {file, dataset, stage, done, total} as each stage starts (converting, chunking, "
    "embedding, writing; ocr after each scanned page read, with ocr {page, done, total}), then done "
    "(Added) or error (ErrorBody)",
    ["progress", "done", "error"],
)
# The operations on the index and the document an upload made, with the names its answer gives.
ON_THE_UPLOAD = {
    "ListDocuments": link("get_get_documents", parameters={"index": "index"}),
    "ListDatasets": link("get_get_datasets", parameters={"index": "index"}),
    "Download": link(
        "get_get_document", parameters={"index": "index", "dataset": "dataset", "filename": "filename"}
    ),
    "Delete": link("post_delete", body={"index": "index", "dataset": "dataset", "filename": "filename"}),
    "DropIndex": link("delete_indexes_{index}", parameters={"index": "index"}),
}
UPLOAD_REFUSALS = {
    400: "a bad index, dataset or file name, no `file` field, or a file with no text to index (code `empty`)",
    404: "no such index for a name the request refers to",
    409: "the index was built with another embedder (code `embedder_mismatch`)",
    413: "the file is larger than MAX_UPLOAD_BYTES, or expands past a limit (zip bomb, pages, cells)",
    415: "a file name without an extension, or with one of a type the worker cannot read (code "
    "`unsupported_type`)",
    422: "the file broke CONVERT_MAX_MEMORY_MB / CONVERT_TIMEOUT_S or could not be converted",
}
INDEX_EVENTS = sse(
    "progress {file, dataset, done, total, stage} (stage ocr: one per scanned page read, with ocr {page, done, "
    "total}), then done {documents, chunks, seconds, unchanged, failed} or error (ErrorBody)",
    ["progress", "done", "error"],
)


def read_index_arg() -> str:
    return check_name(request.args.get("index", "default"), "index")


def require_index(svc: Services, index: str) -> None:
    if not svc.store.exists(index):
        raise IndexNotFound(f"index '{index}' does not exist")


def save_upload(svc: Services, storage, suffix: str) -> Path:
    """Copy the uploaded stream to a private temporary file, refusing it (413) past max_upload_bytes."""
    limit = svc.settings.max_upload_bytes
    incoming = svc.settings.uploads_dir / INCOMING
    incoming.mkdir(parents=True, exist_ok=True)
    tmp = incoming / f"{uuid.uuid4().hex}{suffix}"
    written = 0
    try:
        with open(tmp, "wb") as out:
            while block := storage.stream.read(COPY_BLOCK):
                written += len(block)
                if written > limit:
                    raise PayloadTooLarge(
                        f"the file is larger than the limit of {limit:,} bytes", field="file"
                    )
                out.write(block)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


@routes.post(
    "/add_document",
    "Upload and index one file",
    body=UPLOAD,
    answer=Added,
    # With `Accept: text/event-stream`: progress as each stage starts, then done (the JSON answer).
    also=UPLOAD_EVENTS,
    errors=tuple(UPLOAD_REFUSALS),
    meanings=UPLOAD_REFUSALS,
    links=ON_THE_UPLOAD,
)
def add_document():
    svc = services()
    storage = request.files.get("file")
    if storage is None:
        raise BadRequest(
            "a multipart field 'file' with the document is required", code="missing_field", field="file"
        )
    index = check_name(request.form.get("index", "default"), "index")
    dataset = check_name(request.form.get("dataset", "default"), "dataset")
    # A `filename` form field names the file exactly. The multipart header's filename is lossy: clients escape
    # '"' as %22 and the parser unescapes any %22, so `per%22cent.md` would arrive as `per"cent.md`.
    named = request.form.get("filename")
    filename = check_filename(named if named is not None else (storage.filename or ""))
    kind_of(filename)  # 415 before a byte is stored
    tmp = save_upload(svc, storage, Path(filename).suffix.lower())
    if "text/event-stream" in request.headers.get("Accept", ""):
        keep_at = uploads_path(svc, index, dataset, filename)
        return sse_response(
            ingest_events(svc, index, dataset, tmp, filename, keep_at), svc.settings.keepalive_s
        )
    try:
        result = ingest_file(
            svc, index, dataset, tmp, filename, keep_at=uploads_path(svc, index, dataset, filename)
        )
    finally:
        tmp.unlink(missing_ok=True)  # still there when refused, failed or unchanged-and-kept
    return jsonify({**result.to_dict(), "index": index})


def ingest_events(svc: Services, index: str, dataset: str, tmp: Path, filename: str, keep_at: Path):
    """`/add_document` as SSE (asked for with `Accept: text/event-stream`): `progress` as each stage starts
    (converting, chunking, embedding, writing; "ocr" after each scanned page read, with `ocr: {page, done,
    total}`), then `done` with the same result as the JSON answer, or
    `error`. Closing the stream (the client left) stops the work between stages and removes the upload."""
    try:
        steps = ingest_steps(svc, index, dataset, tmp, filename, keep_at=keep_at)
        while True:
            try:
                stage = next(steps)
            except StopIteration as stop:
                result = stop.value
                break
            event = {"file": filename, "dataset": dataset, "stage": str(stage), "done": 0, "total": 1}
            yield frame("progress", {**event, **stage_detail(stage)})
        yield frame("done", {**result.to_dict(), "index": index})
    except ApiError as err:
        yield frame("error", {**err.to_dict(), "status": err.status})
    except Exception as exc:
        log.exception("indexing %s failed", filename)
        yield frame(
            "error", {"error": f"internal error: {type(exc).__name__}", "code": "internal", "status": 500}
        )
    finally:
        tmp.unlink(missing_ok=True)


@routes.get("/get_documents", "Files of an index", answer=[FileInfo], params=(INDEX_Q,), errors=(400, 404))
def get_documents():
    return jsonify(services().store.list_documents(read_index_arg()))


@routes.get(
    "/get_datasets",
    "Dataset names of an index",
    answer=json_content({"type": "array", "items": {"type": "string"}}),
    params=(INDEX_Q,),
    errors=(400, 404),
)
def get_datasets():
    return jsonify(services().store.list_datasets(read_index_arg()))


@routes.get(
    "/get_document",
    "Download an original file (always an attachment)",
    # The file's own type (text/plain for a .txt, application/pdf, ...), application/octet-stream when unknown.
    answer={"*/*": {"schema": {"type": "string", "format": "binary"}}},
    params=(INDEX_Q, query_param("dataset", False), query_param("filename", True, FILENAME_SCHEMA)),
    errors=(400, 404),
)
def get_document():
    svc = services()
    index = read_index_arg()
    dataset = check_name(request.args.get("dataset", "default"), "dataset")
    filename = check_filename(request.args.get("filename", ""))
    require_index(svc, index)
    path = uploads_path(svc, index, dataset, filename)
    if not path.is_file():
        raise DocumentNotFound(index, dataset, filename)
    # Always an attachment: an uploaded HTML file must never run as a page of the worker's origin.
    resp = send_file(path, as_attachment=True, download_name=filename, conditional=True)
    resp.headers["X-Content-Type-Options"] = "nosniff"
    return resp


DOCUMENT_TEXT = json_content(
    {
        "type": "object",
        "properties": {
            "filename": {"type": "string"},
            "dataset": {"type": "string"},
            "document_id": {"type": "string"},
            "chunks": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "chunk_index": {"type": "integer"},
                        "page": {"type": ["integer", "null"]},
                        "text": {"type": "string"},
                        "location": {"type": ["object", "null"]},
                    },
                },
            },
        },
    }
)


@routes.get(
    "/get_document_text",
    "A document's converted text: its chunks in order, each with its page and location",
    answer=DOCUMENT_TEXT,
    params=(INDEX_Q, query_param("dataset", False), query_param("filename", True, FILENAME_SCHEMA)),
    errors=(400, 404),
)
def get_document_text():
    svc = services()
    index = read_index_arg()
    dataset = check_name(request.args.get("dataset", "default"), "dataset")
    filename = check_filename(request.args.get("filename", ""))
    require_index(svc, index)
    hits = svc.store.document_chunks(index, dataset, filename)
    if not hits:
        raise DocumentNotFound(index, dataset, filename)
    return jsonify(
        {
            "filename": filename,
            "dataset": dataset,
            "document_id": hits[0].document_id,
            "chunks": [
                {
                    "chunk_index": h.chunk_index,
                    "page": h.page,
                    "text": h.text,
                    "location": h.metadata.get("location") or None,
                }
                for h in hits
            ],
        }
    )


@routes.post(
    "/delete",
    "Remove one file: its rows, vectors and full-text entries",
    body=DeleteRequest,
    answer=Deleted,
    errors=(400, 404),
)
def delete():
    svc = services()
    req = parse(DeleteRequest, json_body())
    index = check_name(req.index, "index")
    dataset = check_name(req.dataset, "dataset")
    filename = check_filename(req.filename)
    require_index(svc, index)
    had_original = uploads_path(svc, index, dataset, filename).is_file()
    count = removal.delete_document(svc, index, dataset, filename)
    if count == 0 and not had_original:
        raise DocumentNotFound(index, dataset, filename)
    return jsonify({"count": count})


@routes.post(
    "/index",
    "(Re)build an index from shared_uploads/<index>/",
    body=IndexRequest,
    answer=INDEX_EVENTS,
    errors=(400, 404, 409),
)
def index_uploads():
    svc = services()
    req = parse(IndexRequest, json_body())
    index = check_name(req.index, "index")
    folder = svc.settings.uploads_dir / index
    if not folder.is_dir():
        if not svc.store.exists(index):
            raise IndexNotFound(f"index '{index}' has no uploads folder ({folder}) and no table")
        folder.mkdir(parents=True, exist_ok=True)
    if not req.rebuild and svc.store.exists(index):
        svc.store.check_compatible(index)  # 409 as JSON, before the stream starts

    def frames():
        try:
            for event in index_folder(svc, index, folder, req.rebuild, prune=req.prune):
                if isinstance(event, Progress):
                    yield frame("progress", event.to_dict())
                else:
                    yield frame("done", event.to_dict())
        except ApiError as err:
            yield frame("error", err.to_dict())
        except Exception as exc:
            log.exception("indexing %s failed", index)
            yield frame("error", {"error": f"internal error: {type(exc).__name__}", "code": "internal"})

    return sse_response(frames(), svc.settings.keepalive_s)


@routes.route(
    "put",
    "/indexes/<index>",
    "Create an empty index with an embedder and a full-text language",
    body=CreateIndexRequest,
    answer=IndexCreated,
    params=(path_param("index"),),
    errors=(400, 409),
    created=True,
)
def create_index(index: str):
    """201 when made now, 200 when it exists with the same embedder and language, 409 when with others."""
    svc = services()
    index = check_name(index, "index")
    req = parse(CreateIndexRequest, json_body())
    created = svc.store.create_index(index, embedder=req.embedder, language=req.language)
    return jsonify({"index": index, "created": created, **svc.store.index_settings(index)}), (
        201 if created else 200
    )


@routes.get(
    "/indexes/<index>",
    "The embedder and full-text language an index was made with (its table's marker)",
    answer=IndexSettings,
    params=(path_param("index"),),
    errors=(400, 404),
)
def index_settings(index: str):
    """What the gateway stores beside its index row (and backfills rows made before it stored them)."""
    svc = services()
    index = check_name(index, "index")
    return jsonify({"index": index, **svc.store.index_settings(index)})


@routes.delete(
    "/indexes/<index>",
    "Drop an index and its overviews",
    answer=Dropped,
    params=(path_param("index"),),
    errors=(400, 404),
)
def drop_index(index: str):
    svc = services()
    index = check_name(index, "index")
    had_overviews = overviews.overviews_path(svc.settings, index).exists()
    existed = removal.drop_index(svc, index)
    if not existed and not had_overviews:
        raise IndexNotFound(f"index '{index}' does not exist")
    return jsonify({"index": index, "dropped": True})
