"""The real worker and the real gateway on loopback, with the fake Ollama; started once per test module.

Every module runs on the gateway's default SQLite file and, when TEST_DATABASE_URL names a server
(scripts/start_postgres.sh, as CI does), again on a fresh Postgres database: the scale-out database path.
"""

from __future__ import annotations

import contextlib
import os

import httpx
import pytest

from tests.integration.ops.postgres import database_urls, fresh_database
from tests.ollama_server import OLLAMA_ENV, FakeOllama
from tests.servers import gateway_process, worker_process

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

MAX_UPLOAD_BYTES = 256 * 1024


@pytest.fixture(scope="module")
def ollama_server():
    with FakeOllama() as fake:
        yield fake


@pytest.fixture
def ollama(ollama_server):
    """The module's fake Ollama, put back to its defaults after a test that tweaks it."""
    yield ollama_server
    ollama_server.reset()


@pytest.fixture(scope="module")
def stack_worker(tmp_path_factory, ollama_server):
    """The module's worker, and the folder it shares with the gateway (uploads, as in deploy/). One for both
    databases: the worker keeps no gateway state, and each gateway's tables have names of their own."""
    tmp = tmp_path_factory.mktemp("gateway-stack")
    worker_env = {
        "OLLAMA_HOST": ollama_server.url,
        "SSE_KEEPALIVE_S": "1",
        "TORCH_THREADS": "1",
        **OLLAMA_ENV,
    }
    with worker_process(tmp, env=worker_env) as worker:
        yield worker, tmp


@pytest.fixture(scope="module", params=database_urls(), ids=lambda url: url.split(":", 1)[0].split("+")[0])
def stack(request, stack_worker, ollama_server):
    """(worker, gateway) sharing one uploads folder, as in deploy/; a gateway of its own per database."""
    worker, tmp = stack_worker
    gateway_env = {
        "MAX_UPLOAD_BYTES": str(MAX_UPLOAD_BYTES),
        "SSE_KEEPALIVE_S": "5",
        "OLLAMA_HOST": ollama_server.url,
    }
    with contextlib.ExitStack() as stack:
        if request.param != "sqlite":
            gateway_env["DATABASE_URL"] = stack.enter_context(fresh_database(request.param))
        gateway = stack.enter_context(gateway_process(tmp, worker_url=worker.url, env=gateway_env))
        yield worker, gateway


@pytest.fixture(scope="module")
def gateway(stack):
    return stack[1]


@pytest.fixture(scope="module")
def api(gateway):
    with httpx.Client(base_url=gateway.url, timeout=300) as client:
        yield client
