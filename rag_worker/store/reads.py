"""Everything that reads an index: hybrid, vector and full-text search, neighbouring chunks, listings.

A search takes one snapshot of each table (`snapshots`), runs its legs on them (`legs`), fuses the legs' rows
(`fusion.fuse`) and, in hybrid mode, reads the fused top's columns by row id from the same snapshots. The benches
call `open_tables`, `snapshots` and `legs` themselves to replay a search's legs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ApiError, BadRequest
from ..names import NAME_RE, check_filename, check_name, check_table
from ..runtime import offload
from ..settings import Settings
from . import ann, search
from .catalog import Catalog
from .exact import ExactVectors
from .filters import doc_filter, doc_key, has_words, in_clause
from .fusion import FUSIONS, FusionParams, fuse
from .rows import (
    HIT_COLUMNS,
    SENTENCE_COLUMNS,
    SENTENCE_VECTORS,
    SENTENCES,
    Hit,
    arrow_rows,
    decode_sentences,
    scan,
    scan_arrow,
    to_hit,
)

if TYPE_CHECKING:  # pragma: no cover
    from lancedb.table import LanceTable

    from ..embeddings import Embedder


class Reader:
    """The reading half of the Store (`store.Store` adds the writes): one root of LanceDB tables, one embedder,
    the search parameters (fusion, ANN) the settings give."""

    def __init__(
        self,
        root: Path,
        embedder: Embedder,
        *,
        fusion: FusionParams | None = None,
        ann_params: ann.AnnParams | None = None,
        index_cache_mb: int | None = None,
        metadata_cache_mb: int | None = None,
        embedders=None,
        sentence_vectors: bool | None = None,
        exact_cache_mb: int | None = None,
    ):
        defaults = Settings.model_construct()  # the settings' defaults, no environment read
        self.catalog = Catalog(
            root,
            embedder,
            index_cache_mb=defaults.lancedb_index_cache_mb if index_cache_mb is None else index_cache_mb,
            metadata_cache_mb=(
                defaults.lancedb_metadata_cache_mb if metadata_cache_mb is None else metadata_cache_mb
            ),
            embedders=embedders,
        )
        self.root = self.catalog.root
        self.embedder = embedder
        # How hybrid mode fuses (a search's own arguments override it), when a table gets its ANN index and how
        # the vector leg searches it: the settings' values, their defaults when none are given.
        self.fusion = fusion or FusionParams.defaults()
        self.ann = ann_params or ann.AnnParams.from_settings(defaults)
        # The vectors of the tables without an ANN index, held for their exact vector leg (store/exact.py).
        self.exact = ExactVectors(
            (defaults.exact_search_cache_mb if exact_cache_mb is None else exact_cache_mb) * 1024 * 1024
        )
        # Whether writes embed and store each chunk's passage sentences (SENTENCE_VECTORS=ingest).
        self.sentence_vectors = (
            defaults.sentence_vectors == "ingest" if sentence_vectors is None else sentence_vectors
        )

    @classmethod
    def from_settings(cls, settings: Settings, embedder: Embedder, embedders=None):
        """The store the worker runs with: folder, fusion, ANN parameters and cache sizes from `settings`;
        `embedders` resolves the embedder names tables record (`Services.embedder_named`)."""
        return cls(
            settings.lancedb_dir,
            embedder,
            embedders=embedders,
            fusion=FusionParams.from_settings(settings),
            ann_params=ann.AnnParams.from_settings(settings),
            index_cache_mb=settings.lancedb_index_cache_mb,
            metadata_cache_mb=settings.lancedb_metadata_cache_mb,
            sentence_vectors=settings.sentence_vectors == "ingest",
            exact_cache_mb=settings.exact_search_cache_mb,
        )

    # -- identity and tables --------------------------------------------------------------------------------

    @property
    def own_marker(self) -> dict:
        """What this store's embedder writes into a table it creates: {"embedding_model", "dim", ...}."""
        return self.catalog.own_marker

    def exists(self, index: str) -> bool:
        return self.catalog.exists(index)

    def indexes(self) -> list[str]:
        return self.catalog.indexes()

    def marker(self, index: str) -> dict | None:
        """What the table was built with: {"embedding_model", "dim", ...}; None when the table carries none."""
        return offload(self.catalog.read_marker, self.table(index))

    def embedder_for(self, index: str) -> Embedder:
        """The embedder `index` was built with (its marker names it): its queries and new chunks use it. An index
        without a table yet is written by the default one."""
        table = self.catalog.open(index)
        if table is None:
            return self.embedder
        return self.catalog.embedder_of(self.catalog.marker_of(table))

    def index_settings(self, index: str) -> dict:
        """{"embedder", "language"} of an existing index (NotFound otherwise)."""
        embedder, language = self.catalog.settings_of(self.catalog.marker_of(self.table(index)))
        return {"embedder": embedder, "language": language}

    def check_compatible(self, index: str) -> None:
        table = self.table(index)
        self.catalog.check_marker(index, self.catalog.marker_of(table))

    def table(self, index: str) -> LanceTable:
        """The LanceDB table serving `index` (after a rebuild, the one its alias names); NotFound when none."""
        return self.catalog.table(index)

    def serving_table(self, index: str) -> str:
        """The name of the table serving `index`: `index` itself, or `<index>.<hex>` after a rebuild."""
        return self.catalog.serving_table(index)

    def has_ann(self, index: str) -> bool:
        return offload(ann.has_ann, self.table(index))

    # -- search ---------------------------------------------------------------------------------------------

    def search(
        self,
        indexes: list[str] | str,
        query: str,
        *,
        mode: str = "hybrid",
        datasets: list[str] | None = None,
        limit: int = 30,
        vector: np.ndarray | None = None,
        rrf_k: int | None = None,
        fusion: str | None = None,
        fusion_alpha: float | None = None,
    ) -> list[Hit]:
        """The best `limit` chunks of `indexes` for `query` (embedded unless `vector` is given), best first.
        `fusion`, `rrf_k` and `fusion_alpha` (hybrid mode) default to this store's (`self.fusion`)."""
        if mode not in search.MODES:
            raise BadRequest(f"mode must be one of {', '.join(search.MODES)}", code="bad_mode", field="mode")
        params = self.fusion.but(fusion=fusion, rrf_k=rrf_k, alpha=fusion_alpha)
        if params.fusion not in FUSIONS:
            raise BadRequest(f"fusion must be one of {', '.join(FUSIONS)}", code="bad_fusion", field="fusion")
        names = [indexes] if isinstance(indexes, str) else list(dict.fromkeys(indexes or []))
        if not names:
            raise BadRequest("at least one index is required", code="bad_name", field="index")
        names = [check_table(n) for n in names]
        filters = [check_name(d, "datasets") for d in dict.fromkeys(datasets or [])]
        if not isinstance(limit, int) or limit < 1:
            raise BadRequest("limit must be a positive integer", field="limit")
        limit = min(limit, search.MAX_LIMIT)
        tables = self.open_tables(names)
        query = query if isinstance(query, str) else ""
        embedder = self.query_embedder(tables)
        qvec = self._query_vector(query, vector, embedder) if mode in ("hybrid", "vector") else None
        # A query of only punctuation or nothing at all has no terms: an empty FTS leg, not an error.
        fts_text = query if mode in ("hybrid", "fts") and has_words(query) else None
        where = in_clause("dataset", filters) if filters else None
        leg_limit = max(limit, search.HYBRID_LEG_MIN) if mode == "hybrid" else limit
        fusion_args = {"limit": limit, "fusion": params.fusion, "rrf_k": params.rrf_k, "alpha": params.alpha}
        try:
            return self._search_tables(tables, qvec, fts_text, where, leg_limit, fusion_args, filters or None)
        except ApiError:
            raise
        except Exception:
            # A rebuild may have swapped a table (and dropped the old one) under this search: once more on the
            # tables that serve the indexes now; the same failure on the same tables is a real one.
            fresh = self.open_tables(names)
            if all(a is b for (_, a), (_, b) in zip(tables, fresh, strict=True)):
                raise
            return self._search_tables(fresh, qvec, fts_text, where, leg_limit, fusion_args, filters or None)

    def query_embedder(self, tables: list[tuple[str, LanceTable]]) -> Embedder:
        """The one embedder the tables of a search were built with. Indexes built with different embedders
        have vectors in different spaces: one query vector cannot search them together (400)."""
        found = {}
        for name, table in tables:
            emb = self.catalog.embedder_of(self.catalog.marker_of(table))
            found.setdefault(id(emb), (emb, name))
        if len(found) > 1:
            pairs = ", ".join(f"{n} ({getattr(e, 'name', 'default')})" for e, n in found.values())
            raise BadRequest(
                f"these indexes were built with different embedders and cannot be searched together: {pairs}",
                code="mixed_embedders",
                field="index",
            )
        return next(iter(found.values()))[0] if found else self.embedder

    def _query_vector(
        self, query: str, vector: np.ndarray | None, embedder: Embedder | None = None
    ) -> np.ndarray:
        embedder = embedder or self.embedder
        qvec = embedder.embed_query(query) if vector is None else np.asarray(vector, dtype=np.float32)
        if qvec.shape != (embedder.dim,) or not np.all(np.isfinite(qvec)):
            raise BadRequest(f"the query vector must have {embedder.dim} finite values", field="vector")
        return qvec

    def open_tables(self, indexes: Sequence[str]) -> list[tuple[str, LanceTable]]:
        """(index, the table serving it) for each index, its marker checked against this store's embedder."""
        tables = [(name, self.table(name)) for name in indexes]
        for name, table in tables:
            self.catalog.check_marker(name, self.catalog.marker_of(table))
        return tables

    def snapshots(self, tables: list[tuple[str, LanceTable]]) -> list[search.Snapshot]:
        """A snapshot of each of `open_tables`' tables, at its newest version: a search's legs and the read of its
        hits all run on these."""
        datasets = offload(lambda: [self.catalog.reader(table) for _, table in tables])
        return [
            search.Snapshot(name, dataset, self.catalog.hit_columns(table))
            for (name, table), dataset in zip(tables, datasets, strict=True)
        ]

    def legs(
        self,
        snapshots: list[search.Snapshot],
        qvec: np.ndarray | None,
        fts_text: str | None,
        where: str | None,
        leg_limit: int,
        *,
        slim: bool = False,
        datasets: list[str] | None = None,
    ) -> tuple[search.Rows, search.Rows]:
        """A search's two legs on `snapshots` (`search.run_legs`, with this store's ANN parameters): (vector
        rows, FTS rows), each (index, row) best first, at most `leg_limit` deep; `qvec` None or `fts_text` None
        leaves that leg empty (`filters.has_words` says whether a query has terms). Rows are whole (hit columns,
        vector, `_distance` / `_score`, `_rowid`) unless `slim`; `fusion.fuse` takes them as they are."""
        return search.run_legs(
            snapshots,
            qvec,
            fts_text,
            where,
            leg_limit,
            self.ann,
            slim=slim,
            datasets=datasets,
            exact=self.exact,
        )

    def _search_tables(
        self,
        tables: list[tuple[str, LanceTable]],
        qvec: np.ndarray | None,
        fts_text: str | None,
        where: str | None,
        leg_limit: int,
        fusion_args: dict,
        datasets: list[str] | None = None,
    ) -> list[Hit]:
        snapshots = self.snapshots(tables)
        if qvec is not None and fts_text is not None and leg_limit > fusion_args["limit"]:
            # Late materialisation: both legs return row ids, scores and vectors (the FTS leg's for the fusions'
            # cosine, the vector leg's because its exact re-scoring has read them already), and the hit columns,
            # the id among them, are read for the fused top `limit` alone. Reading a column costs per row fetched
            # at 1M chunks (docs/benchmarks.md, "Fourth round", "Sixth round" and "Ninth round"), and the legs
            # fetch 100 each.
            vec_rows, fts_rows = self.legs(
                snapshots, qvec, fts_text, where, leg_limit, slim=True, datasets=datasets
            )
            hits = fuse(vec_rows, fts_rows, qvec, **fusion_args)
            if search.materialise(snapshots, hits):
                return hits
            # The version's files went away between the legs and the read of their columns (cleaned up by another
            # process's compaction): whole rows from the newest version, once more.
            snapshots = self.snapshots(tables)
        vec_rows, fts_rows = self.legs(snapshots, qvec, fts_text, where, leg_limit, datasets=datasets)
        return fuse(vec_rows, fts_rows, qvec, **fusion_args)

    # -- other reads ----------------------------------------------------------------------------------------

    def neighbours(
        self, index: str, document_id: str, dataset: str, filename: str, chunk_indexes: list[int]
    ) -> list[Hit]:
        """Chunks of one document with the given chunk indexes, in document order (for context expansion)."""
        check_name(dataset, "dataset")
        filename = check_filename(filename)
        wanted = sorted({int(i) for i in chunk_indexes if int(i) >= 0})
        table = self.table(index)
        if not wanted:
            return []
        where = (
            f"{doc_filter(dataset, filename, document_id)} AND chunk_index IN ({', '.join(map(str, wanted))})"
        )
        rows = offload(scan, table, where, HIT_COLUMNS)
        hits = [to_hit(index, row) for row in rows]
        return sorted(hits, key=lambda h: h.chunk_index)

    def neighbours_of(
        self,
        index: str,
        wanted: dict[tuple[str, str, str], list[int]],
        *,
        sentences: bool = False,
        anchors: dict[tuple[str, str, str], list[tuple[int, int]]] | None = None,
    ) -> dict[tuple[str, str, str], list[Hit]]:
        """`neighbours` for several documents of one index in one read: {(document_id, dataset, filename): chunk
        indexes} -> {same key: hits in document order}. With `sentences`, each hit carries the sentence vectors
        stored with it (`Hit.sentence_vectors`; None from a table made before them).

        The chunks are read by row address where it is known (one read, 0.5 ms), rather than by a filtered scan
        of the whole table (9 ms of CPU at 10,000 chunks): where the table's vectors are held (`exact.py`), the
        held version says where each chunk is and that a chunk not there does not exist; elsewhere `anchors`
        {same key: [(chunk index, row address)]}, chunks of those documents as a search just found them, stand in:
        a document's chunks are written in order, one after the other, so its neighbours are usually the rows
        next to it. A row read counts only if it is the chunk wanted (same document, file, dataset and chunk
        index; a deleted row is never returned); whatever was not found so is scanned for, as before."""
        keys: dict[tuple[str, str], tuple[str, str, str]] = {}
        asked: dict[tuple[str, str, str], list[int]] = {}
        for key, chunk_indexes in wanted.items():
            document_id, dataset, filename = key
            check_name(dataset, "dataset")
            filename = check_filename(filename)
            indexes = sorted({int(i) for i in chunk_indexes if int(i) >= 0})
            if indexes:
                keys[(document_id, doc_key(dataset, filename))] = key
                asked[key] = indexes
        table = self.table(index)
        out: dict[tuple[str, str, str], list[Hit]] = {k: [] for k in keys.values()}
        if not asked:
            return out
        stored = sentences and self.catalog.marker_of(table).get("sentences")
        dim = self.embedder_for(index).dim if stored else 0
        found: set[tuple[tuple[str, str, str], int]] = set()

        def keep(key, row, hit: Hit | None = None) -> None:
            hit = to_hit(index, row) if hit is None else hit
            if stored:
                hit.sentence_vectors = decode_sentences(row[SENTENCES], row[SENTENCE_VECTORS], dim)
            out[key].append(hit)
            found.add((key, hit.chunk_index))

        taken, absent = self._taken_neighbours(index, table, asked, anchors or {}, stored)
        for key, row, hit in taken:
            keep(key, row, hit)
        missing = {
            key: [i for i in indexes if (key, i) not in found and (key, i) not in absent]
            for key, indexes in asked.items()
        }
        clauses = [
            f"({doc_filter(key[1], key[2], key[0])} AND chunk_index IN ({', '.join(map(str, indexes))}))"
            for key, indexes in missing.items()
            if indexes
        ]
        if clauses:
            columns = [*HIT_COLUMNS, "doc_key", *(SENTENCE_COLUMNS if stored else ())]
            for row in offload(scan, table, " OR ".join(clauses), columns):
                key = keys.get((row["document_id"], row["doc_key"]))
                if key is not None and (key, row["chunk_index"]) not in found:
                    keep(key, row)
        for hits in out.values():
            hits.sort(key=lambda h: h.chunk_index)
        return out

    def _taken_neighbours(
        self, index: str, table, asked: dict, anchors: dict, stored: bool
    ) -> tuple[list[tuple[tuple, dict, Hit]], set[tuple[tuple, int]]]:
        """(key, row, its hit) for each asked chunk read by row address (`neighbours_of`), and the asked (key, chunk index)
        the held version says do not exist."""
        held = offload(lambda: self.exact.of(self.catalog.reader(table)))
        places = held.chunk_rows if held is not None else None
        expected: dict[int, tuple[tuple[str, str, str], int]] = {}
        absent: set[tuple[tuple, int]] = set()
        for key, indexes in asked.items():
            document_id, dataset, filename = key
            if places is not None:
                dkey = doc_key(dataset, filename)
                for i in indexes:
                    address = places.get((document_id, dkey, i))
                    if address is None:
                        absent.add((key, i))
                    else:
                        expected.setdefault(address, (key, i))
                continue
            for chunk_index, row_id in anchors.get(key, ()):
                if row_id is None or chunk_index is None:
                    continue
                for i in indexes:
                    address = row_id + (i - chunk_index)
                    # Within the anchor's fragment (a row address is fragment << 32 | offset).
                    if address >= 0 and address >> 32 == row_id >> 32:
                        expected.setdefault(address, (key, i))
        if not expected:
            return [], absent
        columns = [*self.catalog.hit_columns(table), *(SENTENCE_COLUMNS if stored else ()), "_rowid"]

        def take() -> list[dict]:
            # The newest version: a write since the places were read shows as rows that are not the chunk.
            dataset = self.catalog.reader(table)
            addresses = sorted(expected)
            try:
                return arrow_rows(dataset._take_rows(addresses, columns))
            except (OSError, ValueError):  # an address past its fragment's end: one at a time, skipping those
                rows = []
                for address in addresses:
                    try:
                        rows += arrow_rows(dataset._take_rows([address], columns))
                    except (OSError, ValueError):
                        continue
                return rows

        out = []
        for row in offload(take):
            key, chunk_index = expected.get(row.get("_rowid"), (None, None))
            if key is None:
                continue
            hit = to_hit(index, row)
            if (hit.document_id, hit.dataset, hit.filename, hit.chunk_index) == (*key, chunk_index):
                out.append((key, row, hit))
        return out, absent

    def document_chunks(self, index: str, dataset: str, filename: str) -> list[Hit]:
        """Every chunk of one document in document order: its converted text, passage by passage, with each
        passage's page and location (the web's source viewer shows a text file this way)."""
        check_name(dataset, "dataset")
        filename = check_filename(filename)
        rows = self._read(index, lambda table: scan(table, doc_filter(dataset, filename), HIT_COLUMNS))
        return sorted((to_hit(index, row) for row in rows), key=lambda h: h.chunk_index)

    def vectors(self, index: str, ids: Sequence[str]) -> dict[str, np.ndarray]:
        """The stored vectors of the chunks with these ids (those that exist), so no caller re-embeds a chunk."""
        wanted = [i for i in dict.fromkeys(ids) if isinstance(i, str) and NAME_RE.fullmatch(i)]
        table = self.catalog.open(index)
        if not wanted or table is None:
            return {}
        data = offload(scan_arrow, table, in_clause("id", wanted), ["id", "vector"])
        return {row["id"]: np.asarray(row["vector"], dtype=np.float32) for row in arrow_rows(data)}

    def sentence_vectors_of(self, index: str, ids: Sequence[str]) -> dict[str, np.ndarray]:
        """{sentence: vector} of the passage sentences stored with the chunks with these ids (ingestion embedded
        them, in the index's embedder's space); {} for a table made before them, unknown ids and rows without."""
        wanted = [i for i in dict.fromkeys(ids) if isinstance(i, str) and NAME_RE.fullmatch(i)]
        table = self.catalog.open(index) if wanted else None
        if table is None or not self.catalog.marker_of(table).get("sentences"):
            return {}
        data = offload(scan_arrow, table, in_clause("id", wanted), SENTENCE_COLUMNS)
        dim = self.embedder_for(index).dim
        out: dict[str, np.ndarray] = {}
        for texts, blob in zip(
            data.column(SENTENCES).to_pylist(), data.column(SENTENCE_VECTORS).to_pylist(), strict=True
        ):
            out.update(decode_sentences(texts, blob, dim))
        return out

    def list_documents(self, index: str) -> list[dict]:
        return self._read(index, search.list_documents)

    def list_datasets(self, index: str) -> list[str]:
        rows = self._read(index, lambda table: scan_arrow(table, None, ["dataset"]))
        return sorted(set(rows.column("dataset").to_pylist()))

    def count(self, index: str) -> int:
        return self._read(index, lambda table: table.count_rows())

    def _read(self, index: str, fn):
        """fn(table) off the loop; once more on the new table when a rebuild swapped it in meanwhile."""
        table = self.table(index)
        try:
            return offload(fn, table)
        except Exception:
            fresh = self.table(index)
            if fresh is table:
                raise
            return offload(fn, fresh)
