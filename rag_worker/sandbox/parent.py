"""The worker's side of the sandbox: one helper process started on first use, jobs sent to it, answers awaited."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Generator
from typing import Any

from ..errors import ApiError

log = logging.getLogger("rag_worker.sandbox")

KILL_WAIT_S = 15.0
# How long a job may wait for the helper to finish starting (importing Docling), on top of its own time.
STARTUP_S = 300.0
LIVENESS_S = 1.0  # how often a waiting job checks that the helper is still there


class SandboxError(Exception):
    """A job did not answer: `reason` is timeout, memory, crashed or gone."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail = reason, detail


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
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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
        scratch: str | os.PathLike | None = None,
    ) -> Any:
        """Run `task(args, emit)` in a fresh child; its result, or its ApiError, or a SandboxError.

        `scratch`: a folder of the job's where a result too large for one pipe line is handed over (the
        system's temporary folder when None); that file is removed once read."""
        steps = self.run_steps(task, args, timeout_s=timeout_s, memory_mb=memory_mb, scratch=scratch)
        while True:
            try:
                data = next(steps)
            except StopIteration as stop:
                return stop.value
            if on_event is not None:
                on_event(data)

    def run_steps(
        self,
        task: str,
        args: dict,
        *,
        timeout_s: float,
        memory_mb: int,
        scratch: str | os.PathLike | None = None,
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
                if scratch is not None:
                    request["scratch"] = os.fspath(scratch)
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
            if answer is not None and answer.get("result_file"):
                with contextlib.suppress(OSError):
                    os.unlink(answer["result_file"])  # an answer not to be trusted: dropped unread
            raise SandboxError("memory", "an allocation failed")
        if answer is None:
            sig = msg.get("signal")
            detail = f"signal {signal.Signals(sig).name}" if sig else f"exit code {msg.get('code')}"
            # Past RLIMIT_AS, C code often aborts or dies on a failed allocation instead of raising.
            raise SandboxError("crashed", detail)
        if answer["event"] == "result":
            return _result(answer)
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


def _result(answer: dict) -> Any:
    """A result event's value: in the line itself, or in the file the line names (read, then removed)."""
    path = answer.get("result_file")
    if path is None:
        return answer.get("result")
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError) as exc:
        raise SandboxError("crashed", f"its result could not be read ({exc})") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


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
