"""Single byte ranges (RFC 7233 / RFC 9110 §14) for an index's originals, so PDF.js opens a large PDF page by page.

`parse` reads a `Range` header into one range or None. None means "send the whole file" (200): no header, a
unit other than bytes, several ranges (multipart answers are not offered; RFC 9110 lets a server ignore the
header) or a malformed one (also ignorable). One well-formed range goes to the worker, whose Werkzeug answers
206 with `Content-Range`; a range starting past the end is a 416 with `Content-Range: bytes */<size>`, which the
browser gets as JSON in the gateway's error shape. A zero-length suffix (`bytes=-0`) selects nothing: it is asked
as a start no file reaches, so the 416 carries the size too. If-Range is not supported (the header is ignored).
"""

from __future__ import annotations

import re

from .errors import ApiError

RANGE_RE = re.compile(r"^\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$", re.IGNORECASE)
BEYOND = 1 << 62  # past any file: a range starting here is unsatisfiable
MAX_DIGITS = 19


class RangeNotSatisfiable(ApiError):
    status, code = 416, "range_not_satisfiable"


def parse(header: str | None) -> str | None:
    """The `Range` value to ask the worker for (`bytes=first-last`, `bytes=first-`, `bytes=-suffix`), or None to
    send the whole file."""
    if not header or len(header) > 200:
        return None
    match = RANGE_RE.match(header)
    if match is None:
        return None  # another unit, several ranges, or not a range at all
    first, last = match.groups()
    if len(first) > MAX_DIGITS or len(last) > MAX_DIGITS:
        return (
            f"bytes={BEYOND}-" if first else None
        )  # a start past any file; an absurd suffix is the whole file
    if first == "" and last == "":
        return None
    if first == "":
        suffix = int(last)
        return f"bytes={BEYOND}-" if suffix == 0 else f"bytes=-{suffix}"
    if last == "":
        return f"bytes={int(first)}-"
    if int(last) < int(first):
        return None  # an invalid range-spec: ignored
    return f"bytes={int(first)}-{int(last)}"


def not_satisfiable(content_range: str | None) -> RangeNotSatisfiable:
    """The 416 for the client, with the size the worker gave (`bytes */<size>`)."""
    size = None
    if content_range:
        match = re.fullmatch(r"\s*bytes\s+\*/(\d+)\s*", content_range)
        size = match.group(1) if match else None
    headers = {"Content-Range": f"bytes */{size}"} if size else None
    where = f" of {size} bytes" if size else ""
    return RangeNotSatisfiable(
        f"the requested range starts past the end of the file{where}", field="Range", headers=headers
    )
