"""The worker's SSE framing (rag_worker/sse.py): frames ready together leave as one chunk, keepalives fill the
silences, a failure arrives after the frames before it, and closing the stream closes its source."""

from __future__ import annotations

import threading
import time

import pytest

from rag_worker.sse import KEEPALIVE, frame, with_keepalive


def test_frames_ready_together_leave_in_fewer_chunks():
    sent = [frame("token", {"token": str(i)}) for i in range(50)]

    def frames():
        yield from sent  # all ready at once: the consumer finds several queued at each wake-up

    chunks = list(with_keepalive(frames(), 10.0))
    assert "".join(chunks) == "".join(sent)
    assert len(chunks) < len(sent)


def test_keepalives_fill_a_silence_and_a_failure_comes_after_the_frames_before_it():
    def frames():
        yield frame("step", {"n": 1})
        time.sleep(0.35)
        raise RuntimeError("boom")

    out = with_keepalive(frames(), 0.1)
    got = []
    with pytest.raises(RuntimeError, match="boom"):
        for chunk in out:
            got.append(chunk)
    assert got[0] == frame("step", {"n": 1})
    assert KEEPALIVE in got[1:]


def test_closing_the_stream_closes_its_source():
    closed = threading.Event()

    def frames():
        try:
            while True:
                yield frame("token", {"token": "x"})
                time.sleep(0.01)
        finally:
            closed.set()

    out = with_keepalive(frames(), 10.0)
    next(out)
    out.close()
    assert closed.wait(5)
