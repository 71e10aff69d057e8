"""A chat stored before answers were kept whole (schema version 3) still reads back with its whole answer: the
migration rebuilds each finished answer from the old columns, with its question and the history up to it."""

from __future__ import annotations

import contextlib

import pytest
from sqlalchemy import JSON, column, inspect, table, text
from sqlmodel import col, select

from gateway.chats import message_json
from gateway.db import SCHEMA_VERSION, Chat, Database, Message, User, utcnow
from tests.integration.ops.postgres import database_urls, fresh_database

DOC = {"id": "c1", "filename": "duck.md", "dataset": "birds", "text": "Ducks eat plants.", "ref": "S1"}
GROUNDING = {
    "supported_share": 1.0,
    "supported": 1,
    "checked": 1,
    "sentences": [{"text": "Ducks eat plants [S1].", "label": "supported", "score": 0.9, "refs": ["S1"]}],
}
JSON_COLUMNS = ("documents", "citations", "steps", "timings", "gate", "details")
OLD_MESSAGES = table(
    "messages",
    *(
        column(n)
        for n in ("chat_id", "role", "content", "rewritten", "route", "status", "error", "created_at")
    ),
    *(column(n, JSON) for n in JSON_COLUMNS),
)


@pytest.fixture(params=database_urls(), ids=lambda url: url.split(":", 1)[0].split("+")[0])
def db(request, tmp_path):
    with contextlib.ExitStack() as stack:
        url = f"sqlite:///{tmp_path / 'old.db'}"
        if request.param != "sqlite":
            url = stack.enter_context(fresh_database(request.param))
        database = Database(url)
        yield database
        database.dispose()


def old_message(chat_id: int, role: str, content: str, status: str = "complete", **columns) -> dict:
    row = {n: {} if n in ("timings", "gate", "details") else [] for n in JSON_COLUMNS}
    row.update(chat_id=chat_id, role=role, content=content, status=status, created_at=utcnow())
    row.update(rewritten=None, route="rag", error=None)
    return {**row, **columns}


def test_a_chat_from_before_whole_answers_reads_back_with_them(db):
    db.migrate()
    with db.engine.begin() as conn:  # back to version 3: no answer column
        conn.execute(text("ALTER TABLE messages DROP COLUMN answer"))
        conn.execute(text("DELETE FROM schema_migrations WHERE version = 4"))
    with db.session() as s:
        user = User(username="u1", password_hash="x")
        s.add(user)
        s.flush()
        chat = Chat(owner_id=user.id)
        s.add(chat)
        s.commit()
        chat_id = chat.id
    details = {"model": "qwen3:8b", "abstained": False, "fetched_new_documents": True, "grounding": GROUNDING}
    citation = {"ref": "S1", "id": "c1", "filename": "duck.md", "page": None}
    rows = [
        old_message(chat_id, "user", "What do ducks eat?"),
        old_message(
            chat_id,
            "assistant",
            "Ducks eat plants [S1].",
            documents=[DOC],
            citations=[citation],
            rewritten="What do ducks eat?",
            timings={"total_ms": 1200},
            details=details,
            steps=[{"step": "retrieving", "label": "Searching documents", "elapsed_ms": 5}],
        ),
        old_message(chat_id, "user", "And geese?", status="interrupted"),
        old_message(chat_id, "assistant", "Geese", status="interrupted", error="stopped by the user"),
        old_message(chat_id, "user", "Thanks!"),
        old_message(chat_id, "assistant", "You're welcome.", route="direct", details={"model": "qwen3:8b"}),
    ]
    with db.engine.begin() as conn:
        conn.execute(OLD_MESSAGES.insert(), rows)
    assert "answer" not in {c["name"] for c in inspect(db.engine).get_columns("messages")}

    assert db.migrate() == SCHEMA_VERSION  # migration 4 and any after it
    with db.session() as s:
        messages = s.exec(select(Message).where(Message.chat_id == chat_id).order_by(col(Message.id))).all()
        shown = [message_json(m) for m in messages]

    first, stopped, last = shown[1], shown[3], shown[5]
    asked = [
        {"role": "user", "content": "What do ducks eat?"},
        {"role": "assistant", "content": "Ducks eat plants [S1]."},
    ]
    assert (
        first["answer"]["reply"] == "Ducks eat plants [S1]."
        and first["answer"]["question"] == "What do ducks eat?"
    )
    assert first["answer"]["history"] == asked
    assert [d["text"] for d in first["answer"]["documents"]] == ["Ducks eat plants."]
    assert first["answer"]["citations"][0]["ref"] == "S1" and first["answer"]["grounding"]["supported"] == 1
    assert first["answer"]["model"] == "qwen3:8b" and first["answer"]["fetched_new_documents"] is True
    assert (
        first["answer"]["timings"] == {"total_ms": 1200}
        and first["answer"]["rewritten"] == "What do ducks eat?"
    )
    # The older fields read as before.
    assert first["documents"][0]["id"] == "c1" and first["citations"] == [citation]
    assert first["details"]["grounding"] == GROUNDING and first["rewritten"] == "What do ducks eat?"
    assert first["steps"][0]["step"] == "retrieving"
    # An answer that did not finish has none; the history skips it, as the worker's did.
    assert stopped["answer"] is None and stopped["content"] == "Geese"
    assert last["answer"]["question"] == "Thanks!" and last["answer"]["route"] == "direct"
    assert last["answer"]["history"] == [
        *asked,
        {"role": "user", "content": "Thanks!"},
        {"role": "assistant", "content": "You're welcome."},
    ]
    assert db.migrate() == SCHEMA_VERSION  # a second start applies nothing twice
