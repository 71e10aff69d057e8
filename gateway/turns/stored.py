"""The turn's rows: the final save (complete or failed), the lock's release, and the turn read back from the
database by any replica (its state, a snapshot, how it ended)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlmodel import Session, col, delete, select, update

from .. import answers, lifecycle
from ..chats import owned_chat
from ..context import Context
from ..db import Chat, Message, utcnow
from ..sse import frame
from .state import TurnPlan, TurnRecord
from .steplog import save_steps


def release(s: Session, plan: TurnPlan) -> None:
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
        # The step log, in this same transaction, after the rows a running turn's writes lock (one INSERT).
        save_steps(s, plan.message_id, rec.steps, done.timings)
        if not plan.needs_title:
            release(s, plan)
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
        release(s, plan)
        s.commit()
        rec.user_message_id, rec.message_id = user_msg.id, kept


def release_lock(c: Context, plan: TurnPlan) -> None:
    with c.db.session() as s:
        release(s, plan)
        s.commit()


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
