"""runtime.offload_all: a hybrid search's legs run at once in native threads, with and without gevent."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest

from rag_worker.runtime import offload_all


def test_calls_run_at_the_same_time_and_results_keep_their_order():
    # Each call waits at a barrier for the other: run one after the other, the first would wait forever.
    barrier = threading.Barrier(2, timeout=10)

    def leg(name):
        barrier.wait()
        return name

    assert offload_all([lambda: leg("vector"), lambda: leg("fts")]) == ["vector", "fts"]


def test_a_failure_is_raised_once_every_call_has_ended():
    finished = threading.Event()

    def slow():
        finished.wait(0.2)
        finished.set()
        return 1

    def boom():
        raise ValueError("the FTS leg failed")

    with pytest.raises(ValueError, match="FTS leg"):
        offload_all([slow, boom])
    assert finished.is_set()


def test_one_call_or_none():
    assert offload_all([lambda: 7]) == [7]
    assert offload_all([]) == []


def test_under_gevent_the_calls_run_in_native_threads_and_the_loop_keeps_serving():
    script = textwrap.dedent(
        """
        from gevent import monkey; monkey.patch_all()
        import threading, gevent
        from rag_worker.runtime import offload_all
        # Native events: the patched ones are greenlet primitives, which never wake across threads.
        native = gevent.monkey.get_original("threading", "Event")
        both = [native(), native()]
        def leg(i):
            both[i].set()
            if not both[1 - i].wait(10):
                raise RuntimeError("the other leg never ran at the same time")
            return i
        ticks = []
        def other_client():
            for _ in range(3):
                ticks.append(1)
                gevent.sleep(0.01)
        g = gevent.spawn(other_client)
        print(offload_all([lambda: leg(0), lambda: leg(1)]))
        g.join()
        print(len(ticks))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[0,", "1]", "3"]
