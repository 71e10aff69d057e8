"""Write locks that hold across processes: several gunicorn processes, replicas on one volume, the indexing CLI.

A thread lock orders the writers of one process; an `flock` on `INDEX_STORE/locks/<name>.lock` orders the
processes. The flock is taken on a fresh open file each time, so it also excludes another thread of the same
process that went around the thread lock. Waiting for it blocks a native thread (`runtime.offload`), never the
gevent loop. `flock` is advisory and local: on NFS and other network file systems it may not exclude writers on
other hosts (deploy/README.md keeps one writer per index there).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from pathlib import Path

from .errors import Conflict
from .runtime import gevent_active, offload


def native_sleep(seconds: float) -> None:
    """Sleep in the calling native thread, also when `time.sleep` is gevent's (called from the thread pool)."""
    if gevent_active():
        from gevent import monkey

        monkey.get_original("time", "sleep")(seconds)
    else:
        time.sleep(seconds)


class FileLock:
    """An exclusive lock for one name: a thread lock in this process plus an flock shared with other processes.

    Not re-entrant: a holder that takes it again waits for ever, as with `threading.Lock`.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self._thread_lock = threading.Lock()
        self._fd: int | None = None

    def acquire(self, blocking: bool = True) -> bool:
        if not self._thread_lock.acquire(blocking):
            return False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                if blocking:
                    offload(fcntl.flock, fd, fcntl.LOCK_EX)
                else:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        os.close(fd)
                        self._thread_lock.release()
                        return False
            except BaseException:
                with contextlib.suppress(OSError):
                    os.close(fd)
                raise
        except BaseException:
            if self._thread_lock.locked():
                self._thread_lock.release()
            raise
        self._fd = fd
        return True

    def release(self) -> None:
        fd, self._fd = self._fd, None
        try:
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
        finally:
            self._thread_lock.release()

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class Locks:
    """The named locks of one data folder, one object per name so that threads share the thread lock."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self._guard = threading.Lock()
        self._locks: dict[str, FileLock] = {}

    def get(self, name: str) -> FileLock:
        with self._guard:
            lock = self._locks.get(name)
            if lock is None:
                lock = self._locks[name] = FileLock(self.folder / f"{name}.lock")
            return lock

    @contextlib.contextmanager
    def try_hold(self, name: str, busy_message: str):
        """Hold `name` for the block, or raise 409 `busy` at once when another writer holds it."""
        lock = self.get(name)
        if not lock.acquire(blocking=False):
            raise Conflict(busy_message, code="busy")
        try:
            yield lock
        finally:
            lock.release()
