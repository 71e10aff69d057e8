"""Validation of index, dataset and file names that reach the file system or the store."""

from __future__ import annotations

import re
import unicodedata
from pathlib import PurePosixPath, PureWindowsPath

from .errors import BadRequest

NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# What check_filename accepts, for the OpenAPI document: no path separators, drive colons or control characters,
# and at least one character that is neither a dot nor a space ("." and ".." are refused).
FILENAME_PATTERN = r"^[^/\\\x00\r\n:]*[^/\\\x00\r\n:.\s][^/\\\x00\r\n:]*$"
# A table being built for an index by a rebuild (`<index>.<12 hex>`): never an index name (no dots there), so
# the HTTP API cannot reach it; the store swaps it in when it is complete.
STAGED_RE = re.compile(r"^([A-Za-z0-9_-]{1,64})\.[0-9a-f]{12}$")


def check_name(value: object, field: str) -> str:
    """An index or dataset name: [A-Za-z0-9_-]{1,64}, else a 400 naming the field."""
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise BadRequest(
            f"{field} must be 1 to 64 characters of letters, digits, '_' or '-'", code="bad_name", field=field
        )
    return value


def check_filename(value: object, field: str = "filename") -> str:
    """A file's display name: a plain base name (unicode and spaces kept); any path in it is a 400."""
    if not isinstance(value, str) or not value.strip():
        raise BadRequest("a file name is required", code="bad_filename", field=field)
    name = unicodedata.normalize("NFC", value.strip())
    if len(name.encode("utf-8")) > 255:
        raise BadRequest("the file name is longer than 255 bytes", code="bad_filename", field=field)
    if any(ch in name for ch in "\x00\r\n") or name in {".", ".."}:
        raise BadRequest("the file name contains forbidden characters", code="bad_filename", field=field)
    if PurePosixPath(name).name != name or PureWindowsPath(name).name != name:
        raise BadRequest("the file name must not contain a path", code="path_in_filename", field=field)
    return name


def check_table(value: object, field: str = "index") -> str:
    """An index name, or the name of a table a rebuild is building for one (`<index>.<12 hex>`)."""
    if isinstance(value, str) and STAGED_RE.fullmatch(value):
        return value
    return check_name(value, field)
