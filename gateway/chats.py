"""Chats: list, create, read (with messages and state), update, delete. Another user's chat is a 404."""

from __future__ import annotations

from sqlalchemy import bindparam
from sqlmodel import Session, col, delete, select
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from . import lifecycle
from .access import (
    beyond_ids,
    get_row,
    readable_documents,
    readable_subset,
    readable_worker_names,
    require_indexes,
)
from .answers import message_fields
from .context import ctx, current_user, in_thread, path_id, read_json
from .db import Chat, ChatIndex, Index, Message, User, iso, read_only, utcnow
from .errors import NotFound
from .responses import ChatFull, ChatSummary, MessageOut
from .routing import ApiRoute, Operation, each
from .schemas import ChatCreate, ChatUpdate


def owned_chat(s: Session, owner_id: int, chat_id: int) -> Chat:
    chat = get_row(s, Chat, chat_id)
    if chat is None or chat.owner_id != owner_id:
        raise NotFound(f"no chat {chat_id}", code="chat_not_found")
    return chat


# Built once: a turn's start reads both (gateway/lifecycle.py says why).
CHAT = select(Chat.__table__).where(col(Chat.id) == bindparam("b_chat"))
LINKED = (
    select(Index.__table__)
    .join(ChatIndex, col(ChatIndex.index_id) == col(Index.id))
    .where(col(ChatIndex.chat_id) == bindparam("b_chat"))
    .order_by(col(Index.id))
)


def read_chat(s: Session, owner_id: int, chat_id: int) -> Chat:
    """`owned_chat`, to read only (db.read_only): a turn's start reads the chat so."""
    row = None if beyond_ids(s, chat_id) else s.connection().execute(CHAT, {"b_chat": chat_id}).first()
    if row is None or row.owner_id != owner_id:
        raise NotFound(f"no chat {chat_id}", code="chat_not_found")
    return read_only(Chat, row)


def linked_indexes(s: Session, chat_id: int) -> list[Index]:
    """Every index linked to the chat, readable or not, to read only (db.read_only): callers pass it through
    `readable_subset`."""
    return [read_only(Index, row) for row in s.connection().execute(LINKED, {"b_chat": chat_id})]


def link_indexes(s: Session, chat: Chat, indexes: list[Index]) -> None:
    s.exec(delete(ChatIndex).where(col(ChatIndex.chat_id) == chat.id))
    for index in indexes:
        s.add(ChatIndex(chat_id=chat.id, index_id=index.id))


def message_json(m: Message) -> dict:
    return MessageOut(
        **{
            "id": m.id,
            "role": m.role,
            "content": m.content,
            "status": m.status,
            "error": m.error,
            "route": m.route,
            "gate": m.gate,
            "steps": m.steps,
            **message_fields(m),
            "created_at": iso(m.created_at),
        }
    ).data()


def _summary(chat: Chat, index_ids: list[int]) -> dict:
    return {
        "id": chat.id,
        "title": chat.title,
        "created_at": iso(chat.created_at),
        "updated_at": iso(chat.updated_at),
        "index_ids": index_ids,
        "datasets": chat.datasets,
    }


def chat_summary(chat: Chat, index_ids: list[int]) -> dict:
    return ChatSummary(**_summary(chat, index_ids)).data()


def _drawn_from(messages: list[Message]) -> set[str]:
    """The worker tables (`index`) the chat's answers took passages from."""
    names: set[str] = set()
    for m in messages:
        for d in [*((m.answer or {}).get("documents") or []), *(m.documents or [])]:
            if isinstance(d, dict) and d.get("index"):
                names.add(str(d["index"]))
    return names


def carried_history(s: Session, user: User, chat: Chat, messages: list[Message] | None = None) -> list:
    """The chat's history as it may be shown and sent on now. The worker keeps each turn's passages in it as a
    `system` message; when any index the chat's answers drew from is no longer readable, those messages go
    (the documents still readable are carried separately, and re-sent by the worker), so nothing of a revoked
    index reaches the worker or the page. The user's and assistant's messages stay as they were shown."""
    history = list(chat.history or [])
    if not any(isinstance(m, dict) and m.get("role") == "system" for m in history):
        return history
    if messages is None:
        messages = list(s.exec(select(Message).where(Message.chat_id == chat.id)))
    drawn = _drawn_from(messages) | {
        str(d["index"]) for d in chat.documents or [] if isinstance(d, dict) and d.get("index")
    }
    if drawn <= readable_worker_names(s, user, drawn):
        return history
    return [m for m in history if not (isinstance(m, dict) and m.get("role") == "system")]


def chat_full(s: Session, chat: Chat, user: User) -> dict:
    """The chat as its user may see it now: the linked indexes they can still read, and the carried documents
    without those of an index they can no longer read (past messages stay as they were shown)."""
    messages = s.exec(select(Message).where(Message.chat_id == chat.id).order_by(col(Message.id))).all()
    readable = readable_subset(s, user, linked_indexes(s, chat.id))
    documents = readable_documents(s, user, chat.documents)
    return ChatFull(
        **_summary(chat, [i.id for i in readable]),
        messages=[message_json(m) for m in messages],
        state={
            "history": carried_history(s, user, chat, list(messages)),
            "documents": documents,
            "datasets": chat.datasets,
        },
        busy=chat.turn_started_at is not None,
    ).data()


async def list_chats(request: Request) -> JSONResponse:
    user, c = await current_user(request), ctx(request)

    def load() -> list[dict]:
        with c.db.read() as s:
            chats = s.exec(
                select(Chat)
                .where(Chat.owner_id == user.id)
                .order_by(col(Chat.updated_at).desc(), col(Chat.id).desc())
            ).all()
            links: dict[int, list[int]] = {}
            if chats:
                rows = list(
                    s.exec(
                        select(ChatIndex)
                        .where(col(ChatIndex.chat_id).in_([ch.id for ch in chats]))
                        .order_by(col(ChatIndex.index_id))
                    )
                )
                linked = s.exec(select(Index).where(col(Index.id).in_({r.index_id for r in rows} or {0})))
                readable = {i.id for i in readable_subset(s, user, linked)}
                for row in rows:
                    if row.index_id in readable:
                        links.setdefault(row.chat_id, []).append(row.index_id)
            return [chat_summary(ch, links.get(ch.id, [])) for ch in chats]

    return JSONResponse(await in_thread(load))


async def create_chat(request: Request) -> JSONResponse:
    user, c = await current_user(request), ctx(request)
    body = await read_json(request, ChatCreate)

    def create() -> dict:
        with c.db.session() as s:
            indexes = require_indexes(s, user, body.index_ids)
            title = body.title.strip() if body.title and body.title.strip() else None
            chat = Chat(owner_id=user.id, title=title, datasets=body.datasets)
            s.add(chat)
            s.flush()
            link_indexes(s, chat, indexes)
            s.commit()
            return chat_full(s, chat, user)

    return JSONResponse(await in_thread(create), status_code=201)


async def get_chat(request: Request) -> JSONResponse:
    user, c, chat_id = await current_user(request), ctx(request), path_id(request)

    def load() -> dict:
        with c.db.read() as s:
            chat = owned_chat(s, user.id, chat_id)
            if lifecycle.is_stale(chat, c.settings.turn_lock_stale_s):
                # Its turn was left by a gateway that died: show it interrupted, and the chat free.
                s.rollback()
                lifecycle.recover_chat(s, chat_id, c.settings.turn_lock_stale_s)
                chat = owned_chat(s, user.id, chat_id)
            return chat_full(s, chat, user)

    return JSONResponse(await in_thread(load))


async def update_chat(request: Request) -> JSONResponse:
    user, c, chat_id = await current_user(request), ctx(request), path_id(request)
    body = await read_json(request, ChatUpdate)

    def update() -> dict:
        with c.db.session() as s:
            chat = owned_chat(s, user.id, chat_id)
            fields = body.model_fields_set
            if "title" in fields:
                chat.title = body.title.strip() if body.title and body.title.strip() else None
            if "datasets" in fields:
                chat.datasets = body.datasets or []
            if "index_ids" in fields:
                link_indexes(s, chat, require_indexes(s, user, body.index_ids or []))
            chat.updated_at = utcnow()
            s.add(chat)
            s.commit()
            return chat_full(s, chat, user)

    return JSONResponse(await in_thread(update))


async def delete_chat(request: Request) -> Response:
    user, c, chat_id = await current_user(request), ctx(request), path_id(request)

    def remove() -> None:
        with c.db.session() as s:
            chat = owned_chat(s, user.id, chat_id)
            from .feedback import delete_chat_feedback  # feedback imports this module

            delete_chat_feedback(s, chat.id)
            s.exec(delete(Message).where(col(Message.chat_id) == chat.id))
            s.exec(delete(ChatIndex).where(col(ChatIndex.chat_id) == chat.id))
            s.delete(chat)
            s.commit()

    await in_thread(remove)
    return Response(status_code=204)


# What a new chat's id opens (OpenAPI links: operationIds).
CHAT_OPS = [
    "get_api_chats_id",
    "patch_api_chats_id",
    "post_api_chats_id_messages",
    "post_api_chats_id_messages_stream",
    "post_api_chats_id_stop",
    "get_api_chats_id_stream",
    "delete_api_chats_id",
]

routes = [
    ApiRoute(
        "GET",
        "/api/chats",
        list_chats,
        Operation("The user's chats, newest first", answer=[ChatSummary], tag="chats"),
    ),
    ApiRoute(
        "POST",
        "/api/chats",
        create_chat,
        Operation(
            "A new chat, optionally linked to indexes",
            ChatCreate,
            ChatFull,
            status=201,
            errors=(404,),
            tag="chats",
            links=each(CHAT_OPS, {"id": "$response.body#/id"}),
        ),
    ),
    ApiRoute(
        "GET",
        "/api/chats/{id:int}",
        get_chat,
        Operation("A chat with its messages and state", answer=ChatFull, errors=(404,)),
    ),
    ApiRoute(
        "PATCH",
        "/api/chats/{id:int}",
        update_chat,
        Operation("Rename, relink or rescope a chat", ChatUpdate, ChatFull, errors=(404,), tag="chats"),
    ),
    ApiRoute(
        "DELETE",
        "/api/chats/{id:int}",
        delete_chat,
        Operation("Delete a chat", status=204, errors=(404,), tag="chats"),
    ),
]
