"""Index (re)builds as jobs (gateway/jobs/rebuild.py) that outlive the page that started them, and the gateway.

`POST /api/indexes/{id}/build` queues a `rebuild` job and streams its events (the answer of before: SSE, with
the job's id in its `snapshot`); the client may go, the job goes on. A second build of an index while one is
queued or running is a 409. `GET /api/indexes/{id}/build` rejoins the index's build, on
any replica: one `snapshot` (files done, total, each file's last stage, the job's id) then `progress` events to
`done`/`error`; 204 when no build is queued or running. The document rows are synced with the worker's table
before `done` is sent, so a refresh after it is exact.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from sqlmodel import col, select
from starlette.requests import Request
from starlette.responses import Response

from ..access import EDITOR, READER, read_index, require_index
from ..context import Context, ctx, current_user, in_thread, path_id, read_json
from ..db import Index, Job
from ..errors import Conflict
from ..jobs import store
from ..jobs.follow import follow
from ..jobs.views import job_view
from ..routing import WORKER, ApiRoute, Operation, event_stream
from ..schemas import BuildRequest
from ..sse import KEEPALIVE, event_response, frame

log = logging.getLogger("gateway.builds")


def active_build(s, index_id: int) -> int | None:
    return s.exec(
        select(Job.id)
        .where(Job.index_id == index_id, Job.kind == "rebuild", col(Job.state).in_(store.ACTIVE))
        .order_by(col(Job.id).desc())
    ).first()


async def start_build(request: Request) -> Response:
    """Queue a (re)build of the index from its uploads folder; it runs as a job whatever the client does."""
    user, c, index_id = await current_user(request), ctx(request), path_id(request)
    body = await read_json(request, BuildRequest)

    def queue():
        with c.db.session() as s:
            index = require_index(s, user, index_id, EDITOR)
            running = active_build(s, index.id)
            if running is not None:
                raise Conflict(
                    f"a build of this index is already queued or running (job {running})",
                    code="build_running",
                )
        return store.create(
            c.db, "rebuild", index.id, user.id, {"rebuild": body.rebuild, "prune": body.prune}, []
        )

    job = await in_thread(queue)
    q = c.jobs.listen(job.id)  # before it can start: the stream sees every file's stages
    c.jobs.poke()
    return event_response(follow_build(c, job.id, q))


async def follow_build(c: Context, job_id: int, q=None) -> AsyncIterator[str]:
    """The build's job as the stream of before: `snapshot`, `progress` per file and stage, `done` or `error`."""
    first, view = True, None
    async for event, data in follow(c, job_id, lambda: job_view(c, job_id), c.settings.keepalive_s, q):
        if event == "keepalive":
            yield KEEPALIVE
            continue
        if event == "progress":
            p = data["progress"] or {}
            yield frame(
                "progress",
                {
                    "file": data["filename"],
                    "dataset": data["dataset"],
                    "done": int(p.get("done") or (view or {}).get("done") or 0),
                    "total": int(p.get("total") or (view or {}).get("total") or 0),
                    "stage": data["stage"],
                    **({"ocr": p["ocr"]} if isinstance(p.get("ocr"), dict) else {}),
                },
            )
            continue
        view = data
        if first:
            first = False
            files = [
                {"file": f["filename"], "dataset": f["dataset"], "stage": f["stage"]} for f in data["files"]
            ]
            last = (data["files"] or [{}])[-1].get("progress") or {}
            yield frame(
                "snapshot",
                {
                    "status": "building",
                    "done": int(last.get("done") or data["done"]),
                    "total": int(last.get("total") or data["total"]),
                    "files": files,
                    "job": job_id,
                },
            )
    if view is not None and view["state"] in store.FINISHED:  # the stream's end: how the build ended
        if view["state"] == "done":
            index = await in_thread(index_row, c, view["index_id"])
            counts = {"documents": index.document_count, "chunks": index.chunk_count} if index else {}
            yield frame("done", {**counts, "job": job_id})
        else:
            error = view["error"] or f"the build was {view['state']}"
            yield frame("error", {"error": error, "code": view["code"] or "build_failed", "job": job_id})


def index_row(c: Context, index_id: int) -> Index | None:
    with c.db.session() as s:
        return s.get(Index, index_id)


async def rejoin_build(request: Request) -> Response:
    user, c, index_id = await current_user(request), ctx(request), path_id(request)
    index = await in_thread(read_index, c, user, index_id, READER)

    def running() -> int | None:
        with c.db.session() as s:
            return active_build(s, index.id)

    job_id = await in_thread(running)
    if job_id is None:
        return Response(status_code=204)
    return event_response(follow_build(c, job_id))


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
            "(Re)build an index from its uploads folder, as a job that outlives the request (its id is in the "
            "snapshot: GET /api/jobs/{id} follows it too)",
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
