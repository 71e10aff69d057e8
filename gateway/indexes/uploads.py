"""One upload: `POST /api/indexes/{id}/documents` stores the file (JOBS_DIR, 0600) and queues an `upload` job
(gateway/jobs/) that sends it to the worker's /add_document and records the document. The answer is `202` with
the job at once; the job goes on whatever the client does (it may close its side right after the bytes).

Older clients: `?wait=1` answers as before, `201` with the stored document (or the refusal) once the job ended;
`Accept: text/event-stream` streams the file's `progress` events (stage: converting, chunking, embedding,
writing) and ends with `done` (the stored document) or `error`. Either way, leaving early loses nothing.

A refusal before any work (not the user's index, too large, empty, not multipart) is a JSON 4xx either way and
stores nothing; a refusal by the worker (an unsupported type) is the job's failure: the 4xx of `?wait=1`, and of
the event stream when it comes before any progress (within REFUSAL_WAIT_S).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

from sqlalchemy import func
from sqlmodel import col, select
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..access import EDITOR, read_index
from ..context import Context, ctx, current_user, in_thread, path_id
from ..db import IndexDocument, Job, JobFile
from ..errors import ApiError, BadRequest, NotFound, PayloadTooLarge, TooManyRequests
from ..jobs.follow import follow
from ..jobs.store import ACTIVE, FINISHED
from ..jobs.upload import queue_upload
from ..jobs.views import job_view
from ..responses import UploadedDocument
from ..sse import KEEPALIVE, SSE_HEADERS, frame
from ..streams import RelayedResponse
from .names import check_dataset, check_filename
from .records import document_json

log = logging.getLogger("gateway.uploads")

WAIT_POLL_S = 0.25
# How long an upload streamed to the web waits for its job's first progress before it answers: a refusal by the
# worker before any work (an unsupported type) comes back in that time, and is a JSON 4xx as it was before jobs.
REFUSAL_WAIT_S = 2.0


async def read_upload(request: Request, c: Context) -> tuple[UploadFile, str]:
    content_type = request.headers.get("content-type", "")
    if not content_type.startswith("multipart/form-data"):
        raise BadRequest("send the file as multipart/form-data with a 'file' field", code="not_multipart")
    form = await request.form(max_files=1, max_fields=10)
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise BadRequest("the form has no 'file' field with a file", code="missing_file", field="file")
    dataset = form.get("dataset") or "default"
    if not isinstance(dataset, str):
        raise BadRequest("dataset must be a text field", field="dataset")
    if upload.size is not None and upload.size > c.settings.max_upload_bytes:
        raise PayloadTooLarge(f"the file is larger than {c.settings.max_upload_bytes} bytes", field="file")
    return upload, check_dataset(dataset.strip())


async def upload_document(request: Request) -> Response:
    user, c, index_id = await current_user(request), ctx(request), path_id(request)

    # Before reading the body: an index the user may not change is a 404, not a 413.
    index = await in_thread(read_index, c, user, index_id, EDITOR)
    # MAX_UPLOADS_PER_USER: a 429 before the body is read when the account has that many uploads queued or being
    # indexed (its unfinished upload jobs, on every replica, and the uploads this process is receiving). The same
    # count is taken again in the transaction that queues the job (jobs/store.create, `at_most`): an upload
    # another process received meanwhile is counted there, and this one is refused and removed.
    unfinished = await in_thread(unfinished_uploads, c, user.id)
    if unfinished + c.upload_slots.running.get(user.id, 0) >= c.settings.max_uploads_per_user:
        raise TooManyRequests(
            f"you already have {c.settings.max_uploads_per_user} files being indexed: wait for one to finish",
            code="too_many_uploads",
            headers={"Retry-After": "5"},
        )
    slot = c.upload_slots.take(user.id)  # given back once the job is queued (it counts from then on)
    try:
        return await _upload(request, c, user, index, slot)
    finally:
        slot.release()


def unfinished_uploads(c: Context, user_id: int) -> int:
    with c.db.session() as s:
        return s.exec(
            select(func.count())
            .select_from(Job)
            .where(Job.user_id == user_id, Job.kind == "upload", col(Job.state).in_(ACTIVE))
        ).one()


async def _upload(request: Request, c: Context, user, index, slot) -> Response:
    wait = wants_wait(request)
    upload, dataset = await read_upload(request, c)
    filename = check_filename(upload.filename)
    if upload.size is not None and upload.size == 0:
        raise BadRequest("the file is empty", code="empty_file", field="file")
    # Stored durably (JOBS_DIR, 0600, fsynced) and queued before the answer: the client may go now.
    upload.file.seek(0)

    def queue() -> Job:
        # The slot is given back before the job's commit, never after: the check before the body
        # (MAX_UPLOADS_PER_USER) reads the unfinished jobs, then this process's slots, so an upload between its
        # commit and its slot's release was counted twice, as the job and as the slot (a burst of 20 got a
        # spurious 429, on CI even with the release in the committing thread). Given back first, an upload is
        # at worst counted by neither in that moment, and the count in the queueing transaction still holds
        # the limit exactly.
        slot.release()
        return queue_upload(c, user.id, index.id, dataset, filename, upload.content_type, upload.file)

    job = await in_thread(queue)
    q = c.jobs.listen(job.id)  # before the job can start: this stream sees its every stage
    c.jobs.poke()
    if wants_events(request):  # the web: the file's stages as they happen, then the document row
        try:
            ended = await refused_at_once(c, job.id, q)
            if ended is not None:
                uploaded_or_raise(c, ended)  # a refusal before any work (an unsupported type): a JSON 4xx
        except BaseException:
            c.jobs.unlisten(job.id, q)
            raise
        return relayed(follow_upload(c, job.id, q), lambda: c.jobs.unlisten(job.id, q))
    c.jobs.unlisten(job.id, q)
    if wait:  # the synchronous answer of before: 201 with the document, or the refusal
        end = await wait_for_job(c, job.id)
        return JSONResponse(uploaded_or_raise(c, end), status_code=201)
    view = await in_thread(job_view, c, job.id)
    return JSONResponse(view, status_code=202, headers={"Location": f"/api/jobs/{job.id}"})


def wants_events(request: Request) -> bool:
    return "text/event-stream" in request.headers.get("accept", "")


def wants_wait(request: Request) -> bool:
    raw = request.query_params.get("wait")
    if raw is None:
        return False
    if raw.lower() in ("1", "true"):
        return True
    if raw.lower() in ("0", "false"):
        return False
    raise BadRequest("wait must be true or false (or 1 or 0)", code="invalid", field="wait")


async def wait_for_job(c: Context, job_id: int) -> tuple[Job | None, list[JobFile]]:
    """The job and its files once it ended (however the client's connection goes meanwhile: the job goes on)."""
    while True:
        job, files = await in_thread(job_rows, c, job_id)
        if job is None or job.state in FINISHED:
            return job, files
        await asyncio.sleep(WAIT_POLL_S)


async def refused_at_once(c: Context, job_id: int, q) -> tuple[Job, list[JobFile]] | None:
    """The job's rows when it failed with a refusal (a 4xx of the worker's) before its first progress event,
    within REFUSAL_WAIT_S; None once it shows progress, ends otherwise, or is still waiting its turn."""
    deadline = time.monotonic() + REFUSAL_WAIT_S
    while time.monotonic() < deadline and q.empty():
        job, files = await in_thread(job_rows, c, job_id)
        if job is None or job.state in FINISHED:
            refused = job is not None and files and files[0].status and 400 <= files[0].status < 500
            return (job, files) if refused else None
        await asyncio.sleep(0.05)
    return None


def job_rows(c: Context, job_id: int) -> tuple[Job | None, list[JobFile]]:
    with c.db.session() as s:
        job = s.get(Job, job_id)
        files = list(s.exec(select(JobFile).where(JobFile.job_id == job_id).order_by(col(JobFile.position))))
        return job, files


def uploaded_or_raise(c: Context, end: tuple[Job | None, list[JobFile]]) -> dict:
    job, files = end
    if job is None:
        raise NotFound("the index was deleted", code="index_not_found")
    file = files[0] if files else None
    if job.state == "done" and file is not None and file.state == "done":
        return uploaded_json(c, file)
    if file is not None and file.error:
        raise ApiError(file.error, code=file.code or "indexing_failed", status=file.status or 502)
    raise ApiError(job.error or "indexing failed", code=job.code or "indexing_failed", status=502)


def uploaded_json(c: Context, file: JobFile) -> dict:
    with c.db.session() as s:
        doc = s.get(IndexDocument, int((file.detail or {}).get("document") or 0))
        if doc is None:
            raise NotFound("the document was deleted meanwhile", code="not_found")
        return UploadedDocument(**document_json(doc), replaced=file.replaced).data()


async def follow_upload(c: Context, job_id: int, q) -> AsyncIterator[str]:
    """The upload's job as the stream of before: `queued` (the job, so a client can follow it elsewhere later),
    `progress` (the worker's event) per stage, then `done` (the document) or `error`."""
    view = None
    async for event, data in follow(c, job_id, lambda: job_view(c, job_id), c.settings.keepalive_s, q):
        if event == "keepalive":
            yield KEEPALIVE
        elif event == "progress":
            yield frame(
                "progress",
                data["progress"]
                or {"file": data["filename"], "dataset": data["dataset"], "stage": data["stage"]},
            )
        elif event == "job":
            if view is None:
                yield frame("queued", data)
            view = data
    if view is not None and view["state"] in FINISHED:  # the stream's end: what became of the file
        try:
            yield frame("done", await in_thread(uploaded_or_raise, c, await in_thread(job_rows, c, job_id)))
        except ApiError as exc:
            yield frame("error", exc.to_dict())


def relayed(body: AsyncIterator[str], *on_end: Callable[[], object]) -> RelayedResponse:
    return RelayedResponse(body, on_end=list(on_end), media_type="text/event-stream", headers=SSE_HEADERS)
