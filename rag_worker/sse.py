"""Server-Sent Events framing shared by every streaming route (`/chat_stream`, `/index`)."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Iterable, Iterator

from flask import Response, stream_with_context

KEEPALIVE = ": keepalive\n\n"


def frame(event: str, data: object) -> str:
    """One SSE frame: `event: <name>` and one line of JSON."""
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event}\ndata: {payload}\n\n"


def with_keepalive(frames: Iterable[str], interval_s: float) -> Iterator[str]:
    """Pass frames through, inserting a keepalive comment whenever `interval_s` passes without one.

    The producer runs in its own (green) thread so a slow stage (a model loading, a long retrieval) still lets
    the comments out; closing this iterator closes the producer, which is how client disconnects cancel work.
    """
    q: queue.Queue = queue.Queue(maxsize=256)
    done = object()
    stop = threading.Event()
    source = iter(frames)

    def produce() -> None:
        try:
            for item in source:
                try:  # a timed put arms a timer: only a full queue needs one
                    q.put_nowait(item)
                except queue.Full:
                    while not stop.is_set():
                        try:
                            q.put(item, timeout=0.5)
                            break
                        except queue.Full:
                            continue
                if stop.is_set():
                    break
        except BaseException as exc:  # delivered to the consumer, which re-raises
            q.put(exc)
        finally:
            close = getattr(source, "close", None)
            if stop.is_set() and close is not None:
                close()
            q.put(done)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    last = time.monotonic()
    try:
        while True:
            try:  # only an empty queue needs the timer (a timeout is a timer armed and cancelled per call)
                item = q.get_nowait()
            except queue.Empty:
                try:
                    item = q.get(timeout=max(0.05, interval_s - (time.monotonic() - last)))
                except queue.Empty:
                    last = time.monotonic()
                    yield KEEPALIVE
                    continue
            # Whatever else is queued already goes out with it: one body chunk (one socket write) per wake-up.
            batch: list[str] = []
            while item is not done and not isinstance(item, BaseException):
                batch.append(item)
                try:
                    item = q.get_nowait()
                except queue.Empty:
                    item = None
                    break
            if batch:
                last = time.monotonic()
                yield "".join(batch) if len(batch) > 1 else batch[0]
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
    finally:
        stop.set()


def sse_response(frames: Iterable[str], keepalive_s: float) -> Response:
    resp = Response(stream_with_context(with_keepalive(frames, keepalive_s)), mimetype="text/event-stream")
    resp.headers["Cache-Control"] = "no-cache"
    resp.headers["X-Accel-Buffering"] = "no"
    return resp
