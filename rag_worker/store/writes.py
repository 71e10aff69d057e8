"""Commits to a table, and the housekeeping after one.

- `merge_insert(...).when_not_matched_by_source_delete(...)` replaces a document's rows in one commit: a reader
  sees the old rows or the new ones, and a failed write leaves the old ones;
- two processes committing to one table at once get "Retryable commit conflict" (LanceDB's optimistic
  concurrency): the losing commit wrote nothing, so it is retried on the new version with a backoff
  (`retry_conflicts`, the one policy of every commit here: merge-inserts, deletes, the FTS index of a new table
  and the Ray engine's fragment appends). Compaction (`optimize`) is housekeeping after a write that already
  committed: when it loses such a race it is left for the next write, never reported as the write's failure.
  Writers of one index are also ordered across processes by a file lock (rag_worker/locks.py), which keeps the
  read-modify-write steps around a commit consistent;
- `optimize()` folds rows added after the FTS index was built into it and compacts small fragments, so it runs
  after every write (tens of milliseconds on 20k rows), except that a folder run does it every so many rows and
  at its end (each one left ~2 MB resident, bench/ingest_memory.py).
"""

from __future__ import annotations

import logging
import random
from datetime import timedelta
from typing import TYPE_CHECKING

import pyarrow as pa

from ..locks import native_sleep
from . import ann
from .rows import scan_arrow

if TYPE_CHECKING:  # pragma: no cover
    from lancedb.table import LanceTable

log = logging.getLogger(__name__)

# Old versions are kept a while so that a reader in another process still holding one does not lose its files.
CLEANUP_OLDER_THAN = timedelta(hours=1)
# A commit that lost a race with another process is retried this many times, the pause doubling from the first
# (randomised up to twice as long, so that two losers do not collide again) up to the last.
COMMIT_ATTEMPTS = 10
COMMIT_BACKOFF_S = 0.02
COMMIT_BACKOFF_MAX_S = 1.0


def is_commit_conflict(exc: BaseException) -> bool:
    """LanceDB's optimistic concurrency refused a commit because another one landed first; nothing was written."""
    text = str(exc).lower()
    # "Incompatible transaction": Lance refused this transaction against one that landed meanwhile (e.g. two
    # processes creating the same new table and its full-text index at once); nothing of it was written either.
    return (
        "commit conflict" in text
        or "incompatible transaction" in text
        or "CommitConflict" in type(exc).__name__
    )


def retry_conflicts(fn, what: str):
    """fn() again, after a growing randomised pause, while it loses commit races; other errors go through."""
    pause = COMMIT_BACKOFF_S
    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        try:
            return fn()
        except Exception as exc:
            if attempt == COMMIT_ATTEMPTS or not is_commit_conflict(exc):
                raise
            log.info("%s: commit conflict (attempt %d), retrying: %s", what, attempt, str(exc)[:200])
            native_sleep(pause * (1 + random.random()))
            pause = min(pause * 2, COMMIT_BACKOFF_MAX_S)
    raise AssertionError("unreachable")  # pragma: no cover


def commit_fragments(table: LanceTable, fragments: list) -> None:
    """One Lance `Append` of fragments written elsewhere, on the table's newest version at each attempt."""
    import lance

    uri = str(table.uri)

    def commit() -> None:
        current = lance.dataset(uri)
        lance.LanceDataset.commit(uri, lance.LanceOperation.Append(fragments), read_version=current.version)

    retry_conflicts(commit, f"appending fragments to {table.name}")


def upsert(
    table: LanceTable,
    data: pa.Table,
    replace_where: str | None,
    min_rows: int,
    *,
    count: bool = True,
    compact: bool = True,
) -> int:
    """One commit: rows matched by id are updated, new ones inserted, and (when replacing) the document's rows
    that are not in `data` deleted; then the housekeeping (`after_write`, ANN index past `min_rows`) unless not
    `compact`. Returns how many rows the document had before."""
    removed = table.count_rows(replace_where) if replace_where and count else 0

    def commit() -> None:
        builder = table.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
        if replace_where:
            builder = builder.when_not_matched_by_source_delete(replace_where)
        builder.execute(data)

    retry_conflicts(commit, f"writing to {table.name}")
    if compact:
        after_write(table, min_rows)
    return removed


def upsert_counted(
    table: LanceTable, data: pa.Table, replace_where: str, min_rows: int, compact: bool = True
) -> dict[str, int]:
    """`upsert` for a batch: the rows each doc_key had before, {doc_key: count}."""
    before = scan_arrow(table, replace_where, ["doc_key"]).column("doc_key").to_pylist()
    counts: dict[str, int] = {}
    for key in before:
        counts[key] = counts.get(key, 0) + 1
    upsert(table, data, replace_where, min_rows, count=False, compact=compact)
    return counts


def delete(table: LanceTable, where: str, min_rows: int) -> int:
    count = table.count_rows(where)
    if count:
        retry_conflicts(lambda: table.delete(where), f"deleting from {table.name}")
        after_write(table, min_rows)
    return count


def after_write(table: LanceTable, min_rows: int) -> None:
    """Housekeeping after a committed write: it never turns that write into a failure. What loses a race with
    another process (or fails otherwise) is logged and done by a later write."""
    try:
        table.optimize(cleanup_older_than=CLEANUP_OLDER_THAN)
    except Exception as exc:
        log.warning(
            "compacting %s deferred to a later write (the write itself is committed): %s", table.name, exc
        )
    try:
        ann.maybe_build(table, min_rows)
    except Exception as exc:
        log.warning("building the ANN index of %s deferred to a later write: %s", table.name, exc)
