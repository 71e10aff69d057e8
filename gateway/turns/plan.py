"""Before the worker is called: the gate, the worker's request, the chat's turn lock and both messages."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam
from sqlmodel import Session, col, select

from .. import lifecycle
from ..access import readable_subset
from ..chats import carried_history, linked_indexes, read_chat
from ..context import Context
from ..db import Chat, Index, IndexDocument, SettingRow, User, utcnow
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


# Built once (gateway/lifecycle.py says why).
OPTIONS = select(SettingRow.__table__.c.value).where(col(SettingRow.key) == TURN_OPTIONS_KEY)
FILES = select(IndexDocument.__table__.c["index_id", "dataset", "filename"]).where(
    col(IndexDocument.index_id).in_(bindparam("b_indexes", expanding=True)),
    col(IndexDocument.filename).in_(bindparam("b_names", expanding=True)),
)


def default_options(s: Session) -> dict:
    value = s.connection().execute(OPTIONS).scalar()
    return dict(value) if value else {}


def sendable_documents(s: Session, chat: Chat, indexes: list[Index]) -> list[dict]:
    """The chat's documents that still exist in an index it is linked to: an unlinked or deleted index, or a
    deleted file, must never be asked about (the worker would refuse the whole turn)."""
    names = {doc.get("filename") for doc in chat.documents if isinstance(doc, dict)}
    names.discard(None)
    if not indexes or not names:
        return []
    by_id = {i.id: i.worker_name for i in indexes}
    params = {"b_indexes": list(by_id), "b_names": sorted(str(n) for n in names)}
    files = {(by_id[i], dataset, filename) for i, dataset, filename in s.connection().execute(FILES, params)}
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
        chat = read_chat(s, user.id, chat_id)
        plan = read_plan(s, c, user, chat, body)
    if chat.turn_started_at is None:
        with c.db.write() as conn:
            if start(conn, c, plan, chat.updated_at):
                return plan
            conn.rollback()
    # Busy, or changed since it was read: read it again under the write lock, as the only turn that may start.
    with c.db.session() as s:
        chat = read_chat(s, user.id, chat_id)
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


# Built once (lifecycle.py says why). TAKE: the chat's lock for this turn, if it is free or stale; TAKE_UNCHANGED:
# the same, on the condition that the chat is as it was read. Their SET columns come with the parameters.
TAKE = lifecycle.CHATS.update().where(
    lifecycle.CHATS.c.id == bindparam("b_chat"), lifecycle.free_or_stale(bindparam("b_cutoff"))
)
TAKE_UNCHANGED = TAKE.where(lifecycle.CHATS.c.updated_at == bindparam("b_seen"))
CHAT_ROW = lifecycle.CHATS.update().where(lifecycle.CHATS.c.id == bindparam("b_chat"))
INSERT_MESSAGE = lifecycle.MESSAGES.insert().returning(lifecycle.MESSAGES.c.id)


def start(conn: Connection, c: Context, plan: TurnPlan, seen: datetime | None) -> bool:
    """Take the chat's turn lock for this replica (if it is free or stale, and, given `seen`, the chat not
    changed since) and store both messages, the answer `running`, the lock pointed at it. False: not taken.
    A 429 when the account already has MAX_TURNS_PER_USER turns running, on any gateway process."""
    now = utcnow()
    # One start per account at a time (Postgres: the user's row, locked to the end of this transaction; SQLite
    # runs one write transaction at a time already), so two processes cannot both count N-1 and both start.
    lock_account(conn, plan.user_id)
    where = {"b_chat": plan.chat_id, "b_cutoff": lifecycle.stale_cutoff(c.settings.turn_lock_stale_s)}
    lock = {
        "turn_started_at": now,
        "turn_owner": c.replica,
        "turn_heartbeat_at": now,
        "turn_stop_at": None,
        "updated_at": now,
    }
    if seen is not None:
        # Free and as it was read: no turn ran since, so none left a message running. Both messages first, then
        # the lock taken and pointed at the answer in one UPDATE (not taken: all of it rolled back).
        store_messages(conn, plan, now)
        lock["turn_message_id"] = plan.message_id
        if conn.execute(TAKE_UNCHANGED, {**where, "b_seen": seen, **lock}).rowcount != 1:
            return False
    else:
        if conn.execute(TAKE, {**where, **lock, "turn_message_id": None}).rowcount != 1:
            return False
        # A turn whose owner died without a trace of it in the lock (taken over just now) is interrupted.
        lifecycle.interrupt_running(conn, plan.chat_id)
        store_messages(conn, plan, now)
        conn.execute(CHAT_ROW, {"b_chat": plan.chat_id, "turn_message_id": plan.message_id})
    check_running_turns(conn, c, plan)
    return True


def store_messages(conn: Connection, plan: TurnPlan, now: datetime) -> None:
    plan.user_message_id = insert_message(conn, plan, "user", plan.message, now)
    plan.message_id = insert_message(conn, plan, "assistant", "", now)


def check_running_turns(conn: Connection, c: Context, plan: TurnPlan) -> None:
    """MAX_TURNS_PER_USER, counted in the database: the account's other chats with a live turn (a turn whose
    owner died stops counting once its heartbeat is stale) and its `/v1` turns. Raising rolls the lock back."""
    refuse_past_limit(c, live_turns(conn, c, plan.user_id, but=plan.chat_id))


def insert_message(conn: Connection, plan: TurnPlan, role: str, content: str, now: datetime) -> int:
    """One `running` message of the turn (every column given: Core applies none of the model's defaults)."""
    values = {
        "chat_id": plan.chat_id,
        "role": role,
        "content": content,
        "documents": [],
        "citations": [],
        "steps": [],
        "timings": {},
        "details": {},
        "route": plan.route,
        "gate": plan.gate,
        "status": "running",
        "created_at": now,
    }
    return int(conn.execute(INSERT_MESSAGE, values).one()[0])


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
