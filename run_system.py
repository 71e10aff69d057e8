#!/usr/bin/env python3
"""Start, check, stop and read the logs of the local stack: the rag_worker and the gateway (which serves the web).

    python run_system.py                 start both, wait until healthy, print where to chat; Ctrl-C stops both
    python run_system.py --health        table of Ollama, worker and gateway; non-zero exit names what is unhealthy
    python run_system.py --stop          stop exactly the processes a running start launched (from its pid file)
    python run_system.py --logs [-f]     tail logs/worker.log and logs/gateway.log
    python run_system.py --worker-only   only the worker (its HTTP API, for other programs)
    python run_system.py --no-web        worker and gateway API, without serving the web chat

Each service runs as a child process in its own process group, so Ctrl-C reaches only this supervisor, which
then stops the children in order and waits until they are gone. A child that dies is reported with the end of
its log and the whole system stops: a crash loop hidden behind automatic restarts helps nobody.
Linux and macOS (process groups); relative INDEX_STORE / UPLOADS_DIR are relative to this folder.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent
PID_FILE = "run_system.json"
# gunicorn's graceful_timeout is 20 s and uvicorn's graceful shutdown 35 s (streams in flight finish); a margin
# on top before SIGKILL.
STOP_GRACE_S = 40.0


# --------------------------------------------------------------------------------------------- processes


def proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state first), or None without /proc or process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()


def start_ticks(pid: int) -> str | None:
    """When the process started (clock ticks since boot): a pid plus this names one process, never a reused pid."""
    fields = proc_stat(pid)
    return fields[19] if fields else None


def is_alive(pid: int, ticks: str | None = None) -> bool:
    if Path("/proc").is_dir():
        fields = proc_stat(pid)
        if fields is None or fields[0] == "Z":
            return False
        return ticks is None or fields[19] == ticks
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_members(pgid: int) -> list[int]:
    """Live processes in process group `pgid` (gunicorn's forked workers live in the master's group)."""
    if not Path("/proc").is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = proc_stat(int(entry.name))
            if fields and fields[0] != "Z" and fields[2] == str(pgid):
                members.append(int(entry.name))
    return members


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_group(name: str, pid: int, ticks: str | None, grace: float = STOP_GRACE_S) -> bool:
    """SIGTERM the group a child leads, SIGKILL what is left after `grace`. True when nothing of it remains."""
    if not is_alive(pid, ticks) and not group_members(pid):
        return True
    if is_alive(pid, ticks) or ticks is None:
        signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and group_members(pid):
        time.sleep(0.2)
    if group_members(pid):
        print(f"  {name} did not stop within {grace:.0f} s: killing it", flush=True)
        signal_group(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and group_members(pid):
            time.sleep(0.1)
    return not group_members(pid)


@dataclass
class Child:
    name: str
    args: list[str]
    url: str
    log_path: Path
    env: dict[str, str]
    proc: subprocess.Popen | None = None
    ticks: str | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(self.args)}\n".encode())
            log.flush()
            # start_new_session: own process group, so a terminal's Ctrl-C reaches only the supervisor.
            self.proc = subprocess.Popen(
                self.args,
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.ticks = start_ticks(self.proc.pid)

    def record(self) -> dict:
        assert self.proc is not None
        return {
            "name": self.name,
            "pid": self.proc.pid,
            "ticks": self.ticks,
            "url": self.url,
            "log": str(self.log_path),
        }

    def stop(self) -> bool:
        if self.proc is None:
            return True
        gone = stop_group(self.name, self.proc.pid, self.ticks)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        return gone


def tail(path: Path, lines: int = 20) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            return "\n".join(fh.read().decode("utf-8", "replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# --------------------------------------------------------------------------------------------- HTTP probes


@dataclass
class Probe:
    status: int | None  # HTTP status, None when nothing answered
    body: dict = field(default_factory=dict)
    error: str | None = None


def get_json(url: str, timeout: float = 5.0, headers: dict[str, str] | None = None) -> Probe:
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers or {}), timeout=timeout
        ) as resp:
            return Probe(resp.status, _json_or_empty(resp.read()))
    except urllib.error.HTTPError as exc:
        return Probe(exc.code, _json_or_empty(exc.read()), f"HTTP {exc.code}")
    except (urllib.error.URLError, OSError) as exc:
        return Probe(None, {}, str(getattr(exc, "reason", exc)))


def _json_or_empty(raw: bytes) -> dict:
    try:
        data = json.loads(raw.decode("utf-8"))
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def describe_llm(llm: dict) -> str:
    """One line from the worker's /health `llm` part: the Ollama model, or the embedded model and why."""
    if not llm:
        return "unknown (the worker's /health has no llm part)"
    backend = str(llm.get("backend") or "?")
    model = llm.get("generation_model") or llm.get("model") or "?"
    reason = llm.get("reason") or ""
    if backend == "openai":
        server = llm.get("openai") or {}
        text = f"OpenAI-compatible server, model {model} at {server.get('base_url') or '?'}"
        return text if llm.get("ok") else f"{text} -- {reason}"
    if backend == "ollama":
        ollama = llm.get("ollama") or {}
        text = f"Ollama, model {model}" + (f" at {ollama['host']}" if ollama.get("host") else "")
        # The reason of a working Ollama only repeats the line; a failing one says what to fix.
        return text if ollama.get("reachable", True) and "not pulled" not in reason else f"{text} -- {reason}"
    return f"embedded model {model} ({reason})" if reason else f"embedded model {model}"


def worker_auth(settings) -> dict[str, str]:
    """The worker's /health shows its details only to callers with the key (when one is set)."""
    key = settings.worker_api_key
    return {"Authorization": f"Bearer {key.get_secret_value()}"} if key is not None else {}


def wait_healthy(child: Child, timeout: float, headers: dict[str, str] | None = None) -> Probe:
    """Wait until the child's /health answers with JSON (200 ok, or 503 degraded: it is up and says why)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert child.proc is not None
        if child.proc.poll() is not None:
            raise StartupError(f"{child.name} exited with code {child.proc.returncode} while starting", child)
        probe = get_json(child.url + "/health", timeout=5, headers=headers)
        if probe.status is not None and probe.body:
            return probe
        time.sleep(0.3)
    raise StartupError(f"{child.name} did not answer {child.url}/health within {timeout:.0f} s", child)


class StartupError(RuntimeError):
    def __init__(self, message: str, child: Child | None = None):
        super().__init__(message)
        self.child = child


class Shutdown(Exception):
    """Raised in the supervisor by SIGTERM (Ctrl-C raises KeyboardInterrupt)."""


# --------------------------------------------------------------------------------------------- configuration


def load_settings():
    sys.path.insert(0, str(ROOT))
    from pydantic import ValidationError

    from rag_worker.settings import Settings

    try:
        return Settings()
    except ValidationError as exc:
        raise SystemExit(f"invalid worker configuration in the environment:\n{exc}") from None


def project_path(p: Path) -> Path:
    return p if p.is_absolute() else (ROOT / p).resolve()


def client_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def read_pid_file(logs_dir: Path) -> dict | None:
    try:
        return json.loads((logs_dir / PID_FILE).read_text())
    except (OSError, ValueError):
        return None


def write_pid_file(logs_dir: Path, data: dict) -> None:
    tmp = logs_dir / (PID_FILE + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(logs_dir / PID_FILE)


def remove_pid_file(logs_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (logs_dir / PID_FILE).unlink()


# --------------------------------------------------------------------------------------------- Ollama


def report_ollama(settings) -> None:
    """Before starting: is Ollama there, are the configured models pulled, and how to fix it if not."""
    from rag_worker.preflight import advice, configured_models, probe_ollama

    if settings.llm_backend == "local":
        print("LLM:     LLM_BACKEND=local: the embedded model answers; Ollama is not used", flush=True)
        return
    if settings.llm_backend == "openai":
        from rag_worker.preflight import openai_status

        st = openai_status(settings)
        if st.ready:
            print(f"OpenAI:  {st.base_url} serves {', '.join(configured_models(settings))}", flush=True)
        elif st.reachable:
            print(f"OpenAI:  {st.base_url} does not serve {', '.join(st.missing)}", flush=True)
            print(f"         it serves: {', '.join(st.available) or 'nothing'}", flush=True)
        else:
            print(
                f"OpenAI:  not reachable at {st.base_url or '(OPENAI_BASE_URL unset)'} ({st.error})",
                flush=True,
            )
        return
    models = configured_models(settings)
    status = probe_ollama(settings.ollama_host, models)
    if status.ready:
        print(f"Ollama:  {status.host} has {', '.join(models)}", flush=True)
        return
    if status.reachable:
        print(f"Ollama:  {status.host} is up but missing {', '.join(status.missing)}", flush=True)
    else:
        print(f"Ollama:  not reachable at {status.host} ({status.error})", flush=True)
    for tip in advice(status, settings.llm_backend, container=False):
        print(f"         {tip}", flush=True)


# --------------------------------------------------------------------------------------------- demo index


def store_is_empty(settings) -> bool:
    lancedb_dir = project_path(settings.index_store) / "lancedb"
    return not lancedb_dir.is_dir() or not any(lancedb_dir.iterdir())


def demo_sources() -> list[Path]:
    docs = sorted(
        p for p in (ROOT / "docs").rglob("*") if p.is_file() and p.suffix.lower() in {".md", ".txt"}
    )
    readme = ROOT / "README.md"
    return ([readme] if readme.is_file() else []) + docs


def build_demo_index(env: dict[str, str], logs_dir: Path, timeout: float) -> bool:
    """Index copies of README.md and docs/ as the `demo` index (dataset `docs`), so a newcomer can ask at once."""
    sources = demo_sources()
    if not sources:
        print("Demo:    no README.md or docs/ to index; skipped", flush=True)
        return False
    log_path = logs_dir / "demo-index.log"
    print(
        f"Demo:    first start with an empty store: indexing {len(sources)} project documents as `demo` ...",
        flush=True,
    )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rag-demo-") as tmp:
        dataset = Path(tmp) / "docs"
        dataset.mkdir()
        for src in sources:
            shutil.copy2(src, dataset / src.name)
        with open(log_path, "ab") as log:
            cmd = [sys.executable, "-m", "rag_worker", "index", tmp, "--index", "demo", "--quiet"]
            proc = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                stop_group("demo indexing", proc.pid, None, grace=5)
                rc = None
            except BaseException:
                stop_group("demo indexing", proc.pid, None, grace=5)
                raise
    if rc == 0:
        print(
            f"Demo:    index `demo` ready ({time.monotonic() - started:.0f} s); ask it about this system",
            flush=True,
        )
        return True
    print(
        f"Demo:    indexing failed ({'timeout' if rc is None else f'exit {rc}'}); see {log_path}:", flush=True
    )
    print(tail(log_path, 10), flush=True)
    return False


# --------------------------------------------------------------------------------------------- start


def child_env(settings) -> dict[str, str]:
    env = dict(os.environ)
    # Models load from local files; the hub is unreachable in many deployments (set HF_HUB_OFFLINE=0 to allow it).
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env["PYTHONUNBUFFERED"] = "1"
    # Both services must see the same folders whatever their working directory.
    env["INDEX_STORE"] = str(project_path(settings.index_store))
    env["UPLOADS_DIR"] = str(project_path(settings.uploads_dir))
    return env


def cmd_start(args: argparse.Namespace) -> int:
    logs_dir: Path = args.logs_dir
    logs_dir.mkdir(parents=True, exist_ok=True)
    running = read_pid_file(logs_dir)
    if running and is_alive(running["supervisor"]["pid"], running["supervisor"].get("ticks")):
        print(
            f"already running (supervisor pid {running['supervisor']['pid']}); "
            "stop it with `python run_system.py --stop` first",
            file=sys.stderr,
        )
        return 1
    remove_pid_file(logs_dir)

    settings = load_settings()
    host, chost = args.host, client_host(args.host)
    from rag_worker.security import open_bind_refusal

    refusal = open_bind_refusal(
        [f"{host}:{args.worker_port}"],
        has_key=settings.worker_api_key is not None,
        allow_open=settings.allow_open,
    )
    if refusal:
        print(f"worker: {refusal}", file=sys.stderr)
        return 2
    with_gateway = not args.worker_only
    wanted = [("worker", args.worker_port)] + ([("gateway", args.gateway_port)] if with_gateway else [])
    for name, port in wanted:
        if not port_free(host, port):
            print(
                f"port {port} ({name}) on {host} is already in use: stop what holds it or pass --{name}-port",
                file=sys.stderr,
            )
            return 1

    report_ollama(settings)
    env = child_env(settings)
    worker_url = f"http://{chost}:{args.worker_port}"
    children = [
        Child(
            "worker",
            [sys.executable, "-m", "rag_worker", "serve", "--host", host, "--port", str(args.worker_port)],
            worker_url,
            logs_dir / "worker.log",
            env,
        )
    ]
    if with_gateway:
        gateway_env = {**env, "WORKER_URL": worker_url}
        if args.no_web:
            # The gateway serves WEB_DIR at "/": an empty folder leaves only its API (and /health) answering.
            no_web = logs_dir / "no-web"
            no_web.mkdir(exist_ok=True)
            gateway_env["WEB_DIR"] = str(no_web)
        children.append(
            Child(
                "gateway",
                [sys.executable, "-m", "gateway", "serve", "--host", host, "--port", str(args.gateway_port)],
                f"http://{chost}:{args.gateway_port}",
                logs_dir / "gateway.log",
                gateway_env,
            )
        )

    state = {
        "supervisor": {"pid": os.getpid(), "ticks": start_ticks(os.getpid())},
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        # What the children were started with: --health from another shell checks these, not its own env.
        "ollama": settings.ollama_host,
        "llm_backend": settings.llm_backend,
        "models": [settings.generation_model, settings.utility_model],
        "components": [c.name for c in children],
        "no_web": bool(args.no_web),
        "children": [],
    }
    supervisor = Supervisor(children, logs_dir, state)
    return supervisor.run(args, env, settings)


class Supervisor:
    def __init__(self, children: list[Child], logs_dir: Path, state: dict):
        self.children, self.logs_dir, self.state = children, logs_dir, state
        self.stopping = False

    def _on_sigterm(self, signum, frame) -> None:
        if not self.stopping:
            raise Shutdown()

    def run(self, args: argparse.Namespace, env: dict[str, str], settings) -> int:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            self._start_all(args, env, settings)
            return self._watch()
        except StartupError as exc:
            print(f"\nstart failed: {exc}", file=sys.stderr, flush=True)
            if exc.child is not None:
                print(
                    f"--- last lines of {exc.child.log_path} ---\n{tail(exc.child.log_path, 30)}",
                    file=sys.stderr,
                )
            return 1
        except (KeyboardInterrupt, Shutdown):
            print("\nstopping ...", flush=True)
            return 0
        finally:
            self.stopping = True
            signal.signal(
                signal.SIGINT, signal.SIG_IGN
            )  # a second Ctrl-C must not abandon half-stopped children
            self._stop_all()
            remove_pid_file(self.logs_dir)

    def _start_all(self, args: argparse.Namespace, env: dict[str, str], settings) -> None:
        health: dict[str, Probe] = {}
        for child in self.children:
            print(f"Start:   {child.name} on {child.url} (log: {child.log_path})", flush=True)
            child.start()
            self.state["children"].append(child.record())
            write_pid_file(self.logs_dir, self.state)
            t0 = time.monotonic()
            auth = worker_auth(settings) if child.name == "worker" else None
            health[child.name] = wait_healthy(child, args.timeout, auth)
            status = health[child.name].body.get("status", "?")
            print(f"Up:      {child.name} in {time.monotonic() - t0:.1f} s, status {status}", flush=True)
        if not args.no_demo and store_is_empty(settings):
            build_demo_index(env, self.logs_dir, args.timeout * 3)
        self._banner(health, worker_auth(settings))

    def _banner(self, health: dict[str, Probe], auth: dict[str, str]) -> None:
        worker = get_json(self.children[0].url + "/health", headers=auth)
        llm = describe_llm((worker.body or health["worker"].body).get("llm") or {})
        lines = ["", "Ready."]
        if "gateway" in health:
            gateway = self.children[1].url
            lines.append(
                f"  Chat:    {gateway}/" if not self.state.get("no_web") else f"  API:     {gateway}/api"
            )
        lines += [
            f"  Worker:  {self.children[0].url}  (HTTP API for other programs)",
            f"  LLM:     {llm}",
            f"  Logs:    {self.logs_dir}/  (python run_system.py --logs -f)",
            "  Stop:    Ctrl-C here, or python run_system.py --stop",
        ]
        degraded = [n for n, p in health.items() if p.status != 200]
        if degraded:
            lines.append(
                f"  Note:    {', '.join(degraded)} started degraded; python run_system.py --health says why"
            )
        print("\n".join(lines), flush=True)

    def _watch(self) -> int:
        while True:
            for child in self.children:
                assert child.proc is not None
                rc = child.proc.poll()
                if rc is not None:
                    print(
                        f"\n{child.name} exited unexpectedly with code {rc}; stopping the system.",
                        file=sys.stderr,
                        flush=True,
                    )
                    print(
                        f"--- last lines of {child.log_path} ---\n{tail(child.log_path, 20)}",
                        file=sys.stderr,
                        flush=True,
                    )
                    return 1
            time.sleep(0.5)

    def _stop_all(self) -> None:
        for child in reversed(self.children):  # the gateway first: it holds streams from the worker
            if child.proc is None:
                continue
            gone = child.stop()
            print(
                f"Stopped: {child.name} (pid {child.proc.pid})" + ("" if gone else " -- NOT confirmed gone"),
                flush=True,
            )


# --------------------------------------------------------------------------------------------- stop


def cmd_stop(args: argparse.Namespace) -> int:
    state = read_pid_file(args.logs_dir)
    if state is None:
        print(f"nothing to stop: no pid file at {args.logs_dir / PID_FILE}")
        return 0
    sup = state["supervisor"]
    if is_alive(sup["pid"], sup.get("ticks")):
        # The supervisor stops its children in order and removes the pid file; wait for it.
        os.kill(sup["pid"], signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S * len(state.get("children", [])) + 10
        while time.monotonic() < deadline and is_alive(sup["pid"], sup.get("ticks")):
            time.sleep(0.2)
    left = []
    for child in state.get("children", []):
        # Whatever the supervisor could not stop (or everything, if it was killed) is stopped here, by pid and
        # start time, so a pid reused by an unrelated process is never signalled.
        if not stop_group(child["name"], child["pid"], child.get("ticks")):
            left.append(child)
        else:
            print(f"stopped {child['name']} (pid {child['pid']})")
    if is_alive(sup["pid"], sup.get("ticks")):
        left.append({"name": "supervisor", "pid": sup["pid"]})
    if left:
        print("still running: " + ", ".join(f"{c['name']} (pid {c['pid']})" for c in left), file=sys.stderr)
        return 1
    remove_pid_file(args.logs_dir)
    print("all stopped")
    return 0


# --------------------------------------------------------------------------------------------- health


@dataclass
class Row:
    component: str
    state: str  # ok | degraded | down | absent | not used | not started
    url: str
    detail: str
    healthy: bool


def health_rows(args: argparse.Namespace) -> list[Row]:
    from rag_worker.preflight import configured_models

    settings = load_settings()
    running = read_pid_file(args.logs_dir) or {}
    urls = {c["name"]: c["url"] for c in running.get("children", [])}
    chost = client_host(args.host)
    worker_url = urls.get("worker") if args.worker_port_given is None else None
    worker_url = worker_url or f"http://{chost}:{args.worker_port}"
    gateway_url = urls.get("gateway") if args.gateway_port_given is None else None
    gateway_url = gateway_url or f"http://{chost}:{args.gateway_port}"
    components = running.get("components") or (["worker"] if args.worker_only else ["worker", "gateway"])
    rows: list[Row] = []

    worker = get_json(worker_url + "/health", headers=worker_auth(settings))
    llm = worker.body.get("llm") or {}
    backend = running.get("llm_backend") or settings.llm_backend
    ollama_host = running.get("ollama") or settings.ollama_host
    models = [m for m in running.get("models") or configured_models(settings) if m]
    rows.append(openai_row(settings) if backend == "openai" else ollama_row(ollama_host, backend, models))
    rows.append(_service_row("worker", worker_url, worker, describe_llm(llm) if worker.body else ""))
    if "gateway" in components:
        gateway = get_json(gateway_url + "/health")
        parts = ", ".join(f"{k}: {_part(v)}" for k, v in gateway.body.items() if k != "status")
        rows.append(_service_row("gateway", gateway_url, gateway, parts))
    else:
        rows.append(Row("gateway", "not started", gateway_url, "started with --worker-only", True))
    return rows


def ollama_row(host: str, backend: str, models: list[str]) -> Row:
    from rag_worker.preflight import probe_ollama

    if backend == "local":
        return Row("ollama", "not used", host, "LLM_BACKEND=local", True)
    # With LLM_BACKEND=auto the worker falls back to the embedded model, so a missing Ollama is a warning.
    needed = backend == "ollama"
    st = probe_ollama(host, models)
    if st.ready:
        return Row("ollama", "ok", st.host, f"models pulled: {', '.join(models)}", True)
    if st.reachable:
        pulls = "; ".join(f"ollama pull {m}" for m in st.missing)
        return Row("ollama", "degraded", st.host, f"missing models: {pulls}", not needed)
    note = "" if needed else " (embedded model answers)"
    return Row("ollama", "down" if needed else "absent", st.host, f"{st.error}{note}", not needed)


def openai_row(settings) -> Row:
    """LLM_BACKEND=openai: the OpenAI-compatible server replaces Ollama, and turns fail without it."""
    from rag_worker.preflight import openai_status

    st = openai_status(settings)
    if not st.reachable:
        return Row("openai", "down", st.base_url or "(OPENAI_BASE_URL unset)", st.error or "no answer", False)
    if settings.generation_model in st.missing:
        served = ", ".join(st.available) or "nothing"
        return Row(
            "openai",
            "degraded",
            st.base_url,
            f"does not serve {settings.generation_model} (serves: {served})",
            False,
        )
    note = f"; {', '.join(st.missing)} missing, the generation model stands in" if st.missing else ""
    return Row("openai", "ok", st.base_url, f"serves {settings.generation_model}{note}", True)


def _part(value) -> str:
    if isinstance(value, dict):
        return str(value.get("status") or value.get("ok") or json.dumps(value))
    return str(value)


def _service_row(name: str, url: str, probe: Probe, detail: str) -> Row:
    if probe.status is None:
        return Row(name, "down", url, probe.error or "no answer", False)
    if probe.status == 200:
        return Row(name, "ok", url, detail, True)
    reason = detail or probe.error or f"HTTP {probe.status}"
    return Row(name, probe.body.get("status") or f"HTTP {probe.status}", url, reason, False)


def cmd_health(args: argparse.Namespace) -> int:
    rows = health_rows(args)
    widths = [
        max(len(r.component) for r in rows),
        max(len(r.state) for r in rows),
        max(len(r.url) for r in rows),
    ]
    widths = [max(w, len(h)) for w, h in zip(widths, ("component", "state", "url"), strict=True)]
    print(f"{'component':<{widths[0]}}  {'state':<{widths[1]}}  {'url':<{widths[2]}}  detail")
    for r in rows:
        print(f"{r.component:<{widths[0]}}  {r.state:<{widths[1]}}  {r.url:<{widths[2]}}  {r.detail}")
    bad = [r.component for r in rows if not r.healthy]
    if bad:
        print(f"\nunhealthy: {', '.join(bad)}")
        return 1
    print("\nall healthy")
    return 0


# --------------------------------------------------------------------------------------------- logs


def cmd_logs(args: argparse.Namespace) -> int:
    names = ["worker", "gateway", "demo-index"] if args.logs == "all" else [args.logs]
    paths = [args.logs_dir / f"{n}.log" for n in names]
    existing = [p for p in paths if p.is_file()]
    if not existing:
        print(f"no logs yet in {args.logs_dir}/", file=sys.stderr)
        return 1
    for p in existing:
        print(f"==> {p} <==\n{tail(p, args.lines)}\n", flush=True)
    if not args.follow:
        return 0
    offsets = {p: p.stat().st_size for p in existing}
    try:
        while True:
            for p in paths:
                size = p.stat().st_size if p.is_file() else 0
                start = offsets.get(p, 0)
                if size < start:  # truncated or replaced
                    start = 0
                if size > start:
                    with open(p, "rb") as fh:
                        fh.seek(start)
                        chunk = fh.read(size - start).decode("utf-8", "replace")
                    prefix = f"[{p.stem}] "
                    sys.stdout.write("".join(prefix + line for line in chunk.splitlines(keepends=True)))
                    sys.stdout.flush()
                offsets[p] = size
            time.sleep(0.5)
    except KeyboardInterrupt:
        return 0


# --------------------------------------------------------------------------------------------- CLI


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    action = p.add_mutually_exclusive_group()
    action.add_argument(
        "--health", action="store_true", help="probe Ollama, worker and gateway; exit 1 if unhealthy"
    )
    action.add_argument("--stop", action="store_true", help="stop the processes a running start launched")
    action.add_argument(
        "--logs",
        nargs="?",
        const="all",
        choices=["all", "worker", "gateway", "demo-index"],
        help="print the end of the logs (all, or one service)",
    )
    p.add_argument("-f", "--follow", action="store_true", help="with --logs: keep printing new lines")
    p.add_argument("-n", "--lines", type=int, default=40, help="with --logs: lines per log (default 40)")
    p.add_argument("--worker-only", action="store_true", help="start only the worker")
    p.add_argument("--no-web", action="store_true", help="start the gateway without serving the web chat")
    p.add_argument("--no-demo", action="store_true", help="never build the `demo` index on an empty store")
    p.add_argument(
        "--host",
        default=os.environ.get("RUN_HOST", "127.0.0.1"),
        help="address both services bind to (default 127.0.0.1; 0.0.0.0 exposes them)",
    )
    p.add_argument("--worker-port", type=int, default=None, help="worker port (default $WORKER_PORT or 8001)")
    p.add_argument(
        "--gateway-port", type=int, default=None, help="gateway port (default $GATEWAY_PORT or 8000)"
    )
    p.add_argument(
        "--logs-dir",
        type=Path,
        default=Path(os.environ.get("RUN_LOGS_DIR", ROOT / "logs")),
        help="logs and the pid file (default ./logs)",
    )
    p.add_argument(
        "--timeout", type=float, default=300.0, help="seconds to wait for each service to be healthy"
    )
    args = p.parse_args(argv)
    args.worker_port_given, args.gateway_port_given = args.worker_port, args.gateway_port
    args.worker_port = args.worker_port or int(os.environ.get("WORKER_PORT", "8001"))
    args.gateway_port = args.gateway_port or int(os.environ.get("GATEWAY_PORT", "8000"))
    args.logs_dir = args.logs_dir.resolve()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.health:
        return cmd_health(args)
    if args.stop:
        return cmd_stop(args)
    if args.logs:
        return cmd_logs(args)
    return cmd_start(args)


if __name__ == "__main__":
    sys.exit(main())
