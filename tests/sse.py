"""A minimal SSE reader for tests and benches: (event, data) pairs from a streamed httpx response."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx


def parse_lines(lines: Iterator[str]) -> Iterator[tuple[str, object]]:
    """Yield (event, parsed data); comments come out as (":", text)."""
    event, data = "message", []
    for line in lines:
        if line == "":
            if data:
                yield event, json.loads("\n".join(data))
            event, data = "message", []
        elif line.startswith(":"):
            yield ":", line[1:].strip()
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())


def post_events(url: str, body: dict, *, headers: dict | None = None, timeout: float = 120.0):
    """POST and collect every event until the stream ends. Returns (status, events)."""
    with (
        httpx.Client(timeout=timeout) as client,
        client.stream("POST", url, json=body, headers=headers) as resp,
    ):
        if resp.status_code != 200:
            resp.read()
            return resp.status_code, resp.json()
        return 200, list(parse_lines(resp.iter_lines()))
