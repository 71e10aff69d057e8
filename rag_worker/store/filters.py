"""Filters: SQL strings in LanceDB, only ever built here, from checked values.

The values are names that passed `names.check_name` (datasets, indexes, ids), a strict id pattern (document ids),
integers, or a sha256 digest of the file name (`doc_key`), so no user text is ever interpolated into a filter.
A value that is none of these is refused with an exception, whatever the interpreter's flags (never an `assert`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

from ..errors import BadRequest
from ..names import NAME_RE

DOCUMENT_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
DIGEST_RE = re.compile(r"^[0-9a-f]{40}$")
WORD_RE = re.compile(r"\w", re.UNICODE)


def doc_key(dataset: str, filename: str) -> str:
    """The (dataset, filename) identity as hex, so that filters never carry a file name (quotes and all)."""
    return hashlib.sha256(f"{dataset}\x00{filename}".encode()).hexdigest()[:40]


def check_document_id(value: object) -> str:
    if not isinstance(value, str) or not DOCUMENT_ID_RE.fullmatch(value):
        raise BadRequest(
            "document_id must be a sha256 hex digest", code="bad_document_id", field="document_id"
        )
    return value


def in_clause(column: str, names: Sequence[str]) -> str:
    """`column IN ('a', 'b')` for values that passed check_name ([A-Za-z0-9_-]), which need no escaping; any other
    value is a ValueError (a caller that skipped the check), never quoted into the filter."""
    bad = [n for n in names if not isinstance(n, str) or not NAME_RE.fullmatch(n)]
    if bad:
        raise ValueError(f"refusing to filter {column} by {bad[0]!r}: only checked names go into a filter")
    return f"{column} IN ({', '.join(repr(str(n)) for n in names)})"


def doc_keys_clause(digests: Sequence[str]) -> str:
    """`doc_key IN (...)` for `doc_key` digests."""
    bad = [d for d in digests if not isinstance(d, str) or not DIGEST_RE.fullmatch(d)]
    if bad:
        raise ValueError(f"refusing to filter doc_key by {bad[0]!r}: not a doc_key digest")
    return "doc_key IN (" + ", ".join(f"'{d}'" for d in digests) + ")"


def doc_filter(dataset: str, filename: str, document_id: str | None = None) -> str:
    where = f"doc_key = '{doc_key(dataset, filename)}'"
    if document_id is not None:
        where += f" AND document_id = '{check_document_id(document_id)}'"
    return where


def has_words(query: str) -> bool:
    """Whether a query has a term for the FTS leg: one of only punctuation or nothing at all has none."""
    return bool(query) and bool(WORD_RE.search(query))
