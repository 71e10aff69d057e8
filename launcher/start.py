"""Start the worker and the gateway, wait until both answer /health, print where to chat, and watch them.

Each service runs as a child process in its own process group, so Ctrl-C reaches only this supervisor, which
then stops the children in order and waits until they are gone. A child that dies is reported with the end of
its log and the whole system stops: a crash loop hidden behind automatic restarts helps nobody.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from launcher.demo import build_demo_index, store_is_empty
from launcher.ollama import report_ollama
from launcher.paths import (
    client_host,
    load_settings,
    logs_folder,
    port_free,
    project_path,
    read_pid_file,
    remove_pid_file,
    write_pid_file,
)
from launcher.probes import Probe, Shutdown, StartupError, describe_llm, get_json, wait_healthy, worker_auth
from launcher.processes import Child, is_alive, start_ticks, tail


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
    logs_folder(logs_dir)
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
    refused = refuse_start(args, settings)
    if refused:
        return refused
    report_ollama(settings)
    env = child_env(settings)
    children = make_children(args, env)
    supervisor = Supervisor(children, logs_dir, start_state(args, settings, children))
    return supervisor.run(args, env, settings)


def refuse_start(args: argparse.Namespace, settings) -> int:
    """Non-zero (the exit code) after saying why, when the worker would listen open or a port is taken."""
    from rag_worker.security import open_bind_refusal

    host = args.host
    refusal = open_bind_refusal(
        [f"{host}:{args.worker_port}"],
        has_key=settings.worker_api_key is not None,
        allow_open=settings.allow_open,
    )
    if refusal:
        print(f"worker: {refusal}", file=sys.stderr)
        return 2
    wanted = [("worker", args.worker_port)] + ([] if args.worker_only else [("gateway", args.gateway_port)])
    for name, port in wanted:
        if not port_free(host, port):
            print(
                f"port {port} ({name}) on {host} is already in use: stop what holds it or pass --{name}-port",
                file=sys.stderr,
            )
            return 1
    return 0


def make_children(args: argparse.Namespace, env: dict[str, str]) -> list[Child]:
    """The worker, and unless --worker-only the gateway pointed at it; not started yet."""
    host, chost, logs_dir = args.host, client_host(args.host), args.logs_dir
    worker_url = f"http://{chost}:{args.worker_port}"
    env = with_host_allowed(env, chost)
    children = [
        Child(
            "worker",
            [sys.executable, "-m", "rag_worker", "serve", "--host", host, "--port", str(args.worker_port)],
            worker_url,
            logs_dir / "worker.log",
            env,
        )
    ]
    if not args.worker_only:
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
    return children


def with_host_allowed(env: dict[str, str], name: str) -> dict[str, str]:
    """`--host some.name`: the services are reached by that name (the gateway calls the worker by it), so both
    answer to it besides what WORKER_ALLOWED_HOSTS / GATEWAY_ALLOWED_HOSTS already list."""
    from contract.hosts import AllowedHosts

    if AllowedHosts.parse("").allows(name):  # localhost or an address: always answered
        return env
    env = dict(env)
    for key in ("WORKER_ALLOWED_HOSTS", "GATEWAY_ALLOWED_HOSTS"):
        env[key] = ",".join(item for item in (env.get(key, "").strip(), name) if item)
    return env


def start_state(args: argparse.Namespace, settings, children: list[Child]) -> dict:
    """What the pid file records: who supervises, and what the children were started with."""
    return {
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
