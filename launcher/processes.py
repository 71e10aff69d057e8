"""Child processes, each leading its own process group, and stopping a group so that nothing of it remains.

A pid together with its start time (clock ticks since boot, from /proc) names one process: a pid reused by an
unrelated process is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from launcher.paths import ROOT, STOP_GRACE_S, open_log


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
        with open_log(self.log_path) as log:
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
