"""Start real servers on loopback for integration tests: free ports, child processes, readiness waits."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"


def shared_absent_reason(path: Path) -> str:
    return (
        f"needs the project's shared fixtures ({path}): ../shared is not beside this checkout "
        "(a bare clone); the rest of the suite runs without it"
    )


def needs_shared(relative: str = "") -> pytest.MarkDecorator:
    """Skip, saying why, when ../shared (or the part of it a test reads) is not there."""
    path = SHARED / relative
    return pytest.mark.skipif(not path.exists(), reason=shared_absent_reason(path))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 120.0, proc: subprocess.Popen | None = None) -> None:
    """Wait until `url` answers any HTTP status (the process is up), or fail with its log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before answering {url}")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except urllib.error.HTTPError:
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer within {timeout} s")


class ServerProcess:
    """A child process serving HTTP on 127.0.0.1:port; its output goes to a log file kept for debugging."""

    def __init__(
        self,
        args: list[str],
        port: int,
        env: dict[str, str],
        log_path: Path,
        health_path: str = "/health",
        cwd: Path = ROOT,
        inherit_env: bool = True,
    ):
        self.args, self.port, self.env, self.log_path = args, port, env, log_path
        self.health_path, self.cwd = health_path, cwd
        # False: the child gets `env` only (a container's environment), not the test process's.
        self.inherit_env = inherit_env
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # The child writes to this file for its whole life; the parent's copy of the handle is not needed.
        with open(self.log_path, "ab") as log:
            env = {**os.environ, **self.env} if self.inherit_env else dict(self.env)
            self.proc = subprocess.Popen(
                self.args, cwd=self.cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            wait_http(self.url + self.health_path, timeout=timeout, proc=self.proc)
        except Exception as exc:
            self.stop()
            raise RuntimeError(f"{exc}\n--- log {self.log_path} ---\n{self.log_tail()}") from exc
        return self

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def processes(service: str) -> str:
    """How many processes the fixtures start a service with: TEST_WORKER_WORKERS / TEST_GATEWAY_WORKERS (default
    1; CI may run the suite with 2 of each), unless a test's own env names WORKER_WORKERS / GATEWAY_WORKERS."""
    value = os.environ.get(f"TEST_{service}_WORKERS", "1").strip() or "1"
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"TEST_{service}_WORKERS must be a whole number of at least 1, not {value!r}")
    return value


def worker_process(tmp: Path, *, env: dict[str, str] | None = None, port: int | None = None) -> ServerProcess:
    """The real worker: `python -m rag_worker serve` (gunicorn + gevent) with its data under `tmp`."""
    port = port or free_port()
    base = {
        "INDEX_STORE": str(tmp / "index_store"),
        "UPLOADS_DIR": str(tmp / "shared_uploads"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "WORKER_WORKERS": processes("WORKER"),
    }
    return ServerProcess(
        [sys.executable, "-m", "rag_worker", "serve", "--port", str(port)],
        port,
        {**base, **(env or {})},
        tmp / "logs" / f"worker-{port}.log",
    )


def gateway_process(
    tmp: Path, *, worker_url: str, env: dict[str, str] | None = None, port: int | None = None
) -> ServerProcess:
    """The real gateway: `python -m gateway serve` (uvicorn) with its SQLite file under `tmp`."""
    port = port or free_port()
    base = {
        "INDEX_STORE": str(tmp / "index_store"),
        "UPLOADS_DIR": str(tmp / "shared_uploads"),
        "WORKER_URL": worker_url,
        "GATEWAY_WORKERS": processes("GATEWAY"),
    }
    return ServerProcess(
        [sys.executable, "-m", "gateway", "serve", "--port", str(port)],
        port,
        {**base, **(env or {})},
        tmp / "logs" / f"gateway-{port}.log",
    )
