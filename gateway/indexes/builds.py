"""Index (re)builds that outlive the page that started them, and can be rejoined.

`POST /api/indexes/{id}/build` starts the worker's `/index` in a background task of this gateway and streams its
events; the browser leaving does not stop the build. `GET /api/indexes/{id}/build` rejoins it: one `snapshot`
(files done, total, each file's last stage) then the live `progress` events to `done`/`error`; 204 when no build
runs. A replica that does not run the build follows the index's status in the database and ends with `done`.
The document rows are synced with the worker's table before `done` is sent, so a refresh after it is exact.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response

from .. import metrics
from ..access import EDITOR, READER, read_index, require_index
from ..context import Context, ctx, current_user, in_thread, path_id, read_json
from ..db import Index
from ..errors import NotFound
from ..routing import WORKER, ApiRoute, Operation, event_stream
from ..schemas import BuildRequest
from ..sse import Listeners, drain, event_response, frame
from ..streams import WorkerStream, WorkerStreamBroken
from .reconcile import sync_documents

log = logging.getLogger("gateway.builds")

POLL_S = 1.0


class BuildHandle(Listeners):
    def __init__(self, index_id: int):
        super().__init__()
        self.index_id = index_id
        self.files: dict[str, dict] = {}
        self.done = 0
        self.total = 0
        self.task: asyncio.Task | None = None

    def see(self, data: dict) -> None:
        name = str(data.get("file") or "")
        if name:
            self.files[name] = {"file": name, "dataset": data.get("dataset"), "stage": data.get("stage")}
        self.done = int(data.get("done") or self.done)
        self.total = int(data.get("total") or self.total)

    def snapshot(self) -> dict:
        return {
            "status": "building",
            "done": self.done,
            "total": self.total,
            "files": list(self.files.values()),
        }


async def run_build(c: Context, handle: BuildHandle, stream: WorkerStream) -> None:
    end = None
    metrics.BUILDS_RUNNING.inc()
    try:
        async for f in stream.frames():
            if f.event == "progress" and isinstance(f.data, dict):
                handle.see(f.data)
                handle.emit(f.raw)
            elif f.event in ("done", "error"):
                end = f.raw if f.event == "error" else f
                break
    except WorkerStreamBroken as exc:
        end = frame("error", {"error": exc.message, "code": "worker_unavailable"})
    except asyncio.CancelledError:
        end = frame("error", {"error": "the gateway stopped during the build", "code": "interrupted"})
        raise
    finally:
        await asyncio.shield(stream.aclose())
        succeeded = end is not None and not isinstance(end, str)
        metrics.BUILDS_RUNNING.dec()
        metrics.BUILDS.labels("done" if succeeded else "failed").inc()
        try:
            await asyncio.shield(sync_documents(c, handle.index_id, failed=not succeeded))
        except Exception:
            log.exception("syncing index %s after its build failed", handle.index_id)
        if end is None:
            end = frame(
                "error",
                {"error": "the worker's stream ended before the build finished", "code": "interrupted"},
            )
        handle.emit(end.raw if not isinstance(end, str) else end)
        handle.emit(None)
        if c.builds.get(handle.index_id) is handle:
            del c.builds[handle.index_id]


async def start_build(request: Request) -> Response:
    """Start the worker's (re)build of the index; the worker holds the per-index lock (409 while busy)."""
    user, c, index_id = await current_user(request), ctx(request), path_id(request)
    body = await read_json(request, BuildRequest)

    def start() -> Index:
        with c.db.session() as s:
            index = require_index(s, user, index_id, EDITOR)
            index.status = "building"
            s.add(index)
            s.commit()
            return index

    index = await in_thread(start)
    try:
        stream = await c.worker.build_index(index.worker_name, body.rebuild, body.prune)
    except BaseException:
        await sync_documents(c, index.id)
        raise
    handle = BuildHandle(index.id)
    q = handle.listen()
    c.builds[index.id] = handle
    handle.task = asyncio.create_task(run_build(c, handle, stream), name=f"build-index-{index.id}")
    c.running.add(handle.task)
    handle.task.add_done_callback(c.running.discard)
    return event_response(drain(q, c.settings.keepalive_s, []))


async def rejoin_build(request: Request) -> Response:
    user, c, index_id = await current_user(request), ctx(request), path_id(request)

    index = await in_thread(read_index, c, user, index_id, READER)
    handle = c.builds.get(index.id)
    if handle is not None:
        snapshot = frame("snapshot", handle.snapshot())
        return event_response(drain(handle.listen(), c.settings.keepalive_s, [snapshot]))
    if index.status != "building":
        return Response(status_code=204)

    async def follow() -> AsyncIterator[str]:
        # Another replica runs it: its per-file progress is not shared, its end is (the index's status).
        yield frame("snapshot", {"status": "building", "done": 0, "total": 0, "files": [], "elsewhere": True})
        current = index
        while current.status == "building":
            await asyncio.sleep(POLL_S)
            try:
                current = await in_thread(read_index, c, user, index_id, READER)
            except NotFound:
                yield frame("error", {"error": "the index was deleted", "code": "index_not_found"})
                return
        if current.status == "failed":
            yield frame("error", {"error": "the build failed", "code": "build_failed"})
        else:
            yield frame("done", {"documents": current.document_count, "chunks": current.chunk_count})

    return event_response(follow())


BUILD_EVENTS = event_stream(
    "snapshot (on rejoin), progress {file, dataset, done, total, stage} per file, then done "
    "{documents, chunks, ...} or error {error, code}",
    ["snapshot", "progress", "done", "error"],
)

routes = [
    ApiRoute(
        "POST",
        "/api/indexes/{id:int}/build",
        start_build,
        Operation(
            "(Re)build an index from its uploads folder; the build outlives the request",
            BuildRequest,
            BUILD_EVENTS,
            errors=(404, 409, *WORKER),
            tag="indexes",
        ),
    ),
    ApiRoute(
        "GET",
        "/api/indexes/{id:int}/build",
        rejoin_build,
        Operation(
            "Rejoin the index's running build (204 when none runs)",
            answer=BUILD_EVENTS,
            empty=(204,),
            errors=(404,),
            tag="indexes",
        ),
    ),
]
