"""The name rules: index, dataset and file names that reach the file system or the store, checked here only.

The request models (schemas.py), the routes, the store and the OpenAPI document all take their rule from this
module: `NAME_RE` / `is_name` for index and dataset names, `check_filename` for a file's display name.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import PurePosixPath, PureWindowsPath

from contract.text import text_problem_in_filename

from .errors import BadRequest

NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
NAME_RULE = "1 to 64 characters of letters, digits, '_' or '-'"
# What check_filename accepts, for the OpenAPI document: no path separators, drive colons, control characters or
# bidirectional controls (contract/text.py), and at least one character that is neither a dot nor a space ("."
# and ".." are refused).
_NOT_IN_FILENAME = r"/\\\x00\r\n:\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c"
FILENAME_PATTERN = rf"^[^{_NOT_IN_FILENAME}]*[^{_NOT_IN_FILENAME}.\s][^{_NOT_IN_FILENAME}]*$"
# A table being built for an index by a rebuild (`<index>.<12 hex>`): never an index name (no dots there), so
# the HTTP API cannot reach it; the store swaps it in when it is complete.
STAGED_RE = re.compile(r"^([A-Za-z0-9_-]{1,64})\.[0-9a-f]{12}$")


class BadName(BadRequest):
    code = "bad_name"


class BadFilename(BadRequest):
    code = "bad_filename"


def is_name(value: object) -> bool:
    """An index or dataset name: [A-Za-z0-9_-]{1,64}."""
    return isinstance(value, str) and NAME_RE.fullmatch(value) is not None


def name_problem(value: str, kind: str) -> str | None:
    """Why `value` is no `kind` (index, dataset) name, or None; for validators that word their own errors."""
    return None if is_name(value) else f"{kind} {value[:80]!r} is not {NAME_RULE}"


def check_name(value: object, field: str) -> str:
    """An index or dataset name, else a 400 naming the field."""
    if not is_name(value):
        raise BadName(f"{field} must be {NAME_RULE}", field=field)
    return value


def check_filename(value: object, field: str = "filename") -> str:
    """A file's display name: a plain base name (unicode and spaces kept); any path in it is a 400."""
    if not isinstance(value, str) or not value.strip():
        raise BadFilename("a file name is required", field=field)
    name = unicodedata.normalize("NFC", value.strip())
    if len(name.encode("utf-8")) > 255:
        raise BadFilename("the file name is longer than 255 bytes", field=field)
    if any(ch in name for ch in "\x00\r\n") or name in {".", ".."}:
        raise BadFilename("the file name contains forbidden characters", field=field)
    problem = text_problem_in_filename(name)
    if problem:
        raise BadFilename(problem, field=field)
    if PurePosixPath(name).name != name or PureWindowsPath(name).name != name:
        raise BadFilename("the file name must not contain a path", code="path_in_filename", field=field)
    return name


def check_table(value: object, field: str = "index") -> str:
    """An index name, or the name of a table a rebuild is building for one (`<index>.<12 hex>`)."""
    if isinstance(value, str) and STAGED_RE.fullmatch(value):
        return value
    return check_name(value, field)
