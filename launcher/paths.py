"""Where things are: the project folder, the pid file a running start leaves, the settings, free ports."""

from __future__ import annotations

import contextlib
import json
import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PID_FILE = "run_system.json"
# gunicorn's graceful_timeout is 20 s and uvicorn's graceful shutdown 35 s (streams in flight finish); a margin
# on top before SIGKILL.
STOP_GRACE_S = 40.0


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
