"""The tables of one store root: which table serves an index, its embedder marker, and the handles kept open.

- pyarrow schema metadata given at `create_table` survives adds, merges, deletes and `optimize`, so the embedder
  marker lives on the table itself, no sidecar file;
- LanceDB OSS cannot rename a table. A rebuild builds a new table `<index>.<12 hex>` while searches keep using the
  old one, then swaps it in by replacing a one-line alias file (`aliases/<index>`) atomically; a reader resolves
  the alias on every call, and one that raced with the swap retries once on the new table;
- LanceDB makes a table's folder before it commits the table's first version, so a table exists once its
  `_versions` folder holds a manifest (`has_table`), not when the folder appears;
- searches run on a pylance dataset of the table's newest version (`reader`), not through LanceDB's query layer,
  which costs 1.3 to 2.8 ms a call at 1M chunks (docs/benchmarks.md, "Eighth round"). Checking for a newer
  version is a listing of `_versions` (tens of microseconds).
Every LanceDB call goes through `runtime.offload`: it blocks the gevent loop otherwise (docs/design/MODELS.md).
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ApiError, BadRequest, Conflict, EmbedderMismatch, NotFound
from ..names import NAME_RE, STAGED_RE, check_name, check_table
from ..runtime import offload
from .fts import DEFAULT_LANGUAGE, check_language, fts_config
from .rows import (
    HIT_COLUMNS,
    MARKER_KEY,
    PACKED,
    PACKED_COLUMNS,
    PACKED_ID,
    SENTENCE_COLUMNS,
    SENTENCE_VECTORS,
    table_schema,
)
from .writes import retry_conflicts

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa
    from lance import LanceDataset
    from lancedb.table import LanceTable

    from ..embeddings import Embedder


def _own_embedders(default: Embedder) -> Callable[[str | None], Embedder]:
    """A resolver for a store made without one (benches, tests): the default, and the others built on first use
    with the settings' defaults."""
    from ..embedders import DEFAULT, check_name

    built: dict[str, Embedder] = {}

    def resolve(name: str | None) -> Embedder:
        name = check_name(name)
        if name == DEFAULT:
            return default
        if name not in built:
            from ..embedders import build
            from ..settings import Settings

            built[name] = build(name, Settings.model_construct(), default)
        return built[name]

    return resolve


ALIASES = "aliases"  # folder in the store root: one file per rebuilt index naming the table that serves it


class Catalog:
    def __init__(
        self,
        root: Path,
        embedder: Embedder,
        *,
        index_cache_mb: int,
        metadata_cache_mb: int,
        embedders: Callable[[str | None], Embedder] | None = None,
    ):
        import lance
        import lancedb

        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.embedder = embedder  # the default one: tables whose marker names no other
        # name -> the embedder of that name (rag_worker/embedders.py), for tables built with another one.
        self._embedders = embedders or _own_embedders(embedder)
        # Consistency interval 0: every read checks for a newer version, so writes made by another process (the
        # indexing CLI, a second worker) are seen at once; on local disk that check is a cheap listing.
        # Bounded caches: every commit makes a new table version, and Lance's defaults (GiBs) let the cached
        # manifests and index pieces of versions nobody reads again pile up, about 0.4 MB per commit
        # (bench/ingest_memory.py).
        self.session = lancedb.Session(
            index_cache_size_bytes=int(index_cache_mb) << 20,
            metadata_cache_size_bytes=int(metadata_cache_mb) << 20,
        )
        self.db = lancedb.connect(
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
        """The marker of a table made with the default embedder, in English."""
        return self.marker_for(self.embedder)

    @staticmethod
    def marker_for(embedder: Embedder, language: str | None = None) -> dict:
        return {
            "embedding_model": embedder.model_id,
            "dim": int(embedder.dim),
            "model_path": getattr(embedder, "model_path", None),
            "embedder": getattr(embedder, "name", "default"),
            "language": check_language(language),
            PACKED_ID: True,
        }

    def table_marker(self, embedder: Embedder, language: str | None) -> dict:
        """The marker a new table of this embedder and language gets (`own_marker` for the default ones)."""
        if embedder is self.embedder and check_language(language) == DEFAULT_LANGUAGE:
            return self.own_marker
        return self.marker_for(embedder, language)

    def embedder_of(self, marker: dict | None) -> Embedder:
        """The embedder a table's marker names (a table made before markers named one: the default)."""
        name = (marker or {}).get("embedder")
        try:
            return self._embedders(name)
        except ApiError as err:
            if err.status != 400:
                raise
            raise EmbedderMismatch(
                f"the index was built with embedder {name!r}, which this worker does not know", field="index"
            ) from err

    def exists(self, index: str) -> bool:
        check_table(index)
        return self.has_table(self.serving_table(index))

    def indexes(self) -> list[str]:
        # LanceDB lists a folder as a table before its first version is committed (has_table).
        tables = {n for n in offload(self.table_names) if self.has_table(n)}
        names = {n for n in tables if NAME_RE.fullmatch(n)}
        aliases = self.root / ALIASES
        if aliases.is_dir():
            names.update(
                p.name
                for p in aliases.iterdir()
                if NAME_RE.fullmatch(p.name) and self.serving_table(p.name) in tables
            )
        return sorted(names)

    def check_marker(self, index: str, marker: dict) -> None:
        ours = self.marker_for(self.embedder_of(marker))
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

    @staticmethod
    def read_marker(table: LanceTable) -> dict:
        """The table's marker as its schema holds it (blocking), with `table_dim` and `packed` from the schema."""
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
        marker["sentences"] = SENTENCE_VECTORS in schema.names
        return marker

    def marker_of(self, table: LanceTable) -> dict:
        """The table's marker, read once per table object: it is written when the table is created and never
        changed (a rebuild makes a new table), while reading the schema checks the disk for a newer version."""
        cached = self._markers.get(table.name)
        if cached is not None and cached[0] is table:
            return cached[1]
        marker = offload(self.read_marker, table)
        self._markers[table.name] = (table, marker)
        return marker

    def hit_columns(self, table: LanceTable) -> list[str]:
        """The columns a search reads for a hit: the packed ones, or each on a table made before them."""
        marker = self.marker_of(table)
        if not marker.get("packed"):
            return HIT_COLUMNS
        return PACKED_COLUMNS if marker.get(PACKED_ID) else ["id", *PACKED_COLUMNS]

    def conform(self, table: LanceTable, data: pa.Table) -> pa.Table:
        """`data` as `table` takes it: without the packed column, or the sentence vectors, for a table made before
        them."""
        marker = self.marker_of(table)
        if PACKED in data.column_names and not marker.get("packed"):
            data = data.drop_columns([PACKED])
        if SENTENCE_VECTORS in data.column_names and not marker.get("sentences"):
            data = data.drop_columns([c for c in SENTENCE_COLUMNS if c in data.column_names])
        return data

    # -- tables ---------------------------------------------------------------------------------------------

    def table_names(self) -> list[str]:
        """Every table LanceDB lists (blocking), committed or not (`has_table`)."""
        names: list[str] = []
        token = None
        while True:
            page = self.db.list_tables(page_token=token)
            names.extend(page.tables)
            token = page.page_token
            if not token:
                return names

    @staticmethod
    def staged_for(name: str) -> str | None:
        """The index a rebuild table `<index>.<hex>` was made for; None for any other name."""
        match = STAGED_RE.fullmatch(name)
        return match.group(1) if match else None

    def serving_table(self, index: str) -> str:
        """The table that serves `index`: the one its alias names after a rebuild, else the table `index`."""
        if STAGED_RE.fullmatch(index):
            return index
        try:
            target = (self.root / ALIASES / index).read_text(encoding="utf-8").strip()
        except (FileNotFoundError, NotADirectoryError):
            return index
        return target if self.staged_for(target) == index else index

    def has_table(self, name: str) -> bool:
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

    def open(self, index: str) -> LanceTable | None:
        """The table serving `index`, kept open across calls; None when there is none."""
        check_table(index)
        name = self.serving_table(index)
        if not self.has_table(name):
            self.forget(name)  # dropped, maybe by another process
            return None
        table = self._tables.get(name)
        if table is None:
            for stale in [n for n in self._tables if n != name and (self.staged_for(n) or n) == index]:
                self.forget(stale)  # swapped out by a rebuild, maybe in another process
            try:
                table = offload(self.db.open_table, name)
            except ValueError:
                if self.has_table(name):
                    raise
                return None  # dropped by another process since the look above
            self._tables[name] = table
        return table

    def table(self, index: str) -> LanceTable:
        """The table serving `index`; NotFound when there is none."""
        table = self.open(index)
        if table is None:
            raise NotFound(f"index '{index}' does not exist", code="index_not_found", field="index")
        return table

    def writable(self, index: str, *, embedder: str | None = None, language: str | None = None) -> LanceTable:
        """The table serving `index`, created when there is none (with the named embedder and language, the
        default ones unless given), its marker checked against the embedder it names."""
        table = self.open(index)
        if table is None:
            name = self.serving_table(index)
            table = offload(self.create, name, embedder, language)
            self._tables[name] = table
        self.check_marker(index, offload(self.read_marker, table))
        return table

    def settings_of(self, marker: dict | None) -> tuple[str, str]:
        """(embedder name, language) a table's marker records; a table made before them: default, English."""
        marker = marker or {}
        return marker.get("embedder") or "default", check_language(marker.get("language"))

    def create_index(self, index: str, embedder: str | None, language: str | None) -> tuple[LanceTable, bool]:
        """Make the table of `index` with this embedder and language now (blocking); (table, created). An index
        that exists with other settings is a 409: its vectors and full-text index were built for those."""
        wanted = (embedder or "default", check_language(language))
        table = self.open(index)
        created = table is None
        if created:
            name = self.serving_table(index)
            table = self.create(name, wanted[0], wanted[1])
            self._tables[name] = table
        have = self.settings_of(self.read_marker(table))
        if have != wanted:
            raise Conflict(
                f"index '{index}' exists with embedder {have[0]} and language {have[1]}; drop it to make it "
                f"with embedder {wanted[0]} and language {wanted[1]}",
                code="index_exists",
                field="index",
            )
        return table, created

    def create(self, index: str, embedder: str | None = None, language: str | None = None) -> LanceTable:
        """Table `index` with the schema, the named embedder's marker and the FTS index for its language
        (blocking)."""
        from lancedb.index import FTS

        emb = self._embedders(embedder)
        marker = self.table_marker(emb, language)
        schema = table_schema(emb.dim, marker)
        # exist_ok: another process may create the same index at the same moment; its marker is checked after.
        table = self.db.create_table(index, schema=schema, exist_ok=True)

        def ensure_fts() -> None:
            if any(idx.index_type == "FTS" for idx in table.list_indices()):
                return
            try:
                table.create_index("text", config=FTS(**fts_config(language)))
            except Exception:  # a concurrent creator won the race; fine if its index is there
                if not any(idx.index_type == "FTS" for idx in table.list_indices()):
                    raise

        retry_conflicts(ensure_fts, f"creating the full-text index of {index}")
        return table

    def forget(self, name: str) -> None:
        """Drop what is kept of table `name` (gone, or no longer serving its index)."""
        self._tables.pop(name, None)
        self._markers.pop(name, None)
        self._readers.pop(name, None)

    def drop_table(self, name: str) -> None:
        self.forget(name)
        offload(self.db.drop_table, name, ignore_missing=True)

    def reader(self, table: LanceTable) -> LanceDataset:
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

    # -- rebuilds: a new table, swapped in when complete ------------------------------------------------------

    def new_staged(self, index: str) -> str:
        """Create an empty table to rebuild `index` into; its name works as `index` in every call of the Store
        (and in no HTTP route). Searches of `index` keep using the current table until `promote`."""
        check_name(index, "index")
        name = f"{index}.{secrets.token_hex(6)}"
        current = self.open(index)  # the rebuilt table keeps the index's embedder and language
        marker = offload(self.read_marker, current) if current is not None else None
        embedder, language = self.settings_of(marker)
        self._tables[name] = offload(self.create, name, embedder, language)
        return name

    def staged_tables(self, index: str) -> list[str]:
        """Tables built for `index` that do not serve it: a rebuild in progress, or one that crashed."""
        check_name(index, "index")
        current = self.serving_table(index)
        return [n for n in offload(self.table_names) if self.staged_for(n) == index and n != current]

    def promote(self, index: str, staged: str) -> None:
        """Make the complete table `staged` serve `index` (one atomic file replace), then drop the old table."""
        check_name(index, "index")
        if self.staged_for(staged) != index:
            raise BadRequest(f"{staged} was not built for index {index}", code="bad_name", field="index")
        if staged not in offload(self.table_names):
            raise NotFound(f"the rebuilt table of index '{index}' is gone", code="index_not_found")
        old = self.serving_table(index)
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
            self.drop_table(old)

    def discard(self, staged: str) -> None:
        """Drop a table a rebuild was building (it failed, or crashed earlier); never a serving one."""
        index = self.staged_for(staged)
        if index is None or self.serving_table(index) == staged:
            raise BadRequest(f"{staged} is not a table being rebuilt", code="bad_name", field="index")
        self.drop_table(staged)

    def drop(self, index: str) -> bool:
        """Drop an index: its table, any table a rebuild left behind, and its alias. True when a table existed."""
        check_name(index, "index")
        existed = self.exists(index)
        for name in offload(self.table_names):
            if name == index or self.staged_for(name) == index:
                self.drop_table(name)
        (self.root / ALIASES / index).unlink(missing_ok=True)
        return existed
