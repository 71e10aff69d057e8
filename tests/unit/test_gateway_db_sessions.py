"""Read-only sessions and the hot path's Core writes on a real SQLite file: a read does not queue behind a
writer, and a running turn's saves report its ownership and a stop asked for elsewhere."""

from __future__ import annotations

import sqlite3
from datetime import timedelta

from gateway import lifecycle
from gateway.db import Chat, Database, Message, User, utcnow
from gateway.sse import Frame
from gateway.turns.state import TurnRecord


def running_turn(db: Database, owner: int, stop: bool = False) -> tuple[int, int]:
    """A chat whose lock is held by a running answer (replica "r1" reading it): (chat id, the answer's id)."""
    with db.session() as s:
        chat = Chat(owner_id=owner)
        s.add(chat)
        s.flush()
        msg = Message(chat_id=chat.id, role="assistant", content="", status="running")
        s.add(msg)
        s.flush()
        chat.turn_started_at = chat.turn_heartbeat_at = utcnow()
        chat.turn_message_id, chat.turn_owner = msg.id, "r1"
        chat.turn_stop_at = utcnow() if stop else None
        s.add(chat)
        s.commit()
        return chat.id, msg.id


def seeded(tmp_path) -> tuple[Database, int, int]:
    db = Database(f"sqlite:///{tmp_path / 'g.db'}")
    db.migrate()
    with db.session() as s:
        user = User(username="ada", password_hash="x")
        s.add(user)
        s.commit()
        owner = user.id
    return db, *running_turn(db, owner)


def test_a_read_session_reads_while_another_connection_holds_the_write_lock(tmp_path):
    db, chat_id, _ = seeded(tmp_path)
    writer = sqlite3.connect(tmp_path / "g.db", isolation_level=None, timeout=0)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("UPDATE chats SET title = 'being written' WHERE id = ?", (chat_id,))
    try:
        # A write session would wait out SQLite's 30 s busy timeout here and fail; a read one is not blocked.
        with db.read() as s:
            assert s.get(Chat, chat_id).title is None  # the last committed state
    finally:
        writer.execute("ROLLBACK")
        writer.close()
        db.dispose()


def test_the_periodic_save_and_its_read_only_check_see_ownership_and_a_stop(tmp_path):
    db, chat_id, msg_id = seeded(tmp_path)
    assert lifecycle.save_progress(db, chat_id, msg_id, "partial", None, None) == (True, False)
    assert lifecycle.check_turns(db, [(chat_id, msg_id)]) == [(True, False)]
    assert lifecycle.request_stop(db, chat_id) == msg_id
    assert lifecycle.check_turns(db, [(chat_id, msg_id)]) == [(True, True)]
    assert lifecycle.save_progress(db, chat_id, msg_id, None, [{"step": "x"}], None) == (True, True)
    with db.read() as s:
        msg = s.get(Message, msg_id)
        assert (msg.content, msg.steps) == ("partial", [{"step": "x"}])
    # Another turn took the chat: this one is no longer owned, and its save writes nothing.
    with db.write() as conn:
        conn.execute(Chat.__table__.update().values(turn_message_id=msg_id + 100))
    assert lifecycle.check_turns(db, [(chat_id, msg_id)]) == [(False, False)]
    assert lifecycle.save_progress(db, chat_id, msg_id, "lost", None, None) == (False, False)
    with db.read() as s:
        assert s.get(Message, msg_id).content == "partial"
    db.dispose()


def test_the_beats_of_several_turns_in_one_write_each_see_its_own_ownership_and_stop(tmp_path):
    db, chat_id, msg_id = seeded(tmp_path)
    old = utcnow() - timedelta(seconds=60)
    with db.session() as s:  # a second running turn, and a third chat whose turn another replica took over
        owner = s.get(Chat, chat_id).owner_id
        chats = [Chat(owner_id=owner), Chat(owner_id=owner)]
        for chat in chats:
            s.add(chat)
        s.flush()
        msgs = [Message(chat_id=chat.id, role="assistant", content="", status="running") for chat in chats]
        for msg in msgs:
            s.add(msg)
        s.flush()
        for chat, msg in zip(chats, msgs, strict=True):
            chat.turn_started_at, chat.turn_heartbeat_at, chat.turn_message_id = old, old, msg.id
            s.add(chat)
        s.commit()
        (second, second_msg), (lost, lost_msg) = [(c.id, m.id) for c, m in zip(chats, msgs, strict=True)]
    with db.write() as conn:  # the first turn's heartbeat is old too; the third chat runs another answer now
        conn.execute(
            Chat.__table__.update().where(Chat.__table__.c.id == chat_id).values(turn_heartbeat_at=old)
        )
        conn.execute(
            Chat.__table__.update().where(Chat.__table__.c.id == lost).values(turn_message_id=lost_msg + 100)
        )
    assert lifecycle.request_stop(db, second) == second_msg
    turns = [(chat_id, msg_id), (second, second_msg), (lost, lost_msg)]
    # A read only: nothing written.
    assert lifecycle.check_turns(db, turns) == [(True, False), (True, True), (False, False)]
    with db.read() as s:
        assert all(lifecycle.aware(s.get(Chat, c).turn_heartbeat_at) == old for c, _ in turns)
    # With the beats of all three: each owned turn's heartbeat written, the lost one's left to its new owner.
    assert lifecycle.check_turns(db, turns, beat=[chat_id, second, lost]) == [
        (True, False),
        (True, True),
        (False, False),
    ]
    with db.read() as s:
        beats = {c: lifecycle.aware(s.get(Chat, c).turn_heartbeat_at) for c, _ in turns}
    assert beats[chat_id] > old and beats[second] > old and beats[lost] == old
    db.dispose()


def test_a_turn_waiting_in_the_queue_has_one_step_to_save_not_one_per_position():
    rec = TurnRecord()
    for position in (5, 4, 3, 2, 1):
        rec.see(Frame(raw="", event="step", data={"step": "queued", "position": position}))
    assert rec.step_changes == 1 and len(rec.steps) == 5  # every position relayed and kept, saved once
    rec.see(Frame(raw="", event="step", data={"step": "retrieving"}))
    rec.see(Frame(raw="", event="step", data={"step": "queued", "position": 1}))
    assert rec.step_changes == 3 and len(rec.steps) == 7


def test_an_in_memory_database_leaves_no_file_behind(tmp_path, monkeypatch):
    """`sqlite://` is an in-memory database: nothing named `sqlite:` appears where the process runs."""
    from gateway.db import make_engine

    monkeypatch.chdir(tmp_path)
    engine = make_engine("sqlite://")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT 1").scalar() == 1
    engine.dispose()
    assert list(tmp_path.iterdir()) == []
