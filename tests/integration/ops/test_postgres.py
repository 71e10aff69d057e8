"""The scale-out database path: the real gateway on Postgres (DATABASE_URL), when a server is available.

Run `eval "$(scripts/start_postgres.sh)"` first (CI does); without TEST_DATABASE_URL these tests skip.
"""

from __future__ import annotations

import httpx
import pytest

from tests.integration.ops.postgres import postgres_url
from tests.servers import free_port, gateway_process

pytestmark = pytest.mark.skipif(
    postgres_url() is None, reason="TEST_DATABASE_URL not set (scripts/start_postgres.sh)"
)


@pytest.fixture
def database_url():
    from tests.integration.ops.postgres import fresh_database

    with fresh_database(postgres_url()) as url:
        yield url


def test_accounts_live_in_postgres_not_in_the_gateways_folder(tmp_path, database_url):
    env = {"DATABASE_URL": database_url, "JWT_SECRET": "shared-by-replicas"}
    nowhere = f"http://127.0.0.1:{free_port()}"  # no worker: accounts don't need one
    credentials = {"username": "ada", "password": "a long enough passphrase"}

    with gateway_process(tmp_path / "one", worker_url=nowhere, env=env) as first:
        health = httpx.get(first.url + "/health").json()
        assert "error" not in str(health.get("database")).lower(), health
        created = httpx.post(first.url + "/api/auth/register", json=credentials)
        assert created.status_code == 201, created.text

    # A second gateway with its own, empty data folder (another replica) sees the same user: the rows are in
    # Postgres, and with the same JWT_SECRET a token from one replica is valid on the other.
    with gateway_process(tmp_path / "two", worker_url=nowhere, env=env) as second:
        login = httpx.post(second.url + "/api/auth/login", json=credentials)
        assert login.status_code == 200, login.text
        token = created.json()["token"]
        me = httpx.get(second.url + "/api/auth/me", headers={"Authorization": f"Bearer {token}"})
        assert me.status_code == 200 and me.json()["username"] == "ada"
        assert not (tmp_path / "two" / "index_store" / "gateway.db").exists()


def test_a_turns_periodic_save_waits_for_its_final_save_instead_of_deadlocking(database_url):
    """A turn's periodic save (heartbeat, answer so far) may still run when the turn's final save starts: the
    final save writes the chat row first and then the messages (the order SQLAlchemy flushes them in). A periodic
    save that took the message row first and then waited for the chat row deadlocked with it, and Postgres killed
    one of the two: a finished answer was not stored (seen as a 502 from the JSON route, the turn left running)."""
    import threading
    import time

    import psycopg

    from gateway import lifecycle
    from gateway.db import Chat, Database, Message, User, utcnow
    from tests.integration.ops.postgres import _libpq

    db = Database(database_url)
    db.migrate()
    with db.session() as s:
        user = User(username="u1", password_hash="x")
        s.add(user)
        s.flush()
        chat = Chat(owner_id=user.id)
        s.add(chat)
        s.flush()
        question = Message(chat_id=chat.id, role="user", content="q", status="running")
        answer = Message(chat_id=chat.id, role="assistant", content="", status="running")
        s.add(question)
        s.add(answer)
        s.flush()
        chat.turn_started_at = chat.turn_heartbeat_at = utcnow()
        chat.turn_message_id, chat.turn_owner = answer.id, "here"
        s.add(chat)
        s.commit()
        chat_id, question_id, answer_id = chat.id, question.id, answer.id

    final = db.session()  # the final save, as its flush runs: the chat row, then the messages
    row = final.get(Chat, chat_id)
    row.updated_at = utcnow()
    final.add(row)
    final.flush()
    periodic: list = []
    thread = threading.Thread(
        target=lambda: periodic.append(lifecycle.save_progress(db, chat_id, answer_id, "so far", None, None))
    )
    thread.start()
    with psycopg.connect(_libpq(database_url), autocommit=True) as watcher:  # until the periodic save waits
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            waiting = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = "
                "'Lock'"
            ).fetchone()[0]
            if waiting:
                break
            time.sleep(0.02)
        assert waiting, "the periodic save never waited for the final save's lock"
    for message_id, content in ((question_id, "q"), (answer_id, "the whole answer")):
        message = final.get(Message, message_id)
        message.status, message.content = "complete", content
        final.add(message)
    final.flush()
    final.commit()
    final.close()
    thread.join(timeout=30)

    assert periodic == [(True, False)]  # it ran after the final save, and wrote nothing over it
    with db.session() as s:
        assert s.get(Message, answer_id).content == "the whole answer"
        assert s.get(Message, answer_id).status == "complete"
    db.dispose()
