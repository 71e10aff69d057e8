"""Heavy work on untrusted files (document conversion; later OCR) in a child process with a memory and a time limit.

Why: a 1.6 MB PDF of 10,000 pages took a worker from 620 MB to 3.5 GB and kept it. Run in the worker, such a
file takes the memory of every turn that process serves; run here, it can only take its own, and every byte of
it is returned when the job ends.

How:
- The worker starts one helper process per worker process (`python -m rag_worker.sandbox`), which imports the
  heavy libraries once (Docling) and then waits for jobs on its stdin.
- Each job runs in a fresh fork of that helper: it starts in milliseconds with everything imported, its address
  space is capped with `RLIMIT_AS` (the helper's own size plus the job's `memory_mb`), an alarm ends it past its
  time, and all its memory goes back to the system when it exits. The helper itself never runs a job.
- Jobs talk back over one pipe as JSON lines, each shorter than PIPE_BUF so lines of concurrent jobs never mix:
  `progress` events while running (`emit`), then `result` or `error`; the helper adds `exit` when it reaps the
  job's process, which tells a crash (or a kill by the memory limit) apart from an answer.
- The parent side is plain blocking code (a reader thread, queues, subprocess pipes). Under gevent's monkey
  patching those are all cooperative, so a worker waiting for a conversion keeps serving every other stream; it
  must then be called from a greenlet, not from the native thread pool (`runtime.offload`).

A task is a function `task(args: dict, emit: Callable[[dict], None]) -> JSON value`, named "module:function".
It may raise `ApiError` (relayed with its code and status); a `MemoryError` is reported as `memory`.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Generator
from typing import Any

from .errors import ApiError

log = logging.getLogger("rag_worker.sandbox")

MAX_LINE = 3800  # < PIPE_BUF (4096 on Linux): one write() of a line is never interleaved with another's
ALARM_GRACE_S = (
    5  # the job's own alarm fires this long after the parent's deadline, in case the parent is gone
)
KILL_WAIT_S = 15.0
# Libraries often catch a failed allocation and log it (Docling drops the page and goes on), or abort on it.
MEMORY_MARKS = ("bad_alloc", "MemoryError", "Cannot allocate memory", "out of memory")
# How long a job may wait for the helper to finish starting (importing Docling), on top of its own time.
STARTUP_S = 300.0
LIVENESS_S = 1.0  # how often a waiting job checks that the helper is still there


class SandboxError(Exception):
    """A job did not answer: `reason` is timeout, memory, crashed or gone."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail = reason, detail


# -- parent side ------------------------------------------------------------------------------------------------


class Sandbox:
    """Runs tasks in forks of one long-lived helper process, started on first use (and again if it dies).

    `warm`: "module:function" callables the helper runs once at start (imports, building converters), each
    given `warm_args`. `parallel`: jobs run at once; more wait their turn.
    """

    def __init__(self, warm: list[str] | None = None, warm_args: dict | None = None, *, parallel: int = 1):
        self.warm = list(warm or [])
        self.warm_args = dict(warm_args or {})
        self._slots = threading.BoundedSemaphore(max(1, parallel))
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._jobs: dict[str, tuple[int, queue.Queue]] = {}  # job -> (helper pid, its messages)

    # The helper --------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the helper now (it imports for a few seconds; jobs sent meanwhile wait in its stdin)."""
        with self._lock:
            self._ensure_started()

    def _ensure_started(self) -> subprocess.Popen:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            return proc
        config = json.dumps({"warm": self.warm, "warm_args": self.warm_args})
        env = dict(os.environ)
        # Fewer malloc arenas: each reserves 64 MiB of address space, which RLIMIT_AS counts.
        env.setdefault("MALLOC_ARENA_MAX", "2")
        # `python -m rag_worker.sandbox` must find this package whatever the working directory.
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        proc = subprocess.Popen(
            [sys.executable, "-m", "rag_worker.sandbox", config],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
        )
        self._proc = proc
        # The reader holds the jobs and the helper's stdout, not this object: once the Sandbox is dropped, the
        # helper's stdin closes and it exits (no helper outlives its owner).
        reader = threading.Thread(
            target=_read, args=(proc.stdout, proc.pid, self._jobs), name="sandbox-reader", daemon=True
        )
        reader.start()
        log.info("sandbox helper started (pid %s)", proc.pid)
        return proc

    def _send(self, proc: subprocess.Popen, msg: dict) -> None:
        assert proc.stdin is not None
        with self._lock:
            proc.stdin.write((json.dumps(msg) + "\n").encode())
            proc.stdin.flush()

    def close(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(Exception):
            assert proc.stdin is not None
            proc.stdin.close()  # the helper ends its jobs and exits on EOF
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    # Jobs --------------------------------------------------------------------------------------------------

    def run(
        self,
        task: str,
        args: dict,
        *,
        timeout_s: float,
        memory_mb: int,
        on_event: Callable[[dict], None] | None = None,
    ) -> Any:
        """Run `task(args, emit)` in a fresh child; its result, or its ApiError, or a SandboxError."""
        steps = self.run_steps(task, args, timeout_s=timeout_s, memory_mb=memory_mb)
        while True:
            try:
                data = next(steps)
            except StopIteration as stop:
                return stop.value
            if on_event is not None:
                on_event(data)

    def run_steps(
        self, task: str, args: dict, *, timeout_s: float, memory_mb: int
    ) -> Generator[dict, None, Any]:
        """`run` as a generator: yields each `progress` event's data as it arrives, returns the result.

        Closing the generator before it ends (the caller stopped waiting: a client left) kills the job."""
        with self._slots:
            job = uuid.uuid4().hex
            inbox: queue.Queue = queue.Queue()
            try:
                with self._lock:
                    proc = self._ensure_started()
                    self._jobs[job] = (proc.pid, inbox)
                request = {"op": "run", "id": job, "task": task, "args": args}
                request.update(timeout_s=timeout_s, memory_mb=memory_mb)
                try:
                    self._send(proc, request)
                except (BrokenPipeError, OSError) as exc:
                    raise SandboxError("gone", f"the helper process is gone ({exc})") from None
                try:
                    result = yield from self._await(proc, job, inbox, timeout_s)
                except GeneratorExit:  # closed while the job runs: nobody wants its answer
                    self._kill(proc, job, inbox)
                    raise
                return result
            finally:
                self._jobs.pop(job, None)

    def _await(self, proc, job: str, inbox: queue.Queue, timeout_s: float) -> Generator[dict, None, Any]:
        """Yield progress; return or raise the job's answer once its process has exited (its memory is back)."""
        # The clock starts when the helper forks the job; until then it may still be importing (first job).
        deadline = time.monotonic() + timeout_s + STARTUP_S
        memory_trouble = False  # the job logged a failed allocation: whatever it answers is incomplete
        answer: dict | None = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._kill(proc, job, inbox)
                if answer is None:
                    raise SandboxError("timeout", f"stopped after {timeout_s:g} s")
                break
            try:
                msg = inbox.get(timeout=min(remaining, LIVENESS_S))
            except queue.Empty:
                if proc.poll() is not None:  # its job may still hold the pipe open, so no EOF tells us
                    raise SandboxError("gone", "the helper process ended") from None
                continue
            event = msg.get("event")
            if event == "started":
                deadline = time.monotonic() + timeout_s
            elif event == "memory":
                memory_trouble = True
            elif event == "progress":
                yield msg.get("data") or {}
            elif event in ("result", "error"):
                answer = msg
                deadline = min(deadline, time.monotonic() + KILL_WAIT_S)  # now only its exit is awaited
            elif event == "exit":
                break
            elif event == "gone":
                raise SandboxError("gone", "the helper process ended")
        if memory_trouble or (answer is not None and answer.get("code") == "memory"):
            raise SandboxError("memory", "an allocation failed")
        if answer is None:
            sig = msg.get("signal")
            detail = f"signal {signal.Signals(sig).name}" if sig else f"exit code {msg.get('code')}"
            # Past RLIMIT_AS, C code often aborts or dies on a failed allocation instead of raising.
            raise SandboxError("crashed", detail)
        if answer["event"] == "result":
            return answer.get("result")
        raise ApiError(
            answer.get("message") or "the job failed",
            code=answer.get("code") or "internal",
            status=int(answer.get("status") or 500),
            field=answer.get("field"),
        )

    def _kill(self, proc, job: str, inbox: queue.Queue) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            self._send(proc, {"op": "kill", "id": job})
        end = time.monotonic() + KILL_WAIT_S
        while (left := end - time.monotonic()) > 0:
            try:
                if inbox.get(timeout=left).get("event") in ("exit", "gone"):
                    return
            except queue.Empty:
                break
        log.warning("sandbox: job %s did not end after a kill; restarting the helper", job)
        with contextlib.suppress(Exception):
            proc.kill()


def _read(stdout, pid: int, jobs: dict[str, tuple[int, queue.Queue]]) -> None:
    """Hand each line from helper `pid` to the job it names; tell its waiting jobs when the helper is gone."""
    try:
        for raw in stdout:
            try:
                msg = json.loads(raw)
            except ValueError:
                log.warning("sandbox: unreadable line %r", raw[:200])
                continue
            owner, target = jobs.get(str(msg.get("id")), (None, None))
            if target is not None and owner == pid:
                target.put(msg)
    finally:
        for owner, target in list(jobs.values()):
            if owner == pid:
                target.put({"event": "gone"})


# -- child side (the helper and its forks) ---------------------------------------------------------------------


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
            self.send({"id": job, "event": "result", "result": result})
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
    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "INFO").upper(), stream=sys.stderr)
    for name in config.get("warm") or []:
        _resolve(name)(config.get("warm_args") or {})
    _Helper(proto_in, proto_out).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
