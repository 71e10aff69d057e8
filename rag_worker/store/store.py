"""The chunk store: one LanceDB table per index, searched by vector, by BM25 full text, or both fused.

Verified against lancedb 0.40 by tests/unit/test_store.py; the facts each part relies on are in its module:
`rows` (the layout, the packed hit column), `filters`, `catalog` (tables, markers, rebuild aliases), `writes`
(commits and their one retry policy), `ann` (the vector index), `search` (the legs) and `fusion`.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import BadRequest
from ..names import check_filename, check_name, check_table
from ..runtime import offload
from . import ann, writes
from .filters import check_document_id, doc_filter, doc_key, doc_keys_clause
from .reads import Reader
from .rows import (
    PACKED,
    SENTENCE_COLUMNS,
    SENTENCE_VECTORS,
    SENTENCES,
    packed_column,
    prepare,
    scan_arrow,
    sentence_columns,
    table_schema,
)


class Store(Reader):
    """The chunk store: `Reader`'s searches and listings, and every write (documents, rebuilds, the ANN index)."""

    def drop(self, index: str) -> bool:
        """Drop an index: its table, any table a rebuild left behind, and its alias. True when a table existed."""
        return self.catalog.drop(index)

    # -- writes ---------------------------------------------------------------------------------------------

    def add_chunks(self, index: str, rows: list[dict]) -> int:
        """Insert (or update by id) chunks; rows without a vector are embedded here. Returns the rows written."""
        check_table(index)
        if not rows:
            return 0
        data = self._prepare(index, rows)
        table = self.catalog.writable(index)
        data = self.catalog.conform(table, data)
        offload(writes.upsert, table, data, None, self.ann.min_rows)
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
        data = self._prepare(index, rows)
        table = self.catalog.writable(index)
        data = self.catalog.conform(table, data)
        where = doc_filter(dataset, filename)
        removed = offload(writes.upsert, table, data, where, self.ann.min_rows)
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
        data = self._prepare(index, all_rows)
        table = self.catalog.writable(index)
        data = self.catalog.conform(table, data)
        digests = [doc_key(d, f) for d, f in keys]
        where = doc_keys_clause(digests)
        before = offload(writes.upsert_counted, table, data, where, self.ann.min_rows, compact)
        return [
            (len(rows), before.get(digest, 0))
            for (_, _, rows), digest in zip(documents, digests, strict=True)
        ]

    def delete_document(self, index: str, *, dataset: str, filename: str) -> int:
        check_name(dataset, "dataset")
        filename = check_filename(filename)
        table = self.table(index)
        self.catalog.check_marker(index, offload(self.catalog.read_marker, table))
        return offload(writes.delete, table, doc_filter(dataset, filename), self.ann.min_rows)

    def has_document(self, index: str, *, dataset: str, filename: str, document_id: str) -> bool:
        """True when these exact bytes (document_id) are already indexed under (dataset, filename)."""
        check_name(dataset, "dataset")
        filename = check_filename(filename)
        table = self.catalog.open(index)
        if table is None:
            return False
        return offload(table.count_rows, doc_filter(dataset, filename, document_id)) > 0

    def optimize(self, index: str) -> None:
        """Fold recent writes into the FTS index and compact fragments (done after every write already, unless
        the write said `compact=False`), and build the ANN index once the table is large enough."""
        offload(writes.after_write, self.table(index), self.ann.min_rows)

    def _prepare(self, index: str, rows: list[dict]) -> pa.Table:
        """Rows embedded (those without a vector) by the embedder of `index`, laid out as its table takes them."""
        table = self.catalog.open(index)
        marker = offload(self.catalog.read_marker, table) if table is not None else None
        embedder = self.catalog.embedder_of(marker)
        _, language = self.catalog.settings_of(marker)
        marker = self.catalog.table_marker(embedder, language)
        return prepare(rows, embedder, marker, sentences=self.sentence_vectors)

    def create_index(self, index: str, *, embedder: str | None = None, language: str | None = None) -> bool:
        """Make the (empty) table of `index` with this embedder and full-text language; True when made now,
        False when it existed with the same ones (a 409 when with others)."""
        from ..embedders import check_name as check_embedder
        from .fts import check_language

        check_table(index)
        embedder, language = check_embedder(embedder), check_language(language)
        _, created = offload(self.catalog.create_index, index, embedder, language)
        return created

    # -- bulk writes from other processes (the Ray engine writes Lance fragments into the table's folder) -----

    def ensure_table(self, index: str) -> None:
        """Create the index's table (schema, embedder marker, FTS index) when it does not exist yet (also a
        rebuild's new table, `<index>.<hex>`)."""
        check_table(index)
        self.catalog.writable(index)

    def prepare_rows(self, index: str, rows: list[dict]) -> pa.Table:
        """Rows validated, embedded where they lack a vector, and laid out as the index's table takes them, for a
        writer that appends Lance fragments itself (the Ray engine)."""
        return self.catalog.conform(self.table(index), self._prepare(index, rows))

    def table_uri(self, index: str) -> str:
        """Where the table's Lance dataset lives (a folder, or an object-store URI)."""
        return str(self.table(index).uri)

    def commit_fragments(self, index: str, fragments: list) -> None:
        """Make fragments written by `lance.fragment.LanceFragment.create` part of the table in one commit."""
        table = self.table(index)
        self.catalog.check_marker(index, offload(self.catalog.read_marker, table))
        if fragments:
            offload(writes.commit_fragments, table, list(fragments))
            # The same housekeeping as after the local engine's writes (compaction, FTS, ANN past its size).
            offload(writes.after_write, table, self.ann.min_rows)

    def remove_superseded(self, index: str, documents: Sequence[tuple[str, str, str]]) -> int:
        """Delete the rows of each (dataset, filename) whose document_id is not the given (newer) one."""
        if not documents:
            return 0
        table = self.table(index)
        removed = 0
        for start in range(0, len(documents), 200):
            group = documents[start : start + 200]
            where = " OR ".join(
                f"({doc_filter(check_name(d, 'dataset'), check_filename(f))} "
                f"AND document_id != '{check_document_id(i)}')"
                for d, f, i in group
            )
            removed += offload(writes.delete, table, where, self.ann.min_rows)
        return removed

    # -- rebuilds: a new table, swapped in when complete ------------------------------------------------------

    def new_staged(self, index: str) -> str:
        """Create an empty table to rebuild `index` into; its name works as `index` in every call of this class
        (and in no HTTP route). Searches of `index` keep using the current table until `promote`."""
        return self.catalog.new_staged(index)

    def staged_tables(self, index: str) -> list[str]:
        """Tables built for `index` that do not serve it: a rebuild in progress, or one that crashed."""
        return self.catalog.staged_tables(index)

    def promote(self, index: str, staged: str) -> None:
        """Make the complete table `staged` serve `index` (one atomic file replace), then drop the old table."""
        self.catalog.promote(index, staged)

    def discard(self, staged: str) -> None:
        """Drop a table a rebuild was building (it failed, or crashed earlier); never a serving one."""
        self.catalog.discard(staged)

    def scan_documents(self, index: str, keys: list[tuple[str, str]]) -> pa.Table:
        """Every stored column of the given (dataset, filename) documents, for carrying them into a rebuild.
        No embedder check: a rebuild reads a table made with another embedder to re-embed its texts."""
        table = self.table(index)
        digests = sorted({doc_key(d, f) for d, f in keys})
        if not digests:
            return offload(scan_arrow, table, "doc_key = ''", table.schema.names)
        parts = []
        for start in range(0, len(digests), 500):
            where = doc_keys_clause(digests[start : start + 500])
            parts.append(offload(scan_arrow, table, where, table.schema.names))
        return pa.concat_tables(parts)

    def write_rows(self, index: str, data: pa.Table, keys: list[tuple[str, str]]) -> None:
        """Replace the documents `keys` with `data` (rows as `scan_documents` returns them) in one commit."""
        table = self.catalog.writable(index)
        marker = offload(self.catalog.read_marker, table)
        embedder = self.catalog.embedder_of(marker)
        schema = table_schema(
            embedder.dim, self.catalog.table_marker(embedder, self.catalog.settings_of(marker)[1])
        )
        # Carried over from a table made before the packed column, or before the id joined it: packed afresh.
        if PACKED not in data.column_names:
            data = data.append_column(PACKED, packed_column(data))
        elif not pc.all(pc.starts_with(data.column(PACKED), '{"id": ')).as_py():
            data = data.set_column(data.schema.get_field_index(PACKED), PACKED, packed_column(data))
        # Sentence vectors carried with their rows (same embedder), else made here as ingestion makes them.
        if SENTENCE_VECTORS not in data.column_names or SENTENCES not in data.column_names:
            data = data.drop_columns([c for c in SENTENCE_COLUMNS if c in data.column_names])
            texts = data.column("text").to_pylist()
            sents, blobs = (
                offload(sentence_columns, texts, embedder)
                if self.sentence_vectors
                else ([None] * len(texts), [None] * len(texts))
            )
            data = data.append_column(SENTENCES, pa.array(sents, pa.list_(pa.string())))
            data = data.append_column(SENTENCE_VECTORS, pa.array(blobs, pa.binary()))
        data = self.catalog.conform(table, data.select(schema.names).cast(schema))
        digests = sorted({doc_key(d, f) for d, f in keys})
        where = doc_keys_clause(digests) if digests else None
        offload(writes.upsert, table, data, where, self.ann.min_rows)

    # -- the ANN vector index -------------------------------------------------------------------------------

    def build_ann(
        self, index: str, index_type: str = ann.ANN_INDEX_TYPE, num_partitions: int | None = None
    ) -> None:
        """Build (or rebuild) the ANN vector index now, whatever the table's size (partitions: LanceDB's
        default when None)."""
        offload(ann.build, self.table(index), index_type, num_partitions)
