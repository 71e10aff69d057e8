"""Rebuild an index into a new table while searches keep using the current one, and swap it in when complete.

Both engines (the local one, `folder.py`, and `ray_engine.py`) rebuild through `rebuild_and_swap`, each with its
own indexing step.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from ..store.rows import SENTENCE_COLUMNS
from . import attachments, overviews
from .document import file_sha256
from .records import DEFAULT_DATASET, BatchDone, IndexInto, Progress

if TYPE_CHECKING:  # pragma: no cover
    from ..services import Services

log = logging.getLogger(__name__)

# Documents carried over from the current table per read and write.
CARRY_BATCH = 200


def rebuild_and_swap(
    services: Services, index: str, folder: Path, prune: bool, started: float, index_into: IndexInto
) -> Iterator[Progress | BatchDone]:
    """Index the folder into a new table while searches keep using the current one, carry over what the folder
    cannot rebuild, and swap the new table in only when it is complete. Both engines rebuild through this, each
    with its own indexing step.

    Kept from the current table: documents whose file is not in the folder (unless `prune`), files that failed
    this time, and whatever uploads and deletes changed while the rebuild ran (settled under the index's write
    lock, just before the swap). A crash or an error before the swap (a node lost, the driver stopped) leaves
    the current table and its overviews as they were; the table being built is dropped then, or by the next
    rebuild when the process died.
    """
    store = services.store
    for stale in store.staged_tables(index):  # a rebuild that crashed (only one runs at a time: the guard)
        store.discard(stale)
        overviews.drop_overviews(services.settings, stale)
    staged = store.new_staged(index)
    swapped = False
    try:
        run = yield from index_into(staged)
        # Most of the carrying over (maybe re-embedding) happens without the lock; what uploads and deletes
        # changed meanwhile is settled under it, then the swap.
        kept, removed = _settle(services, index, staged, folder, prune)
        with services.index_lock(index):
            more_kept, more_removed = _settle(services, index, staged, folder, prune)
            store.promote(index, staged)
            overviews.promote_overviews(services.settings, index, staged)
            swapped = True
    finally:
        if not swapped:
            try:
                store.discard(staged)
                overviews.drop_overviews(services.settings, staged)
            except Exception:  # the next rebuild drops it
                log.exception("dropping the unfinished rebuild table %s failed", staged)
    yield run.done(started, removed=removed + more_removed, kept=len(kept | more_kept))


def _settle(
    services: Services, index: str, staged: str, folder: Path, prune: bool
) -> tuple[set[tuple[str, str]], int]:
    """Make the rebuilt table hold what it must before the swap; returns (documents carried over, chunks of
    documents left out because `prune` was asked)."""
    store = services.store
    current = (
        {(d["dataset"], d["filename"]): d for d in store.list_documents(index)} if store.exists(index) else {}
    )
    built = {(d["dataset"], d["filename"]): d for d in store.list_documents(staged)}
    carry: list[tuple[str, str]] = []
    pruned = 0
    for key, doc in current.items():
        source = _source_in(folder, *key)
        if key not in built:
            if (
                prune
                and source is None
                and not attachments.belongs_to_a_message(key[1], _names_in(folder, key[0]))
            ):
                pruned += int(doc["chunks"])
            else:  # not in the folder, or its file failed this time: the current rows stay
                carry.append(key)
        elif (
            built[key]["document_id"] != doc["document_id"]
            and source is not None
            and file_sha256(source) == doc["document_id"]
        ):
            carry.append(key)  # an upload replaced the file while the rebuild ran: the folder has its bytes
    for key in built.keys() - current.keys():
        if _source_in(folder, *key) is None:  # deleted while the rebuild ran (a delete removes the original)
            store.delete_document(staged, dataset=key[0], filename=key[1])
            overviews.remove_overview(services.settings, staged, dataset=key[0], filename=key[1])
    if carry:
        _carry_over(services, index, staged, carry)
    return set(carry), pruned


def _carry_over(services: Services, index: str, staged: str, keys: list[tuple[str, str]]) -> None:
    """Copy documents' rows (and overviews) from the current table into the rebuilt one; their vectors are
    computed again when the current table was made with another embedder."""
    store = services.store
    marker = store.marker(index)
    embedder = store.embedder_for(staged)  # the index's own (a rebuild keeps it), maybe not the default
    same_embedder = (
        marker.get("embedding_model") in (None, embedder.model_id)
        and marker.get("dim", marker.get("table_dim")) == embedder.dim
    )
    for start in range(0, len(keys), CARRY_BATCH):
        part = keys[start : start + CARRY_BATCH]
        rows = store.scan_documents(index, part)
        if not same_embedder:
            rows = _embedded_again(embedder, rows)
        store.write_rows(staged, rows, part)
    wanted = set(keys)
    entries = [
        e
        for e in overviews.load_overviews(services.settings, index)
        if (e.get("dataset"), e.get("filename")) in wanted
    ]
    if entries:
        overviews.upsert_overviews(services.settings, staged, entries)


def _embedded_again(embedder, rows):
    """The rows with vectors from this worker's embedder: headings + text, as ingestion embeds a chunk."""
    texts = []
    for text, meta in zip(rows.column("text").to_pylist(), rows.column("metadata").to_pylist(), strict=True):
        try:
            headings = json.loads(meta or "{}").get("headings") or []
        except (ValueError, AttributeError):
            headings = []
        texts.append("\n".join([*(str(h) for h in headings if h), text]))
    vectors = np.asarray(embedder.embed_documents(texts), dtype=np.float32) if texts else None
    dim = embedder.dim
    flat = pa.array(vectors.reshape(-1) if vectors is not None else np.zeros(0, dtype=np.float32))
    column = pa.FixedSizeListArray.from_arrays(flat, dim)
    # The sentence vectors carried were the other embedder's too: `write_rows` embeds them again.
    stale = [c for c in ("vector", *SENTENCE_COLUMNS) if c in rows.column_names]
    return rows.drop_columns(stale).append_column(pa.field("vector", pa.list_(pa.float32(), dim)), column)


def _source_in(folder: Path, dataset: str, filename: str) -> Path | None:
    """The file a (dataset, filename) document is read from in `folder`, if it is there."""
    for candidate in (folder / dataset / filename, folder / filename if dataset == DEFAULT_DATASET else None):
        if candidate is not None and candidate.is_file():
            return candidate
    return None


def _names_in(folder: Path, dataset: str) -> set[str]:
    """The file names a dataset has in `folder` (an e-mail there keeps its attachment documents)."""
    dirs = [folder / dataset, *([folder] if dataset == DEFAULT_DATASET else [])]
    return {p.name for d in dirs if d.is_dir() for p in d.iterdir() if p.is_file()}
