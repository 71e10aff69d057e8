"""The ANN vector index of a table: when it is built, how, and how the vector leg searches through it.

Below `AnnParams.min_rows` LanceDB's exact scan is fast enough and exact; past it the index is built once, and
later writes are folded into it by `optimize()` (retrieval latency in docs/benchmarks.md). The parameters come
from the settings (ANN_MIN_ROWS, ANN_NPROBES, ANN_REFINE_FACTOR, ANN_EF), which say what each one trades.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from lance import LanceDataset
    from lancedb.table import LanceTable

    from ..settings import Settings

ANN_INDEX_TYPE = "IVF_HNSW_SQ"


@dataclass(frozen=True)
class AnnParams:
    """When a table gets its ANN index (min_rows; 0: never) and how the vector leg searches it: partitions probed
    (nprobes, at least 1), candidates re-scored exactly (refine_factor; 0: none) and HNSW candidates examined per
    probed partition (ef; 0: LanceDB's default)."""

    min_rows: int
    nprobes: int
    refine_factor: int
    ef: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "min_rows", int(self.min_rows))
        object.__setattr__(self, "nprobes", max(1, int(self.nprobes)))
        object.__setattr__(self, "refine_factor", max(0, int(self.refine_factor)))
        object.__setattr__(self, "ef", max(0, int(self.ef)))

    @classmethod
    def from_settings(cls, settings: Settings) -> AnnParams:
        return cls(settings.ann_min_rows, settings.ann_nprobes, settings.ann_refine_factor, settings.ann_ef)

    def nearest(self, qvec, fetch: int) -> dict[str, Any]:
        """pylance's `nearest` for a vector leg fetching `fetch` rows; the ANN parameters only apply where the
        table has an ANN index."""
        nearest: dict[str, Any] = {"column": "vector", "q": qvec, "k": fetch, "metric": "cosine"}
        nearest["nprobes"] = self.nprobes
        if self.refine_factor:
            nearest["refine_factor"] = self.refine_factor
        if self.ef:  # Lance refuses an ef below the candidates it is asked for
            nearest["ef"] = max(self.ef, fetch * max(1, self.refine_factor))
        return nearest


def has_ann(table: LanceTable) -> bool:
    return any(idx.index_type != "FTS" and "vector" in idx.columns for idx in table.list_indices())


def has_vector_index(dataset: LanceDataset) -> bool:
    """`has_ann` for a pylance dataset (a search's snapshot of the table)."""
    return any(
        "vector" in index["fields"] and index["type"] != "Inverted" for index in dataset.list_indices()
    )


def maybe_build(table: LanceTable, min_rows: int) -> None:
    """Build the index once the table has `min_rows` rows (0: never), unless it has one."""
    if min_rows <= 0 or has_ann(table) or table.count_rows() < min_rows:
        return
    build(table)


def build(table: LanceTable, index_type: str = ANN_INDEX_TYPE, num_partitions: int | None = None) -> None:
    # Cosine, as the vector leg searches; graph and quantizer settings are LanceDB's defaults, partitions too
    # unless given (the latency benchmark's sweep measured them: docs/benchmarks.md).
    table.create_index(
        metric="cosine",
        vector_column_name="vector",
        index_type=index_type,
        num_partitions=num_partitions or None,
        replace=True,
    )
