"""The turn's rows: the final save (complete or failed), the lock's release, and the turn read back from the
database by any replica (its state, a snapshot, how it ended)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import bindparam
from sqlmodel import Session, col, select, update

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


# Built once (lifecycle.py says why): the chat while this turn holds it, and one message of the turn.
TURN_CHAT = lifecycle.CHATS.update().where(
    lifecycle.CHATS.c.id == bindparam("b_chat"), lifecycle.CHATS.c.turn_message_id == bindparam("b_message")
)
TURN_MESSAGE = lifecycle.MESSAGES.update().where(
    lifecycle.MESSAGES.c.id == bindparam("b_message"), lifecycle.MESSAGES.c.chat_id == bindparam("b_chat")
)


def save_complete(c: Context, plan: TurnPlan, rec: TurnRecord) -> None:
    """Both messages and the new chat state, in one transaction of a few Core statements. The turn lock is
    released here, or, for a chat still to be named, once the title is stored (so a reload after the turn always
    shows it). The chat row is written first, as every write of a running turn takes them (lifecycle.py)."""
    done = rec.done
    stored = answers.stored_json(done)
    turn = {"b_chat": plan.chat_id, "b_message": plan.message_id}
    with c.db.write() as conn:
        # The chat state only while this turn still holds the chat (a replica that took it over keeps it).
        state: dict = {"history": stored["history"], "updated_at": utcnow()}
        if answers.carries_documents(stored):
            state["documents"] = stored["documents"]
        if plan.datasets_changed:
            state["datasets"] = plan.datasets
        if not plan.needs_title:
            state.update(lifecycle.clear_lock_values())
        conn.execute(TURN_CHAT, {**turn, **state})
        answered = conn.execute(TURN_MESSAGE, {**turn, **answers.stored_values(stored, done, rec.steps)})
        asked = conn.execute(
            TURN_MESSAGE, {"b_chat": plan.chat_id, "b_message": plan.user_message_id, "status": "complete"}
        )
        if answered.rowcount != 1 or asked.rowcount != 1:  # deleted while the turn ran: nothing to store
            conn.rollback()
            return
        # The step log, in this same transaction, after the rows a running turn's writes lock (one INSERT).
        save_steps(conn, plan.message_id, rec.steps, done.timings)
    rec.user_message_id, rec.message_id = plan.user_message_id, plan.message_id


def save_failed(c: Context, plan: TurnPlan, rec: TurnRecord) -> None:
    """The user message with the error (and any partial answer); the chat state stays as it was."""
    error = (rec.error or {}).get("error")
    chats, messages = Chat.__table__, Message.__table__
    keep = bool(rec.tokens) or rec.status == "interrupted"
    with c.db.write() as conn:
        # The chat row before the messages, as every write of a running turn takes them; the lock released.
        conn.execute(
            chats.update()
            .where(chats.c.id == plan.chat_id, chats.c.turn_message_id == plan.message_id)
            .values(updated_at=utcnow(), **lifecycle.clear_lock_values())
        )
        asked = conn.execute(
            messages.update()
            .where(messages.c.id == plan.user_message_id, messages.c.chat_id == plan.chat_id)
            .values(status=rec.status, error=error)
        )
        if asked.rowcount != 1:  # the chat was deleted while the turn ran
            conn.rollback()
            return
        answer = messages.c.id == plan.message_id, messages.c.chat_id == plan.chat_id
        kept = None
        if keep:
            values = {
                "content": rec.partial_reply,
                "documents": rec.documents or [],
                "steps": rec.steps,
                "status": rec.status,
                "error": error,
            }
            if rec.stopped:
                values["details"] = {"stopped": True}
            if conn.execute(messages.update().where(*answer).values(**values)).rowcount == 1:
                kept = plan.message_id
        else:  # nothing was answered: the user message carries the error alone
            conn.execute(messages.delete().where(*answer))
    rec.user_message_id, rec.message_id = plan.user_message_id, kept


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
    replica is recovered here first (in a transaction of its own: this one only reads). 404 for a chat that is
    not the user's."""
    with c.db.read() as s:
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
