"""The exact vector leg on vectors held in memory (store/exact.py) finds what pylance's own scan finds, on real
LanceDB tables: the same rows in the same order with the same distances, the dataset filter applied before the
cut, every write seen at the next search, and pylance's scan where the vectors are not held; and a search's
neighbouring chunks read by row address are those a scan of the table finds."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from rag_worker.store import AnnParams, Store

DATASETS = ("alpha", "beta", "gamma")


def rows(start: int, count: int, dim: int, rng: np.random.Generator) -> list[dict]:
    vecs = rng.standard_normal((count, dim)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    return [
        {
            "document_id": hashlib.sha256(str(i).encode()).hexdigest(),
            "filename": f"doc{i}.txt",
            "dataset": DATASETS[i % 3],
            "page": None,
            "chunk_index": 0,
            "text": f"passage number {i} about topic {i % 17} and subject {i % 5}",
            "vector": vecs[i - start],
        }
        for i in range(start, start + count)
    ]


@pytest.fixture
def pair(tmp_path, embedder):
    """Two stores on one folder of tables: one holding the vectors (the default), one never (pylance scans)."""
    held = Store(tmp_path / "db", embedder)
    scanned = Store(tmp_path / "db", embedder, exact_cache_mb=0)
    return held, scanned


def queries(written: list[dict], rng: np.random.Generator, n: int = 12) -> list[np.ndarray]:
    """Near some rows, between two rows, and random directions."""
    out = []
    for i in range(n):
        a, b = written[(7 * i) % len(written)]["vector"], written[(11 * i + 3) % len(written)]["vector"]
        out.append((a + (0.3 + 0.1 * (i % 4)) * b).astype(np.float32))
    out += [rng.standard_normal(written[0]["vector"].shape).astype(np.float32) for _ in range(4)]
    return out


def leg(store: Store, qvec, datasets=None, depth: int = 40, query: str | None = None):
    from rag_worker.store.filters import in_clause

    where = in_clause("dataset", datasets) if datasets else None
    snapshots = store.snapshots(store.open_tables(["big"]))
    return store.legs(snapshots, qvec, query, where, depth, datasets=datasets)


def same_rows(got, want) -> None:
    assert [r["_rowid"] for _, r in got] == [r["_rowid"] for _, r in want]
    assert np.allclose([r["_distance"] for _, r in got], [r["_distance"] for _, r in want], atol=1e-5)
    for (_, g), (_, w) in zip(got, want, strict=True):
        assert np.array_equal(np.asarray(g["vector"]), np.asarray(w["vector"]))


@pytest.mark.parametrize("datasets", [None, ["beta"], ["alpha", "gamma"], ["nowhere"]])
def test_the_held_leg_returns_what_pylances_scan_returns(pair, embedder, datasets):
    held, scanned = pair
    rng = np.random.default_rng(3)
    written = rows(0, 600, embedder.dim, rng)
    held.add_chunks("big", written)
    for qvec in queries(written, rng):
        got, _ = leg(held, qvec, datasets)
        want, _ = leg(scanned, qvec, datasets)
        same_rows(got, want)
        if datasets:
            by_id = {r["_rowid"]: r for _, r in got}
            assert all(
                held.search("big", "x", mode="vector", vector=qvec, datasets=datasets, limit=5)[i].dataset
                in datasets
                for i in range(min(5, len(by_id)))
            )
    assert held.exact.held_bytes() > 0  # the comparison ran on held vectors
    assert scanned.exact.held_bytes() == 0


SCORES = ("score", "vector_score")


def without_scores(hit) -> dict:
    return {k: v for k, v in hit.to_dict().items() if k not in SCORES}


@pytest.mark.parametrize("mode", ["vector", "hybrid"])
def test_searches_find_the_same_hits_as_with_pylances_scan(pair, embedder, mode):
    """Every field of every hit, the fused hybrid ranks and the FTS leg's vectors (from memory) included."""
    held, scanned = pair
    rng = np.random.default_rng(4)
    written = rows(0, 500, embedder.dim, rng)
    held.add_chunks("big", written)
    stored = {r["filename"]: r["vector"] for r in written}
    for n, qvec in enumerate(queries(written, rng)):
        text = f"topic {n % 17} subject {n % 5}"
        got = held.search("big", text, mode=mode, vector=qvec, limit=10)
        want = scanned.search("big", text, mode=mode, vector=qvec, limit=10)
        assert [without_scores(h) for h in got] == [without_scores(h) for h in want]
        for g, w in zip(got, want, strict=True):  # the same float32 cosines, summed in another order
            for key in SCORES:
                assert (g.to_dict()[key] is None) == (w.to_dict()[key] is None)
                assert g.to_dict()[key] == pytest.approx(w.to_dict()[key], rel=1e-4, abs=1e-5)
        for hit in got:
            assert np.array_equal(hit.vector, stored[hit.filename])


def test_a_write_is_seen_at_the_next_search_and_a_deleted_row_is_gone(pair, embedder):
    held, _ = pair
    rng = np.random.default_rng(5)
    first = rows(0, 300, embedder.dim, rng)
    held.add_chunks("big", first)
    assert (
        held.search("big", "x", mode="vector", vector=first[10]["vector"], limit=1)[0].filename == "doc10.txt"
    )
    later = rows(300, 20, embedder.dim, rng)
    held.add_chunks("big", later)  # a new version: read again at the next search
    hit = held.search("big", "x", mode="vector", vector=later[4]["vector"], limit=1)[0]
    assert hit.filename == "doc304.txt" and hit.vector_score == pytest.approx(1.0, abs=1e-5)
    held.delete_document("big", dataset="beta", filename="doc304.txt")
    after = held.search("big", "x", mode="vector", vector=later[4]["vector"], limit=5)
    assert "doc304.txt" not in [h.filename for h in after]


def test_a_write_by_another_process_is_seen(tmp_path, embedder):
    """Another store object on the same folder stands for another worker process: its write makes a version this
    one has not held, and this one's next search reads it."""
    rng = np.random.default_rng(6)
    mine = Store(tmp_path / "db", embedder)
    other = Store(tmp_path / "db", embedder)
    first = rows(0, 200, embedder.dim, rng)
    mine.add_chunks("big", first)
    mine.search("big", "x", mode="vector", vector=first[0]["vector"], limit=1)
    extra = rows(200, 5, embedder.dim, rng)
    other.add_chunks("big", extra)
    assert (
        mine.search("big", "x", mode="vector", vector=extra[2]["vector"], limit=1)[0].filename == "doc202.txt"
    )


def test_a_table_too_big_for_the_budget_is_scanned_by_pylance(tmp_path, embedder):
    rng = np.random.default_rng(7)
    small = Store(tmp_path / "db", embedder, exact_cache_mb=0)
    small.exact.budget = 100 * embedder.dim * 4  # room for 100 vectors, the table has 300
    written = rows(0, 300, embedder.dim, rng)
    small.add_chunks("big", written)
    hits = small.search("big", "x", mode="vector", vector=written[250]["vector"], limit=3)
    assert hits[0].filename == "doc250.txt"
    assert small.exact.held_bytes() == 0


def test_the_least_recent_table_goes_when_the_budget_is_full(tmp_path, embedder):
    rng = np.random.default_rng(8)
    store = Store(tmp_path / "db", embedder, exact_cache_mb=0)
    store.exact.budget = 260 * (embedder.dim * 4 + 32)  # about one 200-row table at a time
    for name in ("one", "two"):
        written = rows(0, 200, embedder.dim, rng)
        store.add_chunks(name, written)
        assert store.search(name, "x", mode="vector", vector=written[5]["vector"], limit=1)[0].filename == (
            "doc5.txt"
        )
    assert 0 < store.exact.held_bytes() <= store.exact.budget


def test_a_table_with_an_ann_index_is_searched_through_it(tmp_path, embedder):
    rng = np.random.default_rng(9)
    store = Store(tmp_path / "db", embedder, ann_params=AnnParams(600, 10, 1, 400))
    written = rows(0, 700, embedder.dim, rng)
    store.add_chunks("big", written)
    assert store.has_ann("big")
    hits = store.search("big", "x", mode="vector", vector=written[42]["vector"], limit=3)
    assert hits[0].filename == "doc42.txt"
    assert store.exact.held_bytes() == 0


def test_ties_across_the_cut_go_to_the_lower_row_id(embedder):
    from rag_worker.store.exact import Vectors

    matrix = np.tile(np.eye(1, 4, 0, dtype=np.float32), (6, 1))  # six identical rows
    matrix[0] = np.eye(1, 4, 1, dtype=np.float32)  # and one elsewhere
    ids = np.array([50, 40, 30, 20, 10, 60], dtype=np.uint64)
    vectors = Vectors(
        version=(1, 0),
        matrix=matrix,
        norms=np.linalg.norm(matrix, axis=1),
        row_ids=ids,
        dataset_codes=np.zeros(6, np.int32),
        dataset_names=("d",),
        by_id=np.argsort(ids).astype(np.int64),
    )
    got = vectors.nearest(np.eye(1, 4, 0, dtype=np.float32)[0], 3)
    assert [r["_rowid"] for r in got] == [10, 20, 30]
    assert [v is None for v in vectors.vectors_of([10, 11])] == [False, True]


def documents(dim: int, rng: np.random.Generator, names: list[str], chunks: int = 4) -> list[dict]:
    """Documents of `chunks` chunks each, in dataset alpha, written in order as ingestion writes them."""
    out = []
    for n, name in enumerate(names):
        vecs = rng.standard_normal((chunks, dim)).astype(np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        for i in range(chunks):
            out.append(
                {
                    "document_id": hashlib.sha256(name.encode()).hexdigest(),
                    "filename": name,
                    "dataset": "alpha",
                    "page": None,
                    "chunk_index": i,
                    "text": f"{name} part {i} of document number {n}",
                    "vector": vecs[i],
                }
            )
    return out


def neighbours_three_ways(held: Store, scanned: Store, wanted: dict, anchors: dict) -> dict:
    """The neighbours from the held version, from row addresses next to `anchors` (a table not held), and from
    the scan alone; asserted equal, returned as {key: [(chunk index, text)]}."""

    def flat(found):
        return {k: [(h.chunk_index, h.text, h.id) for h in v] for k, v in found.items()}

    by_held = flat(held.neighbours_of("docs", wanted, anchors=anchors))
    by_address = flat(scanned.neighbours_of("docs", wanted, anchors=anchors))
    by_scan = flat(scanned.neighbours_of("docs", wanted))
    assert by_held == by_scan and by_address == by_scan
    return by_scan


def test_neighbours_read_by_row_address_are_those_the_scan_finds(pair, embedder):
    held, scanned = pair
    rng = np.random.default_rng(11)
    written = documents(embedder.dim, rng, ["a.md", "b.md", "c.md"])
    held.add_chunks("docs", written)
    doc = {r["filename"]: (r["document_id"], "alpha", r["filename"]) for r in written}
    hits = {
        h.filename + str(h.chunk_index): h
        for h in held.search("docs", "x", mode="vector", vector=written[5]["vector"], limit=12)
    }
    b1, c3 = hits["b.md1"], hits["c.md3"]
    wanted = {
        doc["b.md"]: [0, 1, 2],
        doc["c.md"]: [2, 3, 4],
    }  # c.md has no chunk 4; c.md 3 is the table's last row
    anchors = {doc["b.md"]: [(1, b1.row_id)], doc["c.md"]: [(3, c3.row_id)]}
    got = neighbours_three_ways(held, scanned, wanted, anchors)
    assert [i for i, *_ in got[doc["b.md"]]] == [0, 1, 2]
    assert [t for _, t, _ in got[doc["c.md"]]] == [
        "c.md part 2 of document number 2",
        "c.md part 3 of document number 2",
    ]
    assert held.exact.held_bytes() > 0

    # Anchors that point elsewhere (a row of another document) find nothing wrong: the scan finds the chunks.
    wrong = {doc["b.md"]: [(1, c3.row_id)], doc["c.md"]: [(3, b1.row_id)]}
    assert neighbours_three_ways(held, scanned, wanted, wrong) == got


def test_neighbours_after_a_document_is_rewritten_are_its_new_chunks(pair, embedder):
    """The search found b.md's chunks where they were; the document is replaced (its old rows deleted, new ones
    written elsewhere) before the neighbours are read: the new text is read, never the old."""
    held, scanned = pair
    rng = np.random.default_rng(12)
    written = documents(embedder.dim, rng, ["a.md", "b.md", "c.md"])
    held.add_chunks("docs", written)
    key = (written[4]["document_id"], "alpha", "b.md")
    b1 = next(
        h
        for h in held.search("docs", "x", mode="vector", vector=written[5]["vector"], limit=12)
        if h.filename == "b.md" and h.chunk_index == 1
    )
    held.delete_document("docs", dataset="alpha", filename="b.md")
    again = documents(embedder.dim, rng, ["b.md"], chunks=2)
    for row in again:
        row["text"] = row["text"].replace("part", "rewritten part")
    held.add_chunks("docs", again)
    got = neighbours_three_ways(held, scanned, {key: [0, 1, 2]}, {key: [(1, b1.row_id)]})
    assert [t for _, t, _ in got[key]] == [
        "b.md rewritten part 0 of document number 0",
        "b.md rewritten part 1 of document number 0",
    ]


def test_a_table_made_again_under_the_same_name_is_never_answered_from_the_old_ones_vectors(
    tmp_path, embedder
):
    """Dropped and written again, a table counts its versions from 1 again: the same version numbers, other rows."""
    rng = np.random.default_rng(13)
    store = Store(tmp_path / "db", embedder)
    old = rows(0, 50, embedder.dim, rng)
    for start in range(0, 50, 10):  # five writes: five versions
        store.add_chunks("big", old[start : start + 10])
    assert store.search("big", "x", mode="vector", vector=old[7]["vector"], limit=1)[0].filename == "doc7.txt"
    store.drop("big")
    new = rows(100, 50, embedder.dim, rng)
    for start in range(0, 50, 10):
        store.add_chunks("big", new[start : start + 10])
    for probe in (old[7], new[7]):
        for mode in ("vector", "hybrid"):
            hits = store.search("big", "passage", mode=mode, vector=probe["vector"], limit=3)
            assert {h.filename for h in hits} <= {r["filename"] for r in new}
    assert (
        store.search("big", "x", mode="vector", vector=new[7]["vector"], limit=1)[0].filename == "doc107.txt"
    )
