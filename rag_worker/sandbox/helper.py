"""The helper process (`python -m rag_worker.sandbox`) and the forks it runs each job in, under their limits."""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import select
import signal
import sys
import tempfile
from collections.abc import Callable

from ..errors import ApiError

MAX_LINE = 3800  # < PIPE_BUF (4096 on Linux): one write() of a line is never interleaved with another's
# The job's own alarm fires this long after the parent's deadline, in case the parent is gone.
ALARM_GRACE_S = 5
# Libraries often catch a failed allocation and log it (Docling drops the page and goes on), or abort on it.
MEMORY_MARKS = ("bad_alloc", "MemoryError", "Cannot allocate memory", "out of memory")


def _resolve(name: str) -> Callable:
    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(module), attr)


def _vm_size() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


class _Helper:
    def __init__(self, proto_in: int, proto_out: int):
        self.proto_in, self.proto_out = proto_in, proto_out
        self.children: dict[int, str] = {}  # pid -> job id
        self.tasks: dict[str, Callable] = {}

    def send(self, msg: dict) -> None:
        line = json.dumps(msg)
        if len(line) > MAX_LINE:
            msg = {**msg, "message": str(msg.get("message", ""))[:1000], "data": None, "result": None}
            msg = {k: v for k, v in msg.items() if v is not None}
            line = json.dumps(msg)[:MAX_LINE]
        os.write(self.proto_out, (line + "\n").encode())

    def send_result(self, job: str, result, scratch: str | None) -> None:
        """The job's answer: in its line when it fits, else in a file (in the job's `scratch` folder, or the
        system's temporary one) whose path the line carries; the parent reads and removes it."""
        answer = {"id": job, "event": "result", "result": result}
        if len(json.dumps(answer)) <= MAX_LINE:
            self.send(answer)
            return
        fd, path = tempfile.mkstemp(prefix="sandbox-result-", suffix=".json", dir=scratch or None)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(result, fh)
        self.send({"id": job, "event": "result", "result_file": path})

    def serve(self) -> None:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        buf = b""
        try:
            while True:
                try:
                    ready, _, _ = select.select([self.proto_in, wake_r], [], [])
                except InterruptedError:
                    continue
                if wake_r in ready:
                    os.read(wake_r, 4096)
                    self.reap()
                if self.proto_in in ready:
                    data = os.read(self.proto_in, 1 << 16)
                    if not data:
                        return  # the worker is gone: stop everything
                    buf += data
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        if line.strip():
                            self.handle(json.loads(line))
                self.reap()
        finally:
            for pid in list(self.children):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            job = self.children.pop(pid, None)
            if job is None:
                continue
            if os.WIFSIGNALED(status):
                self.send({"id": job, "event": "exit", "signal": os.WTERMSIG(status)})
            else:
                self.send({"id": job, "event": "exit", "code": os.waitstatus_to_exitcode(status)})

    def handle(self, msg: dict) -> None:
        job = str(msg.get("id"))
        if msg.get("op") == "kill":
            for pid, owner in self.children.items():
                if owner == job:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            return
        if msg.get("op") != "run":
            return
        try:
            task = self.tasks.get(msg["task"]) or self.tasks.setdefault(msg["task"], _resolve(msg["task"]))
        except Exception as exc:
            self.send(
                {"id": job, "event": "error", "code": "internal", "message": f"no task {msg['task']}: {exc}"}
            )
            return
        self.send({"id": job, "event": "started"})  # before the fork: no line of the job can be mid-write
        pid = os.fork()
        if pid == 0:  # the job's own process
            self.run_job(job, task, msg)
        self.children[pid] = job

    def run_job(self, job: str, task: Callable, msg: dict) -> None:
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.close(self.proto_in)
            _die_with_parent()
            limit = _vm_size() + int(msg["memory_mb"]) * 1024 * 1024
            resource_limit(limit)
            signal.alarm(int(float(msg["timeout_s"])) + ALARM_GRACE_S)

            def emit(data: dict) -> None:
                self.send({"id": job, "event": "progress", "data": data})

            logging.getLogger().addHandler(_MemoryWatch(lambda: self.send({"id": job, "event": "memory"})))

            result = task(msg.get("args") or {}, emit)
            self.send_result(job, result, msg.get("scratch"))
            code = 0
        except MemoryError:
            self.send({"id": job, "event": "error", "code": "memory", "message": "out of memory"})
        except ApiError as err:
            data = {
                "id": job,
                "event": "error",
                "code": err.code,
                "message": err.message,
                "status": err.status,
            }
            if err.field:
                data["field"] = err.field
            self.send(data)
        except BaseException as exc:  # noqa: BLE001 - every failure must reach the parent as an answer
            if _caused_by_memory(exc):
                self.send({"id": job, "event": "error", "code": "memory", "message": "out of memory"})
            else:
                detail = f"{type(exc).__name__}: {exc}"[:500]
                self.send({"id": job, "event": "error", "code": "internal", "message": detail, "status": 500})
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)


class _MemoryWatch(logging.Handler):
    """Tells the parent at once when a library logs a failed allocation (before it perhaps aborts)."""

    def __init__(self, report: Callable[[], None]):
        super().__init__(level=logging.WARNING)
        self.report, self.reported = report, False

    def emit(self, record: logging.LogRecord) -> None:
        if self.reported:
            return
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += f" {type(record.exc_info[1]).__name__} {record.exc_info[1]}"
        if any(mark in text for mark in MEMORY_MARKS):
            self.reported = True
            self.report()


def _caused_by_memory(exc: BaseException) -> bool:
    seen = 0
    while exc is not None and seen < 20:
        if isinstance(exc, MemoryError) or "bad_alloc" in str(exc) or "Cannot allocate memory" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def _die_with_parent() -> None:
    """A job whose helper dies is killed too (Linux PR_SET_PDEATHSIG), so no orphan keeps converting."""
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG


def resource_limit(address_space: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))


def main(argv: list[str]) -> int:
    config = json.loads(argv[0]) if argv else {}
    # The protocol gets private copies of stdin/stdout; fds 0 and 1 then point elsewhere, so a library that
    # prints cannot corrupt a message.
    proto_in, proto_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    from contract.observe import configure

    configure("rag_worker")  # the worker's log format (LOG_FORMAT), on stderr like the worker's own lines
    for name in config.get("warm") or []:
        _resolve(name)(config.get("warm_args") or {})
    _Helper(proto_in, proto_out).serve()
    return 0
