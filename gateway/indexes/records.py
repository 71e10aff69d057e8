"""An index's document rows, their counts, and their JSON as the API answers it."""

from __future__ import annotations

from sqlmodel import Session, col, func, select

from ..access import Access, get_row
from ..db import Group, Index, IndexDocument, User, iso, utcnow
from ..errors import NotFound
from ..responses import DocumentOut, IndexFull, IndexOut


def owned_document(s: Session, index: Index, document_id: int) -> IndexDocument:
    doc = get_row(s, IndexDocument, document_id)
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


def access_json(s: Session, access: Access) -> dict:
    """The access fields of an index's JSON: the role, the owner and where the access comes from."""
    owner = s.get(User, access.index.owner_id)
    group = s.get(Group, access.group_id) if access.group_id is not None else None
    return {
        "access": access.role,
        "owner_id": access.index.owner_id,
        "owner": owner.username if owner else "",
        "via": access.source,
        "via_group": group.name if group else None,
    }


def index_json(s: Session, access: Access, with_documents: bool = False) -> dict:
    index = access.index
    data = {
        **access_json(s, access),
        "id": index.id,
        "name": index.name,
        "description": index.description,
        "status": index.status,
        "document_count": index.document_count,
        "chunks": index.chunk_count,
        "embedder": index.embedder,
        "language": index.language,
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
