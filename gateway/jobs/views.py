"""A job as the API shows it (the models are the OpenAPI document's), and who may see it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from sqlmodel import Session, col, select

from ..access import EDITOR, READER, index_access
from ..db import Job, JobFile, User, iso
from ..errors import NotFound
from ..responses import Json, Out

FILES_SHOWN = 1000  # a job's JSON lists at most this many of its files (the first ones, in order)


class JobFileOut(Out):
    position: int
    filename: str
    dataset: str
    state: Literal["pending", "running", "done", "failed", "cancelled"]
    stage: str = Field(
        description="the last stage the file reached: converting, ocr, chunking, embedding, ..."
    )
    attempts: int
    bytes: int
    error: str | None
    code: str | None
    document_id: str | None
    chunks: int | None
    progress: Json = Field(description="the worker's last progress event for the file (e.g. the OCR page)")


class JobOut(Out):
    id: int
    kind: str = Field(description="upload, rebuild or sync")
    index_id: int
    user_id: int | None
    state: Literal["queued", "running", "done", "failed", "cancelled"]
    stage: str
    total: int
    done: int
    failed: int
    error: str | None
    code: str | None
    cancel_requested: bool
    attempts: int
    created_at: str | None
    started_at: str | None
    finished_at: str | None
    updated_at: str | None
    files: list[JobFileOut] | None = Field(
        default=None, description=f"the job's files (the first {FILES_SHOWN}); not in lists of jobs"
    )


class JobList(Out):
    jobs: list[JobOut]


def file_json(f: JobFile) -> dict:
    detail = dict(f.detail or {})
    detail.pop("document", None)
    return JobFileOut(
        position=f.position,
        filename=f.filename,
        dataset=f.dataset,
        state=f.state,
        stage=f.stage,
        attempts=f.attempts,
        bytes=f.bytes,
        error=f.error,
        code=f.code,
        document_id=f.document_id,
        chunks=f.chunks,
        progress=detail,
    ).data()


def job_json(job: Job, files: list[JobFile] | None = None) -> dict:
    out = JobOut(
        id=job.id,
        kind=job.kind,
        index_id=job.index_id,
        user_id=job.user_id,
        state=job.state,
        stage=job.stage,
        total=job.total,
        done=job.done,
        failed=job.failed,
        error=job.error,
        code=job.code,
        cancel_requested=job.cancel_at is not None,
        attempts=job.attempts,
        created_at=iso(job.created_at),
        started_at=iso(job.started_at),
        finished_at=iso(job.finished_at),
        updated_at=iso(job.updated_at),
    ).data()
    if files is not None:
        out["files"] = [file_json(f) for f in files]
    else:
        out.pop("files")
    return out


def job_files(s: Session, job_id: int) -> list[JobFile]:
    return list(
        s.exec(
            select(JobFile).where(JobFile.job_id == job_id).order_by(col(JobFile.position)).limit(FILES_SHOWN)
        )
    )


def job_view(c, job_id: int) -> dict:
    """The job with its files (no access check: for the route that just made it)."""
    with c.db.session() as s:
        job = s.get(Job, job_id)
        if job is None:
            raise NotFound(f"no job {job_id}", code="job_not_found")
        return job_json(job, job_files(s, job_id))


def visible_job(s: Session, user: User, job_id: int, need: str = READER) -> Job:
    """The job, when the user may read its index (`need`: EDITOR to cancel it); else a 404 like a missing job."""
    job = s.get(Job, job_id)
    if job is None:
        raise NotFound(f"no job {job_id}", code="job_not_found")
    try:
        index_access(s, user, job.index_id, need)
    except NotFound:
        raise NotFound(f"no job {job_id}", code="job_not_found") from None
    return job


__all__ = ["EDITOR", "READER", "JobList", "JobOut", "job_json", "job_view", "visible_job"]
