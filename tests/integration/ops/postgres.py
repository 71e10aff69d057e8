"""Postgres for tests: `TEST_DATABASE_URL` names a server (scripts/start_postgres.sh prints one); each test gets
a fresh database on it, dropped afterwards, so tests never see each other's rows.

    from tests.integration.ops.postgres import database_urls, fresh_database

    @pytest.fixture(params=database_urls(), ids=lambda u: u.split(":", 1)[0])
    def database_url(request, tmp_path):
        if request.param == "sqlite":
            yield ""  # the gateway's default: SQLite in INDEX_STORE
        else:
            with fresh_database(request.param) as url:
                yield url
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

ENV = "TEST_DATABASE_URL"


def postgres_url() -> str | None:
    return os.environ.get(ENV) or None


def database_urls() -> list[str]:
    """What database-backed tests run against: SQLite always, Postgres too when TEST_DATABASE_URL is set."""
    url = postgres_url()
    return ["sqlite"] + ([url] if url else [])


def _libpq(url: str) -> str:
    """SQLAlchemy's `postgresql+psycopg://` -> the plain URL psycopg itself accepts."""
    scheme, rest = url.split("://", 1)
    return f"{scheme.split('+', 1)[0]}://{rest}"


def _with_database(url: str, name: str) -> str:
    base, _, query = url.partition("?")
    base = base.rsplit("/", 1)[0] if base.count("/") > 2 else base
    return f"{base}/{name}" + (f"?{query}" if query else "")


@contextmanager
def fresh_database(url: str) -> Iterator[str]:
    """Create an empty database on the server `url` points at; yield its URL (same scheme); drop it after."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(_libpq(url), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _with_database(url, name)
    finally:
        with psycopg.connect(_libpq(url), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
