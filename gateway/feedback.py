"""Ratings of answers: thumbs up or down with an optional reason and comment, and the review list built on them.

A user rates the stored answers of their own chats (someone else's message is a 404, a turn still running a 409)
and may change or withdraw a rating; one rating per answer. Each rating is linked to the indexes the answer drew
on (its documents' indexes, else the chat's), so admins review every rating and an index's owner those on their
indexes: `GET /api/feedback` (question, answer, documents, steps, rating; filters by index, date and rating)
and `GET /api/feedback/export`, the same as JSON lines, streamed (raw material for an evaluation set).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Literal

from pydantic import Field
from sqlalchemy import Index as SqlIndex
from sqlalchemy import UniqueConstraint
from sqlmodel import Field as SqlField
from sqlmodel import Session, SQLModel, col, delete, select
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from .access import OWNER, get_row, readable_indexes
from .chats import owned_chat
from .context import ctx, current_user, in_thread, path_id, read_json
from .db import ChatIndex, Index, Message, User, iso, utcnow
from .errors import BadRequest, Conflict, NotFound
from .routing import ApiRoute, Operation, json_content
from .schemas import Body

Rating = Literal["up", "down"]
Reason = Literal["wrong", "not_in_sources", "incomplete", "bad_citation"]
PAGE_MAX = 200
EXPORT_BATCH = 200


class Feedback(SQLModel, table=True):
    """One user's rating of one answer (migration 9). No foreign keys: a deleted chat takes its ratings along
    (chats.delete_chat), and the review list reads only ratings whose message still exists."""

    __tablename__ = "feedback"
    __table_args__ = (UniqueConstraint("message_id", name="uq_feedback_message"),)
    id: int | None = SqlField(default=None, primary_key=True)
    message_id: int = SqlField(index=True)
    chat_id: int = SqlField(index=True)
    user_id: int = SqlField(index=True)
    rating: str = SqlField(max_length=8)
    reason: str | None = SqlField(default=None, max_length=32)
    comment: str | None = SqlField(default=None, max_length=2000)
    created_at: datetime = SqlField(default_factory=utcnow)
    updated_at: datetime = SqlField(default_factory=utcnow, index=True)


class FeedbackIndex(SQLModel, table=True):
    """Which indexes a rated answer drew on: what the review list filters and an owner's access go by."""

    __tablename__ = "feedback_indexes"
    __table_args__ = (SqlIndex("ix_feedback_indexes_index", "index_id"),)
    feedback_id: int = SqlField(primary_key=True)
    index_id: int = SqlField(primary_key=True)


def migrate_feedback(conn) -> None:
    """Migration 9: the ratings and their index links."""
    Feedback.__table__.create(conn, checkfirst=True)
    FeedbackIndex.__table__.create(conn, checkfirst=True)


def rating_scope(s: Session, user: User) -> list[int] | None:
    """The ids of the indexes whose ratings `user` may see; None: all of them (an admin). The one place that
    decides who may see ratings of index X: an administrator all, anyone else those they own."""
    if user.is_admin:
        return None
    return [a.index.id for a in readable_indexes(s, user) if a.allows(OWNER)]


class FeedbackIn(Body):
    rating: Rating
    reason: Reason | None = None
    comment: str | None = Field(default=None, max_length=2000)


def feedback_json(f: Feedback) -> dict:
    return {
        "id": f.id,
        "message_id": f.message_id,
        "chat_id": f.chat_id,
        "rating": f.rating,
        "reason": f.reason,
        "comment": f.comment,
        "created_at": iso(f.created_at),
        "updated_at": iso(f.updated_at),
    }


def _rated_message(s: Session, user_id: int, chat_id: int, message_id: int) -> Message:
    owned_chat(s, user_id, chat_id)
    msg = get_row(s, Message, message_id)
    if msg is None or msg.chat_id != chat_id or msg.role != "assistant":
        raise NotFound(f"no answer {message_id} in this chat", code="message_not_found")
    if msg.status == "running":
        raise Conflict("the answer is still being written; rate it once it has finished", code="turn_running")
    return msg


def _answer_indexes(s: Session, msg: Message) -> list[int]:
    """The indexes the answer drew on: those of its documents, else the chat's linked indexes."""
    documents = (msg.answer or {}).get("documents") or msg.documents or []
    names = {str(d.get("index")) for d in documents if isinstance(d, dict) and d.get("index")}
    ids = list(s.exec(select(Index.id).where(col(Index.worker_name).in_(names))).all()) if names else []
    if not ids:
        ids = list(s.exec(select(ChatIndex.index_id).where(ChatIndex.chat_id == msg.chat_id)).all())
    return sorted(set(ids))


async def rate(request: Request) -> JSONResponse:
    user, c = await current_user(request), ctx(request)
    chat_id, message_id = path_id(request), path_id(request, "message_id")
    body = await read_json(request, FeedbackIn)
    comment = (body.comment or "").strip() or None

    def save() -> dict:
        with c.db.session() as s:
            msg = _rated_message(s, user.id, chat_id, message_id)
            row = s.exec(select(Feedback).where(Feedback.message_id == msg.id)).first()
            if row is None:
                row = Feedback(message_id=msg.id, chat_id=chat_id, user_id=user.id, rating=body.rating)
            row.rating, row.reason, row.comment = body.rating, body.reason, comment
            row.updated_at = utcnow()
            s.add(row)
            s.flush()
            s.exec(delete(FeedbackIndex).where(col(FeedbackIndex.feedback_id) == row.id))
            for index_id in _answer_indexes(s, msg):
                s.add(FeedbackIndex(feedback_id=row.id, index_id=index_id))
            s.commit()  # the rating and its links in one transaction
            return feedback_json(row)

    return JSONResponse(await in_thread(save))


async def unrate(request: Request) -> Response:
    user, c = await current_user(request), ctx(request)
    chat_id, message_id = path_id(request), path_id(request, "message_id")

    def remove() -> None:
        with c.db.session() as s:
            msg = _rated_message(s, user.id, chat_id, message_id)
            row = s.exec(select(Feedback).where(Feedback.message_id == msg.id)).first()
            if row is not None:
                s.exec(delete(FeedbackIndex).where(col(FeedbackIndex.feedback_id) == row.id))
                s.delete(row)
                s.commit()

    await in_thread(remove)
    return Response(status_code=204)


async def chat_feedback(request: Request) -> JSONResponse:
    user, c, chat_id = await current_user(request), ctx(request), path_id(request)

    def load() -> dict:
        with c.db.session() as s:
            owned_chat(s, user.id, chat_id)
            rows = s.exec(select(Feedback).where(Feedback.chat_id == chat_id)).all()
            return {"feedback": {str(f.message_id): feedback_json(f) for f in rows}}

    return JSONResponse(await in_thread(load))


def delete_chat_feedback(s: Session, chat_id: int) -> None:
    """A deleted chat's ratings go with it (called by chats.delete_chat in its transaction)."""
    ids = list(s.exec(select(Feedback.id).where(Feedback.chat_id == chat_id)).all())
    if ids:
        s.exec(delete(FeedbackIndex).where(col(FeedbackIndex.feedback_id).in_(ids)))
        s.exec(delete(Feedback).where(col(Feedback.id).in_(ids)))


# -- the review list --------------------------------------------------------------------------------------------


def _date(value: str | None, name: str) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise BadRequest(f"{name} must be an ISO 8601 date or time", code="bad_query", field=name) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def _int(value: str | None, name: str, default: int, low: int, high: int) -> int:
    if value is None or value == "":
        return default
    if not value.isdigit() or not low <= int(value) <= high:
        raise BadRequest(f"{name} must be a whole number from {low} to {high}", code="bad_query", field=name)
    return int(value)


class Filters:
    def __init__(self, request: Request):
        q = request.query_params
        self.index_id = _int(q.get("index_id"), "index_id", 0, 1, 2**31 - 1) or None
        rating = q.get("rating") or None
        if rating not in (None, "up", "down"):
            raise BadRequest("rating must be up or down", code="bad_query", field="rating")
        self.rating = rating
        self.since, self.until = _date(q.get("since"), "since"), _date(q.get("until"), "until")
        self.limit = _int(q.get("limit"), "limit", 50, 1, PAGE_MAX)
        self.offset = _int(q.get("offset"), "offset", 0, 0, 10**9)


def _query(s: Session, user: User, f: Filters):
    scope = rating_scope(s, user)
    if f.index_id is not None and scope is not None and f.index_id not in scope:
        raise NotFound(f"no index {f.index_id}", code="index_not_found", field="index_id")
    query = select(Feedback).join(Message, col(Message.id) == col(Feedback.message_id))
    wanted = [f.index_id] if f.index_id is not None else scope
    if wanted is not None:
        linked = select(FeedbackIndex.feedback_id).where(col(FeedbackIndex.index_id).in_(wanted or [-1]))
        query = query.where(col(Feedback.id).in_(linked))
    if f.rating:
        query = query.where(Feedback.rating == f.rating)
    if f.since:
        query = query.where(col(Feedback.updated_at) >= f.since)
    if f.until:
        query = query.where(col(Feedback.updated_at) <= f.until)
    return query.order_by(col(Feedback.updated_at).desc(), col(Feedback.id).desc())


def _review_items(s: Session, rows: list[Feedback]) -> list[dict]:
    messages = {
        m.id: m for m in s.exec(select(Message).where(col(Message.id).in_([r.message_id for r in rows])))
    }
    users = {
        u.id: u.username for u in s.exec(select(User).where(col(User.id).in_({r.user_id for r in rows})))
    }
    links: dict[int, list[int]] = {}
    for link in s.exec(select(FeedbackIndex).where(col(FeedbackIndex.feedback_id).in_([r.id for r in rows]))):
        links.setdefault(link.feedback_id, []).append(link.index_id)
    items = []
    for row in rows:
        msg = messages.get(row.message_id)
        if msg is None:
            continue
        answer = msg.answer or {}
        question = answer.get("question")
        if question is None:
            asked = s.exec(
                select(Message.content)
                .where(Message.chat_id == msg.chat_id, Message.role == "user", col(Message.id) < msg.id)
                .order_by(col(Message.id).desc())
            ).first()
            question = asked or ""
        items.append(
            {
                **feedback_json(row),
                "user": users.get(row.user_id),
                "index_ids": sorted(links.get(row.id, [])),
                "question": question,
                "answer": answer.get("reply", msg.content),
                "route": msg.route,
                "model": answer.get("model"),
                "documents": [
                    {
                        k: d.get(k)
                        for k in (
                            "ref",
                            "filename",
                            "dataset",
                            "index",
                            "page",
                            "chunk_index",
                            "location",
                            "text",
                        )
                    }
                    for d in (answer.get("documents") or msg.documents or [])
                    if isinstance(d, dict)
                ],
                "citations": answer.get("citations", []),
                "steps": msg.steps,
                "answered_at": iso(msg.created_at),
            }
        )
    return items


async def review_list(request: Request) -> JSONResponse:
    user, c = await current_user(request), ctx(request)
    filters = Filters(request)

    def load() -> dict:
        with c.db.session() as s:
            rows = list(
                s.exec(_query(s, user, filters).offset(filters.offset).limit(filters.limit + 1)).all()
            )
            more = len(rows) > filters.limit
            return {"items": _review_items(s, rows[: filters.limit]), "more": more}

    return JSONResponse(await in_thread(load))


async def review_export(request: Request) -> StreamingResponse:
    user, c = await current_user(request), ctx(request)
    filters = Filters(request)

    def check() -> None:  # the access check before the first byte: a refusal is a plain 4xx
        with c.db.session() as s:
            _query(s, user, filters)

    await in_thread(check)

    def batches() -> Iterator[bytes]:
        offset = 0
        while True:
            with c.db.session() as s:
                rows = list(s.exec(_query(s, user, filters).offset(offset).limit(EXPORT_BATCH)).all())
                items = _review_items(s, rows)
            for item in items:
                yield (json.dumps(item, ensure_ascii=False) + "\n").encode()
            if len(rows) < EXPORT_BATCH:
                return
            offset += EXPORT_BATCH

    return StreamingResponse(
        batches(),
        media_type="application/x-ndjson",
        headers={"Content-Disposition": 'attachment; filename="feedback.jsonl"'},
    )


FEEDBACK = json_content(
    {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "message_id": {"type": "integer"},
            "rating": {"type": "string", "enum": ["up", "down"]},
            "reason": {"type": ["string", "null"]},
            "comment": {"type": ["string", "null"]},
        },
    }
)
MESSAGE = "/api/chats/{id:int}/messages/{message_id:int}/feedback"

routes = [
    ApiRoute(
        "PUT",
        MESSAGE,
        rate,
        Operation(
            "Rate an answer of your own chat (thumbs up or down, optional reason and comment); again to change it",
            FeedbackIn,
            FEEDBACK,
            errors=(400, 404, 409),
            tag="feedback",
        ),
    ),
    ApiRoute(
        "DELETE",
        MESSAGE,
        unrate,
        Operation("Withdraw your rating of an answer", status=204, errors=(404, 409), tag="feedback"),
    ),
    ApiRoute(
        "GET",
        "/api/chats/{id:int}/feedback",
        chat_feedback,
        Operation(
            "Your ratings of a chat's answers, by message id",
            answer=json_content({"type": "object"}),
            errors=(404,),
            tag="feedback",
        ),
    ),
    ApiRoute(
        "GET",
        "/api/feedback",
        review_list,
        Operation(
            "Rated answers for review (admins: all; index owners: their indexes); ?index_id, rating, since, until, "
            "limit, offset",
            answer=json_content({"type": "object"}),
            errors=(400, 404),
            tag="feedback",
        ),
    ),
    ApiRoute(
        "GET",
        "/api/feedback/export",
        review_export,
        Operation(
            "The review list as JSON lines (same filters), streamed",
            answer={"application/x-ndjson": {"schema": {"type": "string"}}},
            errors=(400, 404),
            tag="feedback",
        ),
    ),
]
