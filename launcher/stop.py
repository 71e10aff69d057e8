"""`--stop`: stop exactly the processes a running start launched, from its pid file."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from launcher.paths import PID_FILE, STOP_GRACE_S, read_pid_file, remove_pid_file
from launcher.processes import is_alive, stop_group


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
