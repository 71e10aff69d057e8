"""The names an index deals in: its worker table's, a dataset's, an uploaded file's, a download's."""

from __future__ import annotations

import re
import secrets
import unicodedata
from pathlib import PurePosixPath, PureWindowsPath
from urllib.parse import quote

from contract.text import text_problem_in_filename

from ..errors import BadRequest
from ..schemas import NAME_RE


def worker_table_name(owner_id: int, name: str) -> str:
    """A unique worker table name that still reads like the index: `u7_contracts-2024_3f9a1c2b`."""
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode().lower()
    slug = re.sub(r"[^a-z0-9-]+", "-", ascii_name).strip("-")[:32] or "index"
    return f"u{owner_id}_{slug}_{secrets.token_hex(4)}"


def check_dataset(value: str) -> str:
    if not NAME_RE.fullmatch(value):
        raise BadRequest(
            "dataset must be 1 to 64 letters, digits, '_' or '-'", code="bad_name", field="dataset"
        )
    return value


def check_filename(value: str | None) -> str:
    """A plain base name (unicode and spaces kept); any path in it is a 400, like the worker."""
    name = unicodedata.normalize("NFC", (value or "").strip())
    if not name:
        raise BadRequest("the upload has no file name", code="bad_filename", field="file")
    if len(name.encode("utf-8")) > 255:
        raise BadRequest("the file name is longer than 255 bytes", code="bad_filename", field="file")
    if any(ch in name for ch in "\x00\r\n") or name in {".", ".."}:
        raise BadRequest("the file name contains forbidden characters", code="bad_filename", field="file")
    problem = text_problem_in_filename(name)
    if problem:
        raise BadRequest(problem, code="bad_filename", field="file")
    if PurePosixPath(name).name != name or PureWindowsPath(name).name != name:
        raise BadRequest("the file name must not contain a path", code="path_in_filename", field="file")
    return name


def content_disposition(filename: str) -> str:
    """An attachment named exactly `filename` (RFC 6266 `filename*`), with a plain ASCII fallback for old
    clients; a name such as `per%22cent.md` survives, where a quoted `filename=` would be read as `per"cent.md`."""
    fallback = "".join(ch if 32 <= ord(ch) < 127 and ch not in '"\\%' else "_" for ch in filename)
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(filename, safe='')}"
