"""The chunk store: one LanceDB table per index, searched by vector, by BM25 full text, or both fused by RRF.

Facts this module relies on (verified against lancedb 0.40 by tests/unit/test_store.py):
- the native FTS index finds rows added after it was built and drops deleted rows without a rebuild (unindexed
  rows are searched exhaustively); `optimize()` folds them into the index and compacts small fragments, so it
  runs after every write (tens of milliseconds on 20k rows), except that a folder run does it every
  `pipeline.COMPACT_ROWS` rows and at its end (each one left ~2 MB resident, bench/ingest_memory.py);
- pyarrow schema metadata given at `create_table` survives adds, merges, deletes and `optimize`, so the embedder
  marker lives on the table itself, no sidecar file;
- `merge_insert(...).when_not_matched_by_source_delete(...)` replaces a document's rows in one commit: a reader
  sees the old rows or the new ones, and a failed write leaves the old ones;
- two processes committing to one table at once get "Retryable commit conflict" (LanceDB's optimistic
  concurrency): the losing commit wrote nothing, so it is retried on the new version with a backoff. Compaction
  (`optimize`) is housekeeping after a write that already committed: when it loses such a race it is left for
  the next write, never reported as the write's failure. Writers of one index are also ordered across processes
  by a file lock (rag_worker/locks.py), which keeps the read-modify-write steps around a commit consistent;
- LanceDB OSS cannot rename a table. A rebuild builds a new table `<index>.<12 hex>` while searches keep using the
  old one, then swaps it in by replacing a one-line alias file (`aliases/<index>`) atomically; a reader resolves
  the alias on every call, and one that raced with the swap retries once on the new table;
- LanceDB makes a table's folder before it commits the table's first version, so a table exists once its
  `_versions` folder holds a manifest (`_has_table`), not when the folder appears;
- a read of rows by row id pays per column per row, so searches read a hit's fields from one packed column
  (`PACKED`), not from seven (tables made before the id joined it read the id column too);
- searches (both legs and the read of the fused hits) run on a pylance dataset of the table's newest version, not
  through LanceDB's query layer, which costs 1.3 to 2.8 ms a call at 1M chunks (docs/benchmarks.md, "Eighth
  round"). Checking for a newer version is a listing of `_versions` (tens of microseconds), done once per search,
  so both legs and the read see one version: the row ids the legs return are valid for the read.

Filters are SQL strings in LanceDB. They are only ever built here, from values that passed `names.check_name`
(datasets, indexes), a strict id pattern (document ids), integers, or a sha256 digest of the file name
(`doc_key`), so no user text is ever interpolated into a filter. Every LanceDB call goes through
`runtime.offload`: it blocks the gevent loop otherwise (MODELS.md).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import secrets
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .errors import ApiError, BadRequest, EmbedderMismatch, NotFound
from .locks import native_sleep
from .names import NAME_RE, STAGED_RE, check_filename, check_name, check_table
from .runtime import offload, offload_all

if TYPE_CHECKING:  # pragma: no cover
    from lance import LanceDataset
    from lancedb.table import LanceTable

    from .embeddings import Embedder

log = logging.getLogger(__name__)

MARKER_KEY = b"rag_worker.marker"
MODES = ("hybrid", "vector", "fts")
# How hybrid mode fuses its two legs (docs/benchmarks.md, "Fusion"):
# - "rrf": reciprocal rank fusion, score = sum over legs of 1 / (rrf_k + rank);
# - "tmm": a convex combination of scores normalised by theoretical min-max (Bruch, Gai, Ingber 2023, "An Analysis
#   of Fusion Functions for Hybrid Retrieval"): alpha * (cos - (-1)) / (max cos - (-1)) + (1 - alpha) * bm25 / max
#   bm25, each max taken over that leg's candidates;
# - "zscore": the same convex combination of z-scores, mean and deviation taken over each leg's candidates;
# - "robust": the same with robust z-scores, (score - median) / (1.4826 * median absolute deviation) over each
#   leg's candidates (1.4826 makes the MAD equal the standard deviation of normally distributed scores). A leg's
#   top 100 is a few relevant outliers above a mass of near misses; the mean and deviation move with those outliers,
#   so one very strong match squeezes every other candidate of its leg, while the median and MAD describe the mass
#   and leave the outliers standing out (docs/benchmarks.md, "Seventh round").
FUSIONS = ("rrf", "tmm", "zscore", "robust")
# The MAD of normally distributed values times this is their standard deviation.
MAD_TO_STD = 1.4826
# Theoretical lower bounds of the two legs' scores: cosine similarity and BM25.
COSINE_MIN = -1.0
BM25_MIN = 0.0
# In hybrid mode each leg fetches at least this many candidates: a chunk ranked 40th by one leg and 3rd by the
# other should still be fused, which a leg cut at `limit` would miss. 100 over 50: +0.004 nDCG@10 on SciFact
# train, no gain from 200 (docs/benchmarks.md).
HYBRID_LEG_MIN = 100
# Lance returns rows with equal scores in no fixed order (its search is multi-threaded; duplicate passages tie
# exactly), and reciprocal rank fusion ranks them: each leg asks for this many rows past its cut, sorts by score,
# then table and row id (the row's place in the table, so no column need be read), and cuts, so that the same query
# on the same index always gives the same ranks and the same tied rows make the cut. Without it, 10 of SciFact's
# 300 test queries changed their RRF top 30 between three identical runs. (A compaction renumbers rows, so after
# one, which of two identical passages ranks first may change; until 2026-12 ties went by id, which costs a
# column read in each leg.)
LEG_TIE_SLACK = 5
MAX_LIMIT = 1000
# Old versions are kept a while so that a reader in another process still holding one does not lose its files.
CLEANUP_OLDER_THAN = timedelta(hours=1)
# A commit that lost a race with another process is retried this many times, the pause doubling from the first.
COMMIT_ATTEMPTS = 10
COMMIT_BACKOFF_S = 0.02
COMMIT_BACKOFF_MAX_S = 1.0
# Lance's caches of one Store (all its tables), in each of its two sessions (LanceDB's, for writes and listings;
# pylance's, for searches): index pieces (FTS postings, ANN partitions) and table metadata.
INDEX_CACHE_MB = 1024
METADATA_CACHE_MB = 128
ALIASES = "aliases"  # folder in the store root: one file per rebuilt index naming the table that serves it
DOCUMENT_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_WORD_RE = re.compile(r"\w", re.UNICODE)
_HIT_COLUMNS = ["id", "document_id", "filename", "dataset", "page", "chunk_index", "text", "metadata"]
# A hit's fields but its text, also packed into one JSON column, `hit`, which the searches read instead of the
# seven columns (as Lucene keeps a document's stored fields together). A Lance read by row id pays per column per
# row, and a column that is constant across a file (`dataset` in a one-dataset index) decodes a whole page per
# row: at 1M chunks, 30 hits' six columns cost several ms where the one column costs about one, and the id column
# half a millisecond more (docs/benchmarks.md, "Fifth round" and "Ninth round"). The separate columns stay for
# filters, listings and older readers. Tables made before the column existed lack it and are read column by
# column; in tables made before the id joined it (their marker lacks PACKED_ID) the id is read from its column
# (`Store._hit_columns`).
PACKED = "hit"
PACKED_ID = "packed_id"  # marker key: every row's packed column holds its id
_PACKED_FIELDS = ("id", "document_id", "filename", "dataset", "page", "chunk_index", "metadata")
_PACKED_COLUMNS = ["text", PACKED]
# The full-text tokenizer: English stemming is worth +0.03 nDCG@10 of the FTS leg on SciFact, dropping stop words
# a hair (docs/benchmarks.md). Changing it only affects tables created afterwards.
FTS_CONFIG = {
    "language": "English",
    "stem": True,
    "remove_stop_words": True,
    "lower_case": True,
    "ascii_folding": True,
}
# ANN vector index (retrieval latency in docs/benchmarks.md): below ANN_MIN_ROWS LanceDB's exact scan is fast
# enough and exact; past it the index is built once, and later writes are folded into it by `optimize()`.
ANN_INDEX_TYPE = "IVF_HNSW_SQ"
ANN_MIN_ROWS = 50_000
ANN_NPROBES = 10
ANN_REFINE_FACTOR = 1
# HNSW candidates examined per query in each probed partition (LanceDB's `ef`); 0: LanceDB's default, 1.5 x the
# rows asked for (and with a refine factor, 1.5 x limit x factor). The 1M-chunk sweep (docs/benchmarks.md): recall
# is bounded by ef, not by the partitions probed or SQ's quantisation: ef 400 with an exact re-scoring of the rows
# returned (refine 1) gives recall@10 0.998 (a hybrid leg's recall@100 0.991), as the earlier refine 10 did, which
# re-read 10x the rows' vectors (1,000 random reads for a hybrid leg).
ANN_EF = 400


@dataclass
class Hit:
    id: str
    document_id: str
    filename: str
    dataset: str
    page: int | None
    chunk_index: int
    text: str
    metadata: dict
    index: str
    score: float = 0.0  # the fused score (FUSIONS); only its order means anything
    # Cosine similarity of query and chunk vectors; in hybrid mode set for the FTS leg's hits too (from the
    # stored vector), vector_rank staying None for a chunk the vector leg did not return.
    vector_score: float | None = None
    fts_score: float | None = None  # BM25 score of the chunk for the query
    vector_rank: int | None = None  # 1-based
    fts_rank: int | None = None  # 1-based
    rerank_score: float | None = None  # set by the pipeline's rerank stage when a cross-encoder runs
    # The chunk's stored vector, when the search read it (so a turn never reads or embeds it again); never
    # serialised.
    vector: np.ndarray | None = field(default=None, repr=False, compare=False)
    # Where the search found the row in its table's version (Lance's row address); never serialised. The legs
    # and the fusion key rows by it and break exact ties by it, so that a hybrid search need read no column but
    # the scores until the fused top is known.
    row_id: int | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _UNSERIALISED}


_UNSERIALISED = ("vector", "row_id")


def doc_key(dataset: str, filename: str) -> str:
    """The (dataset, filename) identity as hex, so that filters never carry a file name (quotes and all)."""
    return hashlib.sha256(f"{dataset}\x00{filename}".encode()).hexdigest()[:40]


def chunk_id(dataset: str, filename: str, document_id: str, chunk_index: int) -> str:
    """A chunk's id: two files with identical bytes (same document_id) still get distinct ids."""
    raw = f"{dataset}\x00{filename}\x00{document_id}\x00{int(chunk_index)}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def table_schema(dim: int, marker: dict) -> pa.Schema:
    return pa.schema(
        [
            pa.field("id", pa.string(), nullable=False),
            pa.field("doc_key", pa.string(), nullable=False),
            pa.field("document_id", pa.string(), nullable=False),
            pa.field("filename", pa.string(), nullable=False),
            pa.field("dataset", pa.string(), nullable=False),
            pa.field("page", pa.int32()),
            pa.field("chunk_index", pa.int32(), nullable=False),
            pa.field("text", pa.string(), nullable=False),
            pa.field("metadata", pa.string()),
            pa.field("file_bytes", pa.int64()),
            pa.field("indexed_at", pa.string()),
            pa.field("vector", pa.list_(pa.float32(), dim)),
            pa.field(PACKED, pa.string()),
        ],
        metadata={MARKER_KEY: json.dumps(marker).encode()},
    )


def _in_clause(column: str, names: Sequence[str]) -> str:
    # Only values that passed check_name ([A-Za-z0-9_-]) reach this point: quoting needs no escaping.
    assert all(NAME_RE.fullmatch(n) for n in names)
    return f"{column} IN ({', '.join(repr(str(n)) for n in names)})"


def _doc_filter(dataset: str, filename: str, document_id: str | None = None) -> str:
    where = f"doc_key = '{doc_key(dataset, filename)}'"
    if document_id is not None:
        where += f" AND document_id = '{_check_document_id(document_id)}'"
    return where


def _check_document_id(value: object) -> str:
    if not isinstance(value, str) or not DOCUMENT_ID_RE.fullmatch(value):
        raise BadRequest(
            "document_id must be a sha256 hex digest", code="bad_document_id", field="document_id"
        )
    return value


def _has_words(query: str) -> bool:
    return bool(query) and bool(_WORD_RE.search(query))


class Store:
    def __init__(
        self,
        root: Path,
        embedder: Embedder,
        *,
        ann_min_rows: int = ANN_MIN_ROWS,
        ann_nprobes: int = ANN_NPROBES,
        ann_refine_factor: int = ANN_REFINE_FACTOR,
        ann_ef: int = ANN_EF,
        index_cache_mb: int = INDEX_CACHE_MB,
        metadata_cache_mb: int = METADATA_CACHE_MB,
    ):
        import lance
        import lancedb

        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.embedder = embedder
        # A table this large gets an ANN vector index after a write (0: never); see docs/benchmarks.md.
        self.ann_min_rows = int(ann_min_rows)
        self.ann_nprobes = max(1, int(ann_nprobes))
        self.ann_refine_factor = max(0, int(ann_refine_factor))
        self.ann_ef = max(0, int(ann_ef))
        # Consistency interval 0: every read checks for a newer version, so writes made by another process (the
        # indexing CLI, a second worker) are seen at once; on local disk that check is a cheap listing.
        # Bounded caches: every commit makes a new table version, and Lance's defaults (GiBs) let the cached
        # manifests and index pieces of versions nobody reads again pile up, about 0.4 MB per commit
        # (bench/ingest_memory.py).
        self.session = lancedb.Session(
            index_cache_size_bytes=int(index_cache_mb) << 20,
            metadata_cache_size_bytes=int(metadata_cache_mb) << 20,
        )
        self._db = lancedb.connect(
            str(self.root), read_consistency_interval=timedelta(0), session=self.session
        )
        self._tables: dict[str, LanceTable] = {}
        self._markers: dict[str, tuple[LanceTable, dict]] = {}
        # The searches' own caches, bounded alike: LanceDB's session is another library's type, not shareable.
        self._search_session = lance.Session(
            index_cache_size_bytes=int(index_cache_mb) << 20,
            metadata_cache_size_bytes=int(metadata_cache_mb) << 20,
        )
        # Physical table name -> (the LanceTable it was opened for, a pylance dataset of one of its versions).
        self._readers: dict[str, tuple[LanceTable, LanceDataset]] = {}

    # -- identity -------------------------------------------------------------------------------------------

    @property
    def own_marker(self) -> dict:
        return {
            "embedding_model": self.embedder.model_id,
            "dim": int(self.embedder.dim),
            "model_path": getattr(self.embedder, "model_path", None),
            PACKED_ID: True,
        }

    def exists(self, index: str) -> bool:
        check_table(index)
        return self._has_table(self._physical(index))

    def indexes(self) -> list[str]:
        # LanceDB lists a folder as a table before its first version is committed (_has_table).
        tables = {n for n in offload(self._table_names) if self._has_table(n)}
        names = {n for n in tables if NAME_RE.fullmatch(n)}
        aliases = self.root / ALIASES
        if aliases.is_dir():
            names.update(
                p.name
                for p in aliases.iterdir()
                if NAME_RE.fullmatch(p.name) and self._physical(p.name) in tables
            )
        return sorted(names)

    def marker(self, index: str) -> dict | None:
        """What the table was built with: {"embedding_model", "dim", ...}; None when the table carries none."""
        table = self._require(index)
        return offload(self._read_marker, table)

    def check_compatible(self, index: str) -> None:
        table = self._require(index)
        self._check_marker(index, self._marker_of(table))

    # -- writes ---------------------------------------------------------------------------------------------

    def add_chunks(self, index: str, rows: list[dict]) -> int:
        """Insert (or update by id) chunks; rows without a vector are embedded here. Returns the rows written."""
        check_table(index)
        if not rows:
            return 0
        data = self._prepare(rows)
        table = self._writable(index)
        data = self._conform(table, data)
        offload(self._upsert, table, data, None)
        return data.num_rows

    def replace_document(
        self, index: str, *, dataset: str, filename: str, rows: list[dict]
    ) -> tuple[int, int]:
        """Swap all chunks of (dataset, filename) for `rows` in one commit. Returns (added, removed)."""
        check_table(index)
        check_name(dataset, "dataset")
        filename = check_filename(filename)
        for row in rows:
            if row.get("dataset") != dataset or check_filename(row.get("filename")) != filename:
                raise BadRequest("every row must belong to the replaced document", code="bad_rows")
        if not rows:
            return 0, self.delete_document(index, dataset=dataset, filename=filename)
        # Embedding (the slow and failure-prone part) happens before anything is written.
        data = self._prepare(rows)
        table = self._writable(index)
        data = self._conform(table, data)
        where = _doc_filter(dataset, filename)
        removed = offload(self._upsert, table, data, where)
        return data.num_rows, removed

    def replace_documents(
        self, index: str, documents: list[tuple[str, str, list[dict]]], *, compact: bool = True
    ) -> list[tuple[int, int]]:
        """Swap the chunks of several documents [(dataset, filename, rows)], all in one commit: each document is
        written whole or not at all, and a batch costs one merge-insert and one compaction instead of one per
        document. Returns (added, removed) per document, in order.

        `compact=False` leaves the housekeeping (`optimize`: FTS index update, compaction; the ANN index) to a
        later write or an explicit `optimize`: a long folder run does it every so many rows and at its end.
        Searches stay complete meanwhile: rows not yet in the FTS index are searched exhaustively."""
        check_table(index)
        keys: list[tuple[str, str]] = []
        all_rows: list[dict] = []
        for dataset, filename, rows in documents:
            check_name(dataset, "dataset")
            filename = check_filename(filename)
            if not rows:
                raise BadRequest("a document in a batch needs rows", code="bad_rows")
            for row in rows:
                if row.get("dataset") != dataset or check_filename(row.get("filename")) != filename:
                    raise BadRequest("every row must belong to its document", code="bad_rows")
            keys.append((dataset, filename))
            all_rows.extend(rows)
        if len(set(keys)) != len(keys):
            raise BadRequest("a batch names a document twice", code="bad_rows")
        if not keys:
            return []
        data = self._prepare(all_rows)
        table = self._writable(index)
        data = self._conform(table, data)
        digests = [doc_key(d, f) for d, f in keys]
        where = "doc_key IN (" + ", ".join(f"'{d}'" for d in digests) + ")"
        before = offload(self._upsert_counted, table, data, where, compact)
        return [
            (len(rows), before.get(digest, 0))
            for (_, _, rows), digest in zip(documents, digests, strict=True)
        ]

    def delete_document(self, index: str, *, dataset: str, filename: str) -> int:
        check_name(dataset, "dataset")
        filename = check_filename(filename)
        table = self._require(index)
        self._check_marker(index, offload(self._read_marker, table))
        return offload(self._delete, table, _doc_filter(dataset, filename))

    def has_document(self, index: str, *, dataset: str, filename: str, document_id: str) -> bool:
        """True when these exact bytes (document_id) are already indexed under (dataset, filename)."""
        check_name(dataset, "dataset")
        filename = check_filename(filename)
        table = self._open(index)
        if table is None:
            return False
        return offload(table.count_rows, _doc_filter(dataset, filename, document_id)) > 0

    def drop(self, index: str) -> bool:
        """Drop an index: its table, any table a rebuild left behind, and its alias. True when a table existed."""
        check_name(index, "index")
        existed = self.exists(index)
        for name in offload(self._table_names):
            if name == index or self._staged_for(name) == index:
                self._forget(name)
                offload(self._db.drop_table, name, ignore_missing=True)
        (self.root / ALIASES / index).unlink(missing_ok=True)
        return existed

    # -- bulk writes from other processes (the Ray engine writes Lance fragments into the table's folder) -----

    def ensure_table(self, index: str) -> None:
        """Create the index's table (schema, embedder marker, FTS index) when it does not exist yet (also a
        rebuild's new table, `<index>.<hex>`)."""
        check_table(index)
        self._writable(index)

    def prepare_rows(self, index: str, rows: list[dict]) -> pa.Table:
        """Rows validated, embedded where they lack a vector, and laid out as the index's table takes them, for a
        writer that appends Lance fragments itself (the Ray engine)."""
        return self._conform(self._require(index), self._prepare(rows))

    def table_uri(self, index: str) -> str:
        """Where the table's Lance dataset lives (a folder, or an object-store URI)."""
        return str(self._require(index).uri)

    def commit_fragments(self, index: str, fragments: list) -> None:
        """Make fragments written by `lance.fragment.LanceFragment.create` part of the table in one commit."""
        table = self._require(index)
        self._check_marker(index, offload(self._read_marker, table))
        if fragments:
            offload(self._commit_fragments, table, list(fragments))
            # The same housekeeping as after the local engine's writes (compaction, FTS, ANN past its size).
            offload(self._after_write, table)

    def remove_superseded(self, index: str, documents: Sequence[tuple[str, str, str]]) -> int:
        """Delete the rows of each (dataset, filename) whose document_id is not the given (newer) one."""
        if not documents:
            return 0
        table = self._require(index)
        removed = 0
        for start in range(0, len(documents), 200):
            group = documents[start : start + 200]
            where = " OR ".join(
                f"({_doc_filter(check_name(d, 'dataset'), check_filename(f))} "
                f"AND document_id != '{_check_document_id(i)}')"
                for d, f, i in group
            )
            removed += offload(self._delete, table, where)
        return removed

    @staticmethod
    def _commit_fragments(table: LanceTable, fragments: list) -> None:
        import lance

        uri = str(table.uri)
        delay = 0.05
        for attempt in range(8):
            try:
                current = lance.dataset(uri)
                lance.LanceDataset.commit(
                    uri, lance.LanceOperation.Append(fragments), read_version=current.version
                )
                break
            except OSError as exc:  # a concurrent commit that could not be rebased: retry on the new version
                if attempt == 7 or "onflict" not in str(exc):
                    raise
                time.sleep(delay)
                delay *= 2

    def optimize(self, index: str) -> None:
        """Fold recent writes into the FTS index and compact fragments (done after every write already, unless
        the write said `compact=False`), and build the ANN index once the table is large enough."""
        offload(self._after_write, self._require(index))

    # -- rebuilds: a new table, swapped in when complete ------------------------------------------------------

    def new_staged(self, index: str) -> str:
        """Create an empty table to rebuild `index` into; its name works as `index` in every call of this class
        (and in no HTTP route). Searches of `index` keep using the current table until `promote`."""
        check_name(index, "index")
        name = f"{index}.{secrets.token_hex(6)}"
        self._tables[name] = offload(self._create, name)
        return name

    def staged_tables(self, index: str) -> list[str]:
        """Tables built for `index` that do not serve it: a rebuild in progress, or one that crashed."""
        check_name(index, "index")
        current = self._physical(index)
        return [n for n in offload(self._table_names) if self._staged_for(n) == index and n != current]

    def promote(self, index: str, staged: str) -> None:
        """Make the complete table `staged` serve `index` (one atomic file replace), then drop the old table."""
        check_name(index, "index")
        if self._staged_for(staged) != index:
            raise BadRequest(f"{staged} was not built for index {index}", code="bad_name", field="index")
        if staged not in offload(self._table_names):
            raise NotFound(f"the rebuilt table of index '{index}' is gone", code="index_not_found")
        old = self._physical(index)
        folder = self.root / ALIASES
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(staged + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, folder / index)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        if old != staged:
            self._forget(old)
            offload(self._db.drop_table, old, ignore_missing=True)

    def discard(self, staged: str) -> None:
        """Drop a table a rebuild was building (it failed, or crashed earlier); never a serving one."""
        index = self._staged_for(staged)
        if index is None or self._physical(index) == staged:
            raise BadRequest(f"{staged} is not a table being rebuilt", code="bad_name", field="index")
        self._forget(staged)
        offload(self._db.drop_table, staged, ignore_missing=True)

    def scan_documents(self, index: str, keys: list[tuple[str, str]]) -> pa.Table:
        """Every stored column of the given (dataset, filename) documents, for carrying them into a rebuild.
        No embedder check: a rebuild reads a table made with another embedder to re-embed its texts."""
        table = self._require(index)
        digests = sorted({doc_key(d, f) for d, f in keys})
        if not digests:
            return offload(self._scan_arrow, table, "doc_key = ''", table.schema.names)
        parts = []
        for start in range(0, len(digests), 500):
            chunk = digests[start : start + 500]
            where = "doc_key IN (" + ", ".join(f"'{d}'" for d in chunk) + ")"
            parts.append(offload(self._scan_arrow, table, where, table.schema.names))
        return pa.concat_tables(parts)

    def write_rows(self, index: str, data: pa.Table, keys: list[tuple[str, str]]) -> None:
        """Replace the documents `keys` with `data` (rows as `scan_documents` returns them) in one commit."""
        table = self._writable(index)
        schema = table_schema(self.embedder.dim, self.own_marker)
        # Carried over from a table made before the packed column, or before the id joined it: packed afresh.
        if PACKED not in data.column_names:
            data = data.append_column(PACKED, packed_column(data))
        elif not pc.all(pc.starts_with(data.column(PACKED), '{"id": ')).as_py():
            data = data.set_column(data.schema.get_field_index(PACKED), PACKED, packed_column(data))
        data = self._conform(table, data.select(schema.names).cast(schema))
        digests = sorted({doc_key(d, f) for d, f in keys})
        where = "doc_key IN (" + ", ".join(f"'{d}'" for d in digests) + ")" if digests else None
        offload(self._upsert, table, data, where)

    # -- reads ----------------------------------------------------------------------------------------------

    def search(
        self,
        indexes: list[str] | str,
        query: str,
        *,
        mode: str = "hybrid",
        datasets: list[str] | None = None,
        limit: int = 30,
        vector: np.ndarray | None = None,
        rrf_k: int = 10,
        fusion: str = "rrf",
        fusion_alpha: float = 0.5,
    ) -> list[Hit]:
        if mode not in MODES:
            raise BadRequest(f"mode must be one of {', '.join(MODES)}", code="bad_mode", field="mode")
        if fusion not in FUSIONS:
            raise BadRequest(f"fusion must be one of {', '.join(FUSIONS)}", code="bad_fusion", field="fusion")
        names = [indexes] if isinstance(indexes, str) else list(dict.fromkeys(indexes or []))
        if not names:
            raise BadRequest("at least one index is required", code="bad_name", field="index")
        names = [check_table(n) for n in names]
        filters = [check_name(d, "datasets") for d in dict.fromkeys(datasets or [])]
        if not isinstance(limit, int) or limit < 1:
            raise BadRequest("limit must be a positive integer", field="limit")
        limit = min(limit, MAX_LIMIT)

        def open_tables() -> list[tuple[str, LanceTable]]:
            tables = [(name, self._require(name)) for name in names]
            for name, table in tables:
                self._check_marker(name, self._marker_of(table))
            return tables

        tables = open_tables()

        query = query if isinstance(query, str) else ""
        qvec = None
        if mode in ("hybrid", "vector"):
            qvec = (
                self.embedder.embed_query(query) if vector is None else np.asarray(vector, dtype=np.float32)
            )
            if qvec.shape != (self.embedder.dim,) or not np.all(np.isfinite(qvec)):
                raise BadRequest(
                    f"the query vector must have {self.embedder.dim} finite values", field="vector"
                )
        # A query of only punctuation or nothing at all has no terms: an empty FTS leg, not an error.
        fts_text = query if mode in ("hybrid", "fts") and _has_words(query) else None
        where = _in_clause("dataset", filters) if filters else None
        leg_limit = max(limit, HYBRID_LEG_MIN) if mode == "hybrid" else limit
        fusion_args = {"limit": limit, "fusion": fusion, "rrf_k": rrf_k, "alpha": fusion_alpha}
        try:
            return self._search_tables(tables, qvec, fts_text, where, leg_limit, fusion_args)
        except ApiError:
            raise
        except Exception:
            # A rebuild may have swapped a table (and dropped the old one) under this search: once more on the
            # tables that serve the indexes now; the same failure on the same tables is a real one.
            fresh = open_tables()
            if all(a is b for (_, a), (_, b) in zip(tables, fresh, strict=True)):
                raise
            return self._search_tables(fresh, qvec, fts_text, where, leg_limit, fusion_args)

    def neighbours(
        self, index: str, document_id: str, dataset: str, filename: str, chunk_indexes: list[int]
    ) -> list[Hit]:
        """Chunks of one document with the given chunk indexes, in document order (for context expansion)."""
        check_name(dataset, "dataset")
        filename = check_filename(filename)
        wanted = sorted({int(i) for i in chunk_indexes if int(i) >= 0})
        table = self._require(index)
        if not wanted:
            return []
        where = f"{_doc_filter(dataset, filename, document_id)} AND chunk_index IN ({', '.join(map(str, wanted))})"
        rows = offload(self._scan, table, where, _HIT_COLUMNS)
        hits = [_hit(index, row) for row in rows]
        return sorted(hits, key=lambda h: h.chunk_index)

    def neighbours_of(
        self, index: str, wanted: dict[tuple[str, str, str], list[int]]
    ) -> dict[tuple[str, str, str], list[Hit]]:
        """`neighbours` for several documents of one index in one scan: {(document_id, dataset, filename): chunk
        indexes} -> {same key: hits in document order}."""
        clauses, keys = [], {}
        for key, chunk_indexes in wanted.items():
            document_id, dataset, filename = key
            check_name(dataset, "dataset")
            filename = check_filename(filename)
            indexes = sorted({int(i) for i in chunk_indexes if int(i) >= 0})
            if indexes:
                keys[(document_id, doc_key(dataset, filename))] = key
                clauses.append(
                    f"({_doc_filter(dataset, filename, document_id)} AND chunk_index IN "
                    f"({', '.join(map(str, indexes))}))"
                )
        table = self._require(index)
        out: dict[tuple[str, str, str], list[Hit]] = {k: [] for k in keys.values()}
        if not clauses:
            return out
        for row in offload(self._scan, table, " OR ".join(clauses), [*_HIT_COLUMNS, "doc_key"]):
            key = keys.get((row["document_id"], row["doc_key"]))
            if key is not None:
                out[key].append(_hit(index, row))
        for hits in out.values():
            hits.sort(key=lambda h: h.chunk_index)
        return out

    def vectors(self, index: str, ids: Sequence[str]) -> dict[str, np.ndarray]:
        """The stored vectors of the chunks with these ids (those that exist), so no caller re-embeds a chunk."""
        wanted = [i for i in dict.fromkeys(ids) if isinstance(i, str) and NAME_RE.fullmatch(i)]
        table = self._open(index)
        if not wanted or table is None:
            return {}
        data = offload(self._scan_arrow, table, _in_clause("id", wanted), ["id", "vector"])
        return {row["id"]: np.asarray(row["vector"], dtype=np.float32) for row in _rows(data)}

    def list_documents(self, index: str) -> list[dict]:
        return self._read(index, self._list_documents)

    def list_datasets(self, index: str) -> list[str]:
        rows = self._read(index, lambda table: self._scan_arrow(table, None, ["dataset"]))
        return sorted(set(rows.column("dataset").to_pylist()))

    def count(self, index: str) -> int:
        return self._read(index, lambda table: table.count_rows())

    def _read(self, index: str, fn):
        """fn(table) off the loop; once more on the new table when a rebuild swapped it in meanwhile."""
        table = self._require(index)
        try:
            return offload(fn, table)
        except Exception:
            fresh = self._require(index)
            if fresh is table:
                raise
            return offload(fn, fresh)

    # -- internals: tables ----------------------------------------------------------------------------------

    def _table_names(self) -> list[str]:
        names: list[str] = []
        token = None
        while True:
            page = self._db.list_tables(page_token=token)
            names.extend(page.tables)
            token = page.page_token
            if not token:
                return names

    @staticmethod
    def _staged_for(name: str) -> str | None:
        """The index a rebuild table `<index>.<hex>` was made for; None for any other name."""
        match = STAGED_RE.fullmatch(name)
        return match.group(1) if match else None

    def _physical(self, index: str) -> str:
        """The table that serves `index`: the one its alias names after a rebuild, else the table `index`."""
        if STAGED_RE.fullmatch(index):
            return index
        try:
            target = (self.root / ALIASES / index).read_text(encoding="utf-8").strip()
        except (FileNotFoundError, NotADirectoryError):
            return index
        return target if self._staged_for(target) == index else index

    def _has_table(self, name: str) -> bool:
        """Whether table `name` exists: a committed version of it in the store, looked up on disk rather than
        through a listing of every table in LanceDB's event loop on each request. The table's folder alone is
        not enough (it is what LanceDB's own listing reads): LanceDB makes the folder before it commits the
        first version, so while another process creates the table the folder is there and cannot be opened
        yet ("Table ... was not found")."""
        try:
            with os.scandir(self.root / f"{name}.lance" / "_versions") as entries:
                return any(entry.name.endswith(".manifest") for entry in entries)
        except (FileNotFoundError, NotADirectoryError):
            return False

    def _open(self, index: str) -> LanceTable | None:
        check_table(index)
        name = self._physical(index)
        if not self._has_table(name):
            self._forget(name)  # dropped, maybe by another process
            return None
        table = self._tables.get(name)
        if table is None:
            for stale in [n for n in self._tables if n != name and (self._staged_for(n) or n) == index]:
                self._forget(stale)  # swapped out by a rebuild, maybe in another process
            try:
                table = offload(self._db.open_table, name)
            except ValueError:
                if self._has_table(name):
                    raise
                return None  # dropped by another process since the look above
            self._tables[name] = table
        return table

    def _forget(self, name: str) -> None:
        """Drop what is kept of table `name` (gone, or no longer serving its index)."""
        self._tables.pop(name, None)
        self._markers.pop(name, None)
        self._readers.pop(name, None)

    def _marker_of(self, table: LanceTable) -> dict:
        """The table's marker, read once per table object: it is written when the table is created and never
        changed (a rebuild makes a new table), while reading the schema checks the disk for a newer version."""
        cached = self._markers.get(table.name)
        if cached is not None and cached[0] is table:
            return cached[1]
        marker = offload(self._read_marker, table)
        self._markers[table.name] = (table, marker)
        return marker

    def _require(self, index: str) -> LanceTable:
        table = self._open(index)
        if table is None:
            raise NotFound(f"index '{index}' does not exist", code="index_not_found", field="index")
        return table

    def _writable(self, index: str) -> LanceTable:
        table = self._open(index)
        if table is None:
            name = self._physical(index)
            table = offload(self._create, name)
            self._tables[name] = table
        self._check_marker(index, offload(self._read_marker, table))
        return table

    def _create(self, index: str) -> LanceTable:
        from lancedb.index import FTS

        schema = table_schema(self.embedder.dim, self.own_marker)
        # exist_ok: another process may create the same index at the same moment; its marker is checked after.
        table = self._db.create_table(index, schema=schema, exist_ok=True)

        def ensure_fts() -> None:
            if any(idx.index_type == "FTS" for idx in table.list_indices()):
                return
            try:
                table.create_index("text", config=FTS(**FTS_CONFIG))
            except Exception:  # a concurrent creator won the race; fine if its index is there
                if not any(idx.index_type == "FTS" for idx in table.list_indices()):
                    raise

        _retry_conflicts(ensure_fts, f"creating the full-text index of {index}")
        return table

    @staticmethod
    def _read_marker(table: LanceTable) -> dict:
        schema = table.schema
        raw = (schema.metadata or {}).get(MARKER_KEY)
        marker: dict[str, Any] = {}
        if raw:
            try:
                marker = json.loads(raw)
            except ValueError:
                marker = {}
        field = schema.field("vector") if "vector" in schema.names else None
        marker["table_dim"] = getattr(field.type, "list_size", None) if field is not None else None
        marker["packed"] = PACKED in schema.names
        return marker

    def _hit_columns(self, table: LanceTable) -> list[str]:
        """The columns a search reads for a hit: the packed ones, or each on a table made before them."""
        marker = self._marker_of(table)
        if not marker.get("packed"):
            return _HIT_COLUMNS
        return _PACKED_COLUMNS if marker.get(PACKED_ID) else ["id", *_PACKED_COLUMNS]

    def _conform(self, table: LanceTable, data: pa.Table) -> pa.Table:
        """`data` as `table` takes it: without the packed column for a table made before it."""
        if PACKED in data.column_names and not self._marker_of(table).get("packed"):
            return data.drop_columns([PACKED])
        return data

    def _check_marker(self, index: str, marker: dict) -> None:
        ours = self.own_marker
        built_model = marker.get("embedding_model")
        built_dim = marker.get("dim", marker.get("table_dim"))
        same_model = built_model is None or built_model == ours["embedding_model"]
        same_dim = built_dim == ours["dim"] and marker.get("table_dim") in (None, ours["dim"])
        if same_model and same_dim:
            return
        hint = marker.get("model_path") or built_model or "the model it was built with"
        raise EmbedderMismatch(
            f"index '{index}' was built with embedding model {built_model or 'unknown'} (dim {built_dim}); "
            f"this worker uses {ours['embedding_model']} (dim {ours['dim']}). Rebuild the index "
            f"(POST /index with rebuild: true) or run the worker with EMBEDDING_MODEL={hint}",
            field="index",
        )

    # -- internals: writes ----------------------------------------------------------------------------------

    def _prepare(self, rows: list[dict]) -> pa.Table:
        """Validate rows and embed the ones without a vector; nothing is written here."""
        dim = self.embedder.dim
        clean: list[dict] = []
        for n, row in enumerate(rows):
            if not isinstance(row, dict):
                raise BadRequest(f"row {n} is not an object", code="bad_rows")
            dataset = check_name(row.get("dataset"), "dataset")
            filename = check_filename(row.get("filename"))
            document_id = _check_document_id(row.get("document_id"))
            chunk_index = row.get("chunk_index")
            text = row.get("text")
            page = row.get("page")
            if not isinstance(chunk_index, int) or isinstance(chunk_index, bool) or chunk_index < 0:
                raise BadRequest(f"row {n}: chunk_index must be a non-negative integer", code="bad_rows")
            if not isinstance(text, str):
                raise BadRequest(f"row {n}: text must be a string", code="bad_rows")
            if page is not None and (not isinstance(page, int) or isinstance(page, bool)):
                raise BadRequest(f"row {n}: page must be an integer or null", code="bad_rows")
            metadata = json.dumps(row.get("metadata") or {}, ensure_ascii=False, default=str)
            row_id = str(row.get("id") or chunk_id(dataset, filename, document_id, chunk_index))
            clean.append(
                {
                    "id": row_id,
                    "doc_key": doc_key(dataset, filename),
                    "document_id": document_id,
                    "filename": filename,
                    "dataset": dataset,
                    "page": page,
                    "chunk_index": chunk_index,
                    "text": text,
                    "metadata": metadata,
                    "file_bytes": int(row.get("file_bytes") or 0),
                    "indexed_at": str(row.get("indexed_at") or ""),
                    PACKED: _pack(row_id, document_id, filename, dataset, page, chunk_index, metadata),
                }
            )
        ids = [r["id"] for r in clean]
        if len(set(ids)) != len(ids):
            raise BadRequest("rows carry duplicate chunk ids", code="bad_rows")

        vectors = np.zeros((len(rows), dim), dtype=np.float32)
        missing = [i for i, row in enumerate(rows) if row.get("vector") is None]
        for i, row in enumerate(rows):
            if row.get("vector") is not None:
                vec = np.asarray(row["vector"], dtype=np.float32)
                if vec.shape != (dim,) or not np.all(np.isfinite(vec)):
                    raise BadRequest(f"row {i}: vector must have {dim} finite values", code="bad_rows")
                vectors[i] = vec
        if missing:
            texts = [rows[i].get("embed_text") or rows[i]["text"] for i in missing]
            vectors[missing] = self.embedder.embed_documents(texts)

        schema = table_schema(dim, self.own_marker)
        columns = {name: [r[name] for r in clean] for name in schema.names if name != "vector"}
        columns["vector"] = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), dim)
        return pa.table(columns, schema=schema)

    def _upsert(
        self,
        table: LanceTable,
        data: pa.Table,
        replace_where: str | None,
        *,
        count: bool = True,
        compact: bool = True,
    ) -> int:
        """One commit: rows matched by id are updated, new ones inserted, and (when replacing) the document's
        rows that are not in `data` deleted. Returns how many rows the document had before."""
        removed = table.count_rows(replace_where) if replace_where and count else 0

        def commit() -> None:
            builder = table.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
            if replace_where:
                builder = builder.when_not_matched_by_source_delete(replace_where)
            builder.execute(data)

        _retry_conflicts(commit, f"writing to {table.name}")
        if compact:
            self._after_write(table)
        return removed

    def _upsert_counted(
        self, table: LanceTable, data: pa.Table, replace_where: str, compact: bool = True
    ) -> dict[str, int]:
        """`_upsert` for a batch: the rows each doc_key had before, {doc_key: count}."""
        before = self._scan_arrow(table, replace_where, ["doc_key"]).column("doc_key").to_pylist()
        counts: dict[str, int] = {}
        for key in before:
            counts[key] = counts.get(key, 0) + 1
        self._upsert(table, data, replace_where, count=False, compact=compact)
        return counts

    def _delete(self, table: LanceTable, where: str) -> int:
        count = table.count_rows(where)
        if count:
            _retry_conflicts(lambda: table.delete(where), f"deleting from {table.name}")
            self._after_write(table)
        return count

    def _after_write(self, table: LanceTable) -> None:
        """Housekeeping after a committed write: it never turns that write into a failure. What loses a race
        with another process (or fails otherwise) is logged and done by a later write."""
        try:
            self._optimize(table)
        except Exception as exc:
            log.warning(
                "compacting %s deferred to a later write (the write itself is committed): %s", table.name, exc
            )
        try:
            self._maybe_build_ann(table)
        except Exception as exc:
            log.warning("building the ANN index of %s deferred to a later write: %s", table.name, exc)

    @staticmethod
    def _optimize(table: LanceTable) -> None:
        table.optimize(cleanup_older_than=CLEANUP_OLDER_THAN)

    # -- internals: the ANN vector index ----------------------------------------------------------------------

    @staticmethod
    def _has_ann(table: LanceTable) -> bool:
        return any(idx.index_type != "FTS" and "vector" in idx.columns for idx in table.list_indices())

    def _maybe_build_ann(self, table: LanceTable) -> None:
        if self.ann_min_rows <= 0 or self._has_ann(table) or table.count_rows() < self.ann_min_rows:
            return
        self._build_ann(table)

    @staticmethod
    def _build_ann(
        table: LanceTable, index_type: str = ANN_INDEX_TYPE, num_partitions: int | None = None
    ) -> None:
        # Cosine, as the vector leg searches; graph and quantizer settings are LanceDB's defaults, partitions too
        # unless given (the latency benchmark's sweep measured them: docs/benchmarks.md).
        table.create_index(
            metric="cosine",
            vector_column_name="vector",
            index_type=index_type,
            num_partitions=num_partitions or None,
            replace=True,
        )

    def has_ann(self, index: str) -> bool:
        return offload(self._has_ann, self._require(index))

    def build_ann(
        self, index: str, index_type: str = ANN_INDEX_TYPE, num_partitions: int | None = None
    ) -> None:
        """Build (or rebuild) the ANN vector index now, whatever the table's size (partitions: LanceDB's
        default when None)."""
        offload(self._build_ann, self._require(index), index_type, num_partitions)

    # -- internals: reads -----------------------------------------------------------------------------------

    def _reader(self, table: LanceTable) -> LanceDataset:
        """A pylance dataset of the table's newest version (blocking: call it offloaded). It is kept per table
        object (a new object after a drop or a rebuild's swap) and moved to a newer version when a write, maybe by
        another process, has made one."""
        import lance

        cached = self._readers.get(table.name)
        if cached is None or cached[0] is not table:
            dataset = lance.dataset(str(table.uri), session=self._search_session)
        else:
            dataset = cached[1]
            latest = dataset.latest_version
            if latest != dataset.version:
                dataset = dataset.checkout_version(latest)
        self._readers[table.name] = (table, dataset)
        return dataset

    def _snapshots(self, tables: list[tuple[str, LanceTable]]) -> list[tuple[str, LanceDataset, list[str]]]:
        """(index, the newest version of its table, the columns a hit reads) for each table of one search: its legs
        and the read of its hits all run on that one version."""
        datasets = offload(lambda: [self._reader(table) for _, table in tables])
        return [
            (name, dataset, self._hit_columns(table))
            for (name, table), dataset in zip(tables, datasets, strict=True)
        ]

    def _search_tables(
        self,
        tables: list[tuple[str, LanceTable]],
        qvec: np.ndarray | None,
        fts_text: str | None,
        where: str | None,
        leg_limit: int,
        fusion_args: dict,
    ) -> list[Hit]:
        readers = self._snapshots(tables)
        if qvec is not None and fts_text is not None and leg_limit > fusion_args["limit"]:
            # Late materialisation: both legs return row ids, scores and vectors (the FTS leg's for the fusions'
            # cosine, the vector leg's because its exact re-scoring has read them already), and the hit columns,
            # the id among them, are read for the fused top `limit` alone. Reading a column costs per row fetched
            # at 1M chunks (docs/benchmarks.md, "Fourth round", "Sixth round" and "Ninth round"), and the legs
            # fetch 100 each.
            vec_rows, fts_rows = self._run_legs(readers, qvec, fts_text, where, leg_limit, slim=True)
            hits = fuse(vec_rows, fts_rows, qvec, **fusion_args)
            if self._materialise(readers, hits):
                return hits
            # The version's files went away between the legs and the read of their columns (cleaned up by another
            # process's compaction): whole rows from the newest version, once more.
            readers = self._snapshots(tables)
        vec_rows, fts_rows = self._run_legs(readers, qvec, fts_text, where, leg_limit)
        return fuse(vec_rows, fts_rows, qvec, **fusion_args)

    @staticmethod
    def _materialise(readers: list[tuple[str, LanceDataset, list[str]]], hits: list[Hit]) -> bool:
        """Fill the hits' columns (and the vectors no leg brought) by row id from the version their legs searched;
        False when a row cannot be read."""
        calls = []
        for name, dataset, hit_columns in readers:
            mine = [h for h in hits if h.index == name]
            if mine:
                # pylance's take by row id, `_take_rows`: marked unstable, so tests/unit/test_store.py compares every
                # field it returns with whole-row legs. LanceDB's `take_row_ids` reads the same at 1.3 ms more a call.
                vector = ["vector"] if any(h.vector is None for h in mine) else []
                columns = [*hit_columns, *vector, "_rowid"]
                ids = [h.row_id for h in mine]
                calls.append(lambda d=dataset, n=name, i=ids, c=columns: (n, d._take_rows(i, c)))
        rows: dict[tuple[str, int], dict] = {}
        try:
            for name, data in offload_all(calls):
                rows.update(((name, r["_rowid"]), r) for r in _rows(data))
        except Exception as exc:  # the files those row ids point into are gone
            log.info("search: reading the fused hits by row id failed, searching again: %s", exc)
            return False
        for hit in hits:
            row = rows.get((hit.index, hit.row_id))
            if row is None:
                return False
            full = _hit(hit.index, row)
            for column in _HIT_COLUMNS:
                setattr(hit, column, getattr(full, column))
            if hit.vector is None and row.get("vector") is not None:
                hit.vector = row["vector"]
        return True

    def _run_legs(
        self,
        readers: list[tuple[str, LanceDataset, list[str]]],
        qvec: np.ndarray | None,
        fts_text: str | None,
        where: str | None,
        leg_limit: int,
        *,
        slim: bool = False,
    ) -> tuple[list[tuple[str, dict]], list[tuple[str, dict]]]:
        """Each table's vector and FTS legs, all at once in native threads, every row with its row id; `slim`: row
        ids, scores and vectors only (the vector leg's where its search reads them anyway), the hit columns, id
        included, left for `_materialise`. Even the 32-character id costs 1.5 to 3 ms a leg to read for 100 rows at
        1M chunks."""
        from lance.query import MatchQuery

        fetch = leg_limit + LEG_TIE_SLACK
        filters = {"filter": where, "prefilter": True} if where else {}

        def vector_leg(name: str, dataset: LanceDataset, hit_columns: list[str]) -> tuple[str, list]:
            nearest: dict[str, Any] = {"column": "vector", "q": qvec, "k": fetch, "metric": "cosine"}
            # Only used when the table has an ANN index: partitions probed, and candidates re-scored exactly.
            nearest["nprobes"] = self.ann_nprobes
            if self.ann_refine_factor:
                nearest["refine_factor"] = self.ann_refine_factor
            if self.ann_ef:  # Lance refuses an ef below the candidates it is asked for
                nearest["ef"] = max(self.ann_ef, fetch * max(1, self.ann_refine_factor))
            # A slim leg brings the vectors only where the search reads them anyway: an exact scan, or an ANN
            # search that re-scores its candidates exactly (0.15 ms for 105 rows at 1M chunks, where reading them
            # afterwards costs 20 us a row). Otherwise `_materialise` reads them for the fused top.
            if slim:
                columns = (
                    ["vector", "_distance"]
                    if self.ann_refine_factor or not _has_vector_index(dataset)
                    else ["_distance"]
                )
            else:
                columns = [*hit_columns, "vector", "_distance"]
            data = dataset.to_table(
                columns=columns, nearest=nearest, limit=fetch, with_row_id=True, **filters
            )
            return "vector", [(name, r) for r in _rows(data)]

        def fts_leg(name: str, dataset: LanceDataset, hit_columns: list[str]) -> tuple[str, list]:
            # A MatchQuery is a plain bag of terms (OR): quotes, colons, parentheses and AND/OR typed by a user are
            # never parsed as query syntax, so no input can make the search raise.
            # In hybrid mode the stored vectors come along: a chunk only this leg found still gets its exact
            # cosine similarity, which the score fusions need (and the relevance check would else re-embed).
            # Reading them here costs less than reading those of the rows the vector leg did not return afterwards
            # (docs/benchmarks.md, "Ninth round").
            columns = [*([] if slim else hit_columns), "_score", *(["vector"] if qvec is not None else [])]
            query = MatchQuery(fts_text, "text")
            data = dataset.to_table(
                columns=columns, full_text_query=query, limit=fetch, with_row_id=True, **filters
            )
            return "fts", [(name, r) for r in _rows(data)]

        calls = []
        for reader in readers:
            if qvec is not None:
                calls.append(lambda r=reader: vector_leg(*r))
            if fts_text is not None:
                calls.append(lambda r=reader: fts_leg(*r))
        vec_rows: list[tuple[str, dict]] = []
        fts_rows: list[tuple[str, dict]] = []
        for leg, rows in offload_all(calls):
            (vec_rows if leg == "vector" else fts_rows).extend(rows)
        # Across several tables each leg is merged by its own score before ranks are assigned; ties by table and
        # row id (LEG_TIE_SLACK).
        vec_rows.sort(key=lambda nr: (nr[1]["_distance"], nr[0], nr[1]["_rowid"]))
        fts_rows.sort(key=lambda nr: (-nr[1]["_score"], nr[0], nr[1]["_rowid"]))
        return vec_rows[:leg_limit], fts_rows[:leg_limit]

    @staticmethod
    def _scan_arrow(table: LanceTable, where: str | None, columns: list[str]) -> pa.Table:
        q = table.search().select(columns)
        if where:
            q = q.where(where)
        return q.limit(None).to_arrow()

    def _scan(self, table: LanceTable, where: str | None, columns: list[str]) -> list[dict]:
        return self._scan_arrow(table, where, columns).to_pylist()

    def _list_documents(self, table: LanceTable) -> list[dict]:
        cols = ["dataset", "filename", "document_id", "file_bytes", "indexed_at", "id"]
        data = self._scan_arrow(table, None, cols)
        if data.num_rows == 0:
            return []
        grouped = data.group_by(["dataset", "filename", "document_id"]).aggregate(
            [("id", "count"), ("file_bytes", "max"), ("indexed_at", "max")]
        )
        docs = [
            {
                "filename": r["filename"],
                "dataset": r["dataset"],
                "document_id": r["document_id"],
                "chunks": int(r["id_count"]),
                "bytes": int(r["file_bytes_max"] or 0),
                "indexed_at": r["indexed_at_max"] or None,
            }
            for r in grouped.to_pylist()
        ]
        return sorted(docs, key=lambda d: (d["dataset"], d["filename"].lower(), d["filename"]))


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


def _retry_conflicts(fn, what: str):
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


def _rows(data: pa.Table) -> list[dict]:
    """Arrow rows as dicts, a `vector` column as numpy rows (a Python list of floats per row costs more CPU than
    the search itself)."""
    if "vector" not in data.column_names:
        return data.to_pylist()
    column = data.column("vector").combine_chunks()
    if column.null_count or not pa.types.is_fixed_size_list(column.type):
        return data.to_pylist()
    rows = data.drop_columns(["vector"]).to_pylist()
    if not rows:
        return rows
    vectors = column.flatten().to_numpy(zero_copy_only=False).reshape(len(rows), -1)
    for row, vec in zip(rows, vectors, strict=True):
        row["vector"] = vec
    return rows


def _pack(
    id: str, document_id: str, filename: str, dataset: str, page: int | None, chunk_index: int, metadata: str
) -> str:
    """The packed column's value: the fields as JSON, `metadata` (already JSON) spliced in, not encoded twice."""
    head = json.dumps(
        {
            "id": id,
            "document_id": document_id,
            "filename": filename,
            "dataset": dataset,
            "page": page,
            "chunk_index": chunk_index,
        },
        ensure_ascii=False,
    )
    return f'{head[:-1]}, "metadata": {metadata}}}'


def packed_column(data: pa.Table) -> pa.Array:
    """The packed column for rows given column by column (read back from a table made before it, or written in
    bulk by the latency benchmark)."""
    packed = []
    for row in data.select(list(_PACKED_FIELDS)).to_pylist():
        try:
            metadata = json.dumps(json.loads(row["metadata"] or "{}"), ensure_ascii=False)
        except ValueError:
            metadata = "{}"
        packed.append(_pack(**{**row, "metadata": metadata}))
    return pa.array(packed, pa.string())


def _hit(index: str, row: dict) -> Hit:
    packed = row.get(PACKED)
    if packed:  # the fields from the packed column (a table made before it has them each in its own)
        row = {**row, **json.loads(packed)}
        metadata = row["metadata"]
    else:
        try:
            metadata = json.loads(row["metadata"]) if row.get("metadata") else {}
        except ValueError:
            metadata = {}
    # A slim leg's row has its row id and scores only; `Store._materialise` fills in the rest for the hits that
    # are kept.
    return Hit(
        id=row.get("id", ""),
        document_id=row.get("document_id", ""),
        filename=row.get("filename", ""),
        dataset=row.get("dataset", ""),
        page=row.get("page"),
        chunk_index=int(row.get("chunk_index", 0)),
        text=row.get("text", ""),
        metadata=metadata if isinstance(metadata, dict) else {},
        index=index,
        row_id=row.get("_rowid"),
    )


def _has_vector_index(dataset: LanceDataset) -> bool:
    return any(
        "vector" in index["fields"] and index["type"] != "Inverted" for index in dataset.list_indices()
    )


def fuse(
    vec_rows: list[tuple[str, dict]],
    fts_rows: list[tuple[str, dict]],
    qvec: np.ndarray | None = None,
    *,
    limit: int,
    fusion: str = "rrf",
    rrf_k: int = 60,
    alpha: float = 0.5,
) -> list[Hit]:
    """Fuse the two legs' rows (each best first) into at most `limit` hits, best first (see FUSIONS).

    `alpha` weighs the vector leg in the convex fusions (1 - alpha the FTS leg). A chunk missing from a leg
    scores that leg's theoretical minimum (BM25 0, cosine -1), except that an FTS row carrying its stored vector
    gets its exact cosine similarity with `qvec`. Ties go to the higher cosine similarity, then index, then row
    id (where the legs give one), then id.

    A row is the same chunk in both legs by its row id when the legs return one (the store's legs always do; a
    slim leg returns nothing else), else by its id."""
    if fusion not in FUSIONS:
        raise ValueError(f"unknown fusion {fusion!r}")
    # One entry per chunk (its first row), numbered in the order the legs bring them; the scores are computed for
    # all entries at once, and a Hit is only built for the `limit` kept (a search's legs bring about 200 rows,
    # most of which go).
    vec_keys = [(name, row["_rowid"] if "_rowid" in row else row["id"]) for name, row in vec_rows]
    fts_keys = [(name, row["_rowid"] if "_rowid" in row else row["id"]) for name, row in fts_rows]
    number: dict[tuple[str, object], int] = {}
    rows: list[dict] = []
    for key, (_, row) in zip([*vec_keys, *fts_keys], [*vec_rows, *fts_rows], strict=True):
        if key not in number:
            number[key] = len(rows)
            rows.append(row)
    names = [name for name, _ in number]
    size = len(rows)
    vector_rank = np.zeros(size, dtype=np.int64)  # 0: not in the leg
    fts_rank = np.zeros(size, dtype=np.int64)
    cosine = np.full(size, np.nan)
    scores = np.full(size, np.nan)
    vectors: list = [None] * size
    if vec_rows:
        at = [number[key] for key in vec_keys]
        vector_rank[at] = np.arange(1, len(at) + 1)
        cosine[at] = 1.0 - np.array([float(row["_distance"]) for _, row in vec_rows])
        for n, (_, row) in zip(at, vec_rows, strict=True):
            if row.get("vector") is not None:
                vectors[n] = row["vector"]
    if fts_rows:
        at = [number[key] for key in fts_keys]
        fts_rank[at] = np.arange(1, len(at) + 1)
        scores[at] = [float(row["_score"]) for _, row in fts_rows]
        for n, (_, row) in zip(at, fts_rows, strict=True):
            if vectors[n] is None and row.get("vector") is not None:
                vectors[n] = row["vector"]
    cosine[~np.isfinite(cosine)] = np.nan
    scores[~np.isfinite(scores)] = np.nan

    in_vec = vector_rank > 0
    in_fts = fts_rank > 0
    # The cosine similarity of the chunks only the FTS leg found, from their stored vectors, all in one product.
    only_fts = []
    if qvec is not None:
        only_fts = [n for n in np.flatnonzero(in_fts & np.isnan(cosine)).tolist() if vectors[n] is not None]
    if only_fts:
        matrix = np.stack([vectors[n] for n in only_fts]).astype(np.float32, copy=False)
        qnorm = float(np.linalg.norm(qvec))
        norms = np.sqrt(np.einsum("ij,ij->i", matrix, matrix)).astype(np.float64) * qnorm
        with np.errstate(divide="ignore", invalid="ignore"):
            found = (matrix @ np.asarray(qvec, dtype=np.float32)).astype(np.float64) / norms
        cosine[only_fts] = np.where((norms > 0) & np.isfinite(found), found, np.nan)

    if fusion == "rrf":
        fused = np.where(in_vec, 1.0 / (rrf_k + vector_rank), 0.0) + np.where(
            in_fts, 1.0 / (rrf_k + fts_rank), 0.0
        )
    else:
        # Normalisation statistics come from each leg's own candidates, as the leg ranked them.
        vec_scores = cosine[in_vec & ~np.isnan(cosine)]
        fts_scores = scores[in_fts & ~np.isnan(scores)]
        norm_vec = _normaliser(fusion, vec_scores, COSINE_MIN)
        norm_fts = _normaliser(fusion, fts_scores, BM25_MIN)
        fused = alpha * norm_vec(np.where(np.isnan(cosine), COSINE_MIN, cosine)) + (1.0 - alpha) * norm_fts(
            np.where(np.isnan(scores), BM25_MIN, scores)
        )

    # Only the entries that can make the cut are ordered: those scoring at least the `limit`-th best score.
    if len(names) > limit:
        cut = np.partition(fused, len(names) - limit)[len(names) - limit]
        candidates = np.flatnonzero(fused >= cut).tolist()
    else:
        candidates = list(range(len(names)))
    tie_cosine = np.where(np.isnan(cosine), -2.0, cosine)
    candidates.sort(
        key=lambda n: (
            -fused[n],
            -tie_cosine[n],
            names[n],
            -1 if rows[n].get("_rowid") is None else rows[n]["_rowid"],
            rows[n].get("id", ""),
        )
    )
    hits = []
    for n in candidates[:limit]:
        hit = _hit(names[n], rows[n])
        hit.score = float(fused[n])
        hit.vector_score = None if np.isnan(cosine[n]) else float(cosine[n])
        hit.fts_score = None if np.isnan(scores[n]) else float(scores[n])
        hit.vector_rank = int(vector_rank[n]) or None
        hit.fts_rank = int(fts_rank[n]) or None
        hit.vector = vectors[n]
        hits.append(hit)
    return hits


def _normaliser(fusion: str, scores: np.ndarray, floor: float):
    """scores -> normalised scores (numpy arrays) for one leg: theoretical min-max ("tmm"), z-score ("zscore") or
    robust z-score ("robust"; the plain z-score's deviation where more than half the scores are equal, so the MAD
    is 0)."""
    if len(scores) == 0:
        return lambda s: np.zeros(np.shape(s))
    if fusion == "tmm":
        span = float(np.max(scores)) - floor
        return (lambda s: (s - floor) / span) if span > 0 else (lambda s: np.zeros(np.shape(s)))
    if fusion == "robust":
        median = _median(scores)
        mad = MAD_TO_STD * _median(np.abs(scores - median))
        if mad > 0:
            return lambda s: (s - median) / mad
    mean = float(np.mean(scores))
    std = float(np.std(scores))
    return (lambda s: (s - mean) / std) if std > 0 else (lambda s: s - mean)


def _median(values: np.ndarray) -> float:
    """np.median's value (the middle one, or the mean of the two middle ones) without its overhead, which is most
    of its cost for a leg's hundred scores."""
    ordered = np.sort(values)
    middle = len(ordered) // 2
    return float(ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2)
