"""Before the worker is called: the gate, the worker's request, the chat's turn lock and both messages."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, true
from sqlmodel import Session, col, select, update

from .. import lifecycle
from ..access import readable_subset
from ..chats import carried_history, linked_indexes, owned_chat
from ..context import Context
from ..db import Chat, Index, IndexDocument, Message, SettingRow, User, utcnow
from ..errors import BadRequest, Conflict
from ..gate import should_use_rag
from ..schemas import TurnRequest
from .running import live_turns, lock_account, refuse_past_limit
from .state import TurnPlan

TURN_OPTIONS_KEY = "turn_options"


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
    # The reads in a read-only transaction (no write lock held while the gate runs and the request is built),
    # then the writes in one short one, on the condition that the chat is as it was read: free, and not
    # changed since (`updated_at`, which every turn's start and end and every edit of the chat move on).
    with c.db.read() as s:
        chat = owned_chat(s, user.id, chat_id)
        plan = read_plan(s, c, user, chat, body)
    if chat.turn_started_at is None:
        with c.db.write() as conn:
            if start(conn, c, plan, chat.updated_at):
                return plan
            conn.rollback()
    # Busy, or changed since it was read: read it again under the write lock, as the only turn that may start.
    with c.db.session() as s:
        chat = owned_chat(s, user.id, chat_id)
        plan = read_plan(s, c, user, chat, body)
        if not start(s.connection(), c, plan, None):
            s.rollback()
            raise Conflict(
                "a reply is still being written in this chat: wait for it to finish, or stop it",
                code="turn_in_progress",
            )
        s.commit()
    return plan


def read_plan(s: Session, c: Context, user: User, chat: Chat, body: TurnRequest) -> TurnPlan:
    """The gate and the worker's request, from what the chat holds now (reads only)."""
    # Access is checked at every turn: an index the user can no longer read is neither searched nor are
    # its passages carried (sendable_documents keeps only documents of the indexes searched). An index
    # with no documents (none uploaded yet, or a first build that failed) may have no worker table: there
    # is nothing to search in it.
    indexes = [i for i in readable_subset(s, user, linked_indexes(s, chat.id)) if i.document_count > 0]
    if body.force_rag and not indexes:
        # Well-formed, but this chat has no index to search: a conflict with its state (link one first).
        raise Conflict("force_rag needs an index linked to this chat", code="no_index", field="force_rag")
    route, reason = should_use_rag(body.message, force_rag=body.force_rag, has_indexes=bool(indexes))
    datasets = body.datasets if body.datasets is not None else list(chat.datasets)
    payload = worker_payload(s, c, chat, indexes, body, route, datasets, carried_history(s, user, chat))
    assert chat.id is not None
    return TurnPlan(
        chat_id=chat.id,
        message=body.message,
        route=route,
        reason=reason,
        datasets=datasets,
        datasets_changed=body.datasets is not None,
        needs_title=chat.title is None,
        payload=payload,
        gate={"layer": 1, "route": route, "reason": reason},
        user_id=user.id or 0,
    )


def start(conn: Connection, c: Context, plan: TurnPlan, seen: datetime | None) -> bool:
    """Take the chat's turn lock for this replica (if it is free or stale, and, given `seen`, the chat not
    changed since) and store both messages, the answer `running`, the lock pointed at it. False: not taken.
    A 429 when the account already has MAX_TURNS_PER_USER turns running, on any gateway process."""
    now = utcnow()
    chats = Chat.__table__
    # One start per account at a time (Postgres: the user's row, locked to the end of this transaction; SQLite
    # runs one write transaction at a time already), so two processes cannot both count N-1 and both start.
    lock_account(conn, plan.user_id)
    taken = conn.execute(
        update(Chat)
        .where(col(Chat.id) == plan.chat_id)
        .where(lifecycle.stale_condition(c.settings.turn_lock_stale_s))
        .where(col(Chat.updated_at) == seen if seen is not None else true())
        .values(
            turn_started_at=now,
            turn_owner=c.replica,
            turn_heartbeat_at=now,
            turn_stop_at=None,
            turn_message_id=None,
        )
    )
    if taken.rowcount != 1:
        return False
    check_running_turns(conn, c, plan)
    # A turn whose owner died without a trace of it in the lock (taken over just now) is interrupted.
    lifecycle.interrupt_running(conn, plan.chat_id)
    plan.user_message_id = insert_message(conn, plan, "user", plan.message, now)
    plan.message_id = insert_message(conn, plan, "assistant", "", now)
    conn.execute(
        chats.update()
        .where(chats.c.id == plan.chat_id)
        .values(turn_message_id=plan.message_id, updated_at=now)
    )
    return True


def check_running_turns(conn: Connection, c: Context, plan: TurnPlan) -> None:
    """MAX_TURNS_PER_USER, counted in the database: the account's other chats with a live turn (a turn whose
    owner died stops counting once its heartbeat is stale) and its `/v1` turns. Raising rolls the lock back."""
    refuse_past_limit(c, live_turns(conn, c, plan.user_id, but=plan.chat_id))


def insert_message(conn: Connection, plan: TurnPlan, role: str, content: str, now: datetime) -> int:
    """One `running` message of the turn (every column given: Core applies none of the model's defaults)."""
    messages = Message.__table__
    row = conn.execute(
        messages.insert()
        .values(
            chat_id=plan.chat_id,
            role=role,
            content=content,
            documents=[],
            citations=[],
            steps=[],
            timings={},
            details={},
            route=plan.route,
            gate=plan.gate,
            status="running",
            created_at=now,
        )
        .returning(messages.c.id)
    ).one()
    return int(row[0])


def worker_payload(
    s: Session,
    c: Context,
    chat: Chat,
    indexes: list[Index],
    body: TurnRequest,
    route: str,
    datasets: list[str],
    history: list,
) -> dict[str, Any]:
    """The worker's /chat_stream request: the turn defaults with the turn's own options, the history that fits
    (`history`: chats.carried_history, without the passages of an index the user can no longer read), the
    documents still searchable, the scope."""
    settings = c.settings
    options = default_options(s)
    if body.options is not None:
        options.update(body.options.as_options())
    options["route"] = "rag" if body.force_rag else ("direct" if route == "direct" else "auto")
    payload: dict[str, Any] = {
        "prompt": body.message,
        "history": trim_history(history, settings.max_history_messages, settings.max_history_chars),
        "docs": sendable_documents(s, chat, indexes),
        "datasets": datasets,
        "options": options,
    }
    if indexes:
        payload["index"] = [i.worker_name for i in indexes]
    return payload
