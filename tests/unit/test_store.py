"""The LanceDB store against a real table on disk, with the real packaged embedder."""

from __future__ import annotations

import copy
import hashlib
from datetime import timedelta

import numpy as np
import pytest

from rag_worker.errors import ApiError, BadRequest, EmbedderMismatch, NotFound
from rag_worker.store import Hit, Store

CORPUS = {
    ("hr", "leave.md"): [
        "Employees are entitled to 25 days of paid vacation per calendar year.",
        "Unused vacation days can be carried over until the end of March.",
        "Sick leave requires a doctor's note after three consecutive days.",
    ],
    ("hr", "office.md"): [
        "The office opens at 8 am and closes at 6 pm on weekdays.",
        "Visitors must sign in at the reception desk.",
    ],
    ("legal", "contract.md"): [
        "Either party may terminate this agreement with three months written notice.",
        "Liability under this contract is capped at one million euros.",
    ],
    ("eng", "deploy.md"): [
        "Deployments to production happen every Tuesday after the change review.",
        "Rollbacks are performed with the blue-green switch in the load balancer.",
    ],
}


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


_VECTORS: dict[str, np.ndarray] = {}


def vectors(embedder, chunks: list[str]) -> list[np.ndarray]:
    """Embeddings memoised across tests: the shared 2-core machine makes re-embedding the corpus slow."""
    todo = [t for t in dict.fromkeys(chunks) if t not in _VECTORS]
    if todo:
        _VECTORS.update(zip(todo, embedder.embed_documents(todo), strict=True))
    return [_VECTORS[t] for t in chunks]


def rows_for(
    dataset: str, filename: str, chunks: list[str], document_id: str | None = None, *, embedder=None
) -> list[dict]:
    """Rows as ingestion passes them; with `embedder`, vectors precomputed, else the store embeds them."""
    document_id = document_id or digest("\n".join(chunks))
    vecs = vectors(embedder, chunks) if embedder is not None else [None] * len(chunks)
    return [
        {
            "vector": vecs[i],
            "document_id": document_id,
            "filename": filename,
            "dataset": dataset,
            "page": None if i == 0 else i,
            "chunk_index": i,
            "text": text,
            "metadata": {"heading": f"part {i}"},
            "file_bytes": 1234,
            "indexed_at": f"2025-01-0{i + 1}T00:00:00Z",
        }
        for i, text in enumerate(chunks)
    ]


@pytest.fixture
def store(tmp_path, embedder) -> Store:
    return Store(tmp_path / "lancedb", embedder)


@pytest.fixture
def filled(store) -> Store:
    for (dataset, filename), chunks in CORPUS.items():
        store.replace_document(
            "default",
            dataset=dataset,
            filename=filename,
            rows=rows_for(dataset, filename, chunks, embedder=store.embedder),
        )
    return store


def texts(hits: list[Hit]) -> list[str]:
    return [h.text for h in hits]


@pytest.mark.parametrize("mode", ["hybrid", "vector", "fts"])
def test_each_mode_finds_the_right_chunk(filled, mode):
    hits = filled.search(["default"], "how many vacation days do employees get", mode=mode, limit=3)
    assert hits[0].text == CORPUS[("hr", "leave.md")][0]
    top = hits[0]
    assert (top.dataset, top.filename, top.chunk_index, top.index) == ("hr", "leave.md", 0, "default")
    assert top.metadata == {"heading": "part 0"} and top.page is None
    if mode != "fts":
        assert top.vector_rank == 1 and 0.3 < top.vector_score <= 1.0
    if mode != "vector":
        assert top.fts_rank == 1 and top.fts_score > 0
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_hybrid_fuses_both_legs_by_reciprocal_rank(filled):
    hits = filled.search("default", "vacation days", mode="hybrid", limit=10, fusion="rrf", rrf_k=60)
    for h in hits:
        expected = sum(1 / (60 + r) for r in (h.vector_rank, h.fts_rank) if r is not None)
        assert h.score == pytest.approx(expected)
    # A keyword match that is also the nearest vector ranks first; chunks without the words still come back.
    assert hits[0].vector_rank is not None and hits[0].fts_rank is not None
    assert any(h.fts_rank is None for h in hits)


def test_keyword_only_match_is_found_by_fts(filled):
    # "blue-green" is a rare exact term: BM25 pins it even where meaning is vague.
    hits = filled.search("default", "blue-green", mode="fts", limit=3)
    assert texts(hits) == [CORPUS[("eng", "deploy.md")][1]]


def test_stemming_and_case_folding(filled):
    hits = filled.search("default", "DEPLOYMENT", mode="fts", limit=3)
    assert texts(hits)[:1] == [CORPUS[("eng", "deploy.md")][0]]


@pytest.mark.parametrize("mode", ["vector", "fts", "hybrid"])
def test_dataset_filter_is_a_prefilter_in_every_leg(store, mode):
    # 60 noise chunks match the query far better than the single chunk of the wanted dataset; with a post-filter
    # the top 5 would all be noise and the wanted chunk would be lost.
    noise = [f"Vacation policy note number {i}: vacation days and vacation rules." for i in range(60)]
    store.replace_document(
        "default",
        dataset="noise",
        filename="n.md",
        rows=rows_for("noise", "n.md", noise, embedder=store.embedder),
    )
    target = ["Annual holidays: see the vacation section of the handbook."]
    store.replace_document("default", dataset="hr", filename="t.md", rows=rows_for("hr", "t.md", target))
    hits = store.search("default", "vacation days", mode=mode, datasets=["hr"], limit=5)
    assert texts(hits) == target
    both = store.search("default", "vacation days", mode=mode, datasets=["hr", "noise"], limit=100)
    assert {h.dataset for h in both} == {"hr", "noise"}


@pytest.mark.parametrize(
    "hostile", ["hr' OR '1'='1", "hr) OR (1=1", "hr;DROP", "", "a" * 65, "h r", "hr\n", 5, None]
)
def test_hostile_dataset_names_are_rejected(filled, hostile):
    with pytest.raises(BadRequest) as info:
        filled.search("default", "vacation", datasets=[hostile])
    assert info.value.status == 400 and info.value.field == "datasets"


@pytest.mark.parametrize(
    "query",
    [
        '"unbalanced quote',
        "title:vacation",
        "(vacation OR",
        "AND OR NOT",
        "vacation^3 ~2 *days?",
        '+-&&||!(){}[]^"~*?:\\/',
        "the of and a",
        "",
        "   ",
        "!!!",
        "' OR 1=1 --",
        "ünïcödé vacation",
        "x" * 5000,
    ],
)
def test_fts_accepts_any_user_text(filled, query):
    for mode in ("fts", "hybrid"):
        hits = filled.search("default", query, mode=mode, limit=5)
        assert isinstance(hits, list)
    if "vacation" in query:
        assert any("vacation" in h.text.lower() for h in filled.search("default", query, mode="fts", limit=5))


def test_stop_words_only_query_gives_an_empty_fts_leg(filled):
    assert filled.search("default", "the of and", mode="fts") == []
    hybrid = filled.search("default", "the of and", mode="hybrid", limit=3)
    assert len(hybrid) == 3 and all(h.fts_rank is None for h in hybrid)


def test_rows_added_after_the_index_are_found_and_deleted_rows_are_not(filled):
    extra = ["The cafeteria serves zucchini lasagna on Fridays."]
    filled.add_chunks("default", rows_for("hr", "food.md", extra))
    assert texts(filled.search("default", "zucchini", mode="fts")) == extra
    assert filled.search("default", "zucchini lasagna", mode="vector", limit=1)[0].text == extra[0]
    assert filled.delete_document("default", dataset="hr", filename="food.md") == 1
    assert filled.search("default", "zucchini", mode="fts") == []
    assert extra[0] not in texts(filled.search("default", "zucchini lasagna", mode="vector", limit=20))


def test_replace_swaps_old_chunks_for_new(filled):
    new = ["Employees are entitled to 30 days of paid vacation from 2026 on."]
    added, removed = filled.replace_document(
        "default", dataset="hr", filename="leave.md", rows=rows_for("hr", "leave.md", new)
    )
    assert (added, removed) == (1, 3)
    hits = filled.search("default", "vacation days", mode="hybrid", datasets=["hr"], limit=10)
    assert new[0] in texts(hits)
    assert not set(CORPUS[("hr", "leave.md")]) & set(texts(hits))
    assert filled.search("default", "doctor's note", mode="fts") == []
    docs = {d["filename"]: d for d in filled.list_documents("default")}
    assert docs["leave.md"]["chunks"] == 1


def test_identical_files_under_two_names_are_isolated(store):
    chunks = ["Identical content shared by two files about the parking garage."]
    same_id = digest("identical bytes")
    store.replace_document(
        "default", dataset="hr", filename="a.md", rows=rows_for("hr", "a.md", chunks, same_id)
    )
    store.replace_document(
        "default", dataset="hr", filename="b.md", rows=rows_for("hr", "b.md", chunks, same_id)
    )
    hits = store.search("default", "parking garage", mode="hybrid", limit=10)
    assert sorted(h.filename for h in hits) == ["a.md", "b.md"]
    assert len({h.id for h in hits}) == 2
    assert store.delete_document("default", dataset="hr", filename="a.md") == 1
    hits = store.search("default", "parking garage", mode="fts", limit=10)
    assert [h.filename for h in hits] == ["b.md"]
    assert store.has_document("default", dataset="hr", filename="b.md", document_id=same_id)
    assert not store.has_document("default", dataset="hr", filename="a.md", document_id=same_id)


def test_file_names_with_quotes_are_stored_and_deleted_safely(store):
    name = 'o\'brien "final" (v2); DROP TABLE x.md'
    store.replace_document(
        "default", dataset="hr", filename=name, rows=rows_for("hr", name, ["Quoted name chunk."])
    )
    assert [d["filename"] for d in store.list_documents("default")] == [name]
    assert store.delete_document("default", dataset="hr", filename=name) == 1
    assert store.count("default") == 0


def test_has_document_detects_identical_bytes(filled):
    doc_id = digest("\n".join(CORPUS[("legal", "contract.md")]))
    assert filled.has_document("default", dataset="legal", filename="contract.md", document_id=doc_id)
    assert not filled.has_document(
        "default", dataset="legal", filename="contract.md", document_id=digest("x")
    )
    assert not filled.has_document("default", dataset="hr", filename="contract.md", document_id=doc_id)
    assert not filled.has_document("other", dataset="legal", filename="contract.md", document_id=doc_id)


def test_failed_replace_keeps_the_old_rows(filled, monkeypatch):
    before = filled.search("default", "terminate agreement notice", mode="fts", limit=5)
    assert before
    new = rows_for("legal", "contract.md", ["A brand new contract text about penguins."] * 3)

    # 1. The embedder fails half way (model crash, out of memory).
    broken = copy.copy(filled.embedder)

    def explode(texts):
        raise RuntimeError("embedding failed")

    broken.embed_documents = explode
    failing = Store(filled.root, broken)
    with pytest.raises(RuntimeError):
        failing.replace_document("default", dataset="legal", filename="contract.md", rows=new)

    # 2. One row is malformed (wrong vector size).
    bad = [dict(r) for r in new]
    for i, r in enumerate(bad):
        r["chunk_index"] = i
    bad[2]["vector"] = [0.1] * 7
    with pytest.raises(BadRequest):
        filled.replace_document("default", dataset="legal", filename="contract.md", rows=bad)

    # 3. The commit itself fails (disk full, I/O error).
    from lancedb.table import LanceMergeInsertBuilder

    def disk_full(self, *a, **kw):
        raise OSError("No space left on device")

    with monkeypatch.context() as m:
        m.setattr(LanceMergeInsertBuilder, "execute", disk_full)
        with pytest.raises(OSError):
            filled.replace_document(
                "default",
                dataset="legal",
                filename="contract.md",
                rows=rows_for("legal", "contract.md", ["x"]),
            )

    after = filled.search("default", "terminate agreement notice", mode="fts", limit=5)
    assert texts(after) == texts(before)
    assert filled.search("default", "penguins", mode="fts") == []
    assert {d["filename"]: d["chunks"] for d in filled.list_documents("default")}["contract.md"] == 2


def test_marker_mismatch_is_a_409_on_search_and_write(filled):
    other = copy.copy(filled.embedder)
    other.model_id = "BAAI/bge-small-en-v1.5"
    mismatched = Store(filled.root, other)
    with pytest.raises(EmbedderMismatch) as info:
        mismatched.search("default", "vacation")
    err = info.value
    assert err.status == 409 and err.code == "embedder_mismatch"
    assert "sentence-transformers/all-MiniLM-L6-v2" in err.message and "BAAI/bge-small-en-v1.5" in err.message
    assert "rebuild" in err.message.lower() and "EMBEDDING_MODEL=" in err.message
    with pytest.raises(EmbedderMismatch):
        mismatched.add_chunks("default", rows_for("hr", "x.md", ["some text"]))
    with pytest.raises(EmbedderMismatch):
        mismatched.delete_document("default", dataset="hr", filename="leave.md")
    with pytest.raises(EmbedderMismatch):
        mismatched.check_compatible("default")
    # Nothing was written by the refused calls, and the right embedder still works.
    assert filled.count("default") == sum(len(c) for c in CORPUS.values())
    filled.check_compatible("default")

    wider = copy.copy(filled.embedder)
    wider.dim = 768
    with pytest.raises(EmbedderMismatch, match="768"):
        Store(filled.root, wider).search("default", "vacation", mode="fts")


def test_marker_is_recorded_on_the_table_and_survives_writes(filled):
    marker = filled.marker("default")
    assert marker["embedding_model"] == "sentence-transformers/all-MiniLM-L6-v2" and marker["dim"] == 384
    filled.delete_document("default", dataset="eng", filename="deploy.md")
    filled.optimize("default")
    assert filled.marker("default")["embedding_model"] == "sentence-transformers/all-MiniLM-L6-v2"


def test_unknown_index_is_a_404(filled):
    for call in (
        lambda: filled.search(["default", "nope"], "vacation"),
        lambda: filled.list_documents("nope"),
        lambda: filled.neighbours("nope", digest("x"), "hr", "a.md", [0]),
    ):
        with pytest.raises(NotFound, match="index 'nope' does not exist") as info:
            call()
        assert info.value.status == 404
    with pytest.raises(BadRequest):
        filled.search("../etc", "vacation")


def test_bad_mode_and_vector_are_400s(filled):
    with pytest.raises(BadRequest):
        filled.search("default", "vacation", mode="semantic")
    with pytest.raises(BadRequest):
        filled.search("default", "vacation", mode="vector", vector=np.zeros(3, dtype=np.float32))


def test_a_precomputed_vector_is_used(filled):
    vec = filled.embedder.embed_documents(["blue-green rollback switch"])[0]
    hits = filled.search("default", "", mode="vector", vector=vec, limit=1)
    assert hits[0].text == CORPUS[("eng", "deploy.md")][1]


def test_search_across_several_indexes(filled):
    extra = ["Zebra crossings near the campus are repainted every spring."]
    filled.add_chunks("second", rows_for("hr", "roads.md", extra))
    hits = filled.search(["default", "second"], "zebra crossing repainted", mode="hybrid", limit=5)
    assert hits[0].text == extra[0] and hits[0].index == "second"
    assert {h.index for h in hits} == {"default", "second"}
    vacation = filled.search(["default", "second"], "paid vacation days", mode="fts", limit=1)
    assert vacation[0].index == "default"


@pytest.mark.parametrize("mode", ["hybrid", "vector", "fts"])
def test_rows_at_the_same_place_in_two_indexes_are_two_hits(store, mode):
    """The legs and the fusion know a row by its row id, its place in its table; two new tables have rows at the
    same places. Each chunk comes back once, with its own text, from its own index."""
    texts = {
        "north": ["The north depot opens at six.", "Forklifts at the north depot need a licence."],
        "south": ["The south depot opens at seven.", "Forklifts at the south depot are leased."],
    }
    for index, chunks in texts.items():
        store.add_chunks(index, rows_for("ops", "depot.md", chunks, embedder=store.embedder))
    hits = store.search(["north", "south"], "depot opens forklifts", mode=mode, limit=10)
    assert sorted((h.index, h.text) for h in hits) == sorted((i, t) for i, ts in texts.items() for t in ts)
    assert len({(h.index, h.id) for h in hits}) == 4


@pytest.mark.filterwarnings("ignore:optimize\\(cleanup_older_than=0\\):UserWarning")
@pytest.mark.parametrize("cleanup", [False, True], ids=["old-version-kept", "old-version-cleaned-up"])
def test_hybrid_hits_carry_their_own_rows_when_a_compaction_lands_mid_search(filled, monkeypatch, cleanup):
    """Hybrid legs return row ids and scores, and the fused top's columns are read by row id afterwards. A write
    landing in between compacts the table (every write does) and moves every row: the search must still return
    each chunk's own text and place, never another row's, and never fail. The read runs on the version the legs
    searched, whose files stay an hour; when they are gone already (another process cleaned up at once), the
    search runs again, on whole rows of the newest version."""
    legs = filled.legs
    slim_calls = []

    def legs_then_another_write(*args, **kwargs):
        out = legs(*args, **kwargs)
        slim_calls.append(kwargs.get("slim", False))
        if kwargs.get("slim"):
            extra = ["Pods are restarted by the scheduler when their health check fails."]
            filled.add_chunks("default", rows_for("eng", "pods.md", extra, embedder=filled.embedder))
            if cleanup:
                filled.table("default").optimize(cleanup_older_than=timedelta(0), delete_unverified=True)
        return out

    monkeypatch.setattr(filled, "legs", legs_then_another_write)
    hits = filled.search("default", "how many vacation days do employees get", mode="hybrid", limit=5)
    assert hits[0].text == CORPUS[("hr", "leave.md")][0]
    for h in hits:
        assert h.text == CORPUS[(h.dataset, h.filename)][h.chunk_index]
        assert h.metadata == {"heading": f"part {h.chunk_index}"} and h.vector is not None
    assert slim_calls == ([True, False] if cleanup else [True])


def test_hybrid_hits_are_the_same_as_whole_row_legs_give(filled):
    """Late materialisation changes what is read, not what is found: every field of every hit, as fusing legs
    that read whole rows gives it."""
    from rag_worker.store import fuse

    for query in ("how many vacation days do employees get", "contract liability", "blue-green rollback"):
        got = filled.search("default", query, mode="hybrid", limit=4, fusion="zscore")
        qvec = filled.embedder.embed_query(query)
        snapshots = filled.snapshots(filled.open_tables(["default"]))
        vec_rows, fts_rows = filled.legs(snapshots, qvec, query, None, 100)
        want = fuse(vec_rows, fts_rows, qvec, limit=4, fusion="zscore", rrf_k=10, alpha=0.5)
        assert [h.to_dict() for h in got] == [h.to_dict() for h in want]
        for g, w in zip(got, want, strict=True):
            assert np.array_equal(g.vector, w.vector)


@pytest.mark.parametrize("mode", ["fts", "vector", "hybrid"])
def test_tied_chunks_rank_by_row_and_the_same_ones_make_the_cut(store, mode):
    """Files holding the same passage tie exactly in both legs. Lance returns tied rows in no fixed order, so ties
    are ranked by their place in the table (row id), over LEG_TIE_SLACK rows past the cut: the same query always
    gives the same chunks in the same order, and the cut keeps the first rows of a tie that many rows deep."""
    from rag_worker.store import LEG_TIE_SLACK

    limit = 3
    text = "The quarterly audit of the expense ledger is due in the second week of April."
    for i in range(limit + LEG_TIE_SLACK):
        store.add_chunks("default", rows_for("fin", f"copy{i:02d}.md", [text], embedder=store.embedder))
    store.add_chunks(
        "default", rows_for("fin", "other.md", ["Lunch is served at noon."], embedder=store.embedder)
    )
    query = "quarterly audit ledger"
    runs = [
        [h.id for h in store.search("default", query, mode=mode, limit=limit, fusion="rrf", rrf_k=60)]
        for _ in range(5)
    ]
    assert all(r == runs[0] for r in runs)
    rows = store.table("default").search().select(["id", "text"]).with_row_id(True).to_arrow().to_pylist()
    tied = [r["id"] for r in sorted(rows, key=lambda r: r["_rowid"]) if r["text"] == text]
    assert len(tied) == limit + LEG_TIE_SLACK and runs[0] == tied[:limit]


def test_neighbours_returns_requested_chunks_in_order(filled):
    chunks = CORPUS[("hr", "leave.md")]
    doc_id = digest("\n".join(chunks))
    hits = filled.neighbours("default", doc_id, "hr", "leave.md", [2, 0, 7])
    assert [(h.chunk_index, h.text) for h in hits] == [(0, chunks[0]), (2, chunks[2])]
    assert hits[1].page == 2 and hits[0].metadata == {"heading": "part 0"}
    assert filled.neighbours("default", doc_id, "hr", "office.md", [0]) == []
    assert filled.neighbours("default", doc_id, "hr", "leave.md", []) == []


def test_neighbours_of_several_documents_in_one_call(filled):
    leave, office = CORPUS[("hr", "leave.md")], CORPUS[("hr", "office.md")]
    leave_id, office_id = digest("\n".join(leave)), digest("\n".join(office))
    got = filled.neighbours_of(
        "default",
        {
            (leave_id, "hr", "leave.md"): [2, 0, 7],
            (office_id, "hr", "office.md"): [1],
            (office_id, "hr", "leave.md"): [1],  # another document's id: nothing
            (leave_id, "eng", "deploy.md"): [],
        },
    )
    assert [(h.chunk_index, h.text) for h in got[(leave_id, "hr", "leave.md")]] == [
        (0, leave[0]),
        (2, leave[2]),
    ]
    assert [h.text for h in got[(office_id, "hr", "office.md")]] == [office[1]]
    assert got[(office_id, "hr", "leave.md")] == []
    assert (leave_id, "eng", "deploy.md") not in got
    with pytest.raises(BadRequest):
        filled.neighbours_of("default", {(leave_id, "hr' OR 1=1 --", "leave.md"): [0]})


def test_a_table_recreated_under_the_same_name_is_checked_again(filled):
    filled.check_compatible("default")  # the marker is now known for this table
    other = copy.copy(filled.embedder)
    other.model_id, other.dim = "example/other", 8
    filled.drop("default")
    stranger = Store(filled.root, other)
    stranger.add_chunks("default", [{**rows_for("hr", "x.md", ["x"])[0], "vector": [0.1] * 8}])
    with pytest.raises(EmbedderMismatch):
        filled.check_compatible("default")


def test_listing_documents_datasets_and_counts(filled):
    docs = filled.list_documents("default")
    assert [(d["dataset"], d["filename"], d["chunks"]) for d in docs] == [
        ("eng", "deploy.md", 2),
        ("hr", "leave.md", 3),
        ("hr", "office.md", 2),
        ("legal", "contract.md", 2),
    ]
    assert docs[0]["bytes"] == 1234 and docs[0]["indexed_at"] == "2025-01-02T00:00:00Z"
    assert docs[0]["document_id"] == digest("\n".join(CORPUS[("eng", "deploy.md")]))
    assert filled.list_datasets("default") == ["eng", "hr", "legal"]
    assert filled.count("default") == 9
    assert filled.indexes() == ["default"] and filled.exists("default") and not filled.exists("other")


def test_drop_removes_the_index(filled):
    assert filled.drop("default") is True
    assert not filled.exists("default") and filled.indexes() == []
    with pytest.raises(NotFound):
        filled.search("default", "vacation")
    assert filled.drop("default") is False


def test_writes_by_another_process_are_seen(filled, embedder):
    other = Store(filled.root, embedder)  # a second handle, as the indexing CLI or another worker holds
    filled.search("default", "vacation")  # warm the first store's table cache
    other.add_chunks("default", rows_for("eng", "oncall.md", ["The on-call rotation changes every Monday."]))
    assert texts(filled.search("default", "rotation", mode="fts")) == [
        "The on-call rotation changes every Monday."
    ]
    other.drop("default")
    assert not filled.exists("default")
    with pytest.raises(NotFound):
        filled.search("default", "rotation")


@pytest.mark.parametrize("mode", ["fts", "vector", "hybrid"])
def test_every_search_reads_the_newest_version_another_handle_wrote(filled, embedder, mode):
    """Searches read a kept pylance dataset of the table, moved on to the newest version at each search: a write
    by another handle (another worker process, the indexing CLI) shows at the next search in every mode, and an
    index dropped and made again under the same name shows its new rows only."""
    other = Store(filled.root, embedder)
    filled.search("default", "vacation", mode=mode)  # the first store now keeps a dataset of this version
    rotation = "The on-call rotation changes every Monday."
    other.add_chunks("default", rows_for("eng", "oncall.md", [rotation]))
    assert filled.search("default", "on-call rotation Monday", mode=mode, limit=1)[0].text == rotation
    other.drop("default")
    pager = "The pager rotation for weekends is posted on Friday."
    other.add_chunks("default", rows_for("ops", "pager.md", [pager]))
    assert texts(filled.search("default", "on-call rotation Monday", mode=mode, limit=5)) == [pager]


def test_add_is_idempotent_by_id(filled):
    rows = rows_for("hr", "dup.md", ["Duplicate adds must not duplicate chunks."])
    filled.add_chunks("default", rows)
    filled.add_chunks("default", rows)
    assert len(filled.search("default", "duplicate adds", mode="fts", limit=10)) == 1


def test_bad_rows_are_400s(store):
    good = rows_for("hr", "a.md", ["text"])[0]
    for broken in (
        {**good, "dataset": "bad name"},
        {**good, "filename": "../a.md"},
        {**good, "document_id": "x' OR '1'='1"},
        {**good, "chunk_index": "3"},
        {**good, "text": None},
    ):
        with pytest.raises(ApiError) as info:
            store.add_chunks("default", [broken])
        assert info.value.status == 400
    with pytest.raises(BadRequest):
        store.replace_document("default", dataset="hr", filename="b.md", rows=[good])


def test_a_table_another_process_is_still_creating_is_absent_until_a_write_creates_it(store, embedder):
    # LanceDB makes a table's folder before it commits the first version; another worker process creating the
    # index leaves this on disk for that moment. Opening it then fails inside LanceDB ("was not found").
    (store.root / "fresh.lance" / "_versions").mkdir(parents=True)
    assert not store.exists("fresh")
    assert "fresh" not in store.indexes()
    with pytest.raises(NotFound):
        store.check_compatible("fresh")

    store.add_chunks("fresh", rows_for("hr", "leave.md", CORPUS[("hr", "leave.md")], embedder=embedder))
    assert store.exists("fresh") and "fresh" in store.indexes()
    assert [d["filename"] for d in store.list_documents("fresh")] == ["leave.md"]


# -- the packed hit column -----------------------------------------------------------------------------------------

QUERIES = ("how many vacation days do employees get", "contract liability", "blue-green rollback")
STORED = ("id", "document_id", "filename", "dataset", "page", "chunk_index", "text", "metadata", "index")


def stored(hit: Hit) -> dict:
    return {k: getattr(hit, k) for k in STORED}


def column_hits(store: Store, index: str) -> dict[str, dict]:
    """Every chunk as its own columns give it (all that a table made before the packed column holds)."""
    from rag_worker.store import HIT_COLUMNS, scan, to_hit

    table = store.table(index)
    return {row["id"]: stored(to_hit(index, row)) for row in scan(table, None, HIT_COLUMNS)}


@pytest.mark.parametrize("mode", ["hybrid", "vector", "fts"])
def test_hits_read_from_the_packed_column_carry_what_the_columns_hold(store, embedder, mode):
    from rag_worker.store import PACKED

    meta = {"heading": "Bürozeiten — “Öffnung”", "path": ["A", "B"], "n": 3, "none": None}
    rows = rows_for("hr", "büro plan.md", CORPUS[("hr", "office.md")], embedder=embedder)
    rows[1]["metadata"], rows[1]["page"] = meta, 7
    store.replace_document("default", dataset="hr", filename="büro plan.md", rows=rows)
    for (dataset, filename), chunks in CORPUS.items():
        store.add_chunks("default", rows_for(dataset, filename, chunks, embedder=embedder))
    assert PACKED in store.table("default").schema.names
    want = column_hits(store, "default")
    for query in (*QUERIES, "visitors reception desk"):
        hits = store.search("default", query, mode=mode, limit=5)
        assert hits and [stored(h) for h in hits] == [want[h.id] for h in hits]
    # office.md holds the same passage: the two tie, in an order that depends on the rows' places in the table.
    top = store.search("default", "visitors must sign in at the reception desk", mode=mode, limit=2)
    assert {h.filename for h in top} == {"büro plan.md", "office.md"}
    mine = next(h for h in top if h.filename == "büro plan.md")
    assert (mine.dataset, mine.chunk_index, mine.page, mine.metadata) == ("hr", 1, 7, meta)


def test_a_table_made_before_the_packed_column_is_searched_written_and_rebuilt(tmp_path, embedder):
    """An index written by an older worker has no packed column: it is read column by column, writes leave it
    without one, and a rebuild's new table gets it."""
    from rag_worker.store import PACKED

    root = tmp_path / "lancedb"
    old = Store(root, embedder)
    for (dataset, filename), chunks in CORPUS.items():
        old.add_chunks("default", rows_for(dataset, filename, chunks, embedder=embedder))
    modes = ("hybrid", "vector", "fts")
    expected = {m: [h.to_dict() for h in old.search("default", QUERIES[0], mode=m, limit=4)] for m in modes}
    old.table("default").drop_columns([PACKED])

    store = Store(root, embedder)  # a new worker opening the old table
    assert PACKED not in store.table("default").schema.names
    for mode, want in expected.items():
        assert [h.to_dict() for h in store.search("default", QUERIES[0], mode=mode, limit=4)] == want

    parking = ["Parking spaces are assigned by the facilities team each quarter."]
    store.replace_document(
        "default",
        dataset="hr",
        filename="parking.md",
        rows=rows_for("hr", "parking.md", parking, embedder=embedder),
    )
    store.add_chunks(
        "default", rows_for("hr", "bikes.md", ["Bicycles go in the basement rack."], embedder=embedder)
    )
    assert PACKED not in store.table("default").schema.names
    top = store.search("default", "who assigns parking spaces", limit=1)[0]
    assert (top.filename, top.dataset, top.text) == ("parking.md", "hr", parking[0])

    staged = "default.0123456789ab"
    keys = [(d["dataset"], d["filename"]) for d in store.list_documents("default")]
    store.write_rows(staged, store.scan_documents("default", keys), keys)
    assert PACKED in store.table(staged).schema.names
    want = {k: {**v, "index": staged} for k, v in column_hits(store, "default").items()}
    assert column_hits(store, staged) == want
    for mode in modes:
        hits = store.search(staged, QUERIES[0], mode=mode, limit=4)
        assert hits and [stored(h) for h in hits] == [want[h.id] for h in hits]


def packed_ids(store: Store, index: str) -> dict[str, str | None]:
    """id column -> the id the packed column holds (None where it holds none), for every row."""
    import json

    from rag_worker.store import PACKED, scan

    rows = scan(store.table(index), None, ["id", PACKED])
    return {row["id"]: json.loads(row[PACKED]).get("id") for row in rows}


def test_a_table_whose_packed_column_lacks_the_id_is_searched_written_and_rebuilt(
    tmp_path, embedder, monkeypatch
):
    """An index written by a worker from before the id joined the packed column: its marker says nothing of it, so
    searches read the id column; writes leave the marker so, and a rebuild's new table packs every row's id, the
    carried rows' included."""
    import json

    from rag_worker.store import PACKED_ID
    from rag_worker.store import rows as store_rows
    from rag_worker.store.catalog import Catalog

    root = tmp_path / "lancedb"
    pack, marker = store_rows.pack, Catalog.own_marker.fget
    with monkeypatch.context() as m:  # the older worker
        m.setattr(
            store_rows, "pack", lambda id, *rest: pack(id, *rest).replace(f'"id": {json.dumps(id)}, ', "")
        )
        m.setattr(
            Catalog,
            "own_marker",
            property(lambda self: {k: v for k, v in marker(self).items() if k != PACKED_ID}),
        )
        older = Store(root, embedder)
        for (dataset, filename), chunks in CORPUS.items():
            older.add_chunks("default", rows_for(dataset, filename, chunks, embedder=embedder))
    assert set(packed_ids(older, "default").values()) == {None}

    store = Store(root, embedder)  # a new worker opening the old table
    assert PACKED_ID not in store.marker("default")
    want = column_hits(store, "default")
    for mode in ("hybrid", "vector", "fts"):
        for query in QUERIES:
            hits = store.search("default", query, mode=mode, limit=4)
            assert hits and [stored(h) for h in hits] == [want[h.id] for h in hits]

    parking = ["Parking spaces are assigned by the facilities team each quarter."]
    store.add_chunks("default", rows_for("hr", "parking.md", parking, embedder=embedder))
    assert PACKED_ID not in store.marker("default")
    top = store.search("default", "who assigns parking spaces", limit=1)[0]
    assert (top.filename, top.text) == ("parking.md", parking[0])
    assert stored(top) == column_hits(store, "default")[top.id]

    staged = "default.0123456789ab"
    keys = [(d["dataset"], d["filename"]) for d in store.list_documents("default")]
    store.write_rows(staged, store.scan_documents("default", keys), keys)
    assert store.marker(staged)[PACKED_ID] is True
    carried = packed_ids(store, staged)
    assert carried == {chunk: chunk for chunk in packed_ids(store, "default")}
    want = {k: {**v, "index": staged} for k, v in column_hits(store, "default").items()}
    for mode in ("hybrid", "vector", "fts"):
        hits = store.search(staged, QUERIES[0], mode=mode, limit=4)
        assert hits and [stored(h) for h in hits] == [want[h.id] for h in hits]


def test_a_filter_refuses_an_unchecked_value_also_under_python_O():
    """A name that skipped check_name never goes into a filter: it is refused with an error saying so, also when
    the worker runs under `python -O`, which strips asserts (the quoted value would end the filter's string)."""
    import subprocess
    import sys

    code = "from rag_worker.store.filters import in_clause; print(in_clause('dataset', ['hr', \"x') OR 1=1 --\"]))"
    run = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "OR 1=1" not in run.stdout
    assert "only checked names go into a filter" in run.stderr


def test_a_fragment_commit_rides_out_lost_races_as_every_other_commit(filled, monkeypatch):
    """The Ray engine's fragment appends lose commit races to other writers as any commit does; they are retried
    under the store's one policy (as many attempts, the same growing pauses) rather than given up on sooner."""
    import lance
    from lance.commit import CommitConflictError
    from lance.fragment import LanceFragment

    from rag_worker.store import writes

    text = "Pods are restarted by the scheduler when their health check fails."
    rows = rows_for("eng", "pods.md", [text], embedder=filled.embedder)
    fragment = LanceFragment.create(filled.table_uri("default"), filled.prepare_rows("default", rows))
    commit = lance.LanceDataset.commit
    lost = []

    def loses_to_other_writers(*args, **kwargs):
        if len(lost) < writes.COMMIT_ATTEMPTS - 1:
            lost.append(args)
            raise CommitConflictError(
                "Retryable commit conflict for version 7: preempted by a concurrent Append"
            )
        return commit(*args, **kwargs)

    monkeypatch.setattr(lance.LanceDataset, "commit", staticmethod(loses_to_other_writers))
    monkeypatch.setattr(writes, "COMMIT_BACKOFF_S", 0.001)  # the same doubling pauses, shorter
    filled.commit_fragments("default", [fragment])
    assert len(lost) == writes.COMMIT_ATTEMPTS - 1
    assert texts(filled.search("default", "scheduler restarts pods health check", mode="fts", limit=1)) == [
        text
    ]
