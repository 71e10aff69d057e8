"""The bodies and answers of the source routes."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import ConfigDict, Field, field_validator

from ..responses import Out
from ..schemas import Body

BUCKET = r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$"
REGION = r"^[a-z0-9-]{1,64}$"
MAX_EVERY = 525_600  # a year, in minutes
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _plain(value: str | None, what: str) -> str | None:
    if value is not None and _CONTROL.search(value):
        raise ValueError(f"{what} must not hold control characters")
    return value


def _prefix(value: str | None) -> str | None:
    if value is None:
        return value
    _plain(value, "prefix")
    if any(part in (".", "..") for part in value.split("/")):
        raise ValueError("prefix must not hold '.' or '..' segments")
    return value


ABSOLUTE = r"^/[^\x00-\x1f\x7f]*$"


def _source_schema(schema: dict) -> None:
    """The two kinds, for the OpenAPI document: a folder (a path, nothing of a bucket's) or a bucket (no path;
    both credentials or neither). Whether a folder lies under SYNC_ROOTS and an endpoint is one of
    SYNC_S3_ENDPOINTS is the operator's setting, checked by the route (400 `outside_roots`,
    `endpoint_not_allowed`)."""
    none_of = lambda *names: [{"not": {"required": [n]}} for n in names]  # noqa: E731
    schema["oneOf"] = [
        {
            "properties": {"kind": {"const": "folder"}, "prefix": {"const": ""}},
            "required": ["path"],
            "allOf": none_of("bucket", "endpoint", "region", "access_key", "secret_key"),
        },
        {
            "properties": {"kind": {"const": "s3"}},
            "required": ["bucket"],
            "allOf": none_of("path", "access_key", "secret_key"),
        },
        {
            "properties": {"kind": {"const": "s3"}},
            "required": ["bucket", "access_key", "secret_key"],
            "allOf": none_of("path"),
        },
    ]


class SourceCreate(Body):
    """A folder source (`path`) or an S3 one (`bucket`, optionally `prefix`, `endpoint`, `region` and both keys)."""

    model_config = ConfigDict(json_schema_extra=_source_schema)

    kind: Literal["folder", "s3"]
    path: str | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        json_schema_extra={"pattern": ABSOLUTE},
        description="folder: an absolute path inside SYNC_ROOTS",
    )
    bucket: str | None = Field(default=None, json_schema_extra={"pattern": BUCKET}, max_length=63)
    prefix: str = Field(default="", max_length=1024, description="s3: the key prefix synced ('' = all)")
    endpoint: str | None = Field(
        default=None, max_length=512, description="s3: an endpoint URL of SYNC_S3_ENDPOINTS (none: AWS)"
    )
    region: str | None = Field(default=None, json_schema_extra={"pattern": REGION}, max_length=64)
    access_key: str | None = Field(default=None, min_length=1, max_length=256, description="write-only")
    secret_key: str | None = Field(default=None, min_length=1, max_length=1024, description="write-only")
    every: int | None = Field(
        default=None, ge=1, le=MAX_EVERY, description="minutes between scheduled syncs (none: on demand)"
    )

    _p = field_validator("path")(lambda v: _plain(v, "path"))
    _x = field_validator("prefix")(_prefix)
    _e = field_validator("endpoint")(lambda v: _plain(v, "endpoint"))
    _k = field_validator("access_key", "secret_key")(lambda v: _plain(v, "a credential"))

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(BUCKET, value):
            raise ValueError("bucket must be an S3 bucket name: 3-63 of a-z, 0-9, '.', '-'")
        return value

    @field_validator("region")
    @classmethod
    def _region(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(REGION, value):
            raise ValueError("region must be like us-east-1")
        return value


class SourceUpdate(Body):
    """Fields to change (the kind stays); `every: null` stops the schedule, a credential `null` forgets it."""

    path: str | None = Field(
        default=None, min_length=1, max_length=1024, json_schema_extra={"pattern": ABSOLUTE}
    )
    bucket: str | None = Field(default=None, json_schema_extra={"pattern": BUCKET}, max_length=63)
    prefix: str | None = Field(default=None, max_length=1024)
    endpoint: str | None = Field(default=None, max_length=512)
    region: str | None = Field(default=None, json_schema_extra={"pattern": REGION}, max_length=64)
    access_key: str | None = Field(default=None, min_length=1, max_length=256)
    secret_key: str | None = Field(default=None, min_length=1, max_length=1024)
    every: int | None = Field(default=None, ge=1, le=MAX_EVERY)

    _p = field_validator("path")(lambda v: _plain(v, "path"))
    _x = field_validator("prefix")(_prefix)
    _e = field_validator("endpoint")(lambda v: _plain(v, "endpoint"))
    _k = field_validator("access_key", "secret_key")(lambda v: _plain(v, "a credential"))
    _b = field_validator("bucket")(SourceCreate._bucket.__func__)
    _r = field_validator("region")(SourceCreate._region.__func__)


class SourceOut(Out):
    id: int
    index_id: int
    kind: Literal["folder", "s3"]
    path: str | None
    bucket: str | None
    prefix: str
    endpoint: str | None
    region: str | None
    has_credentials: bool = Field(description="whether credentials are set (they are never returned)")
    every: int | None
    next_run_at: str | None
    last_job_id: int | None
    last_summary: dict = Field(
        description="the last run's counts: added, changed, removed, unchanged, failed, failed_unchanged "
        "(of the failed, those not tried again: unchanged since they failed)"
    )
    created_at: str | None
    updated_at: str | None
