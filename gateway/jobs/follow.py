"""Following a job: its progress events as they happen when it runs on this replica (every one, from its start:
runner.Feed), else its stages as the database shows them (its owner writes each new stage), and the job itself
whenever it changes, to its end. Used by `GET /api/jobs/{id}/events` and by the streams of before (an upload
sent with `Accept: text/event-stream`, `POST`/`GET /api/indexes/{id}/build`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

from ..context import Context, in_thread
from . import store

POLL_S = 0.5


async def follow(
    c: Context,
    job_id: int,
    load: Callable[[], dict],
    keepalive_s: float | None = None,
    q: asyncio.Queue | None = None,
) -> AsyncIterator[tuple[str, dict | None]]:
    """Yields ("job", view) first and on every change, ("progress", {position, filename, dataset, stage,
    progress}) per stage, ("keepalive", None) after `keepalive_s` of silence; ends after the job's view in a
    finished state (or, when the first view shows it finished already, after the progress events queued before
    that: consumers take the last view they saw as the end). `load()` (run in a thread) reads the view, raising
    NotFound when the job is gone. `q`: the queue of `c.jobs.listen(job_id)` when the caller listened already
    (before the job could start)."""
    q = q or c.jobs.listen(job_id)
    try:
        view = await in_thread(load)
        yield "job", view
        if view["state"] in store.FINISHED:
            # It ended before this first look (a small file is indexed within a poll): the stages it ran on this
            # replica, queued since the caller listened, still follow, then the stream ends.
            while not q.empty():
                yield "progress", q.get_nowait()
            return
        seen = {f["position"]: f["stage"] for f in view.get("files") or []}
        local = False
        polled = quiet = time.monotonic()
        while view["state"] not in store.FINISHED:
            wait = max(0.0, POLL_S - (time.monotonic() - polled))
            try:
                item = await asyncio.wait_for(q.get(), timeout=wait)
            except TimeoutError:
                item = None
            if item is not None:
                local = True
                seen[item["position"]] = item["stage"]
                quiet = time.monotonic()
                yield "progress", item
                if time.monotonic() - polled < POLL_S:
                    continue
            polled = time.monotonic()
            current = await in_thread(load)
            if not local:  # it runs elsewhere: its stages as its owner wrote them
                for f in current.get("files") or []:
                    if f["stage"] and seen.get(f["position"]) != f["stage"]:
                        seen[f["position"]] = f["stage"]
                        quiet = time.monotonic()
                        yield (
                            "progress",
                            {
                                "position": f["position"],
                                "filename": f["filename"],
                                "dataset": f["dataset"],
                                "stage": f["stage"],
                                "progress": f["progress"],
                            },
                        )
            if current != view:
                view = current
                quiet = time.monotonic()
                if view["state"] in store.FINISHED:
                    # Progress events still queued come first: a follower sees every stage before the end.
                    while not q.empty():
                        yield "progress", q.get_nowait()
                yield "job", view
            elif keepalive_s is not None and time.monotonic() - quiet >= keepalive_s:
                quiet = time.monotonic()
                yield "keepalive", None
    finally:
        c.jobs.unlisten(job_id, q)
