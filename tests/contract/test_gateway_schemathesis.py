"""Schemathesis (a tool nobody here wrote) against the running gateway, with a real worker behind it (on the
fake Ollama): every check, every phase, stateful included, signed in with an administrator's token. It must
report nothing: no 5xx, no answer that contradicts /api/openapi.json, no schema-valid request refused and no
invalid one accepted.

The first run leaves out logout and the password change, which end every session of the account (the token
schemathesis signs in with); each of those two then runs on its own, with an account of its own.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.ollama_server import OLLAMA_ENV, FakeOllama
from tests.servers import gateway_process, worker_process

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent
ENDS_SESSIONS = ["/api/auth/logout", "/api/auth/password"]


def schemathesis(
    schema_url: str, tmp: Path, token: str, *extra: str, phases: str = "examples,coverage,fuzzing,stateful"
) -> subprocess.CompletedProcess:
    cli = Path(sys.executable).with_name("schemathesis")
    args = [str(cli), "--config-file", str(HERE / "gateway.toml"), "run", schema_url, "--checks", "all"]
    args += ["--phases", phases, "--max-examples", "10", "--seed", "7"]
    args += ["--request-timeout", "120", "-H", f"Authorization: Bearer {token}"]
    args += ["--report", "junit", "--report-dir", str(tmp), *extra]
    return subprocess.run(args, cwd=tmp, capture_output=True, text=True, timeout=900)


def sign_up(gateway_url: str, username: str) -> str:
    r = httpx.post(
        gateway_url + "/api/auth/register",
        json={"username": username, "password": "a long enough passphrase"},
        timeout=60,
    )
    assert r.status_code == 201, r.text
    return r.json()["token"]


@pytest.fixture(scope="module")
def fuzzed_gateway(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzzed-gateway")  # its own stack: the fuzzer creates and drops things
    with contextlib.ExitStack() as stack:
        fake = stack.enter_context(FakeOllama(models=["qwen3:8b", "qwen3:0.6b"]))
        worker_env = {"OLLAMA_HOST": fake.url, "TORCH_THREADS": "1", **OLLAMA_ENV}
        worker = stack.enter_context(worker_process(tmp, env=worker_env))
        # The fuzzer signs in wrongly on purpose: no waiting between failed logins, so the run stays short.
        env = {
            "OLLAMA_HOST": fake.url,
            "LOGIN_BASE_DELAY_S": "0",
            "LOGIN_MAX_DELAY_S": "0",
            "REGISTER_LIMIT": "100000",
        }
        gateway = stack.enter_context(gateway_process(tmp, worker_url=worker.url, env=env))
        yield gateway, tmp


@pytest.mark.timeout(1800)
def test_schemathesis_finds_nothing_wrong_with_the_gateway(fuzzed_gateway):
    gateway, tmp = fuzzed_gateway
    admin = sign_up(gateway.url, "fuzz-admin")  # the first account: the administrator
    excluded = [arg for path in ENDS_SESSIONS for arg in ("--exclude-path", path)]
    result = schemathesis(gateway.url + "/api/openapi.json", tmp, admin, *excluded)
    report = result.stdout[-12000:] + result.stderr[-2000:]
    assert result.returncode == 0, report
    assert "No issues found" in result.stdout or " passed" in result.stdout, report

    # One at a time, each with a fresh account: a logout first would leave the password change only 401s.
    for n, path in enumerate(ENDS_SESSIONS):
        user = sign_up(gateway.url, f"fuzz-sessions-{n}")
        # Alone, an operation has no links to follow: no stateful phase.
        result = schemathesis(
            gateway.url + "/api/openapi.json",
            tmp,
            user,
            "--include-path",
            path,
            phases="examples,coverage,fuzzing",
        )
        report = result.stdout[-12000:] + result.stderr[-2000:]
        assert result.returncode == 0, report
        assert " passed" in result.stdout, report
