"""The source routes of an index: list, create, read, change, delete, and sync now (a job of kind `sync`).

Reading an index's sources needs read access to it; creating, changing, deleting and syncing them needs edit
access. Any other caller gets the 404 of a missing index (or source): never a 403, never the source. The
credentials are write-only: answers say `has_credentials`, never the keys.
"""

from __future__ import annotations

from sqlmodel import col, delete, select
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .. import audit
from ..access import EDITOR, READER, get_row, require_index
from ..context import Context, ctx, current_user, in_thread, path_id, read_json
from ..db import IndexSource, IndexSourceFile, Job, utcnow
from ..errors import BadRequest, NotFound
from ..jobs import queue_job
from ..jobs.views import JobOut, job_json
from ..routing import ApiRoute, Operation, each
from .schemas import SourceCreate, SourceOut, SourceUpdate
from .sources import check_row, schedule, source_json

MAX_SOURCES = 20  # per index
UNFINISHED = ("queued", "running")


def _source(s, user, index_id: int, source_id: int, need: str) -> IndexSource:
    require_index(s, user, index_id, need)
    row = get_row(s, IndexSource, source_id)
    if row is None or row.index_id != index_id:
        raise NotFound(f"no source {source_id} in index {index_id}", code="source_not_found")
    return row


async def list_sources(request: Request) -> JSONResponse:
    user, c, index_id = await current_user(request), ctx(request), path_id(request)

    def load() -> list[dict]:
        with c.db.session() as s:
            require_index(s, user, index_id, READER)
            rows = s.exec(
                select(IndexSource).where(IndexSource.index_id == index_id).order_by(col(IndexSource.id))
            ).all()
            return [source_json(r) for r in rows]

    return JSONResponse(await in_thread(load))


async def create_source(request: Request) -> JSONResponse:
    user, c, index_id = await current_user(request), ctx(request), path_id(request)
    body = await read_json(request, SourceCreate)
    address = audit.address_of(request)

    def create() -> dict:
        with c.db.session() as s:
            index = require_index(s, user, index_id, EDITOR)
            row = IndexSource(index_id=index.id, created_by=user.id, **body.model_dump())
            row.endpoint = row.endpoint.rstrip("/") if row.endpoint else None
            check_row(c.settings, row)
            count = len(s.exec(select(IndexSource.id).where(IndexSource.index_id == index.id)).all())
            if count >= MAX_SOURCES:
                raise BadRequest(f"an index has at most {MAX_SOURCES} sources", code="too_many_sources")
            schedule(row)
            s.add(row)
            s.flush()
            audit.record(s, user, "source.create", "source", row.id, _audit(index, row), address)
            s.commit()
            return source_json(row)

    return JSONResponse(await in_thread(create), status_code=201)


async def get_source(request: Request) -> JSONResponse:
    user, c = await current_user(request), ctx(request)
    index_id, source_id = path_id(request), path_id(request, "source_id")

    def load() -> dict:
        with c.db.session() as s:
            return source_json(_source(s, user, index_id, source_id, READER))

    return JSONResponse(await in_thread(load))


async def update_source(request: Request) -> JSONResponse:
    user, c = await current_user(request), ctx(request)
    index_id, source_id = path_id(request), path_id(request, "source_id")
    body = await read_json(request, SourceUpdate)
    address = audit.address_of(request)

    def change() -> dict:
        with c.db.session() as s:
            row = _source(s, user, index_id, source_id, EDITOR)
            fields = body.model_fields_set
            for name in fields:
                value = getattr(body, name)
                if name == "prefix":
                    value = value or ""
                if name == "endpoint" and value:
                    value = value.rstrip("/")
                setattr(row, name, value)
            check_row(c.settings, row)  # nothing is written when the changed source is not usable
            if "every" in fields:
                schedule(row)
            row.updated_at = utcnow()
            s.add(row)
            index = require_index(s, user, index_id, EDITOR)
            audit.record(s, user, "source.update", "source", row.id, _audit(index, row), address)
            s.commit()
            return source_json(row)

    return JSONResponse(await in_thread(change))


async def delete_source(request: Request) -> Response:
    """The source and its records go; the documents it synced stay in the index (delete them as any other)."""
    user, c = await current_user(request), ctx(request)
    index_id, source_id = path_id(request), path_id(request, "source_id")
    address = audit.address_of(request)

    def remove() -> None:
        with c.db.session() as s:
            row = _source(s, user, index_id, source_id, EDITOR)
            index = require_index(s, user, index_id, EDITOR)
            s.exec(delete(IndexSourceFile).where(col(IndexSourceFile.source_id) == row.id))
            audit.record(s, user, "source.delete", "source", row.id, _audit(index, row), address)
            s.delete(row)
            s.commit()

    await in_thread(remove)
    return Response(status_code=204)


def queue_sync(c: Context, source_id: int, user_id: int | None) -> tuple[Job, bool]:
    """The source's unfinished sync job, or a new one queued; (job, created)."""
    with c.db.session() as s:
        row = s.get(IndexSource, source_id)
        if row is None:
            raise NotFound(f"no source {source_id}", code="source_not_found")
        for job in s.exec(
            select(Job).where(
                Job.index_id == row.index_id, Job.kind == "sync", col(Job.state).in_(UNFINISHED)
            )
        ).all():
            if (job.params or {}).get("source") == source_id:
                return job, False
        index_id = row.index_id
    job = queue_job(c, "sync", index_id, user_id, {"source": source_id}, files=[])
    with c.db.session() as s:
        row = s.get(IndexSource, source_id)
        if row is not None:
            row.last_job_id = job.id
            s.add(row)
            s.commit()
    return job, True


async def sync_now(request: Request) -> JSONResponse:
    """Queue a sync run (202 with its job); one already queued or running for this source is answered (200)."""
    user, c = await current_user(request), ctx(request)
    index_id, source_id = path_id(request), path_id(request, "source_id")

    def start() -> tuple[dict, bool]:
        with c.db.session() as s:
            row = _source(s, user, index_id, source_id, EDITOR)
            check_row(c.settings, row)  # the operator may have narrowed SYNC_ROOTS since
        job, created = queue_sync(c, source_id, user.id)
        return job_json(job), created

    view, created = await in_thread(start)
    c.jobs.poke()
    return JSONResponse(view, status_code=202 if created else 200)


def _audit(index, row: IndexSource) -> dict:
    return {
        "index_id": index.id,
        "index": index.name,
        "kind": row.kind,
        "path": row.path,
        "bucket": row.bucket,
        "prefix": row.prefix,
        "every": row.every,
    }


BASE = "/api/indexes/{id:int}/sources"
ONE = BASE + "/{source_id:int}"
SOURCE_OPS = ["get_api_indexes_id_sources_source_id", "post_api_indexes_id_sources_source_id_sync"]

routes = [
    ApiRoute(
        "GET",
        BASE,
        list_sources,
        Operation(
            "The index's sources (folders, buckets it syncs from)",
            answer=[SourceOut],
            errors=(404,),
            tag="sources",
        ),
    ),
    ApiRoute(
        "POST",
        BASE,
        create_source,
        Operation(
            "Add a source: a folder under SYNC_ROOTS or an S3 bucket and prefix, synced on demand or every N minutes",
            SourceCreate,
            SourceOut,
            status=201,
            errors=(400, 404),
            tag="sources",
            links=each(SOURCE_OPS, {"id": "$request.path.id", "source_id": "$response.body#/id"}),
        ),
    ),
    ApiRoute(
        "GET",
        ONE,
        get_source,
        Operation(
            "One source (its credentials are never returned)", answer=SourceOut, errors=(404,), tag="sources"
        ),
    ),
    ApiRoute(
        "PATCH",
        ONE,
        update_source,
        Operation(
            "Change a source (its kind stays); `every: null` stops its schedule",
            SourceUpdate,
            SourceOut,
            errors=(400, 404),
            tag="sources",
        ),
    ),
    ApiRoute(
        "DELETE",
        ONE,
        delete_source,
        Operation("Remove a source (the documents it synced stay)", status=204, errors=(404,), tag="sources"),
    ),
    ApiRoute(
        "POST",
        ONE + "/sync",
        sync_now,
        Operation(
            "Sync now: a job of kind sync (202); the source's unfinished one if there is one (200)",
            answer=JobOut,
            status=202,
            same=(200,),
            errors=(400, 404),
            tag="sources",
            links=each(
                ["get_api_jobs_id", "get_api_jobs_id_events", "post_api_jobs_id_cancel"],
                {"id": "$response.body#/id"},
            ),
        ),
    ),
]
