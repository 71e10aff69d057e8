"""run_system.py for real: it starts the real worker and gateway, reports health, survives nothing it shouldn't,
and `--stop` leaves no process behind. Ollama is the fake server (the one stand-in); LLM_BACKEND=ollama keeps the
embedded model out of it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.ollama_server import FakeOllama
from tests.servers import ROOT, free_port

pytestmark = pytest.mark.timeout(900)

GEN, UTIL = "qwen3:8b", "qwen3:0.6b"


# -- independent process checks (not run_system's own, which is what is under test) ---------------------------


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()


def alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def group(pgid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields and fields[0] != "Z" and fields[2] == str(pgid):
                out.append(int(entry.name))
    return out


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


# -- a run_system.py start, driven like a person in a terminal ------------------------------------------------


class RunSystem:
    def __init__(self, tmp: Path, ollama_url: str, *extra: str):
        self.tmp, self.extra = tmp, extra
        self.worker_port, self.gateway_port = free_port(), free_port()
        self.logs = tmp / "logs"
        self.out_path = tmp / f"run_system-{self.worker_port}.out"
        self.env = {
            **os.environ,
            "INDEX_STORE": str(tmp / "index_store"),
            "UPLOADS_DIR": str(tmp / "shared_uploads"),
            "OLLAMA_HOST": ollama_url,
            "LLM_BACKEND": "ollama",
            "GENERATION_MODEL": GEN,
            "UTILITY_MODEL": UTIL,
            "DATABASE_URL": "",
            "JWT_SECRET": "ops-test-secret",
            "WORKER_WORKERS": "1",
            "TORCH_THREADS": "1",
            "HF_HUB_OFFLINE": "1",
        }
        self.env.pop("WORKER_API_KEY", None)
        self.proc: subprocess.Popen | None = None
        self.state: dict = {}

    def cli(self, *args: str, timeout: float = 180, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "run_system.py", "--logs-dir", str(self.logs), *args],
            cwd=ROOT,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def ports(self) -> list[str]:
        return ["--worker-port", str(self.worker_port), "--gateway-port", str(self.gateway_port)]

    def start(self, timeout: float = 600) -> RunSystem:
        with open(self.out_path, "wb") as out:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                [sys.executable, "run_system.py", "--logs-dir", str(self.logs), *self.ports(), *self.extra],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_until(lambda: "Ready." in self.output() or self.proc.poll() is not None, timeout, "Ready.")
        except AssertionError:
            self.cleanup()
            raise
        if "Ready." not in self.output():
            self.cleanup()
            pytest.fail(
                f"run_system.py exited with {self.proc.returncode}:\n{self.output()}\n{self.log_tails()}"
            )
        self.state = json.loads((self.logs / "run_system.json").read_text())
        return self

    def output(self) -> str:
        return self.out_path.read_text(errors="replace") if self.out_path.exists() else ""

    def log_tails(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self.logs.glob("*.log")
        )

    def pid(self, name: str) -> int:
        return next(c["pid"] for c in self.state["children"] if c["name"] == name)

    def all_pids(self) -> dict[str, int]:
        pids = {c["name"]: c["pid"] for c in self.state.get("children", [])}
        if self.proc is not None:
            pids["supervisor"] = self.proc.pid
        return pids

    def cleanup(self) -> None:
        """Whatever a failed test left: stop it through run_system, then make sure by process group."""
        if self.proc is not None and self.proc.poll() is None:
            self.cli("--stop")
        for pid in self.all_pids().values():
            for member in group(pid):
                os.kill(member, signal.SIGKILL)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


# -- the tests ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ollama():
    fake = FakeOllama(models=[GEN, UTIL]).start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def system(tmp_path_factory, ollama):
    """One full start on an empty store (so it builds the demo index), shared by the read-only tests."""
    run = RunSystem(tmp_path_factory.mktemp("ops"), ollama.url).start()
    yield run
    run.cleanup()


def test_start_says_where_to_chat_and_which_model_answers(system):
    out = system.output()
    assert f"Chat:    http://127.0.0.1:{system.gateway_port}/" in out
    assert f"Worker:  http://127.0.0.1:{system.worker_port}" in out
    assert f"LLM:     Ollama, model {GEN}" in out
    assert f"has {GEN}, {UTIL}" in out  # the pre-start check found both configured models pulled
    health = get_json(f"http://127.0.0.1:{system.gateway_port}/health")
    assert health["status"] == "ok"


def test_first_start_builds_a_demo_index_of_the_project_docs(system):
    assert "index `demo` ready" in system.output()
    docs = get_json(f"http://127.0.0.1:{system.worker_port}/get_documents?index=demo")
    names = {d["filename"] for d in docs}
    expected = {p.name for p in (ROOT / "docs").glob("*.md")} | (
        {"README.md"} if (ROOT / "README.md").exists() else set()
    )
    assert expected and expected <= names
    # The archive of earlier measurements is left out: its replaced figures would be cited as current.
    archived = {p.name for p in (ROOT / "docs" / "benchmarks").glob("*.md")}
    assert archived and not archived & names


def test_the_first_user_finds_the_demo_index_in_the_chat(system):
    base = f"http://127.0.0.1:{system.gateway_port}"
    body = json.dumps({"username": "newcomer", "password": "a long enough password"}).encode()
    req = urllib.request.Request(
        base + "/api/auth/register", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        token = json.loads(resp.read())["token"]
    req = urllib.request.Request(base + "/api/indexes", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        indexes = json.loads(resp.read())
    demo = [i for i in indexes if i["name"] == "demo"]
    assert demo and demo[0]["document_count"] >= 1, indexes


def test_health_is_zero_with_everything_up(system):
    # From another terminal whose environment knows nothing of this start: the pid file says what to check.
    result = system.cli("--health", env={"OLLAMA_HOST": "http://127.0.0.1:9", "LLM_BACKEND": "auto"})
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {line.split()[0]: line.split()[1] for line in result.stdout.splitlines()[1:4]}
    assert rows == {"ollama": "ok", "worker": "ok", "gateway": "ok"}, result.stdout
    assert "all healthy" in result.stdout


def test_logs_show_each_service(system):
    result = system.cli("--logs", "-n", "5")
    assert result.returncode == 0
    assert (
        f"{system.logs / 'worker.log'}" in result.stdout and f"{system.logs / 'gateway.log'}" in result.stdout
    )


def test_a_dead_worker_is_reported_and_stops_the_system(system):
    """Last of the module: it takes the shared system down on purpose."""
    worker = system.pid("worker")
    os.killpg(worker, signal.SIGKILL)  # what an out-of-memory kill looks like from outside

    health = system.cli("--health", *system.ports())
    assert health.returncode != 0
    assert "unhealthy: worker" in health.stdout, health.stdout

    # The supervisor notices, says which child died, stops the rest and exits non-zero: no silent restarts.
    assert system.proc.wait(timeout=90) == 1
    assert "worker exited unexpectedly" in system.output()
    for name, pid in system.all_pids().items():
        assert not group(pid), f"{name} (pgid {pid}) still has processes: {group(pid)}"
    assert not (system.logs / "run_system.json").exists()


def test_stop_leaves_no_process_behind(tmp_path):
    # Only the generation model is pulled: the start says how to pull the other one, and still starts.
    fake = FakeOllama(models=[GEN]).start()
    run = RunSystem(tmp_path, fake.url, "--no-demo")
    try:
        run.start()
        assert f"ollama pull {UTIL}" in run.output()
        pids = run.all_pids()
        workers = [p for p in group(pids["worker"]) if p != pids["worker"]]
        assert workers, "gunicorn's worker processes should be in the master's group"
        assert all(alive(p) for p in pids.values())

        result = run.cli("--stop")
        assert result.returncode == 0, result.stdout + result.stderr
        assert run.proc.wait(timeout=30) == 0  # the supervisor exits cleanly when asked to stop

        for name, pid in pids.items():
            assert not alive(pid), f"{name} (pid {pid}) is still running"
            assert not group(pid), f"{name}'s group still has {group(pid)}"
        assert not any(alive(p) for p in workers)
        assert not (run.logs / "run_system.json").exists()
        assert run.cli("--stop").returncode == 0  # stopping twice is harmless
    finally:
        run.cleanup()
        fake.stop()
