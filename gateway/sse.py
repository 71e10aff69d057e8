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
    """The browser's side: frames as they are queued, keepalives while none come. Cancelled on disconnect,
    which leaves the task that fills the queue untouched."""
    for item in first or []:
        yield item
    while True:
        if out.empty():  # only an empty queue needs the timer (wait_for is a task and a timer per call)
            try:
                item = await asyncio.wait_for(out.get(), timeout=keepalive_s)
            except TimeoutError:
                yield KEEPALIVE
                continue
        else:
            item = out.get_nowait()
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


def parse_frame(lines: list[str]) -> Frame:
    event: str | None = None
    data_lines: list[str] = []
    for line in lines:
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
        text = "\n".join(data_lines)
        try:
            data = json.loads(text)
        except ValueError:
            data = text
        event = event or "message"
    return Frame(raw="\n".join(lines) + "\n\n", event=event, data=data)


async def read_frames(lines: AsyncIterator[str]) -> AsyncIterator[Frame]:
    """Group a stream of lines into frames (a blank line ends one), yielding each as soon as it is complete."""
    pending: list[str] = []
    async for line in lines:
        line = line.rstrip("\r\n")
        if line:
            pending.append(line)
            continue
        if pending:
            yield parse_frame(pending)
            pending = []
    if pending:
        yield parse_frame(pending)
