"""The search legs: vector and BM25 full text, run on pylance datasets, and the read of the fused hits by row id.

Searches (both legs and the read of the fused hits) run on a pylance dataset of the table's newest version, not
through LanceDB's query layer, which costs 1.3 to 2.8 ms a call at 1M chunks (docs/benchmarks.md, "Eighth
round"). Each table of a search is one `Snapshot`, taken once per search, so both legs and the read see one
version: the row ids the legs return are valid for the read. A read of rows by row id pays per column per row,
so a hit's fields come from one packed column (rows.PACKED).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ..runtime import offload_all
from .ann import AnnParams, has_vector_index
from .exact import ExactVectors
from .rows import HIT_COLUMNS, Hit, arrow_rows, scan_arrow, to_hit

if TYPE_CHECKING:  # pragma: no cover
    from lance import LanceDataset
    from lancedb.table import LanceTable

log = logging.getLogger(__name__)

MODES = ("hybrid", "vector", "fts")
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

Rows = list[tuple[str, dict]]  # (index, row) pairs, best first


class Snapshot(NamedTuple):
    """One table of one search: its index, the newest version of its table, and the columns a hit reads."""

    index: str
    dataset: LanceDataset
    hit_columns: list[str]


def run_legs(
    snapshots: list[Snapshot],
    qvec: np.ndarray | None,
    fts_text: str | None,
    where: str | None,
    leg_limit: int,
    ann: AnnParams,
    *,
    slim: bool = False,
    datasets: list[str] | None = None,
    exact: ExactVectors | None = None,
) -> tuple[Rows, Rows]:
    """Each table's vector leg (when `qvec`) and FTS leg (when `fts_text`), all at once in native threads, each leg
    merged across tables by its own score and cut at `leg_limit`, every row with its row id. `slim`: row ids,
    scores and vectors only (the vector leg's where its search reads them anyway), the hit columns, id included,
    left for `materialise`. Even the 32-character id costs 1.5 to 3 ms a leg to read for 100 rows at 1M chunks.
    `exact`: where a table has no ANN index, its vector leg compares against its vectors held there (`exact.py`);
    `where` is then the dataset filter `datasets` (None: no filter), which it applies itself."""
    fetch = leg_limit + LEG_TIE_SLACK
    filters = {"filter": where, "prefilter": True} if where else {}
    held = exact if exact is not None and (where is None or datasets is not None) else None
    calls = []
    for snap in snapshots:
        if qvec is not None:
            calls.append(lambda s=snap: _vector_leg(s, qvec, fetch, ann, slim, filters, held, datasets))
        if fts_text is not None:
            calls.append(lambda s=snap: _fts_leg(s, fts_text, qvec is not None, fetch, slim, filters, held))
    vec_rows: Rows = []
    fts_rows: Rows = []
    for leg, rows in offload_all(calls):
        (vec_rows if leg == "vector" else fts_rows).extend(rows)
    # Across several tables each leg is merged by its own score before ranks are assigned; ties by table and
    # row id (LEG_TIE_SLACK).
    vec_rows.sort(key=lambda nr: (nr[1]["_distance"], nr[0], nr[1]["_rowid"]))
    fts_rows.sort(key=lambda nr: (-nr[1]["_score"], nr[0], nr[1]["_rowid"]))
    return vec_rows[:leg_limit], fts_rows[:leg_limit]


def _vector_leg(
    snap: Snapshot,
    qvec,
    fetch: int,
    ann: AnnParams,
    slim: bool,
    filters: dict,
    exact: ExactVectors | None = None,
    datasets: list[str] | None = None,
) -> tuple[str, Rows]:
    vectors = exact.of(snap.dataset) if exact is not None else None
    if vectors is not None:  # no ANN index, the version's vectors in memory: the scan is one matrix product
        rows = vectors.nearest(qvec, fetch, datasets)
        if not slim and rows:
            data = snap.dataset._take_rows([r["_rowid"] for r in rows], [*snap.hit_columns, "_rowid"])
            by_id = {r["_rowid"]: r for r in data.to_pylist()}
            rows = [{**by_id[r["_rowid"]], **r} for r in rows if r["_rowid"] in by_id]
        return "vector", [(snap.index, r) for r in rows]
    # A slim leg brings the vectors only where the search reads them anyway: an exact scan, or an ANN search that
    # re-scores its candidates exactly (0.15 ms for 105 rows at 1M chunks, where reading them afterwards costs
    # 20 us a row). Otherwise `materialise` reads them for the fused top.
    if slim:
        exact = ann.refine_factor or not has_vector_index(snap.dataset)
        columns = ["vector", "_distance"] if exact else ["_distance"]
    else:
        columns = [*snap.hit_columns, "vector", "_distance"]
    data = snap.dataset.to_table(
        columns=columns, nearest=ann.nearest(qvec, fetch), limit=fetch, with_row_id=True, **filters
    )
    return "vector", [(snap.index, r) for r in arrow_rows(data)]


def _fts_leg(
    snap: Snapshot,
    text: str,
    with_vectors: bool,
    fetch: int,
    slim: bool,
    filters: dict,
    exact: ExactVectors | None = None,
) -> tuple[str, Rows]:
    from lance.query import MatchQuery

    # A MatchQuery is a plain bag of terms (OR): quotes, colons, parentheses and AND/OR typed by a user are never
    # parsed as query syntax, so no input can make the search raise.
    # In hybrid mode the stored vectors come along: a chunk only this leg found still gets its exact cosine
    # similarity, which the score fusions need (and the relevance check would else re-embed). Reading them here
    # costs less than reading those of the rows the vector leg did not return afterwards (docs/benchmarks.md,
    # "Ninth round").
    # Where the version's vectors are held (`exact.py`) they come from memory: reading them with the rows cost
    # the leg 3 ms of its 4 at 10,000 chunks.
    held = exact.of(snap.dataset) if exact is not None and with_vectors else None
    read_vectors = with_vectors and held is None
    columns = [*([] if slim else snap.hit_columns), "_score", *(["vector"] if read_vectors else [])]
    data = snap.dataset.to_table(
        columns=columns, full_text_query=MatchQuery(text, "text"), limit=fetch, with_row_id=True, **filters
    )
    rows = arrow_rows(data)
    if held is not None:
        for row, vector in zip(rows, held.vectors_of([r["_rowid"] for r in rows]), strict=True):
            row["vector"] = vector
    return "fts", [(snap.index, r) for r in rows]


def materialise(snapshots: list[Snapshot], hits: list[Hit]) -> bool:
    """Fill the hits' columns (and the vectors no leg brought) by row id from the version their legs searched;
    False when a row cannot be read."""
    calls = []
    for name, dataset, hit_columns in snapshots:
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
            rows.update(((name, r["_rowid"]), r) for r in arrow_rows(data))
    except Exception as exc:  # the files those row ids point into are gone
        log.info("search: reading the fused hits by row id failed, searching again: %s", exc)
        return False
    for hit in hits:
        row = rows.get((hit.index, hit.row_id))
        if row is None:
            return False
        full = to_hit(hit.index, row)
        for column in HIT_COLUMNS:
            setattr(hit, column, getattr(full, column))
        if hit.vector is None and row.get("vector") is not None:
            hit.vector = row["vector"]
    return True


def list_documents(table: LanceTable) -> list[dict]:
    """One entry per document of the table (blocking), by dataset and file name."""
    cols = ["dataset", "filename", "document_id", "file_bytes", "indexed_at", "id"]
    data = scan_arrow(table, None, cols)
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
