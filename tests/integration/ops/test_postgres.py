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
