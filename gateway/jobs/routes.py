"""The job routes: `GET /api/jobs` (of one index, or of every index the user may read), `GET /api/jobs/{id}`,
`GET /api/jobs/{id}/events` (SSE: the job as it changes, from the database, so on every replica) and
`POST /api/jobs/{id}/cancel`. A job is readable by whoever may read its index, cancelled by whoever may change
it; any other job is a 404, as a missing one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from sqlmodel import col, select
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..access import EDITOR, INT32_MAX, READER, readable_indexes, require_index
from ..context import ctx, current_user, in_thread, path_id, query_int
from ..db import Job
from ..errors import BadRequest, NotFound
from ..routing import ApiRoute, Operation, event_stream
from ..schemas import MAX_ID
from ..sse import KEEPALIVE, event_response, frame
from . import store
from .follow import follow
from .views import JobList, JobOut, job_files, job_json, visible_job

MAX_PAGE = 200
EVENTS_POLL_S = 0.5
CANCEL_WAIT_S = 10.0  # how long POST /cancel waits for a running job's owner to end it
STATES = ("queued", "running", "done", "failed", "cancelled")


async def list_jobs(request: Request) -> Response:
    """Jobs, newest first: of `index` (one the user may read; else 404), or of every index they may read."""
    user, c, params = await current_user(request), ctx(request), request.query_params
    index_id = query_int(params, "index", 1, MAX_ID)
    limit = query_int(params, "limit", 1, MAX_PAGE) or 50
    state = params.get("state")
    if state is not None and state not in STATES:
        raise BadRequest(f"state must be one of {', '.join(STATES)}", code="invalid", field="state")

    def load() -> dict:
        with c.db.session() as s:
            if index_id is not None:
                if index_id > INT32_MAX and s.get_bind().dialect.name == "postgresql":
                    require_index(s, user, 0, READER)  # no such index: the same 404
                ids = [require_index(s, user, index_id, READER).id]
            else:
                ids = [a.index.id for a in readable_indexes(s, user)]
            query = select(Job).where(col(Job.index_id).in_(ids or [0]))
            if state is not None:
                query = query.where(Job.state == state)
            rows = s.exec(query.order_by(col(Job.id).desc()).limit(limit)).all()
            views = [job_json(j) for j in rows]
            JobList(jobs=views)  # checked against the model; sent without the files it leaves out
            return {"jobs": views}

    return JSONResponse(await in_thread(load))


def read_job(c, user, job_id: int, need: str = READER, with_files: bool = True) -> dict:
    with c.db.session() as s:
        if job_id > INT32_MAX and s.get_bind().dialect.name == "postgresql":
            job_id = 0  # past its integers: no such job (the same 404)
        job = visible_job(s, user, job_id, need)
        return job_json(job, job_files(s, job.id) if with_files else None)


async def get_job(request: Request) -> Response:
    user, c, job_id = await current_user(request), ctx(request), path_id(request)
    return JSONResponse(await in_thread(read_job, c, user, job_id))


async def job_events(request: Request) -> Response:
    """SSE: `job` (the job with its files) at once and on every change, `progress` per stage of a file, until the
    job ended; keepalives between."""
    user, c, job_id = await current_user(request), ctx(request), path_id(request)
    await in_thread(read_job, c, user, job_id, READER, False)  # the access check: a 404 before any stream

    async def body() -> AsyncIterator[str]:
        try:
            async for event, data in follow(
                c, job_id, lambda: read_job(c, user, job_id), c.settings.keepalive_s
            ):
                yield KEEPALIVE if event == "keepalive" else frame(event, data)
        except NotFound:  # the job (its index) was deleted, or the user's access to it taken away
            yield frame("gone", {"error": f"job {job_id} is no longer there", "code": "job_not_found"})

    return event_response(body())


async def cancel_job(request: Request) -> Response:
    """Cancel: a queued job at once; a running one is asked to stop, and this waits (a while) until it did."""
    user, c, job_id = await current_user(request), ctx(request), path_id(request)
    await in_thread(read_job, c, user, job_id, EDITOR, False)
    state = await in_thread(store.request_cancel, c.db, job_id)
    if state == "running":
        c.jobs.cancel_local(job_id)
        deadline = time.monotonic() + CANCEL_WAIT_S
        while time.monotonic() < deadline:
            view = await in_thread(read_job, c, user, job_id, READER, False)
            if view["state"] in store.FINISHED:
                break
            await asyncio.sleep(0.2)
    return JSONResponse(await in_thread(read_job, c, user, job_id))


JOB_EVENTS = event_stream(
    "job (the job, with its files) at once and whenever it changes, until its state is done, failed or "
    "cancelled; progress {position, filename, dataset, stage, progress} per stage of a file; gone when the job "
    "was deleted meanwhile",
    ["job", "progress", "gone"],
)
STATE_FILTER = {"type": "string", "enum": list(STATES)}

routes = [
    ApiRoute(
        "GET",
        "/api/jobs",
        list_jobs,
        Operation(
            "Jobs (uploads, rebuilds, syncs), newest first: of one index, or of every index the user may read",
            answer=JobList,
            errors=(400, 404),
            tag="jobs",
            query={
                "index": ({"type": "integer", "minimum": 1, "maximum": MAX_ID}, "only this index's jobs"),
                "state": (STATE_FILTER, "only jobs in this state"),
                "limit": ({"type": "integer", "minimum": 1, "maximum": MAX_PAGE}, "at most this many (50)"),
            },
        ),
    ),
    ApiRoute(
        "GET",
        "/api/jobs/{id:int}",
        get_job,
        Operation("One job, with its files and their progress", answer=JobOut, errors=(404,), tag="jobs"),
    ),
    ApiRoute(
        "GET",
        "/api/jobs/{id:int}/events",
        job_events,
        Operation("Follow a job as it runs (from any replica)", answer=JOB_EVENTS, errors=(404,), tag="jobs"),
    ),
    ApiRoute(
        "POST",
        "/api/jobs/{id:int}/cancel",
        cancel_job,
        Operation(
            "Cancel a job: queued, at once; running, its worker call ends (nothing half written)",
            answer=JobOut,
            errors=(404,),
            tag="jobs",
        ),
    ),
]
