"""The turn-lifecycle schema and recovery on a real SQLite file: an old database gains the columns, and a turn
whose owner stopped refreshing its heartbeat is marked interrupted with its partial text."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import inspect, text

from gateway import lifecycle
from gateway.db import SCHEMA_VERSION, Chat, Database, Message, User, utcnow

NEW_COLUMNS = {"turn_message_id", "turn_owner", "turn_heartbeat_at", "turn_stop_at"}


def test_a_database_from_before_the_lifecycle_gains_its_columns(tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'old.db'}")
    db.migrate()
    with db.engine.begin() as conn:
        for name in NEW_COLUMNS:
            conn.execute(text(f"ALTER TABLE chats DROP COLUMN {name}"))
        conn.execute(text("DELETE FROM schema_migrations WHERE version = 3"))
    assert not NEW_COLUMNS & {c["name"] for c in inspect(db.engine).get_columns("chats")}
    assert db.migrate() == SCHEMA_VERSION
    assert NEW_COLUMNS <= {c["name"] for c in inspect(db.engine).get_columns("chats")}
    db.dispose()


def test_a_turn_with_a_stale_heartbeat_is_interrupted_and_its_chat_freed(tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'g.db'}")
    db.migrate()
    old = utcnow() - timedelta(seconds=60)
    with db.session() as s:
        user = User(username="u1", password_hash="x")
        s.add(user)
        s.flush()
        dead, alive = Chat(owner_id=user.id), Chat(owner_id=user.id)
        s.add(dead)
        s.add(alive)
        s.flush()
        msgs = {}
        for chat, beat in ((dead, old), (alive, utcnow())):
            q = Message(chat_id=chat.id, role="user", content="q", status="running")
            m = Message(chat_id=chat.id, role="assistant", content="half an ans", status="running")
            s.add(q)
            s.add(m)
            s.flush()
            chat.turn_started_at, chat.turn_heartbeat_at, chat.turn_message_id = old, beat, m.id
            chat.turn_owner = "gone" if chat is dead else "here"
            s.add(chat)
            msgs[chat.id] = (q.id, m.id)
        s.commit()
        dead_id, alive_id = dead.id, alive.id

    assert lifecycle.recover_stale(db, stale_s=10) == 1
    with db.session() as s:
        d, a = s.get(Chat, dead_id), s.get(Chat, alive_id)
        assert d.turn_started_at is None and d.turn_message_id is None
        assert a.turn_started_at is not None, "a live turn must be left alone"
        q, m = (s.get(Message, i) for i in msgs[dead_id])
        assert q.status == m.status == "interrupted" and m.content == "half an ans" and m.error
        assert all(s.get(Message, i).status == "running" for i in msgs[alive_id])
    # The periodic save of a turn that lost its lock says so, and writes nothing.
    owned, _stop = lifecycle.save_progress(db, dead_id, msgs[dead_id][1], "more", None, None)
    assert owned is False
    owned, stop = lifecycle.save_progress(db, alive_id, msgs[alive_id][1], "half an answer", None, None)
    assert owned is True and stop is False
    assert lifecycle.request_stop(db, alive_id) == msgs[alive_id][1]
    assert lifecycle.save_progress(db, alive_id, msgs[alive_id][1], None, None, None) == (True, True)
    assert lifecycle.request_stop(db, dead_id) is None
    db.dispose()
