"""A source row checked against the operator's settings, and turned into contract/sync.py's Source."""

from __future__ import annotations

from datetime import timedelta

from contract.sync import FolderSource, S3Source, SyncError, root_problem

from ..db import IndexSource, utcnow
from ..errors import BadRequest
from ..settings import Settings


def source_problem(settings: Settings, row: IndexSource) -> tuple[str, str, str] | None:
    """(field, code, message) of what makes the source unusable here, or None."""
    if row.kind == "folder":
        if not row.path:
            return "path", "invalid", "a folder source needs path (an absolute folder path)"
        if row.bucket or row.endpoint or row.access_key or row.secret_key or row.prefix:
            return "bucket", "invalid", "a folder source takes no bucket, prefix, endpoint or credentials"
        problem = root_problem(row.path, settings.resolved_sync_roots())
        if problem:
            return "path", "outside_roots", problem
        return None
    if not row.bucket:
        return "bucket", "invalid", "an s3 source needs bucket"
    if row.path:
        return "path", "invalid", "an s3 source takes no path"
    if row.endpoint and row.endpoint.rstrip("/") not in settings.s3_endpoints():
        return (
            "endpoint",
            "endpoint_not_allowed",
            "the endpoint is not one of the gateway's SYNC_S3_ENDPOINTS",
        )
    if bool(row.access_key) != bool(row.secret_key):
        return "secret_key", "invalid", "access_key and secret_key go together"
    return None


def check_row(settings: Settings, row: IndexSource) -> None:
    problem = source_problem(settings, row)
    if problem:
        field, code, message = problem
        raise BadRequest(message, code=code, field=field)


def open_source(settings: Settings, row: IndexSource):
    """contract/sync.py's Source for the row; SyncError when the settings no longer allow it."""
    problem = source_problem(settings, row)
    if problem:
        raise SyncError(problem[1], problem[2])
    if row.kind == "folder":
        return FolderSource(row.path)
    return S3Source(
        row.bucket,
        row.prefix or "",
        endpoint_url=row.endpoint or None,
        region=row.region or None,
        access_key=row.access_key or None,
        secret_key=row.secret_key or None,
        max_bytes=settings.max_upload_bytes,
    )


def schedule(row: IndexSource, *, now=None) -> None:
    """The next scheduled run: `every` minutes from now (at once for a new schedule), none without one."""
    now = now or utcnow()
    row.next_run_at = None if row.every is None else now


def source_json(row: IndexSource) -> dict:
    def iso(value):
        return value.isoformat() if value is not None else None

    return {
        "id": row.id,
        "index_id": row.index_id,
        "kind": row.kind,
        "path": row.path,
        "bucket": row.bucket,
        "prefix": row.prefix or "",
        "endpoint": row.endpoint,
        "region": row.region,
        "has_credentials": bool(row.access_key and row.secret_key),
        "every": row.every,
        "next_run_at": iso(row.next_run_at),
        "last_job_id": row.last_job_id,
        "last_summary": dict(row.last_summary or {}),
        "created_at": iso(row.created_at),
        "updated_at": iso(row.updated_at),
    }


def after(minutes: int, now=None):
    return (now or utcnow()) + timedelta(minutes=minutes)
