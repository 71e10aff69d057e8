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
import os
from pathlib import Path

from launcher.health import cmd_health
from launcher.logs import cmd_logs
from launcher.paths import ROOT
from launcher.start import cmd_start
from launcher.stop import cmd_stop


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
