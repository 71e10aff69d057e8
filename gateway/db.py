"""The gateway's tables (SQLModel), the engine (SQLite by default, Postgres by URL) and schema migrations.

Everything here is portable SQL through SQLAlchemy: the same code runs on `sqlite:///...` and
`postgresql+psycopg://...`. Schema changes are appended to MIGRATIONS, never edited in place.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    Connection,
    Engine,
    ForeignKey,
    Integer,
    UniqueConstraint,
    column,
    event,
    inspect,
    table,
    text,
)
from sqlalchemy import Index as SqlIndex
from sqlalchemy.engine import make_url
from sqlmodel import Field, Session, SQLModel, create_engine, select

from .answers import from_columns
from .settings import private_dir

log = logging.getLogger("gateway.db")
T = TypeVar("T", bound=SQLModel)


def utcnow() -> datetime:
    """Aware UTC, to the millisecond: SQLModel stores it portably (SQLite text, Postgres timestamptz)."""
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


def iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="milliseconds") + "Z"


def json_column() -> Any:
    return Field(default_factory=list, sa_column=Column(JSON, nullable=False))


def json_dict_column() -> Any:
    return Field(default_factory=dict, sa_column=Column(JSON, nullable=False))


class User(SQLModel, table=True):
    __tablename__ = "users"
    # At most one row holds the first-admin seat (TRUE; everyone else NULL, and NULLs never collide): two
    # first registrations racing on Postgres cannot both become admin, the database refuses the second.
    __table_args__ = (SqlIndex("uq_users_first_admin", "first_admin", unique=True),)
    id: int | None = Field(default=None, primary_key=True)
    username: str = Field(max_length=64, unique=True, index=True)
    password_hash: str
    is_admin: bool = False
    created_at: datetime = Field(default_factory=utcnow)
    first_admin: bool | None = None
    # Raised by logout, a password change and disabling: every token issued before carries an older one.
    token_version: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    disabled: bool = Field(default=False, sa_column_kwargs={"server_default": text("false")})


class Chat(SQLModel, table=True):
    __tablename__ = "chats"
    id: int | None = Field(default=None, primary_key=True)
    owner_id: int = Field(foreign_key="users.id", index=True)
    title: str | None = Field(default=None, max_length=200)
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow, index=True)
    # The state the worker returned last (history, documents) and the datasets the chat is scoped to.
    history: list = json_column()
    documents: list = json_column()
    datasets: list = json_column()
    # Set while a turn runs: a second message to the same chat is a 409 (works across gateway replicas).
    turn_started_at: datetime | None = None
    # The running turn (gateway/lifecycle.py): its assistant message, the replica that reads it from the
    # worker, that replica's last heartbeat (a stale one means it crashed) and a stop asked for from any replica.
    turn_message_id: int | None = None
    turn_owner: str | None = Field(default=None, max_length=64)
    turn_heartbeat_at: datetime | None = None
    turn_stop_at: datetime | None = None


class Message(SQLModel, table=True):
    __tablename__ = "messages"
    id: int | None = Field(default=None, primary_key=True)
    chat_id: int = Field(foreign_key="chats.id", index=True)
    role: str = Field(max_length=16)  # user | assistant
    content: str
    documents: list = json_column()
    citations: list = json_column()
    rewritten: str | None = None
    steps: list = json_column()
    timings: dict = json_dict_column()
    route: str | None = Field(default=None, max_length=16)
    gate: dict = json_dict_column()  # the layer-1 decision: {"route", "reason"}
    status: str = Field(default="complete", max_length=16)  # running | complete | interrupted | failed
    error: str | None = None
    # A finished answer, whole: `contract.answer.Answer` as the worker sent it (gateway/answers.py). Null while
    # the turn runs, and for a turn that did not finish (its partial text is `content`, `documents`, `steps`).
    answer: dict | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    details: dict = json_dict_column()  # beside the answer: {"stopped": true} for a turn the user stopped
    # Before schema version 4 a finished answer was spread over `documents`, `citations`, `rewritten`,
    # `timings` and `details`; the last three are no longer written (kept so older rows and gateways still read).
    created_at: datetime = Field(default_factory=utcnow)


class Index(SQLModel, table=True):
    __tablename__ = "indexes"
    __table_args__ = (UniqueConstraint("owner_id", "name", name="uq_indexes_owner_name"),)
    id: int | None = Field(default=None, primary_key=True)
    owner_id: int = Field(foreign_key="users.id", index=True)
    name: str = Field(max_length=100)
    description: str = ""
    worker_name: str = Field(max_length=64, unique=True)
    status: str = Field(default="empty", max_length=16)  # empty | ready | building | failed
    document_count: int = 0
    chunk_count: int = 0
    # Fixed when the worker's table is made (its marker records them): the embedder of the passages and the
    # language of the full-text index. None on a row from before migration 12 until the worker's marker has
    # been read (indexes/settings.py backfills them).
    embedder: str | None = Field(default=None, max_length=64)
    language: str | None = Field(default=None, max_length=16)
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)


class IndexDocument(SQLModel, table=True):
    __tablename__ = "index_documents"
    __table_args__ = (UniqueConstraint("index_id", "dataset", "filename", name="uq_index_documents_file"),)
    id: int | None = Field(default=None, primary_key=True)
    index_id: int = Field(foreign_key="indexes.id", index=True)
    dataset: str = Field(max_length=64)
    filename: str = Field(max_length=255)
    document_id: str = Field(default="", max_length=128)
    chunks: int = 0
    bytes: int = 0
    created_at: datetime = Field(default_factory=utcnow)


class ChatIndex(SQLModel, table=True):
    __tablename__ = "chat_indexes"
    chat_id: int = Field(foreign_key="chats.id", primary_key=True)
    index_id: int = Field(foreign_key="indexes.id", primary_key=True)


class SettingRow(SQLModel, table=True):
    __tablename__ = "settings"
    key: str = Field(primary_key=True, max_length=64)
    value: dict = json_dict_column()
    updated_at: datetime = Field(default_factory=utcnow)


class LoginFailure(SQLModel, table=True):
    """Failed logins of one key (an (account, address) pair, or an address) inside a window, counted in the
    database so that concurrent guesses, and every gateway replica, share one count (gateway/lockout.py)."""

    __tablename__ = "login_failures"
    key: str = Field(primary_key=True, max_length=200)
    count: int = 0
    expires_at: float = Field(default=0.0, index=True)  # epoch seconds: the window ends, the row goes


class RateEvent(SQLModel, table=True):
    """One counted event of a rate limit (a new account from an address, a request with an API key), kept until
    its window ends: every gateway process and replica counts the same rows (gateway/ratelimits.py)."""

    __tablename__ = "rate_events"
    id: int | None = Field(default=None, primary_key=True)
    key: str = Field(max_length=200, index=True)
    expires_at: float = Field(default=0.0, index=True)  # epoch seconds: the event leaves the window


class RunningTurn(SQLModel, table=True):
    """A `/v1` turn being relayed (it stores no chat): counted with the account's chat turns against
    MAX_TURNS_PER_USER on every process, alive while its process's heartbeat refreshes `expires_at`
    (gateway/turns/running.py)."""

    __tablename__ = "running_turns"
    id: int | None = Field(default=None, primary_key=True)
    user_id: int = Field(index=True)
    expires_at: float = Field(default=0.0, index=True)  # epoch seconds


class Group(SQLModel, table=True):
    """A named set of users (admin-managed) that indexes can be shared with. `name_key` is the name lowered:
    two groups cannot differ only by case."""

    __tablename__ = "groups"
    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(max_length=64)
    name_key: str = Field(max_length=64, unique=True)
    description: str = ""
    created_at: datetime = Field(default_factory=utcnow)


class GroupMember(SQLModel, table=True):
    __tablename__ = "group_members"
    group_id: int = Field(foreign_key="groups.id", primary_key=True)
    user_id: int = Field(foreign_key="users.id", primary_key=True, index=True)
    added_at: datetime = Field(default_factory=utcnow)


class IndexGrant(SQLModel, table=True):
    """One share of an index: to a user, a group or everyone signed in (`subject_id` 0), as reader or editor.
    The owner is `indexes.owner_id`, never a grant."""

    __tablename__ = "index_grants"
    __table_args__ = (
        UniqueConstraint("index_id", "subject_type", "subject_id", name="uq_index_grants_subject"),
        SqlIndex("ix_index_grants_subject", "subject_type", "subject_id"),
    )
    id: int | None = Field(default=None, primary_key=True)
    index_id: int = Field(foreign_key="indexes.id", index=True)
    subject_type: str = Field(max_length=16)  # user | group | everyone
    subject_id: int = 0
    role: str = Field(max_length=16)  # reader | editor
    created_by: int | None = None
    created_at: datetime = Field(default_factory=utcnow)


class AuditEvent(SQLModel, table=True):
    """An append-only record: who (`actor_id`, and the name as it was), what (`action`), on which object, when
    and from which address. No route updates or deletes a row (gateway/audit.py only inserts)."""

    __tablename__ = "audit_log"
    id: int | None = Field(default=None, primary_key=True)
    at: datetime = Field(default_factory=utcnow, index=True)
    actor_id: int | None = Field(default=None, index=True)
    actor_name: str | None = Field(default=None, max_length=64)
    action: str = Field(max_length=64, index=True)
    object_type: str = Field(default="", max_length=32)
    object_id: str = Field(default="", max_length=128)
    detail: dict = json_dict_column()
    address: str | None = Field(default=None, max_length=64)


class ApiKey(SQLModel, table=True):
    """A user's API key (gateway/keys.py): only the SHA-256 of its secret is stored, with the visible prefix.
    A revoked key keeps its row (revoked_at set) so its name and use stay on record; it authenticates nothing."""

    __tablename__ = "api_keys"
    id: int | None = Field(default=None, primary_key=True)
    user_id: int = Field(foreign_key="users.id", index=True)
    name: str = Field(max_length=100)
    prefix: str = Field(max_length=32)
    secret_hash: str = Field(max_length=64, unique=True)
    read_only: bool = Field(default=False, sa_column_kwargs={"server_default": text("false")})
    created_at: datetime = Field(default_factory=utcnow)
    expires_at: datetime | None = None
    last_used_at: datetime | None = None
    revoked_at: datetime | None = None


class TurnStep(SQLModel, table=True):
    """The step log: one row per step of a finished turn, next to its assistant message (written in the same
    transaction as the answer, gateway/turns/steplog.py), so latency per step is a SQL query. `started_ms` is
    the step's start within the turn, `duration_ms` how long it took (the worker's timing of the stage; for
    the turn's clocks, the rows `first_token` and `total`)."""

    __tablename__ = "turn_steps"
    id: int | None = Field(default=None, primary_key=True)
    # Deleting a message (or its chat) deletes its steps with it, on both databases.
    message_id: int = Field(
        sa_column=Column(Integer, ForeignKey("messages.id", ondelete="CASCADE"), nullable=False, index=True)
    )
    position: int
    step: str = Field(max_length=32)
    method: str | None = Field(default=None, max_length=64)
    started_ms: int
    duration_ms: int | None = None
    detail: dict = json_dict_column()
    created_at: datetime = Field(default_factory=utcnow, index=True)


class Job(SQLModel, table=True):
    """One piece of background work on an index (gateway/jobs/): an upload, a rebuild, a sync run. `state` is
    queued | running | done | failed | cancelled. While it runs, `owner` (a replica) refreshes `heartbeat_at`; a
    heartbeat older than JOB_STALE_S means the owner died and any replica may take the job over (the rule running
    turns use). A cancel asked for on any replica is `cancel_at`; the owner reads it with its heartbeat."""

    __tablename__ = "jobs"
    __table_args__ = (SqlIndex("ix_jobs_state_index", "state", "index_id"),)
    id: int | None = Field(default=None, primary_key=True)
    kind: str = Field(max_length=32)
    index_id: int = Field(
        sa_column=Column(Integer, ForeignKey("indexes.id", ondelete="CASCADE"), nullable=False, index=True)
    )
    user_id: int | None = Field(default=None, index=True)
    state: str = Field(default="queued", max_length=16)
    stage: str = Field(default="", max_length=64)  # what it does now, in a word (the running file's stage)
    params: dict = json_dict_column()  # the kind's own: {"rebuild": true}, a source id, ...
    total: int = 0  # files known so far
    done: int = 0  # files committed
    failed: int = 0  # files that failed for good
    error: str | None = None
    code: str | None = Field(default=None, max_length=64)
    owner: str | None = Field(default=None, max_length=64)
    heartbeat_at: datetime | None = None
    cancel_at: datetime | None = None
    attempts: int = 0  # how many times a replica started (or took over) the job
    created_at: datetime = Field(default_factory=utcnow, index=True)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    updated_at: datetime = Field(default_factory=utcnow)


class JobFile(SQLModel, table=True):
    """One file of a job, in order: `state` pending | running | done | failed | cancelled, its last `stage`, the
    tries so far (counted before each try, so a crash mid-file counts), and once committed the document it made.
    `stored` is the job's own copy of an uploaded file (JOBS_DIR), removed when the job ends."""

    __tablename__ = "job_files"
    __table_args__ = (UniqueConstraint("job_id", "position", name="uq_job_files_position"),)
    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(
        sa_column=Column(Integer, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False, index=True)
    )
    position: int
    dataset: str = Field(default="default", max_length=64)
    filename: str = Field(max_length=255)
    content_type: str | None = Field(default=None, max_length=255)
    stored: str | None = Field(default=None, max_length=1024)
    bytes: int = 0
    state: str = Field(default="pending", max_length=16)
    stage: str = Field(default="", max_length=64)
    attempts: int = 0
    error: str | None = None
    code: str | None = Field(default=None, max_length=64)
    status: int | None = None  # the HTTP status of a refusal (the worker's 4xx), for `?wait=1` answers
    document_id: str | None = Field(default=None, max_length=128)
    chunks: int | None = None
    replaced: bool = False
    detail: dict = json_dict_column()
    updated_at: datetime = Field(default_factory=utcnow)


class IndexSource(SQLModel, table=True):
    """Where an index's documents come from and are kept in step with (gateway/sync/): a server folder under
    SYNC_ROOTS (`path`) or an S3-compatible bucket and prefix. The credentials are the gateway's: written by the
    API, never returned by it. `every` minutes (None: on demand only) sets `next_run_at`, which the replicas'
    schedulers claim with one conditional UPDATE, so a due source is queued once whatever the replica count."""

    __tablename__ = "index_sources"
    id: int | None = Field(default=None, primary_key=True)
    index_id: int = Field(
        sa_column=Column(Integer, ForeignKey("indexes.id", ondelete="CASCADE"), nullable=False, index=True)
    )
    kind: str = Field(max_length=16)  # folder | s3
    path: str | None = Field(default=None, max_length=1024)
    bucket: str | None = Field(default=None, max_length=63)
    prefix: str = Field(default="", max_length=1024)
    endpoint: str | None = Field(default=None, max_length=512)
    region: str | None = Field(default=None, max_length=64)
    access_key: str | None = Field(default=None, max_length=256)
    secret_key: str | None = Field(default=None, max_length=1024)
    every: int | None = None  # minutes between scheduled runs
    next_run_at: datetime | None = Field(default=None, index=True)
    last_job_id: int | None = None
    last_summary: dict = (
        json_dict_column()
    )  # the last run's counts: added, changed, removed, unchanged, failed
    created_by: int | None = None
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)


class IndexSourceFile(SQLModel, table=True):
    """What a source's syncs wrote: per source path, the size and stamp seen and the hash indexed under
    (dataset, filename), so an unchanged file is not read again and only a document the source wrote is removed
    when its file goes (contract/sync.py)."""

    __tablename__ = "index_source_files"
    __table_args__ = (UniqueConstraint("source_id", "path", name="uq_index_source_files_path"),)
    id: int | None = Field(default=None, primary_key=True)
    source_id: int = Field(
        sa_column=Column(
            Integer, ForeignKey("index_sources.id", ondelete="CASCADE"), nullable=False, index=True
        )
    )
    path: str = Field(max_length=1024)
    size: int = Field(default=0, sa_column=Column(BigInteger, nullable=False, default=0))
    stamp: str = Field(default="", max_length=200)
    sha256: str = Field(default="", max_length=64)
    dataset: str = Field(default="default", max_length=64)
    filename: str = Field(max_length=255)
    # The lasting failure of the file's last try (size, stamp and sha256 of what failed, code, error): the
    # next runs do not send it to the worker again while it is unchanged. NULL when it did not fail.
    failure: dict | None = Field(default=None, sa_column=Column(JSON, nullable=True))


class SchemaMigration(SQLModel, table=True):
    __tablename__ = "schema_migrations"
    version: int = Field(primary_key=True)
    name: str
    applied_at: datetime = Field(default_factory=utcnow)


def _initial_schema(conn: Connection) -> None:
    tables = [m.__table__ for m in (User, Chat, Message, Index, IndexDocument, ChatIndex, SettingRow)]
    SQLModel.metadata.create_all(conn, tables=tables)


def _account_security(conn: Connection) -> None:
    """Token versions, disabled accounts and the first-admin seat (a database created at version 1 lacks
    them; one created now has them from the models already)."""
    columns = {c["name"] for c in inspect(conn).get_columns("users")}
    added = {
        "first_admin": "BOOLEAN NULL",
        "token_version": "INTEGER NOT NULL DEFAULT 0",
        "disabled": "BOOLEAN NOT NULL DEFAULT FALSE",
    }
    for name, ddl in added.items():
        if name not in columns:
            conn.execute(text(f"ALTER TABLE users ADD COLUMN {name} {ddl}"))
    if "first_admin" not in columns:
        conn.execute(
            text(
                "UPDATE users SET first_admin = TRUE WHERE id = "
                "(SELECT MIN(id) FROM users WHERE is_admin = TRUE)"
            )
        )
    conn.execute(text("CREATE UNIQUE INDEX IF NOT EXISTS uq_users_first_admin ON users (first_admin)"))


def _turn_lifecycle(conn: Connection) -> None:
    """The running turn's columns on chats (a database made before version 3 has none of them)."""
    if not inspect(conn).has_table("chats"):
        return  # nothing to add to (a hand-made database); the models create the table with these columns
    present = {c["name"] for c in inspect(conn).get_columns("chats")}
    for name in ("turn_message_id", "turn_owner", "turn_heartbeat_at", "turn_stop_at"):
        if name not in present:
            column = Chat.__table__.c[name]
            kind = column.type.compile(dialect=conn.dialect)
            conn.execute(text(f"ALTER TABLE chats ADD COLUMN {name} {kind}"))


def _answer_whole(conn: Connection) -> None:
    """The finished answer stored whole on its message (`messages.answer`); the answers of messages stored
    before are rebuilt from their columns, so older chats still render and rejoin as newer ones."""
    if not inspect(conn).has_table("messages"):
        return
    if "answer" not in {c["name"] for c in inspect(conn).get_columns("messages")}:
        kind = Message.__table__.c["answer"].type.compile(dialect=conn.dialect)
        conn.execute(text(f"ALTER TABLE messages ADD COLUMN answer {kind}"))
    # The columns as they were at version 3 (not the model's, which may grow after this migration).
    old = table(
        "messages",
        column("id"),
        column("chat_id"),
        column("role"),
        column("content"),
        column("status"),
        column("route"),
        column("rewritten"),
        *(column(name, JSON) for name in ("documents", "citations", "timings", "details", "answer")),
    )
    rows = conn.execute(old.select().order_by(old.c.chat_id, old.c.id)).mappings().all()
    chat_id, question, history = None, "", []
    for row in rows:
        if row["chat_id"] != chat_id:
            chat_id, question, history = row["chat_id"], "", []
        if row["role"] == "user":
            question = row["content"]
            continue
        if row["role"] != "assistant" or row["status"] != "complete":
            continue
        history = [
            *history,
            {"role": "user", "content": question},
            {"role": "assistant", "content": row["content"]},
        ]
        if row["answer"] is None:
            answer = from_columns(dict(row), question, history)
            if answer is not None:
                conn.execute(old.update().where(old.c.id == row["id"]).values(answer=answer))


def _login_failures(conn: Connection) -> None:
    """Failed logins counted in the database (they were counted in each process's memory)."""
    LoginFailure.__table__.create(conn, checkfirst=True)


def _teams(conn: Connection) -> None:
    """Groups, their members, index grants and the audit log. Every index keeps its owner; nothing is shared."""
    for model in (Group, GroupMember, IndexGrant, AuditEvent):
        model.__table__.create(conn, checkfirst=True)


def _api_keys(conn: Connection) -> None:
    """API keys per user (gateway/keys.py)."""
    ApiKey.__table__.create(conn, checkfirst=True)


def _step_log(conn: Connection) -> None:
    """The step log of finished turns (turn_steps); turns finished before it have no rows."""
    TurnStep.__table__.create(conn, checkfirst=True)


def _feedback(conn: Connection) -> None:
    """Ratings of answers and the indexes each rated answer drew on (gateway/feedback.py has the models)."""
    from .feedback import migrate_feedback

    migrate_feedback(conn)


def _jobs(conn: Connection) -> None:
    """Background jobs (uploads, rebuilds, syncs) and their files (gateway/jobs/)."""
    for model in (Job, JobFile):
        model.__table__.create(conn, checkfirst=True)


def _index_sources(conn: Connection) -> None:
    """Sources an index syncs from (folders, buckets) and what their syncs wrote (gateway/sync/)."""
    for model in (IndexSource, IndexSourceFile):
        model.__table__.create(conn, checkfirst=True)


def _index_languages(conn: Connection) -> None:
    """Each index's embedder and full-text language (a database made before version 12 lacks the columns; its
    rows stay NULL until the gateway has read the worker's marker of each, see gateway/indexes/settings.py)."""
    if not inspect(conn).has_table("indexes"):
        return  # made whole, with the columns, from the models
    columns = {c["name"] for c in inspect(conn).get_columns("indexes")}
    for name, ddl in {"embedder": "VARCHAR(64) NULL", "language": "VARCHAR(16) NULL"}.items():
        if name not in columns:
            conn.execute(text(f"ALTER TABLE indexes ADD COLUMN {name} {ddl}"))


def _sync_failures(conn: Connection) -> None:
    """A sync file's lasting failure, so an unchanged file the worker refused is not sent again every run."""
    if not inspect(conn).has_table("index_source_files"):
        return  # made whole, with the column, from the model
    columns = {c["name"] for c in inspect(conn).get_columns("index_source_files")}
    if "failure" not in columns:
        conn.execute(text("ALTER TABLE index_source_files ADD COLUMN failure JSON NULL"))


def _rate_events(conn: Connection) -> None:
    """Rate limits and `/v1` turns counted in the database (they were counted in each process's memory)."""
    RateEvent.__table__.create(conn, checkfirst=True)
    RunningTurn.__table__.create(conn, checkfirst=True)


# (version, name, change). Append only; a deployed version is never edited.
MIGRATIONS: list[tuple[int, str, Callable[[Connection], None]]] = [
    (1, "initial schema", _initial_schema),
    (2, "account security: token versions, disabled accounts, one first admin", _account_security),
    (3, "turn lifecycle: running turn, owner, heartbeat, stop", _turn_lifecycle),
    (4, "the answer stored whole on its message", _answer_whole),
    (5, "failed logins counted in the database", _login_failures),
    (6, "teams: groups, index grants, the audit log", _teams),
    (7, "API keys per user", _api_keys),
    (8, "the step log: each finished turn's steps in turn_steps", _step_log),
    (9, "ratings of answers (feedback) and the indexes they drew on", _feedback),
    (10, "jobs: uploads, rebuilds and syncs in the background, with their files", _jobs),
    (
        11,
        "index sources: folders and buckets an index syncs from, and what their syncs wrote",
        _index_sources,
    ),
    (12, "each index's embedder and full-text language", _index_languages),
    (13, "a sync file's lasting failure, kept until the file changes", _sync_failures),
    (14, "rate limits and /v1 turns counted in the database, shared by every gateway process", _rate_events),
]
SCHEMA_VERSION = MIGRATIONS[-1][0]


def read_only(model: type[T], row: Any) -> T:
    """A row read with Core (`select(Model.__table__)`), as the model, to read only: built without the ORM's
    identity map and loading, which cost a turn's hot path more than the query itself. It belongs to no session
    and never may (added to one, it would be inserted as a new row)."""
    return model.model_construct(**row._mapping)


READ_ONLY = "gateway_read_only"  # the execution option of Database.read's sessions
MIGRATION_LOCK_KEY = 0x6761_7465_776179  # Postgres advisory lock of migrate(): "gateway" in hex


def make_engine(url: str) -> Engine:
    if not url.startswith("sqlite"):
        return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)
    path = make_url(url).database  # None for "sqlite://" (in memory), not a file named "sqlite:"
    if path and path != ":memory:":
        private_file(Path(path))
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:
        # Let SQLAlchemy's "begin" below open transactions instead of pysqlite's implicit ones.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn) -> None:
        # IMMEDIATE takes the write lock up front: a read-then-write transaction can otherwise fail with
        # "database is locked" at once instead of waiting its turn (SQLite does not upgrade under contention).
        # A read-only session (Database.read) begins deferred: in WAL mode it reads its snapshot beside the
        # writer and never waits for the write lock (nor holds it while other requests wait).
        # Sent to the driver's connection itself: every transaction begins here, and SQLAlchemy's own execution
        # of one statement costs more CPU than SQLite's work on it.
        begin = "BEGIN" if conn.get_execution_options().get(READ_ONLY) else "BEGIN IMMEDIATE"
        conn.connection.driver_connection.execute(begin)

    return engine


def private_file(path: Path) -> None:
    """Create the SQLite file 0600 (in a 0700 folder) before SQLite does, with the umask's 0644: SQLite gives
    its -wal and -shm files the database file's mode."""
    private_dir(path.parent)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


class TimedSession(Session):
    """A session whose time held (from `with` to its end) feeds gateway_db_session_seconds."""

    def __enter__(self):
        self._opened = time.monotonic()
        return super().__enter__()

    def __exit__(self, *exc_info):
        try:
            return super().__exit__(*exc_info)
        finally:
            from .metrics import DB_SESSION

            DB_SESSION.observe(time.monotonic() - self._opened)


@contextlib.contextmanager
def timed(begin: Any):
    """A Core transaction (`engine.begin()`) timed into gateway_db_session_seconds as sessions are."""
    opened = time.monotonic()
    try:
        with begin as conn:
            yield conn
    finally:
        from .metrics import DB_SESSION

        DB_SESSION.observe(time.monotonic() - opened)


class Database:
    """The engine plus a session factory; `migrate()` brings the schema to SCHEMA_VERSION."""

    def __init__(self, url: str):
        self.url = url
        self.engine = make_engine(url)
        # The same pool; on SQLite its transactions begin deferred (make_engine). Postgres is unchanged.
        self.read_engine = self.engine.execution_options(**{READ_ONLY: True})

    def session(self) -> Session:
        """A session that may write: on SQLite it holds the write lock from its first statement."""
        return TimedSession(self.engine, expire_on_commit=False)

    def read(self) -> Session:
        """A session that only reads: on SQLite it takes no write lock, so it never queues behind a writer.
        A write in it could fail at once with "database is locked" under contention: never write in one."""
        return TimedSession(self.read_engine, expire_on_commit=False)

    def write(self) -> Any:
        """A Core connection in one write transaction (commits at the end of `with`): the hot path's few
        statements without the ORM's unit of work."""
        return timed(self.engine.begin())

    def migrate(self) -> int:
        """Apply the migrations not applied yet. Safe with several processes starting at once: each migration
        runs in a transaction that first takes the database's migration lock (SQLite: its write lock, BEGIN
        IMMEDIATE; Postgres: an advisory lock) and checks again that nobody applied it meanwhile."""
        with self.engine.begin() as conn:
            self._migration_lock(conn)
            SchemaMigration.__table__.create(conn, checkfirst=True)
        with self.read() as s:
            applied = set(s.exec(select(SchemaMigration.version)).all())
        versions = SchemaMigration.__table__.c.version
        for version, name, change in MIGRATIONS:
            if version in applied:
                continue
            with self.engine.begin() as conn:
                self._migration_lock(conn)
                if conn.execute(select(versions).where(versions == version)).first() is not None:
                    log.info("migration %d was applied by another process", version)
                    continue
                change(conn)
                conn.execute(
                    SchemaMigration.__table__.insert().values(version=version, name=name, applied_at=utcnow())
                )
            log.info("database migrated to version %d (%s)", version, name)
        return self.current_version()

    @staticmethod
    def _migration_lock(conn: Connection) -> None:
        """Held until the transaction ends. SQLite's BEGIN IMMEDIATE (make_engine) already serialises writers."""
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})

    def current_version(self) -> int:
        with self.session() as s:
            versions = s.exec(select(SchemaMigration.version)).all()
        return max(versions, default=0)

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    def dispose(self) -> None:
        self.engine.dispose()
