"""Chat turns: gate, call the worker's /chat_stream, relay its events as they arrive, persist the finished turn.

The worker is read by a background task that feeds a queue; the browser's response drains that queue. So a
browser that goes away stops only the draining: the turn is still read to its end and stored (ARCHITECTURE.md,
principle 2). One turn per chat at a time: the chat row carries a lock (`turn_started_at`), which holds across
gateway replicas because it lives in the shared database.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlmodel import col, select, update
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .chats import linked_indexes, message_json, owned_chat
from .context import Context, ctx, current_user, in_thread, path_id, read_json
from .db import Chat, Message, SettingRow, User, utcnow
from .errors import ApiError, BadRequest, Conflict
from .gate import should_use_rag
from .quotas import check_options
from .schemas import TurnRequest
from .sse import KEEPALIVE, SSE_HEADERS, Frame, frame

log = logging.getLogger("gateway.turns")

TURN_OPTIONS_KEY = "turn_options"
TITLE_WORDS = 6


@dataclass
class TurnPlan:
    """Everything a turn needs, read from the database once, before the worker is called."""

    chat_id: int
    message: str
    route: str
    reason: str
    datasets: list[str]
    datasets_changed: bool
    needs_title: bool
    payload: dict


@dataclass
class TurnRecord:
    """What the worker has said so far in this turn."""

    steps: list[dict] = field(default_factory=list)
    documents: list[dict] | None = None
    tokens: list[str] = field(default_factory=list)
    done: dict | None = None
    error: dict | None = None
    status: str = "running"  # complete | interrupted | failed
    message_id: int | None = None
    user_message_id: int | None = None
    error_status: int = 502

    def see(self, f: Frame) -> None:
        data = f.data if isinstance(f.data, dict) else {}
        if f.event == "step":
            self.steps.append(data)
        elif f.event == "documents":
            self.documents = data.get("documents") or []
        elif f.event == "token":
            self.tokens.append(str(data.get("token", "")))
        elif f.event == "done":
            self.done = data
        elif f.event == "error":
            self.error = {
                "error": str(data.get("error") or "the worker failed"),
                "code": str(data.get("code") or "worker_error"),
            }
            self.error_status = 503 if "unavailable" in self.error["code"] else 502

    @property
    def partial_reply(self) -> str:
        return "".join(self.tokens)


def trim_history(history: list, max_messages: int, max_chars: int) -> list:
    """The most recent messages that fit the worker's limits; the oldest go first."""
    kept = list(history)[-max_messages:] if max_messages > 0 else []

    def size(msg: Any) -> int:
        return len(str(msg.get("content", ""))) if isinstance(msg, dict) else len(str(msg))

    total = sum(size(m) for m in kept)
    while kept and total > max_chars:
        total -= size(kept.pop(0))
    return kept


def default_options(s) -> dict:
    row = s.get(SettingRow, TURN_OPTIONS_KEY)
    return dict(row.value) if row else {}


def plan_turn(c: Context, user: User, chat_id: int, body: TurnRequest) -> TurnPlan:
    """Load the chat, run the gate, build the worker request, and take the chat's turn lock (409 if held)."""
    settings = c.settings
    if len(body.message) > settings.max_message_chars:
        raise BadRequest(
            f"the message is longer than {settings.max_message_chars} characters",
            code="too_long",
            field="message",
        )
    with c.db.session() as s:
        chat = owned_chat(s, user.id, chat_id)
        indexes = linked_indexes(s, chat.id)
        if body.force_rag and not indexes:
            raise BadRequest(
                "force_rag needs an index linked to this chat", code="no_index", field="force_rag"
            )
        route, reason = should_use_rag(body.message, force_rag=body.force_rag, has_indexes=bool(indexes))
        options = default_options(s)
        if body.options is not None:
            options.update(body.options.as_options())
        options["route"] = "rag" if body.force_rag else ("direct" if route == "direct" else "auto")
        datasets = body.datasets if body.datasets is not None else list(chat.datasets)
        payload: dict[str, Any] = {
            "prompt": body.message,
            "history": trim_history(chat.history, settings.max_history_messages, settings.max_history_chars),
            "docs": list(chat.documents),
            "datasets": datasets,
            "options": options,
        }
        if indexes:
            payload["index"] = [i.worker_name for i in indexes]
        stale = utcnow() - timedelta(seconds=settings.turn_lock_stale_s)
        taken = s.exec(
            update(Chat)
            .where(col(Chat.id) == chat.id)
            .where((col(Chat.turn_started_at).is_(None)) | (col(Chat.turn_started_at) < stale))
            .values(turn_started_at=utcnow())
        )
        if taken.rowcount != 1:
            s.rollback()
            raise Conflict(
                "a reply is still being written in this chat: wait for it to finish", code="turn_in_progress"
            )
        s.commit()
        return TurnPlan(
            chat_id=chat.id,
            message=body.message,
            route=route,
            reason=reason,
            datasets=datasets,
            datasets_changed=body.datasets is not None,
            needs_title=chat.title is None,
            payload=payload,
        )


# What of the worker's `done` the message keeps besides its text; `grounding` (issue 16): the per-sentence check
# the web marks the answer with. `reply` is already the worker's corrected final text (fixed citations, quotes).
DONE_DETAILS = ("model", "abstained", "fetched_new_documents", "grounding")


def save_complete(c: Context, plan: TurnPlan, rec: TurnRecord) -> None:
    """Both messages and the new chat state, in one transaction. The turn lock is released here, or, for a
    chat still to be named, once the title is stored (so a reload after the turn always shows it)."""
    done = rec.done or {}
    gate = {"layer": 1, "route": plan.route, "reason": plan.reason}
    with c.db.session() as s:
        chat = s.get(Chat, plan.chat_id)
        if chat is None:  # deleted while the turn ran: nothing left to store into
            return
        user_msg = Message(
            chat_id=chat.id, role="user", content=plan.message, route=plan.route, gate=gate, status="complete"
        )
        documents = done.get("documents")
        if documents is None:
            documents = rec.documents or []
        reply = done.get("reply")
        assistant = Message(
            chat_id=chat.id,
            role="assistant",
            content=reply if isinstance(reply, str) else rec.partial_reply,
            documents=documents,
            citations=done.get("citations") or [],
            rewritten=done.get("rewritten"),
            steps=rec.steps,
            timings=done.get("timings") or {},
            route=done.get("route") or plan.route,
            gate=gate,
            status="complete",
            details={k: done.get(k) for k in DONE_DETAILS if k in done},
        )
        s.add(user_msg)
        s.add(assistant)
        chat.history = done.get("history") if isinstance(done.get("history"), list) else chat.history
        chat.documents = documents
        if plan.datasets_changed:
            chat.datasets = plan.datasets
        chat.updated_at = utcnow()
        if not plan.needs_title:
            chat.turn_started_at = None
        s.add(chat)
        s.commit()
        rec.user_message_id, rec.message_id = user_msg.id, assistant.id


def save_failed(c: Context, plan: TurnPlan, rec: TurnRecord) -> None:
    """The user message with the error (and any partial answer); the chat state stays as it was."""
    error = (rec.error or {}).get("error")
    gate = {"layer": 1, "route": plan.route, "reason": plan.reason}
    with c.db.session() as s:
        chat = s.get(Chat, plan.chat_id)
        if chat is None:
            return
        user_msg = Message(
            chat_id=chat.id,
            role="user",
            content=plan.message,
            route=plan.route,
            gate=gate,
            status=rec.status,
            error=error,
        )
        s.add(user_msg)
        partial = None
        if rec.tokens:
            partial = Message(
                chat_id=chat.id,
                role="assistant",
                content=rec.partial_reply,
                documents=rec.documents or [],
                steps=rec.steps,
                route=plan.route,
                gate=gate,
                status=rec.status,
                error=error,
            )
            s.add(partial)
        chat.updated_at = utcnow()
        chat.turn_started_at = None
        s.add(chat)
        s.commit()
        rec.user_message_id = user_msg.id
        rec.message_id = partial.id if partial is not None else None


def release_lock(c: Context, chat_id: int) -> None:
    with c.db.session() as s:
        s.exec(update(Chat).where(col(Chat.id) == chat_id).values(turn_started_at=None))
        s.commit()


def fallback_title(message: str) -> str:
    words = message.split()
    title = " ".join(words[:TITLE_WORDS])
    return (title[:80] + "…") if len(title) > 80 else title + ("…" if len(words) > TITLE_WORDS else "")


def store_title(c: Context, chat_id: int, title: str) -> None:
    """Name the chat and end its turn. Only if still untitled: a title the user set meanwhile wins."""
    with c.db.session() as s:
        s.exec(update(Chat).where(col(Chat.id) == chat_id, col(Chat.title).is_(None)).values(title=title))
        s.exec(update(Chat).where(col(Chat.id) == chat_id).values(turn_started_at=None))
        s.commit()


async def name_chat(c: Context, plan: TurnPlan) -> str:
    try:
        title = await c.worker.create_title(plan.message)
    except ApiError as exc:
        log.info("create_title failed (%s); using the first words", exc.message)
        title = ""
    title = " ".join(title.split())[:200] or fallback_title(plan.message)
    await in_thread(store_title, c, plan.chat_id, title)
    return title


async def run_turn(c: Context, plan: TurnPlan, out: asyncio.Queue) -> TurnRecord:
    """Read the worker's stream to its end, relaying frames into `out`, and persist the outcome."""
    rec = TurnRecord()
    started = time.monotonic()
    out.put_nowait(frame("route", {"layer": 1, "route": plan.route, "reason": plan.reason}))
    held = None  # the terminal `error` frame, relayed after the failure is stored
    try:
        async with c.worker.events("/chat_stream", plan.payload) as frames:
            async for f in frames:
                rec.see(f)
                if f.event == "error":
                    held = f.raw
                    break
                out.put_nowait(f.raw)
                if f.event == "done":
                    break
    except ApiError as exc:
        rec.error = {"error": exc.message, "code": exc.code}
        rec.error_status = exc.status if exc.status >= 500 else 502
    except asyncio.CancelledError:
        # The gateway is shutting down mid-turn: record what there is, then let the cancellation through.
        rec.status = "interrupted"
        rec.error = {"error": "the gateway stopped before the answer was complete", "code": "interrupted"}
        await _store_failure(c, plan, rec)
        raise
    except Exception as exc:  # a bug or an unexpected transport failure: still store, still tell the browser
        log.exception("turn in chat %s failed", plan.chat_id)
        rec.error = {"error": f"the turn failed: {type(exc).__name__}", "code": "gateway_error"}

    if rec.done is not None:
        try:
            await in_thread(save_complete, c, plan, rec)
            rec.status = "complete"
            out.put_nowait(
                frame("saved", {"message_id": rec.message_id, "user_message_id": rec.user_message_id})
            )
            if plan.needs_title:
                try:
                    out.put_nowait(frame("title", {"title": await name_chat(c, plan)}))
                except BaseException:
                    await asyncio.shield(in_thread(release_lock, c, plan.chat_id))
                    raise
        except Exception:
            log.exception("storing the turn in chat %s failed", plan.chat_id)
            await in_thread(release_lock, c, plan.chat_id)
            out.put_nowait(frame("error", {"error": "the answer could not be saved", "code": "save_failed"}))
    else:
        if rec.error is None:
            rec.status = "interrupted"
            rec.error = {
                "error": "the worker's stream ended before the answer was complete",
                "code": "interrupted",
            }
        else:
            rec.status = "failed"
        await _store_failure(c, plan, rec)
        out.put_nowait(held or frame("error", rec.error))
    log.info(
        "turn chat=%s route=%s status=%s in %.0f ms",
        plan.chat_id,
        plan.route,
        rec.status,
        (time.monotonic() - started) * 1000,
    )
    out.put_nowait(None)
    return rec


async def _store_failure(c: Context, plan: TurnPlan, rec: TurnRecord) -> None:
    try:
        await in_thread(save_failed, c, plan, rec)
    except Exception:
        log.exception("storing the failed turn in chat %s failed", plan.chat_id)
        await in_thread(release_lock, c, plan.chat_id)


async def start_turn(request: Request) -> tuple[Context, TurnPlan, asyncio.Queue, asyncio.Task]:
    user, c, chat_id = await current_user(request), ctx(request), path_id(request)
    body = await read_json(request, TurnRequest)
    check_options(body.options, c.settings)
    slot = c.turn_slots.take(user.id)  # MAX_TURNS_PER_USER: a 429 when the account has that many running
    try:
        plan = await in_thread(plan_turn, c, user, chat_id, body)
    except BaseException:
        slot.release()
        raise
    out: asyncio.Queue = asyncio.Queue()
    task = asyncio.create_task(run_turn(c, plan, out), name=f"turn-chat-{chat_id}")
    c.running.add(task)
    task.add_done_callback(c.running.discard)
    task.add_done_callback(slot.release)
    return c, plan, out, task


async def drain(out: asyncio.Queue, keepalive_s: float) -> AsyncIterator[str]:
    """The browser's side: frames as they are queued, keepalives while none come. Cancelled on disconnect,
    which leaves the reading task untouched."""
    while True:
        try:
            item = await asyncio.wait_for(out.get(), timeout=keepalive_s)
        except TimeoutError:
            yield KEEPALIVE
            continue
        if item is None:
            return
        yield item


async def post_message_stream(request: Request) -> Response:
    c, _plan, out, _task = await start_turn(request)
    return StreamingResponse(
        drain(out, c.settings.keepalive_s), media_type="text/event-stream", headers=SSE_HEADERS
    )


async def post_message(request: Request) -> JSONResponse:
    c, plan, _out, task = await start_turn(request)
    rec = await asyncio.shield(task)

    def load() -> dict:
        with c.db.session() as s:
            ids = [i for i in (rec.user_message_id, rec.message_id) if i is not None]
            msgs = {m.id: m for m in s.exec(select(Message).where(col(Message.id).in_(ids)))} if ids else {}
            chat = s.get(Chat, plan.chat_id)
            return {
                "route": {"layer": 1, "route": plan.route, "reason": plan.reason},
                "status": rec.status,
                "user_message": message_json(msgs[rec.user_message_id])
                if rec.user_message_id in msgs
                else None,
                "message": message_json(msgs[rec.message_id]) if rec.message_id in msgs else None,
                "title": chat.title if chat else None,
            }

    result = await in_thread(load)
    if rec.status == "complete":
        return JSONResponse(result)
    result.update(rec.error or {})
    return JSONResponse(result, status_code=rec.error_status)


routes = [
    Route("/api/chats/{id:int}/messages", post_message, methods=["POST"]),
    Route("/api/chats/{id:int}/messages/stream", post_message_stream, methods=["POST"]),
]
