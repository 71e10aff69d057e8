"""Chats taken along: one chat as Markdown or JSON, an account's whole history as JSON lines.

- `GET /api/chats/{id}/export?format=markdown`: each turn's question and answer, and under it every citation
  resolved to its file, its place (page, sheet rows, slide, section) and the quoted passage;
- `?format=json`: the chat and its typed messages, as `GET /api/chats/{id}` gives them;
- `GET /api/account/export`: one JSON object per line (`account`, then each `chat` followed by its `message`s),
  streamed chat by chat, never the whole history in memory.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime

from sqlmodel import Session, col, select
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from .chats import message_json, owned_chat
from .context import ctx, current_user, in_thread, path_id
from .db import Chat, ChatIndex, Index, Message, iso
from .errors import BadRequest
from .indexes.names import content_disposition
from .routing import ApiRoute, Operation, json_content
from .sources import readable_index

MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]<>#|])")
CHAT_BATCH = 50


def escape(text: str) -> str:
    """Text that Markdown shows as it is (no emphasis, links, HTML or headings of its own)."""
    return MARKDOWN_SPECIAL.sub(r"\\\1", text)


def place(doc: dict) -> str:
    location = doc.get("location") if isinstance(doc.get("location"), dict) else {}
    if location.get("label"):
        return str(location["label"])
    return f"p. {doc['page']}" if isinstance(doc.get("page"), int) else ""


def quote(text: str) -> str:
    lines = [ln.rstrip() for ln in (text or "").strip().splitlines()] or [""]
    return "\n".join(f"  > {ln}" if ln else "  >" for ln in lines)


def _index_names(s: Session, user_id: int, messages: list[Message]) -> dict[str, str]:
    names = {
        str(d.get("index"))
        for m in messages
        for d in ((m.answer or {}).get("documents") or [])
        if isinstance(d, dict) and d.get("index")
    }
    if not names:
        return {}
    rows = s.exec(select(Index).where(col(Index.worker_name).in_(names))).all()
    return {i.worker_name: i.name for i in rows if readable_index(s, user_id, i) is not None}


def chat_markdown(chat: Chat, messages: list[Message], index_names: dict[str, str]) -> str:
    title = chat.title or "Untitled chat"
    out = [
        f"# {escape(title)}",
        "",
        f"Exported {datetime.now(UTC).isoformat(timespec='seconds')} from RAG Chat.",
        "",
    ]
    question = None
    turn = 0
    for msg in messages:
        if msg.role == "user":
            question = msg.content
            continue
        if msg.role != "assistant":
            continue
        turn += 1
        answer = msg.answer or {}
        out += [f"## {turn}. {escape(' '.join((question or answer.get('question') or '').split()))}", ""]
        reply = answer.get("reply", msg.content) or ""
        out += [reply.strip() or "_(no answer)_", ""]
        if msg.status != "complete":
            out += [f"_This answer did not finish ({msg.status})._", ""]
        documents = {d.get("ref"): d for d in answer.get("documents") or [] if isinstance(d, dict)}
        cited = [c.get("ref") for c in answer.get("citations") or [] if isinstance(c, dict)]
        sources = [documents[r] for r in dict.fromkeys(cited) if r in documents]
        if sources:
            out += ["**Sources**", ""]
            for doc in sources:
                if doc.get("kind") == "table":
                    out += [f"- [{doc['ref']}] computed table: `{doc.get('query') or ''}`", ""]
                    continue
                where = " · ".join(
                    p
                    for p in (
                        place(doc),
                        f"index {escape(index_names[doc['index']])}"
                        if doc.get("index") in index_names
                        else "",
                        f"dataset {escape(str(doc.get('dataset')))}" if doc.get("dataset") else "",
                    )
                    if p
                )
                out += [
                    f"- [{doc['ref']}] {escape(str(doc.get('filename') or ''))} — {where}",
                    quote(doc.get("text") or ""),
                    "",
                ]
        question = None
    return "\n".join(out).rstrip() + "\n"


def _chat_json(s: Session, chat: Chat) -> dict:
    index_ids = list(s.exec(select(ChatIndex.index_id).where(ChatIndex.chat_id == chat.id)).all())
    return {
        "id": chat.id,
        "title": chat.title,
        "created_at": iso(chat.created_at),
        "updated_at": iso(chat.updated_at),
        "index_ids": index_ids,
        "datasets": chat.datasets,
    }


def _messages(s: Session, chat_id: int) -> list[Message]:
    return list(s.exec(select(Message).where(Message.chat_id == chat_id).order_by(col(Message.id))).all())


def _filename(chat: Chat, suffix: str) -> str:
    stem = re.sub(r"[^\w\- ]+", "", chat.title or "")[:60].strip() or f"chat-{chat.id}"
    return f"{stem}.{suffix}"


async def export_chat(request: Request) -> Response:
    user, c, chat_id = await current_user(request), ctx(request), path_id(request)
    fmt = request.query_params.get("format", "markdown")
    if fmt not in ("markdown", "json"):
        raise BadRequest("format must be markdown or json", code="bad_query", field="format")

    def build() -> tuple[str, str, str]:
        with c.db.session() as s:
            chat = owned_chat(s, user.id, chat_id)
            messages = _messages(s, chat.id)
            if fmt == "json":
                data = {"chat": _chat_json(s, chat), "messages": [message_json(m) for m in messages]}
                return (
                    json.dumps(data, ensure_ascii=False, indent=2),
                    "application/json",
                    _filename(chat, "json"),
                )
            text = chat_markdown(chat, messages, _index_names(s, user.id, messages))
            return text, "text/markdown; charset=utf-8", _filename(chat, "md")

    body, media, name = await in_thread(build)
    return Response(body, media_type=media, headers={"Content-Disposition": content_disposition(name)})


async def export_account(request: Request) -> StreamingResponse:
    user, c = await current_user(request), ctx(request)

    def lines() -> Iterator[bytes]:
        head = {"type": "account", "username": user.username, "exported_at": datetime.now(UTC).isoformat()}
        yield (json.dumps(head, ensure_ascii=False) + "\n").encode()
        after = 0
        while True:
            with c.db.session() as s:
                chats = list(
                    s.exec(
                        select(Chat)
                        .where(Chat.owner_id == user.id, col(Chat.id) > after)
                        .order_by(col(Chat.id))
                        .limit(CHAT_BATCH)
                    ).all()
                )
            if not chats:
                return
            for chat in chats:
                with c.db.session() as s:  # one chat's messages at a time
                    head = {"type": "chat", **_chat_json(s, chat)}
                    rows = [message_json(m) for m in _messages(s, chat.id)]
                yield (json.dumps(head, ensure_ascii=False) + "\n").encode()
                for row in rows:
                    yield (
                        json.dumps({"type": "message", "chat_id": chat.id, **row}, ensure_ascii=False) + "\n"
                    ).encode()
            after = chats[-1].id

    return StreamingResponse(
        lines(),
        media_type="application/x-ndjson",
        headers={"Content-Disposition": content_disposition(f"{user.username}-history.jsonl")},
    )


routes = [
    ApiRoute(
        "GET",
        "/api/chats/{id:int}/export",
        export_chat,
        Operation(
            "A chat as Markdown (?format=markdown: questions, answers, citations with file, place and passage) or "
            "JSON (?format=json: the chat and its typed messages), as a download",
            answer={
                "text/markdown": {"schema": {"type": "string"}},
                **json_content({"type": "object"}),
            },
            errors=(400, 404),
            tag="chats",
        ),
    ),
    ApiRoute(
        "GET",
        "/api/account/export",
        export_account,
        Operation(
            "The account's whole history as JSON lines (account, then each chat and its messages), streamed",
            answer={"application/x-ndjson": {"schema": {"type": "string"}}},
            tag="accounts",
        ),
    ),
]
