"""Where things are: the project folder, the pid file a running start leaves, the settings, free ports."""

from __future__ import annotations

import contextlib
import json
import os
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


def logs_folder(path: Path) -> Path:
    """The logs folder, made readable by its owner only (0700) when this creates it; a folder that exists is left
    as it is (it may be a shared one the operator chose)."""
    if not path.exists():
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path, 0o700)  # mkdir's mode is filtered by the umask
    return path


def open_log(path: Path):
    """A log opened for appending, 0600 whatever the umask: logs hold every user's file names and questions. A log
    an older start left readable to others is made private too."""
    logs_folder(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "ab")


def read_pid_file(logs_dir: Path) -> dict | None:
    try:
        return json.loads((logs_dir / PID_FILE).read_text())
    except (OSError, ValueError):
        return None


def write_pid_file(logs_dir: Path, data: dict) -> None:
    tmp = logs_dir / (PID_FILE + ".tmp")
    with open_log(tmp) as fh:  # 0600 like the logs: it names the children's logs and settings
        fh.truncate(0)
        fh.write(json.dumps(data, indent=2).encode())
    tmp.replace(logs_dir / PID_FILE)


def remove_pid_file(logs_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (logs_dir / PID_FILE).unlink()
