"""Chat turns: gate, call the worker's /chat_stream, relay its events as they arrive, persist the finished turn.

The worker is read by a background task that feeds a queue; the browser's response drains that queue. So a
browser that goes away stops only the draining: the turn is still read to its end and stored (ARCHITECTURE.md,
principle 2). One turn per chat at a time: the chat row carries a lock (`turn_started_at`), which holds across
gateway replicas because it lives in the shared database.

The turn is written ahead (gateway/lifecycle.py): both messages are stored before the worker is called, the
answer so far is saved while it streams, and a heartbeat tells other replicas the turn is alive. A stop (from any
replica) closes the worker stream, which closes the worker's generator and the model call. Anyone may rejoin a
running turn (`GET /api/chats/{id}/stream`): from the owner's memory, or from another replica's database saves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from sqlmodel import Session, col, delete, select, update
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from contract.answer import Answer

from . import answers, lifecycle
from .chats import linked_indexes, message_json, owned_chat
from .context import Context, ctx, current_user, in_thread, path_id, read_json
from .db import Chat, Index, IndexDocument, Message, SettingRow, User, utcnow
from .errors import ApiError, BadRequest, Conflict
from .gate import should_use_rag
from .quotas import check_options
from .responses import StopResult, TurnResult
from .schemas import StopRequest, TurnRequest
from .sse import KEEPALIVE, SSE_HEADERS, Frame, frame
from .worker_answer import read_answer

log = logging.getLogger("gateway.turns")

TURN_OPTIONS_KEY = "turn_options"
TITLE_WORDS = 6
REJOIN_POLL_S = 0.25  # how often a replica that does not own a turn reads its saves for a rejoined stream
STOP_WAIT_S = 30.0  # how long POST /stop waits for the owner to store the stopped turn


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
    message_id: int = 0
    user_message_id: int = 0
    gate: dict = field(default_factory=dict)


@dataclass
class TurnRecord:
    """What the worker has said so far in this turn."""

    steps: list[dict] = field(default_factory=list)
    documents: list[dict] | None = None
    tokens: list[str] = field(default_factory=list)
    done: Answer | None = None
    error: dict | None = None
    status: str = "running"  # complete | interrupted | failed
    message_id: int | None = None
    user_message_id: int | None = None
    error_status: int = 502
    stopped: bool = False
    documents_changed: bool = False

    def see(self, f: Frame) -> None:
        data = f.data if isinstance(f.data, dict) else {}
        if f.event == "step":
            self.steps.append(data)
        elif f.event == "documents":
            self.documents = data.get("documents") or []
            self.documents_changed = True
        elif f.event == "token":
            self.tokens.append(str(data.get("token", "")))
        elif f.event == "done":
            self.done, problem = read_answer(data)
            if problem:
                self.error = {"error": problem, "code": "worker_contract"}
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


class TurnHandle:
    """A turn this replica is reading from the worker: its record, its listeners and its stop switch."""

    def __init__(self, plan: TurnPlan):
        self.plan = plan
        self.rec = TurnRecord(message_id=plan.message_id, user_message_id=plan.user_message_id)
        self.listeners: list[asyncio.Queue] = []
        self.stop = asyncio.Event()
        self.wake = asyncio.Event()  # enough unsaved tokens: save now rather than at the next heartbeat
        self.finishing = False  # the final save is next: the periodic saves end
        self.task: asyncio.Task | None = None
        self.saved_tokens = 0
        self.saved_steps = 0

    def listen(self) -> asyncio.Queue:
        q: asyncio.Queue = asyncio.Queue()
        self.listeners.append(q)
        return q

    def emit(self, item: str | None) -> None:
        for q in list(self.listeners):
            q.put_nowait(item)

    def snapshot(self) -> dict:
        rec = self.rec
        return {
            "message_id": self.plan.message_id,
            "user_message_id": self.plan.user_message_id,
            "question": self.plan.message,
            "route": self.plan.gate,
            "status": "running",
            "steps": rec.steps,
            "documents": rec.documents,
            "answer": rec.partial_reply,
            "done": rec.done.model_dump() if rec.done is not None else None,
        }


def sendable_documents(s: Session, chat: Chat, indexes: list[Index]) -> list[dict]:
    """The chat's documents that still exist in an index it is linked to: an unlinked or deleted index, or a
    deleted file, must never be asked about (the worker would refuse the whole turn)."""
    if not indexes:
        return []
    by_id = {i.id: i.worker_name for i in indexes}
    files = {
        (by_id[row.index_id], row.dataset, row.filename)
        for row in s.exec(select(IndexDocument).where(col(IndexDocument.index_id).in_(list(by_id))))
    }
    kept = []
    for doc in chat.documents:
        if isinstance(doc, dict) and (doc.get("index"), doc.get("dataset"), doc.get("filename")) in files:
            kept.append(doc)
    return kept


def plan_turn(c: Context, user: User, chat_id: int, body: TurnRequest) -> TurnPlan:
    """Load the chat, run the gate, build the worker request, take the chat's turn lock (409 if held by a
    live turn) and store both messages of the turn, the answer as `running`: nothing is lost from here on."""
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
            # Well-formed, but this chat has no index to search: a conflict with its state (link one first).
            raise Conflict("force_rag needs an index linked to this chat", code="no_index", field="force_rag")
        route, reason = should_use_rag(body.message, force_rag=body.force_rag, has_indexes=bool(indexes))
        options = default_options(s)
        if body.options is not None:
            options.update(body.options.as_options())
        options["route"] = "rag" if body.force_rag else ("direct" if route == "direct" else "auto")
        datasets = body.datasets if body.datasets is not None else list(chat.datasets)
        payload: dict[str, Any] = {
            "prompt": body.message,
            "history": trim_history(chat.history, settings.max_history_messages, settings.max_history_chars),
            "docs": sendable_documents(s, chat, indexes),
            "datasets": datasets,
            "options": options,
        }
        if indexes:
            payload["index"] = [i.worker_name for i in indexes]
        now = utcnow()
        taken = s.exec(
            update(Chat)
            .where(col(Chat.id) == chat.id)
            .where(lifecycle.stale_condition(settings.turn_lock_stale_s))
            .values(
                turn_started_at=now,
                turn_owner=c.replica,
                turn_heartbeat_at=now,
                turn_stop_at=None,
                turn_message_id=None,
            )
        )
        if taken.rowcount != 1:
            s.rollback()
            raise Conflict(
                "a reply is still being written in this chat: wait for it to finish, or stop it",
                code="turn_in_progress",
            )
        # A turn whose owner died without a trace of it in the lock (taken over just now) is interrupted.
        lifecycle.interrupt_running(s, chat.id)
        gate = {"layer": 1, "route": route, "reason": reason}
        user_msg = Message(
            chat_id=chat.id, role="user", content=body.message, route=route, gate=gate, status="running"
        )
        answer = Message(
            chat_id=chat.id, role="assistant", content="", route=route, gate=gate, status="running"
        )
        s.add(user_msg)
        s.add(answer)
        s.flush()
        s.exec(update(Chat).where(col(Chat.id) == chat.id).values(turn_message_id=answer.id, updated_at=now))
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
            message_id=answer.id,
            user_message_id=user_msg.id,
            gate=gate,
        )


def _release(s: Session, plan: TurnPlan) -> None:
    """Free the chat, if this turn still holds it (a replica that took it over as stale keeps it)."""
    s.exec(
        update(Chat)
        .where(col(Chat.id) == plan.chat_id, col(Chat.turn_message_id) == plan.message_id)
        .values(**lifecycle.clear_lock_values())
    )


def save_complete(c: Context, plan: TurnPlan, rec: TurnRecord) -> None:
    """Both messages and the new chat state, in one transaction. The turn lock is released here, or, for a
    chat still to be named, once the title is stored (so a reload after the turn always shows it)."""
    done = rec.done
    with c.db.session() as s:
        chat = s.get(Chat, plan.chat_id)
        user_msg, assistant = s.get(Message, plan.user_message_id), s.get(Message, plan.message_id)
        if chat is None or user_msg is None or assistant is None:  # deleted while the turn ran
            return
        user_msg.status = "complete"
        answer = answers.store(assistant, done, rec.steps)
        s.add(user_msg)
        s.add(assistant)
        if chat.turn_message_id == plan.message_id:
            answers.carry_state(chat, answer)
            if plan.datasets_changed:
                chat.datasets = plan.datasets
            chat.updated_at = utcnow()
            s.add(chat)
        s.flush()
        if not plan.needs_title:
            _release(s, plan)
        s.commit()
        rec.user_message_id, rec.message_id = plan.user_message_id, plan.message_id


def save_failed(c: Context, plan: TurnPlan, rec: TurnRecord) -> None:
    """The user message with the error (and any partial answer); the chat state stays as it was."""
    error = (rec.error or {}).get("error")
    with c.db.session() as s:
        chat = s.get(Chat, plan.chat_id)
        user_msg, assistant = s.get(Message, plan.user_message_id), s.get(Message, plan.message_id)
        if chat is None or user_msg is None:
            return
        user_msg.status, user_msg.error = rec.status, error
        s.add(user_msg)
        kept = dropped = None
        if assistant is not None:
            if rec.tokens or rec.status == "interrupted":
                assistant.content = rec.partial_reply
                assistant.documents = rec.documents or []
                assistant.steps = rec.steps
                assistant.status, assistant.error = rec.status, error
                if rec.stopped:
                    assistant.details = {"stopped": True}
                s.add(assistant)
                kept = assistant.id
            else:  # nothing was answered: the user message carries the error alone
                dropped = assistant.id
        if chat.turn_message_id == plan.message_id:
            chat.updated_at = utcnow()
            s.add(chat)
        s.flush()  # the chat row before the messages, as every write of a running turn takes them
        if dropped is not None:
            s.exec(delete(Message).where(col(Message.id) == dropped))
        _release(s, plan)
        s.commit()
        rec.user_message_id, rec.message_id = user_msg.id, kept


def release_lock(c: Context, plan: TurnPlan) -> None:
    with c.db.session() as s:
        _release(s, plan)
        s.commit()


def fallback_title(message: str) -> str:
    words = message.split()
    title = " ".join(words[:TITLE_WORDS])
    return (title[:80] + "…") if len(title) > 80 else title + ("…" if len(words) > TITLE_WORDS else "")


def store_title(c: Context, plan: TurnPlan, title: str) -> None:
    """Name the chat and end its turn. Only if still untitled: a title the user set meanwhile wins."""
    with c.db.session() as s:
        s.exec(
            update(Chat).where(col(Chat.id) == plan.chat_id, col(Chat.title).is_(None)).values(title=title)
        )
        _release(s, plan)
        s.commit()


async def name_chat(c: Context, plan: TurnPlan) -> str:
    try:
        title = await c.worker.create_title(plan.message)
    except ApiError as exc:
        log.info("create_title failed (%s); using the first words", exc.message)
        title = ""
    title = " ".join(title.split())[:200] or fallback_title(plan.message)
    await in_thread(store_title, c, plan, title)
    return title


async def keep_turn(c: Context, handle: TurnHandle) -> None:
    """The owner's side of the write-ahead turn: every heartbeat (or sooner, after TURN_SAVE_TOKENS tokens)
    save what changed in one short write, refresh the heartbeat, and pick up a stop asked for elsewhere."""
    plan, rec = handle.plan, handle.rec
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(handle.wake.wait(), timeout=c.settings.turn_heartbeat_s)
        handle.wake.clear()
        if handle.finishing:
            return
        tokens, steps = len(rec.tokens), len(rec.steps)
        content = rec.partial_reply if tokens != handle.saved_tokens and rec.done is None else None
        step_list = list(rec.steps) if steps != handle.saved_steps and rec.done is None else None
        documents = rec.documents if rec.documents_changed and rec.done is None else None
        rec.documents_changed = False
        try:
            owned, stop = await in_thread(
                lifecycle.save_progress, c.db, plan.chat_id, plan.message_id, content, step_list, documents
            )
        except Exception:
            log.exception("saving the running turn in chat %s failed; trying again", plan.chat_id)
            rec.documents_changed = rec.documents_changed or documents is not None
            continue
        handle.saved_tokens, handle.saved_steps = tokens, steps
        if stop or not owned:
            handle.stop.set()


async def read_worker(c: Context, handle: TurnHandle) -> str | None:
    """Relay the worker's frames to the listeners until `done` or an error; returns a held `error` frame."""
    rec = handle.rec
    try:
        async with c.worker.events("/chat_stream", handle.plan.payload) as frames:
            async for f in frames:
                rec.see(f)
                if rec.error is not None:  # an error event, or an answer that breaks the worker's contract
                    return f.raw if f.event == "error" else frame("error", rec.error)
                handle.emit(f.raw)
                unsaved = len(rec.tokens) - handle.saved_tokens
                if f.event == "documents" or unsaved >= c.settings.turn_save_tokens:
                    handle.wake.set()
                if f.event == "done":
                    return None
    except ApiError as exc:
        rec.error = {"error": exc.message, "code": exc.code}
        rec.error_status = exc.status if exc.status >= 500 else 502
        if exc.headers and "Retry-After" in exc.headers:  # the worker is at capacity: say when to come back
            rec.error["retry_after_s"] = int(exc.headers["Retry-After"])
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a bug or an unexpected transport failure: still store, still tell the browser
        log.exception("turn in chat %s failed", handle.plan.chat_id)
        rec.error = {"error": f"the turn failed: {type(exc).__name__}", "code": "gateway_error"}
    return None


async def run_turn(c: Context, handle: TurnHandle) -> TurnRecord:
    """Read the worker's stream to its end (or to a stop), relaying frames, and persist the outcome."""
    plan, rec = handle.plan, handle.rec
    started = time.monotonic()
    handle.emit(frame("route", plan.gate))
    keeper = asyncio.create_task(keep_turn(c, handle), name=f"keep-chat-{plan.chat_id}")
    reader = asyncio.create_task(read_worker(c, handle), name=f"read-chat-{plan.chat_id}")
    stopper = asyncio.create_task(handle.stop.wait())
    held = None  # the terminal `error` frame, relayed after the failure is stored
    try:
        try:
            await asyncio.wait({reader, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if reader.done():
                held = reader.result()
            else:
                # Stop: closing the worker stream closes the worker's generator, which closes the model call.
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
                if rec.done is None:
                    rec.stopped = True
        except asyncio.CancelledError:
            # The gateway is shutting down mid-turn: record what there is, then let the cancellation through.
            reader.cancel()
            rec.status = "interrupted"
            rec.error = {"error": "the gateway stopped before the answer was complete", "code": "interrupted"}
            await asyncio.shield(_store_failure(c, plan, rec))
            raise
        finally:
            stopper.cancel()
        # The periodic saves end before the final one: a save still in flight completes first, so the two never
        # write the turn's rows at once (they would wait on each other's row locks on Postgres).
        handle.finishing = True
        handle.wake.set()
        await asyncio.gather(keeper, return_exceptions=True)
        await _finish(c, handle, held)
    finally:
        keeper.cancel()
        c.turns.pop(plan.chat_id, None)
        handle.emit(None)
    log.info(
        "turn chat=%s route=%s status=%s in %.0f ms",
        plan.chat_id,
        plan.route,
        rec.status,
        (time.monotonic() - started) * 1000,
    )
    return rec


async def _finish(c: Context, handle: TurnHandle, held: str | None) -> None:
    plan, rec = handle.plan, handle.rec
    if rec.done is not None:
        try:
            await in_thread(save_complete, c, plan, rec)
            rec.status = "complete"
            handle.emit(
                frame("saved", {"message_id": rec.message_id, "user_message_id": rec.user_message_id})
            )
            if plan.needs_title:
                try:
                    handle.emit(frame("title", {"title": await name_chat(c, plan)}))
                except BaseException:
                    await asyncio.shield(in_thread(release_lock, c, plan))
                    raise
        except Exception:
            log.exception("storing the turn in chat %s failed", plan.chat_id)
            await in_thread(release_lock, c, plan)
            # The JSON route's 502 says so too (it carried the turn with no error before).
            rec.error = {"error": "the answer could not be saved", "code": "save_failed"}
            handle.emit(frame("error", rec.error))
        return
    if rec.stopped:
        rec.status = "interrupted"
        rec.error = {"error": lifecycle.STOPPED, "code": "stopped"}
        rec.error_status = 200
        await _store_failure(c, plan, rec)
        handle.emit(
            frame(
                "interrupted",
                {**rec.error, "message_id": rec.message_id, "user_message_id": rec.user_message_id},
            )
        )
        return
    if rec.error is None:
        rec.status = "interrupted"
        rec.error = {
            "error": "the worker's stream ended before the answer was complete",
            "code": "interrupted",
        }
    else:
        rec.status = "failed"
    await _store_failure(c, plan, rec)
    handle.emit(held or frame("error", rec.error))


async def _store_failure(c: Context, plan: TurnPlan, rec: TurnRecord) -> None:
    try:
        await in_thread(save_failed, c, plan, rec)
    except Exception:
        log.exception("storing the failed turn in chat %s failed", plan.chat_id)
        await in_thread(release_lock, c, plan)


async def start_turn(request: Request) -> tuple[Context, TurnHandle, asyncio.Queue]:
    user, c, chat_id = await current_user(request), ctx(request), path_id(request)
    body = await read_json(request, TurnRequest)
    check_options(body.options, c.settings)
    slot = c.turn_slots.take(user.id)  # MAX_TURNS_PER_USER: a 429 when the account has that many running
    try:
        plan = await in_thread(plan_turn, c, user, chat_id, body)
    except BaseException:
        slot.release()
        raise
    handle = TurnHandle(plan)
    out = handle.listen()
    c.turns[plan.chat_id] = handle
    handle.task = asyncio.create_task(run_turn(c, handle), name=f"turn-chat-{chat_id}")
    c.running.add(handle.task)
    handle.task.add_done_callback(c.running.discard)
    handle.task.add_done_callback(slot.release)
    return c, handle, out


async def drain(out: asyncio.Queue, keepalive_s: float, first: list[str] | None = None) -> AsyncIterator[str]:
    """The browser's side: frames as they are queued, keepalives while none come. Cancelled on disconnect,
    which leaves the reading task untouched."""
    for item in first or []:
        yield item
    while True:
        try:
            item = await asyncio.wait_for(out.get(), timeout=keepalive_s)
        except TimeoutError:
            yield KEEPALIVE
            continue
        if item is None:
            return
        yield item


def sse(body: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(body, media_type="text/event-stream", headers=SSE_HEADERS)


async def post_message_stream(request: Request) -> Response:
    c, _handle, out = await start_turn(request)
    return sse(drain(out, c.settings.keepalive_s))


async def post_message(request: Request) -> JSONResponse:
    c, handle, _out = await start_turn(request)
    assert handle.task is not None
    rec = await asyncio.shield(handle.task)
    plan = handle.plan

    def load() -> dict:
        with c.db.session() as s:
            ids = [i for i in (rec.user_message_id, rec.message_id) if i is not None]
            msgs = {m.id: m for m in s.exec(select(Message).where(col(Message.id).in_(ids)))} if ids else {}
            chat = s.get(Chat, plan.chat_id)
            return {
                "route": plan.gate,
                "status": rec.status,
                "user_message": message_json(msgs[rec.user_message_id])
                if rec.user_message_id in msgs
                else None,
                "message": message_json(msgs[rec.message_id]) if rec.message_id in msgs else None,
                "title": chat.title if chat else None,
            }

    result = await in_thread(load)
    if rec.status == "complete":
        return JSONResponse(TurnResult(**result).data())
    result.update(rec.error or {})
    retry = (rec.error or {}).get("retry_after_s")
    headers = {"Retry-After": str(retry)} if retry else None
    return JSONResponse(TurnResult(**result).data(), status_code=rec.error_status, headers=headers)


# ---- the running turn, from any replica: state, stop, rejoin --------------------------------------------------


@dataclass
class Running:
    """What the database says about a chat's turn, read in one short transaction."""

    message_id: int | None
    message: Message | None = None
    user_message: Message | None = None
    busy: bool = False


def read_running(c: Context, user_id: int, chat_id: int, message_id: int | None = None) -> Running:
    """The chat's running turn (or, given `message_id`, that turn however it ended). A turn left by a dead
    replica is recovered here first. 404 for a chat that is not the user's."""
    with c.db.session() as s:
        chat = owned_chat(s, user_id, chat_id)
        if chat.turn_started_at is not None and lifecycle.is_stale(chat, c.settings.turn_lock_stale_s):
            s.rollback()
            lifecycle.recover_chat(s, chat_id, c.settings.turn_lock_stale_s)
            chat = owned_chat(s, user_id, chat_id)
        busy = chat.turn_started_at is not None
        wanted = message_id if message_id is not None else chat.turn_message_id
        if wanted is None:
            return Running(None, busy=busy)
        msg = s.get(Message, wanted)
        if msg is None or msg.chat_id != chat_id:
            return Running(wanted, busy=busy)
        question = s.exec(
            select(Message)
            .where(col(Message.chat_id) == chat_id, col(Message.id) < msg.id, col(Message.role) == "user")
            .order_by(col(Message.id).desc())
        ).first()
        return Running(wanted, msg, question, busy=busy and chat.turn_message_id == wanted)


def db_snapshot(run: Running) -> dict:
    msg, question = run.message, run.user_message
    assert msg is not None
    return {
        "message_id": msg.id,
        "user_message_id": question.id if question else None,
        "question": question.content if question else "",
        "route": msg.gate,
        "status": msg.status,
        "steps": msg.steps,
        "documents": msg.documents or None,
        "answer": msg.content,
        "done": None,
    }


def end_frames(run: Running) -> list[str]:
    """How a turn read from the database ended, as the events the owner sent."""
    msg = run.message
    if msg is None:  # removed: a failure before any token keeps only the user message
        q = run.user_message
        err = (q.error if q else None) or "the turn failed"
        return [frame("error", {"error": err, "code": "turn_failed"})]
    ids = {"message_id": msg.id, "user_message_id": run.user_message.id if run.user_message else None}
    if msg.status == "complete":
        return [frame("done", answers.done_event(msg)), frame("saved", ids)]
    if msg.status == "interrupted":
        code = "stopped" if msg.error == lifecycle.STOPPED else "interrupted"
        return [frame("interrupted", {"error": msg.error, "code": code, **ids})]
    return [frame("error", {"error": msg.error or "the turn failed", "code": "turn_failed"})]


async def follow_database(c: Context, user_id: int, chat_id: int, first: Running) -> AsyncIterator[str]:
    """A turn another replica owns, streamed from its periodic saves: the snapshot, then what changed."""
    message_id = first.message_id
    run = first
    yield frame("snapshot", db_snapshot(run))
    assert run.message is not None
    sent_text, sent_steps, sent_docs = run.message.content, len(run.message.steps), run.message.documents
    quiet = 0.0
    while run.message is not None and run.message.status == "running" and run.busy:
        await asyncio.sleep(REJOIN_POLL_S)
        quiet += REJOIN_POLL_S
        try:
            run = await in_thread(read_running, c, user_id, chat_id, message_id)
        except ApiError:  # the chat was deleted meanwhile
            yield frame("error", {"error": "the chat was deleted", "code": "chat_not_found"})
            return
        msg = run.message
        if msg is None:
            break
        for step in msg.steps[sent_steps:]:
            yield frame("step", step)
            quiet = 0.0
        sent_steps = len(msg.steps)
        if msg.documents and msg.documents != sent_docs:
            yield frame("documents", {"documents": msg.documents})
            sent_docs = msg.documents
        if len(msg.content) > len(sent_text) and msg.content.startswith(sent_text):
            yield frame("token", {"token": msg.content[len(sent_text) :]})
            sent_text = msg.content
            quiet = 0.0
        if quiet >= c.settings.keepalive_s:
            quiet = 0.0
            yield KEEPALIVE
    if run.message is not None and run.message.status == "running":
        # The turn lost its lock without being finished: recovered as interrupted by now, or about to be.
        run = await in_thread(read_running, c, user_id, chat_id, message_id)
    for item in end_frames(run):
        yield item


async def rejoin_stream(request: Request) -> Response:
    user, c, chat_id = await current_user(request), ctx(request), path_id(request)
    handle = c.turns.get(chat_id)
    if handle is not None and handle.task is not None and not handle.task.done():
        await in_thread(read_running, c, user.id, chat_id)  # the owner check (404)
        snapshot = frame("snapshot", handle.snapshot())
        out = handle.listen()  # no await between the snapshot and listening: nothing falls in between
        return sse(drain(out, c.settings.keepalive_s, [snapshot]))
    run = await in_thread(read_running, c, user.id, chat_id)
    if run.message is None or run.message.status != "running" or not run.busy:
        return Response(status_code=204)
    return sse(follow_database(c, user.id, chat_id, run))


async def stop_turn(request: Request) -> JSONResponse:
    """Stop the chat's running turn, wherever it runs; answers once the stopped turn is stored."""
    user, c, chat_id = await current_user(request), ctx(request), path_id(request)
    await read_json(request, StopRequest)
    run = await in_thread(read_running, c, user.id, chat_id)
    message_id = run.message_id if run.busy else None
    if message_id is not None:
        message_id = await in_thread(lifecycle.request_stop, c.db, chat_id)
    if message_id is None:
        raise Conflict("no answer is being written in this chat", code="no_turn")
    handle = c.turns.get(chat_id)
    if handle is not None and handle.plan.message_id == message_id and handle.task is not None:
        handle.stop.set()
        await asyncio.wait({asyncio.ensure_future(asyncio.shield(handle.task))}, timeout=STOP_WAIT_S)
    else:  # another replica owns it: it reads the request with its next heartbeat
        deadline = time.monotonic() + max(STOP_WAIT_S, c.settings.turn_lock_stale_s * 2)
        while time.monotonic() < deadline:
            run = await in_thread(read_running, c, user.id, chat_id, message_id)
            if not run.busy:
                break
            await asyncio.sleep(REJOIN_POLL_S)
    run = await in_thread(read_running, c, user.id, chat_id, message_id)
    msg = run.message
    return JSONResponse(
        StopResult(
            status=msg.status if msg is not None else "failed",
            busy=run.busy,
            message=message_json(msg) if msg is not None else None,
            user_message=message_json(run.user_message) if run.user_message is not None else None,
        ).data()
    )


async def sweep_forever(c: Context) -> None:
    """At start-up and then periodically: turns whose owner stopped refreshing them become interrupted."""
    while True:
        try:
            n = await in_thread(lifecycle.recover_stale, c.db, c.settings.turn_lock_stale_s)
            if n:
                log.warning("marked %d turns left by a stopped gateway as interrupted", n)
        except Exception:
            log.exception("recovering abandoned turns failed; trying again")
        await asyncio.sleep(max(1.0, c.settings.turn_lock_stale_s / 2))


routes = [
    Route("/api/chats/{id:int}/messages", post_message, methods=["POST"]),
    Route("/api/chats/{id:int}/messages/stream", post_message_stream, methods=["POST"]),
    Route("/api/chats/{id:int}/stop", stop_turn, methods=["POST"]),
    Route("/api/chats/{id:int}/stream", rejoin_stream, methods=["GET"]),
]
