"""Server-Sent Events: framing what the gateway sends, and parsing what the worker sends."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.responses import StreamingResponse

KEEPALIVE = ": keepalive\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def frame(event: str, data: object) -> str:
    """One SSE frame: `event: <name>` and one line of JSON."""
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event}\ndata: {payload}\n\n"


class Listeners:
    """Something running that any number of browsers follow: each listener gets every frame from its start,
    then None at the end."""

    def __init__(self) -> None:
        self.listeners: list[asyncio.Queue] = []

    def listen(self) -> asyncio.Queue:
        q: asyncio.Queue = asyncio.Queue()
        self.listeners.append(q)
        return q

    def emit(self, item: str | None) -> None:
        for q in list(self.listeners):
            q.put_nowait(item)


async def drain(out: asyncio.Queue, keepalive_s: float, first: list[str] | None = None) -> AsyncIterator[str]:
    """The browser's side: frames as they are queued, a keepalive after `keepalive_s` without one. Cancelled on
    disconnect, which leaves the task that fills the queue untouched."""
    for item in first or []:
        yield item
    loop = asyncio.get_running_loop()
    sent = loop.time()

    # One timer per quiet stretch, not one per frame (a timeout around each wait costs a task and a timer).
    def quiet() -> None:
        nonlocal timer
        due = sent + keepalive_s - loop.time()
        if due <= 0:
            out.put_nowait(KEEPALIVE)
            due = keepalive_s
        timer = loop.call_later(due, quiet)

    timer = loop.call_later(keepalive_s, quiet)
    try:
        while True:
            item = await out.get()
            if item is None:
                return
            # Whatever else is queued already goes out with it: one body chunk (one socket write) per wake-up.
            batch = [item]
            while not out.empty():
                item = out.get_nowait()
                if item is None:
                    yield "".join(batch)
                    return
                batch.append(item)
            yield "".join(batch) if len(batch) > 1 else batch[0]
            sent = loop.time()
    finally:
        timer.cancel()


def event_response(body: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(body, media_type="text/event-stream", headers=SSE_HEADERS)


@dataclass(frozen=True)
class Frame:
    """One frame as received: `raw` is relayed verbatim; `event`/`data` are read to follow the turn."""

    raw: str
    event: str | None = None
    data: Any = None

    @property
    def is_comment(self) -> bool:
        return self.event is None and self.data is None


def parse_frame(block: str) -> Frame:
    """One frame's lines (no blank line among them), as received."""
    event: str | None = None
    data_lines: list[str] = []
    for line in block.split("\n"):
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            event = value
        elif name == "data":
            data_lines.append(value)
    data: Any = None
    if data_lines:
        text = data_lines[0] if len(data_lines) == 1 else "\n".join(data_lines)
        try:
            data = json.loads(text)
        except ValueError:
            data = text
        event = event or "message"
    return Frame(raw=block + "\n\n", event=event, data=data)


def _lf(buffer: bytes) -> bytes:
    """SSE's other line ends (CRLF, CR) as LF; a CR at the end waits for the next bytes (it may begin a CRLF)."""
    held = buffer.endswith(b"\r")
    body = buffer[:-1] if held else buffer
    return body.replace(b"\r\n", b"\n").replace(b"\r", b"\n") + (b"\r" if held else b"")


async def read_frames(chunks: AsyncIterator[bytes]) -> AsyncIterator[Frame]:
    """Group a stream of bytes into frames (a blank line ends one), yielding each as soon as it is complete.
    Split on bytes, each frame decoded once: a blank line never falls inside a UTF-8 character."""
    pending = b""
    async for chunk in chunks:
        pending += chunk
        if b"\r" in pending:
            pending = _lf(pending)
        if b"\n\n" not in pending:
            continue
        *complete, pending = pending.split(b"\n\n")
        for block in complete:
            block = block.strip(b"\n")  # blank lines between frames
            if block:
                yield parse_frame(block.decode("utf-8", "replace"))
    block = pending.rstrip(b"\r").strip(b"\n")
    if block:
        yield parse_frame(block.decode("utf-8", "replace"))
