"""A cited source, opened: what the web's source viewer needs to show the original at the passage.

`GET /api/chats/{id}/messages/{message_id}/sources/{ref}` resolves one of an answer's documents (`S1`...) to the
index document it came from today: its gateway ids, the range-capable download URL of the original, the passage
and its location. What happened since the answer is said, never a blank pane: the index is gone or no longer
readable (404 `source_unavailable`), the file was deleted from it (404 `document_deleted`), or replaced by other
bytes (`replaced: true`, the highlight may be off). `GET /api/indexes/{id}/documents/{document_id}/text` is the
document's converted text, passage by passage (the viewer's view of a non-PDF file).
"""

from __future__ import annotations

from pathlib import PurePath

from sqlmodel import Session, select
from starlette.requests import Request
from starlette.responses import JSONResponse

from .access import access_of, get_row
from .chats import owned_chat
from .context import ctx, current_user, in_thread, path_id
from .db import Index, IndexDocument, Message, User
from .errors import NotFound
from .routing import WORKER, ApiRoute, Operation, json_content

REF_MAX = 16


def readable_index(s: Session, user_id: int, index: Index | None) -> Index | None:
    """The index if `user_id` may read it (owner, editor or reader: gateway/access.py), else None: every role
    that may read an index opens its sources."""
    if index is None:
        return None
    user = s.get(User, user_id)
    if user is None or access_of(s, user, index) is None:
        return None
    return index


def viewer_kind(filename: str, location: dict | None) -> str:
    """How the viewer shows the file: `pdf` (PDF.js, boxes), `sheet` (the cited rows as a table), `text` (the
    converted text, scrolled to the passage)."""
    if PurePath(filename).suffix.lower() == ".pdf":
        return "pdf"
    if location and (location.get("rows") or location.get("sheet")):
        return "sheet"
    return "text"


def _resolve(c, user_id: int, chat_id: int, message_id: int, ref: str) -> dict:
    with c.db.session() as s:
        owned_chat(s, user_id, chat_id)
        msg = get_row(s, Message, message_id)
        if msg is None or msg.chat_id != chat_id or msg.role != "assistant":
            raise NotFound(f"no answer {message_id} in this chat", code="message_not_found")
        documents = (msg.answer or {}).get("documents") or msg.documents or []
        doc = next((d for d in documents if isinstance(d, dict) and d.get("ref") == ref), None)
        if doc is None:
            raise NotFound(f"this answer has no source {ref}", code="source_not_found", field="ref")
        if doc.get("kind") == "table":
            raise NotFound(
                f"{ref} is a table computed from the index's spreadsheets, not a file",
                code="source_not_a_file",
                field="ref",
            )
        filename, dataset = str(doc.get("filename") or ""), str(doc.get("dataset") or "default")
        index = s.exec(select(Index).where(Index.worker_name == str(doc.get("index") or ""))).first()
        index = readable_index(s, user_id, index)
        if index is None:
            raise NotFound(
                f"the index that '{filename}' came from was deleted or is no longer shared with you",
                code="source_unavailable",
            )
        row = s.exec(
            select(IndexDocument).where(
                IndexDocument.index_id == index.id,
                IndexDocument.dataset == dataset,
                IndexDocument.filename == filename,
            )
        ).first()
        if row is None:
            raise NotFound(
                f"'{filename}' was deleted from the index '{index.name}' after this answer was written",
                code="document_deleted",
            )
        location = doc.get("location") if isinstance(doc.get("location"), dict) else None
        base = f"/api/indexes/{index.id}/documents/{row.id}"
        return {
            "ref": ref,
            "filename": filename,
            "dataset": dataset,
            "index_id": index.id,
            "index_name": index.name,
            "document_id": row.id,
            "page": doc.get("page"),
            "chunk_index": doc.get("chunk_index"),
            "location": location,
            "text": doc.get("text") or "",
            "kind": viewer_kind(filename, location),
            "file_url": f"{base}/download",
            "text_url": f"{base}/text",
            "bytes": row.bytes,
            "replaced": bool(doc.get("document_id")) and doc.get("document_id") != row.document_id,
        }


async def open_source(request: Request) -> JSONResponse:
    user, c = await current_user(request), ctx(request)
    ref = str(request.path_params["ref"])
    if len(ref) > REF_MAX:
        raise NotFound("this answer has no such source", code="source_not_found", field="ref")
    data = await in_thread(_resolve, c, user.id, path_id(request), path_id(request, "message_id"), ref)
    return JSONResponse(data)


def _document(c, user_id: int, index_id: int, document_id: int) -> tuple[Index, IndexDocument]:
    with c.db.session() as s:
        index = readable_index(s, user_id, get_row(s, Index, index_id))
        if index is None:
            raise NotFound(f"no index {index_id}", code="index_not_found")
        row = get_row(s, IndexDocument, document_id)
        if row is None or row.index_id != index.id:
            raise NotFound(f"no document {document_id} in this index", code="document_not_found")
        return index, row


async def document_text(request: Request) -> JSONResponse:
    user, c = await current_user(request), ctx(request)
    index, row = await in_thread(_document, c, user.id, path_id(request), path_id(request, "document_id"))
    data = await c.worker.get_document_text(index.worker_name, row.dataset, row.filename)
    return JSONResponse({**data, "document_id": row.id, "index_id": index.id})


SOURCE = json_content(
    {
        "type": "object",
        "properties": {
            "ref": {"type": "string"},
            "filename": {"type": "string"},
            "kind": {"type": "string", "enum": ["pdf", "sheet", "text"]},
            "file_url": {"type": "string"},
            "text_url": {"type": "string"},
            "location": {"type": ["object", "null"]},
            "replaced": {"type": "boolean"},
        },
    }
)

routes = [
    ApiRoute(
        "GET",
        "/api/chats/{id:int}/messages/{message_id:int}/sources/{ref}",
        open_source,
        Operation(
            "One cited source of an answer, resolved to the index document it came from",
            answer=SOURCE,
            errors=(404,),
            tag="chats",
        ),
    ),
    ApiRoute(
        "GET",
        "/api/indexes/{id:int}/documents/{document_id:int}/text",
        document_text,
        Operation(
            "A document's converted text, passage by passage, each with its location",
            answer=json_content({"type": "object"}),
            errors=(404, *WORKER),
            tag="indexes",
        ),
    ),
]
