"""The chunk store: one LanceDB table per index, searched by vector, by BM25 full text, or both fused.

`Store` is the one entry point of the worker; the modules hold one concept each:
- `rows`: a chunk's row (table layout, row checks and embedding, the packed hit column, `Hit`);
- `filters`: the SQL filters, built from checked values only;
- `catalog`: the tables of a store root (which one serves an index, markers, rebuild aliases);
- `writes`: commits, their one retry policy, and the housekeeping after a write;
- `ann`: the ANN vector index and its parameters;
- `search`: the vector and full-text legs, and the read of the fused hits by row id;
- `fusion`: how hybrid mode fuses the legs;
- `reads` (`Reader`: searches and listings) and `store` (`Store`: a Reader that also writes).
"""

from __future__ import annotations

from .ann import AnnParams
from .filters import doc_key, has_words
from .fusion import BM25_MIN, COSINE_MIN, FUSIONS, FusionParams, fuse, normaliser
from .reads import Reader
from .rows import (
    FTS_CONFIG,
    HIT_COLUMNS,
    MARKER_KEY,
    PACKED,
    PACKED_ID,
    Hit,
    chunk_id,
    packed_column,
    scan,
    table_schema,
    to_hit,
)
from .search import HYBRID_LEG_MIN, LEG_TIE_SLACK, MAX_LIMIT, MODES, Snapshot
from .store import Store
from .writes import is_commit_conflict

__all__ = [
    "BM25_MIN",
    "COSINE_MIN",
    "FTS_CONFIG",
    "FUSIONS",
    "HIT_COLUMNS",
    "HYBRID_LEG_MIN",
    "LEG_TIE_SLACK",
    "MARKER_KEY",
    "MAX_LIMIT",
    "MODES",
    "PACKED",
    "PACKED_ID",
    "AnnParams",
    "FusionParams",
    "Hit",
    "Reader",
    "Snapshot",
    "Store",
    "chunk_id",
    "doc_key",
    "fuse",
    "has_words",
    "is_commit_conflict",
    "normaliser",
    "packed_column",
    "scan",
    "table_schema",
    "to_hit",
]
