"""Migration 12: a database from before it gains each index's embedder and language columns, its rows left
unknown (NULL) for the gateway to read from the worker; a new database has them from the models."""

from __future__ import annotations

from sqlalchemy import inspect, text

from gateway.db import SCHEMA_VERSION, Database, Index, User


def test_an_older_database_gains_the_columns_and_keeps_its_rows(tmp_path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'g.db'}")
    db.migrate()
    with db.session() as s:
        user = User(username="old", password_hash="x")
        s.add(user)
        s.commit()
        s.add(Index(owner_id=user.id, name="old", worker_name="u1_old_00000000"))
        s.commit()
    # Back to what a gateway before migration 12 left.
    with db.engine.begin() as conn:
        conn.execute(text("ALTER TABLE indexes DROP COLUMN embedder"))
        conn.execute(text("ALTER TABLE indexes DROP COLUMN language"))
        conn.execute(text("DELETE FROM schema_migrations WHERE version = 12"))
    assert db.migrate() == SCHEMA_VERSION
    with db.engine.connect() as conn:
        assert {"embedder", "language"} <= {c["name"] for c in inspect(conn).get_columns("indexes")}
        rows = conn.execute(text("SELECT name, embedder, language FROM indexes")).all()
    assert [tuple(r) for r in rows] == [("old", None, None)]
    assert db.migrate() == SCHEMA_VERSION  # nothing applied twice


def test_a_new_database_has_them_from_the_start(tmp_path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'g.db'}")
    db.migrate()
    with db.session() as s:
        user = User(username="new", password_hash="x")
        s.add(user)
        s.commit()
        s.add(
            Index(
                owner_id=user.id,
                name="n",
                worker_name="u1_n_0",
                embedder="multilingual-e5-small",
                language="ko",
            )
        )
        s.commit()
        row = s.query(Index).one()
    assert (row.embedder, row.language) == ("multilingual-e5-small", "ko")
