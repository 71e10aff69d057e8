"""The child-process sandbox that conversion (and later OCR) runs in: answers, refusals, limits, crashes."""

from __future__ import annotations

import os
import signal
import time

import pytest

from rag_worker.errors import ApiError
from rag_worker.sandbox import Sandbox, SandboxError

TASKS = "tests.sandbox_tasks"


@pytest.fixture(scope="module")
def sandbox():
    box = Sandbox()
    yield box
    box.close()


def run(
    box: Sandbox, task: str, args: dict | None = None, *, timeout_s: float = 60, memory_mb: int = 256, **kw
):
    return box.run(f"{TASKS}:{task}", args or {}, timeout_s=timeout_s, memory_mb=memory_mb, **kw)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as fh:  # a zombie not yet reaped by the helper is gone too
        return fh.read().rsplit(")", 1)[1].split()[0] == "Z"


def test_a_job_answers_and_reports_progress_in_order(sandbox):
    events: list[dict] = []
    result = run(sandbox, "count", {"n": 5}, on_event=events.append)
    assert result["counted"] == 5
    assert events == [{"step": i} for i in range(5)]
    assert result["pid"] != os.getpid()
    again = run(sandbox, "count", {"n": 1})
    assert again["pid"] != result["pid"], "each job runs in a fresh process"


def test_run_steps_yields_each_progress_event_as_it_comes_and_returns_the_answer(sandbox):
    steps = sandbox.run_steps(f"{TASKS}:count", {"n": 3}, timeout_s=60, memory_mb=256)
    seen = []
    while True:
        try:
            seen.append(next(steps))
        except StopIteration as stop:
            result = stop.value
            break
    assert seen == [{"step": 0}, {"step": 1}, {"step": 2}]
    assert result["counted"] == 3


def test_closing_run_steps_early_ends_the_job(sandbox):
    steps = sandbox.run_steps(f"{TASKS}:hang", {}, timeout_s=600, memory_mb=256)
    pid = next(steps)["pid"]  # the job is running and has reported
    steps.close()  # the caller stopped waiting (a client left)
    assert gone(pid)
    assert run(sandbox, "count", {"n": 1})["counted"] == 1, "the sandbox goes on serving"


def test_a_result_larger_than_a_pipe_line_arrives_whole(sandbox, tmp_path):
    result = run(sandbox, "big", {"n": 2000}, scratch=tmp_path)
    assert len(result["names"]) == 2000 and result["names"][-1].startswith("attachment-1999-")
    assert list(tmp_path.iterdir()) == [], "the file that carried the result is removed once read"
    assert len(run(sandbox, "big", {"n": 500})["names"]) == 500  # without a scratch folder too


def test_a_refusal_keeps_its_code_and_status(sandbox):
    with pytest.raises(ApiError) as err:
        run(sandbox, "refuse")
    assert (err.value.code, err.value.status, err.value.field) == ("not_welcome", 413, "file")
    assert err.value.message == "this file is not welcome"


def test_a_job_past_its_time_is_killed(sandbox):
    pids: list[int] = []
    with pytest.raises(SandboxError) as err:
        run(sandbox, "hang", timeout_s=2, on_event=lambda e: pids.append(e["pid"]))
    assert err.value.reason == "timeout"
    assert pids and gone(pids[0])
    assert run(sandbox, "count", {"n": 1})["counted"] == 1, "the sandbox goes on serving"


def test_a_job_past_its_memory_is_stopped_and_gives_it_all_back(sandbox):
    pids: list[int] = []
    with pytest.raises(SandboxError) as err:
        run(sandbox, "hog", {"mb": 400}, memory_mb=64, on_event=lambda e: pids.append(e["pid"]))
    assert err.value.reason == "memory"
    assert pids and gone(pids[0])
    assert run(sandbox, "hog", {"mb": 16}, memory_mb=64) == 16, "a job within the limit runs"


def test_a_crash_is_reported_not_hung(sandbox):
    with pytest.raises(SandboxError) as err:
        run(sandbox, "abort")
    assert err.value.reason == "crashed" and "SIGABRT" in err.value.detail


def test_a_crash_after_a_failed_allocation_counts_as_memory(sandbox):
    with pytest.raises(SandboxError) as err:
        run(sandbox, "crash_after_logging_bad_alloc")
    assert err.value.reason == "memory"


def test_a_dead_helper_fails_the_job_and_is_replaced():
    box = Sandbox()
    try:
        pids: list[int] = []

        def kill_helper(event: dict) -> None:
            pids.append(event["pid"])
            os.kill(box._proc.pid, signal.SIGKILL)

        with pytest.raises(SandboxError) as err:
            run(box, "hang", on_event=kill_helper)
        assert err.value.reason == "gone"
        assert run(box, "count", {"n": 2})["counted"] == 2
        # The job dies with its helper (PR_SET_PDEATHSIG): no orphan goes on converting.
        deadline = time.monotonic() + 30
        while not gone(pids[0]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert gone(pids[0])
    finally:
        box.close()
