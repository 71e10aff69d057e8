"""Sample a server process with py-spy while a bench drives it, and summarise where its CPU went.

py-spy is not a project requirement: a bench takes its path (`--profile-with /path/to/py-spy`, e.g. after
`pip install --target /tmp/pyspy py-spy`) and profiles only then. It samples the process and its children
(gunicorn's forked worker) without pausing them (`--nonblocking`); idle threads (the gevent hub waiting in epoll,
pool threads waiting for work) are not sampled, so the samples are where CPU time went, in Python frames (a torch
forward shows as the Python line that called it).
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter
from pathlib import Path


class Spy:
    """`with Spy(exe, pid, out):` records raw (collapsed) stacks of pid and its subprocesses into `out`."""

    def __init__(self, exe: str | None, pid: int, out: Path, rate: int = 100):
        self.exe, self.pid, self.out, self.rate = exe, pid, Path(out), rate
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Spy:
        if self.exe:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            self.proc = subprocess.Popen(
                [self.exe, "record", "--pid", str(self.pid), "--subprocesses", "--nonblocking"]
                + ["--rate", str(self.rate), "--format", "raw", "--output", str(self.out)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1.0)  # attached and sampling before the bench starts
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGINT)  # py-spy writes its file on Ctrl-C
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _frame_name(frame: str) -> str:
    """'embed_query (rag_worker/embeddings.py:160)' -> 'rag_worker/embeddings.py:embed_query'."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    else:
        path = path.rsplit("throughput2/", 1)[-1] if "throughput2/" in path else path.split("/work/", 1)[-1]
    return f"{path}:{name}"


def summarise(raw: Path, top: int = 20) -> str:
    """Top functions by inclusive and by self samples (shares of all samples), from py-spy's raw output. Work a
    greenlet sends to gevent's thread pool (torch, LanceDB) shows under the pool's threads, not its caller."""
    if not raw.exists():
        return f"(no profile written to {raw})"
    total = 0
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_frame_name(f) for f in stack.split(";") if "(" in f]
        if not frames:
            continue
        total += n
        own[frames[-1]] += n
        for name in set(frames):
            inclusive[name] += n
    if not total:
        return "(no samples)"
    lines = [f"{total} samples (CPU-busy threads only)", "inclusive (function and what it calls):"]
    lines += [f"  {100 * n / total:5.1f}%  {name}" for name, n in inclusive.most_common(top)]
    lines.append("self (the function's own code, native calls included):")
    lines += [f"  {100 * n / total:5.1f}%  {name}" for name, n in own.most_common(top)]
    return "\n".join(lines)
