"""The exact vector leg of a table without an ANN index, on its vectors held in memory.

Below ANN_MIN_ROWS a table has no ANN index and pylance's `nearest` scans every vector of the version at every
search: at 10,000 chunks that read, decoded and compared the whole column in 9 to 12 ms of CPU a query (its
native threads), where the same comparison on the vectors already in memory is a 0.5 ms matrix product
(docs/benchmarks.md, "Eleventh round"). So the vectors of such a table's newest version are read once, with their
row ids and datasets, and kept here; a search of that version compares against them and returns what pylance's
vector leg returns: rows of `_rowid`, `_distance` (cosine distance, 1 - cos, as `metric="cosine"` computes it),
`vector`, best first, the dataset filter applied before the cut (pylance's prefilter).

A new version (any write, by this process or another; a table made again under the same name) is read again at
its first search. The cache keeps the newest version of the tables used last, within EXACT_SEARCH_CACHE_MB; a
table that does not fit, or that has an ANN index, is searched by pylance as before. With the vectors it holds
where each chunk is, which context expansion reads the neighbours by (`Reader.neighbours_of`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from lance import LanceDataset


@dataclass(frozen=True)
class Vectors:
    """One version's vectors: row i of `matrix` is the row with id `row_ids[i]`, in dataset `datasets[i]`."""

    version: tuple[int, object]  # `stamp` of the version read
    matrix: np.ndarray  # (rows, dim) float32, C-contiguous
    norms: np.ndarray  # (rows,) float32: each row's length, for the cosine
    row_ids: np.ndarray  # (rows,) uint64
    dataset_codes: np.ndarray  # (rows,) int32: index into `dataset_names`
    dataset_names: tuple[str, ...]
    by_id: np.ndarray  # (rows,) int64: the rows in order of their ids, for `vectors_of`
    # (document_id, doc_key, chunk_index) -> row id: where each chunk is, so a search's neighbours are read by
    # row id (`Reader.neighbours_of`) and a chunk not in it is known not to exist. None: a table without doc_key.
    chunk_rows: dict[tuple[str, str, int], int] | None = None

    @property
    def nbytes(self) -> int:
        arrays = sum(
            a.nbytes for a in (self.matrix, self.norms, self.row_ids, self.dataset_codes, self.by_id)
        )
        return arrays + CHUNK_ROW_BYTES * len(self.chunk_rows or ())

    def vectors_of(self, row_ids: list[int]) -> list[np.ndarray | None]:
        """The vectors of these rows (copies), None for an id this version does not hold."""
        if not row_ids or not len(self.row_ids):
            return [None] * len(row_ids)
        wanted = np.asarray(row_ids, dtype=np.uint64)
        sorted_ids = self.row_ids[self.by_id]
        at = np.minimum(np.searchsorted(sorted_ids, wanted), len(sorted_ids) - 1)
        found = sorted_ids[at] == wanted
        rows = self.by_id[at]
        return [self.matrix[r].copy() if ok else None for r, ok in zip(rows, found, strict=True)]

    def nearest(self, qvec: np.ndarray, k: int, datasets: list[str] | None = None) -> list[dict]:
        """The `k` rows nearest `qvec` by cosine distance, nearest first (ties: lower row id first), among the
        rows of `datasets` when given; each row {"_rowid", "_distance", "vector"} as pylance's leg gives it."""
        q = np.asarray(qvec, dtype=np.float32)
        matrix, norms, row_ids = self.matrix, self.norms, self.row_ids
        if datasets is not None:
            allowed = set(datasets)
            wanted = [i for i, name in enumerate(self.dataset_names) if name in allowed]
            keep = np.flatnonzero(np.isin(self.dataset_codes, wanted))
            matrix, norms, row_ids = matrix[keep], norms[keep], row_ids[keep]
        if not len(row_ids) or k <= 0:
            return []
        q_norm = float(np.linalg.norm(q))
        scale = norms * q_norm
        # numpy's own loop, one thread: `matrix @ q` hands a product this size to OpenBLAS's threads, whose
        # spinning after each call cost a RAG turn more CPU than the whole scan saved (docs/benchmarks.md).
        dots = np.einsum("ij,j->i", matrix, q)
        distance = (1.0 - np.divide(dots, scale, out=np.zeros_like(dots), where=scale > 0)).astype(np.float32)
        if k < len(distance):
            cut = np.argpartition(distance, k - 1)[:k]
            # Every row at the cut's distance is a candidate, so a tie across the cut goes to the lower row id.
            edge = distance[cut].max()
            cut = np.flatnonzero(distance <= edge)
        else:
            cut = np.arange(len(distance))
        order = cut[np.lexsort((row_ids[cut], distance[cut]))][:k]
        return [
            {"_rowid": int(row_ids[i]), "_distance": float(distance[i]), "vector": matrix[i].copy()}
            for i in order
        ]


# What one entry of `Vectors.chunk_rows` holds, about: a tuple of two 64-character strings and two ints in a dict.
CHUNK_ROW_BYTES = 400


def read_vectors(dataset: LanceDataset) -> Vectors | None:
    """The version's vectors, row ids, datasets and chunk places (blocking); None when a vector is missing."""
    placed = {"document_id", "doc_key", "chunk_index"} <= set(dataset.schema.names)
    columns = ["vector", "dataset", *(["document_id", "doc_key", "chunk_index"] if placed else [])]
    data = dataset.to_table(columns=columns, with_row_id=True)
    column = data.column("vector").combine_chunks()
    if column.null_count:
        return None
    rows = data.num_rows
    dim = column.type.list_size if rows else 0
    matrix = np.ascontiguousarray(
        column.flatten().to_numpy(zero_copy_only=False).reshape(rows, dim), dtype=np.float32
    )
    codes = data.column("dataset").combine_chunks().dictionary_encode()
    row_ids = data.column("_rowid").to_numpy().astype(np.uint64)
    chunk_rows = None
    if placed:
        chunk_rows = dict(
            zip(
                zip(
                    data.column("document_id").to_pylist(),
                    data.column("doc_key").to_pylist(),
                    data.column("chunk_index").to_pylist(),
                    strict=True,
                ),
                row_ids.tolist(),
                strict=True,
            )
        )
    return Vectors(
        version=stamp(dataset),
        matrix=matrix,
        norms=np.linalg.norm(matrix, axis=1).astype(np.float32) if rows else np.zeros(0, np.float32),
        row_ids=row_ids,
        dataset_codes=codes.indices.to_numpy(zero_copy_only=False).astype(np.int32),
        dataset_names=tuple(codes.dictionary.to_pylist()),
        by_id=np.argsort(row_ids, kind="stable").astype(np.int64),
        chunk_rows=chunk_rows,
    )


class ExactVectors:
    """The newest version's vectors of the tables searched last, within `budget_bytes` (0: off)."""

    def __init__(self, budget_bytes: int):
        self.budget = max(0, int(budget_bytes))
        self._held: OrderedDict[str, Vectors] = OrderedDict()
        # table -> a version found with an ANN index (pylance searches it)
        self._indexed: dict[str, tuple] = {}
        # Taken in the native threads a search's legs run in: the interpreter's own lock, never gevent's.
        self._lock = _native_lock()

    def of(self, dataset: LanceDataset) -> Vectors | None:
        """The vectors of `dataset`'s version, read now if not held; None when the version has an ANN index or
        its vectors would not fit."""
        if self.budget <= 0:
            return None
        key, version = str(dataset.uri), stamp(dataset)
        with self._lock:
            held = self._held.get(key)
            if held is not None and held.version == version:
                self._held.move_to_end(key)
                return held
            if self._indexed.get(key) == version:
                return None
        from .ann import has_vector_index

        if has_vector_index(dataset):
            with self._lock:
                self._indexed[key] = version
                self._held.pop(key, None)
            return None
        dim = _dim(dataset)
        if dim is None or dataset.count_rows() * (dim * 4 + 24 + CHUNK_ROW_BYTES) > self.budget:
            return None
        fresh = read_vectors(dataset)
        if fresh is None or fresh.nbytes > self.budget:
            return None
        with self._lock:
            self._held[key] = fresh  # the version read last: a search of another reads its own
            self._held.move_to_end(key)
            total = sum(v.nbytes for v in self._held.values())
            while total > self.budget and len(self._held) > 1:
                _, dropped = self._held.popitem(last=False)
                total -= dropped.nbytes
        return fresh

    def held_bytes(self) -> int:
        with self._lock:
            return sum(v.nbytes for v in self._held.values())


def stamp(dataset: LanceDataset) -> tuple[int, object]:
    """Which version of which table `dataset` is: its number and its commit time (from the manifest already
    loaded). A table dropped and made again under the same name counts its versions from 1 again: the number
    alone would take the new table's version 3 for the old one's."""
    return dataset.version, dataset.get_version().get("timestamp")


def _dim(dataset: LanceDataset) -> int | None:
    import pyarrow as pa

    field = dataset.schema.field("vector") if "vector" in dataset.schema.names else None
    if field is None or not pa.types.is_fixed_size_list(field.type):
        return None
    return int(field.type.list_size)


def _native_lock():
    """A real OS lock: in a gevent-patched process `threading.Lock` is a greenlet lock, which native threads must
    not share."""
    try:
        from gevent import monkey

        return monkey.get_original("threading", "Lock")()
    except ImportError:  # pragma: no cover - gevent is a worker dependency
        return threading.Lock()
