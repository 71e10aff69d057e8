"""Server-Sent Events: framing what the gateway sends, and parsing what the worker sends."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

KEEPALIVE = ": keepalive\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def frame(event: str, data: object) -> str:
    """One SSE frame: `event: <name>` and one line of JSON."""
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event}\ndata: {payload}\n\n"


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
