"""The step log (migration 8) on SQLite and, with TEST_DATABASE_URL, on Postgres: an existing database gains the
table in place, a finished turn's steps are written as rows, the per-stage median query answers with the true
medians on both, only the window asked for counts, and deleting a chat takes its steps with it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import inspect, text
from sqlmodel import col, delete, select

from gateway.db import SCHEMA_VERSION, Chat, Database, Message, TurnStep, User, utcnow
from gateway.turns.steplog import first_tokens, save_steps, stage_medians, step_rows
from tests.integration.ops.postgres import database_urls, fresh_database


@pytest.fixture(params=database_urls(), ids=lambda u: u.split(":", 1)[0].split("+")[0])
def db(request, tmp_path):
    if request.param == "sqlite":
        database = Database(f"sqlite:///{tmp_path / 'g.db'}")
        yield database
        database.dispose()
    else:
        with fresh_database(request.param) as url:
            database = Database(url)
            yield database
            database.dispose()


def steps_of(retrieve_started: int) -> list[dict]:
    """A document turn's step events as the worker streams them: a start and a result per stage."""
    return [
        {"step": "retrieving", "label": "Searching all datasets (hybrid)", "elapsed_ms": retrieve_started},
        {"step": "evaluating", "label": "Checking", "elapsed_ms": retrieve_started + 40},
        {
            "step": "evaluating",
            "label": "Relevant",
            "elapsed_ms": retrieve_started + 55,
            "method": "score",
            "detail": {"relevant": True, "evidence": 0.8},
        },
        {"step": "queued", "label": "Waiting: 1st in line", "elapsed_ms": retrieve_started + 60},
        {"step": "generating", "label": "Writing the answer", "elapsed_ms": retrieve_started + 70},
    ]


def add_turn(db: Database, chat_id: int, retrieve_ms: int, first_token_ms: int, age_h: float = 0) -> int:
    with db.session() as s:
        s.add(Message(chat_id=chat_id, role="user", content="q"))
        msg = Message(chat_id=chat_id, role="assistant", content="a", route="rag")
        s.add(msg)
        s.flush()
        timings = {
            "retrieve_ms": retrieve_ms,
            "evaluate_ms": 15,
            "generate_ms": 300,
            "first_token_ms": first_token_ms,
            "total_ms": first_token_ms + 400,
            "trace_id": "0" * 32,
        }
        save_steps(s, msg.id, steps_of(10), timings)
        if age_h:
            old = utcnow() - timedelta(hours=age_h)
            s.exec(
                text("UPDATE turn_steps SET created_at = :old WHERE message_id = :id").bindparams(
                    old=old, id=msg.id
                )
            )
        s.commit()
        return msg.id


def test_the_step_log_upgrades_in_place_and_answers_per_stage_medians(db) -> None:
    db.migrate()
    # A database from before the step log: no table, version 8 not applied; migrating adds it in place.
    with db.engine.begin() as conn:
        conn.execute(text("DROP TABLE turn_steps"))
        conn.execute(text("DELETE FROM schema_migrations WHERE version = 8"))
    assert not inspect(db.engine).has_table("turn_steps")
    assert db.migrate() == SCHEMA_VERSION
    assert inspect(db.engine).has_table("turn_steps")

    with db.session() as s:
        user = User(username="steps", password_hash="x")
        s.add(user)
        s.flush()
        chat, other = Chat(owner_id=user.id), Chat(owner_id=user.id)
        s.add(chat)
        s.add(other)
        s.commit()
        chat_id, other_id = chat.id, other.id
    first = add_turn(db, chat_id, retrieve_ms=100, first_token_ms=900)
    for retrieve_ms, first_token_ms in ((30, 700), (50, 800), (400, 2000)):
        add_turn(db, other_id, retrieve_ms, first_token_ms)
    add_turn(db, other_id, retrieve_ms=99_999, first_token_ms=99_999, age_h=30)  # outside the last day

    with db.session() as s:
        rows = s.exec(
            select(TurnStep).where(col(TurnStep.message_id) == first).order_by(TurnStep.position)
        ).all()
    # One row per stage (its events merged), timed by the worker where it times the stage, then the clocks.
    assert [(r.step, r.started_ms, r.duration_ms, r.method) for r in rows] == [
        ("retrieving", 10, 100, None),
        ("evaluating", 50, 15, "score"),
        ("queued", 70, 10, None),  # not a timed stage: until the next step
        ("generating", 80, 300, None),
        ("first_token", 0, 900, None),
        ("total", 0, 1300, None),
    ]
    assert rows[1].detail == {"relevant": True, "evidence": 0.8}

    since = utcnow() - timedelta(hours=24)
    with db.session() as s:
        medians = {m["step"]: (m["median_ms"], m["turns"]) for m in stage_medians(s, since)}
        points = first_tokens(s, since)
    # Four turns in the window: an even count's median is the mean of the middle two.
    assert medians["retrieving"] == (75.0, 4)  # 30, 50, 100, 400
    assert medians["first_token"] == (850.0, 4)  # 700, 800, 900, 2000
    assert medians["evaluating"] == (15.0, 4)
    assert sorted(p["ms"] for p in points) == [700, 800, 900, 2000] and {p["route"] for p in points} == {
        "rag"
    }
    with db.session() as s:
        three = {m["step"]: m for m in stage_medians(s, utcnow() - timedelta(hours=48))}
    assert (
        three["retrieving"]["median_ms"] == 100.0 and three["retrieving"]["turns"] == 5
    )  # odd: the middle one

    # Deleting the chat's messages deletes their steps. (A message's steps are saved once, in the final save of
    # its turn: the message is made when the turn starts, so there is nothing to replace.)
    with db.session() as s:
        assert len(s.exec(select(TurnStep).where(col(TurnStep.message_id) == first)).all()) == 6
        s.exec(delete(Message).where(col(Message.chat_id) == chat_id))
        s.commit()
        assert s.exec(select(TurnStep).where(col(TurnStep.message_id) == first)).all() == []


def test_odd_step_events_are_skipped_not_stored() -> None:
    rows = step_rows(
        7,
        [
            {"step": "retrieving", "elapsed_ms": 5},
            {"step": "", "elapsed_ms": 6},
            {"step": "x", "elapsed_ms": -1},
            {"step": "y"},
            {"step": "z" * 100, "elapsed_ms": 8, "method": "m" * 100, "detail": {"big": "d" * 5000}},
        ],
        {"total_ms": True, "first_token_ms": "12"},
    )
    assert [(r["step"], r["duration_ms"]) for r in rows] == [("retrieving", 3), ("z" * 32, None)]
    assert len(rows[1]["method"]) == 64 and rows[1]["detail"] == {}
