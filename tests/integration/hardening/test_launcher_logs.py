"""Issue 27: run_system.py's logs hold every user's file names, so they are created readable by their owner
only (0600), whatever the umask."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
import time

import pytest

from tests.integration.ops.test_run_system import RunSystem
from tests.ollama_server import FakeOllama
from tests.servers import ROOT

pytestmark = pytest.mark.timeout(300)


def test_run_system_creates_its_logs_readable_by_their_owner_only(tmp_path):
    with FakeOllama() as ollama:
        run = RunSystem(tmp_path, ollama.url, "--no-demo", "--worker-only")
        with open(run.out_path, "wb") as out:
            run.proc = subprocess.Popen(
                [sys.executable, "run_system.py", "--logs-dir", str(run.logs), *run.ports(), *run.extra],
                cwd=ROOT,
                env=run.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=lambda: os.umask(0o022),  # the common default: files 0644 unless made otherwise
            )
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not list(run.logs.glob("*.log")):
                assert run.proc.poll() is None, run.output()
                time.sleep(0.1)
            logs = sorted(run.logs.glob("*.log"))
            assert logs, f"no log appeared in {run.logs}: {run.output()}"
            modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in logs}
        finally:
            with contextlib.suppress(Exception):
                json_state = run.logs / "run_system.json"
                deadline = time.monotonic() + 60
                while not json_state.exists() and run.proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.2)
                if json_state.exists():
                    run.state = json.loads(json_state.read_text())
            run.cleanup()
        assert all(m == "0o600" for m in modes.values()), modes
