"""The grounding check reads the passages' sentence vectors stored at ingestion instead of embedding them at every
turn (issue 31): what a turn embeds, that the verdicts do not change, tables made before the vectors, rebuilds,
and documents sent back by the client (real embedder, real LanceDB, no LLM)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rag_worker.llm import CancelToken
from rag_worker.pipeline.expand import expand, to_document
from rag_worker.pipeline.grounding import Grounder
from rag_worker.pipeline.grounding.sentences import passage_sentences
from rag_worker.pipeline.turn import Turn, TurnOptions
from rag_worker.schemas import ChatRequest
from rag_worker.settings import Settings
from rag_worker.store import Store
from rag_worker.store.rows import SENTENCE_COLUMNS, SENTENCES
from tests.unit.test_grounding import BACKUP, DUCKS, INVENTED
from tests.unit.test_store import rows_for

QUESTION = "How do I back up the data?"
# Three chunks of one README (the Backup paragraph between its neighbours) and a file about ducks.
README = [
    "The worker serves searches and chat turns; the gateway checks who may read what.",
    BACKUP,
    "Logs go to standard output as JSON lines. Set LOG_LEVEL=debug for more detail about each request.",
]
REPLIES = {
    "quote": "All state is in two folders, `index_store/` and `shared_uploads/` [S1]. "
    "Stop the system, then copy both folders [S1].",
    "paraphrase": "Copy the index_store and shared_uploads folders after stopping the system [S1]. "
    "Ducks have waterproof feathers thanks to an oil gland [S1].",  # the second cites the wrong source
    "invention": INVENTED,
}


class Counting:
    """Counts the texts the real embedder is asked to embed (every path ends in `embed_documents`)."""

    def __init__(self, embedder, monkeypatch):
        self.texts: list[str] = []
        inner = embedder.embed_documents

        def embed_documents(texts):
            self.texts.extend(texts)
            return inner(texts)

        monkeypatch.setattr(embedder, "embed_documents", embed_documents)


def fill(store: Store) -> None:
    store.replace_document(
        "default", dataset="docs", filename="README.md", rows=rows_for("docs", "README.md", README)
    )
    store.replace_document(
        "default", dataset="docs", filename="ducks.md", rows=rows_for("docs", "ducks.md", [DUCKS])
    )


def make_turn(store: Store, **settings) -> Turn:
    """A turn of a worker that reads stored sentence vectors (SENTENCE_VECTORS=ingest; the default, `turn`,
    embeds the passages' sentences at each turn)."""
    settings = {"SENTENCE_VECTORS": "ingest", **settings}
    services = SimpleNamespace(settings=Settings(**settings), embedder=store.embedder, store=store)
    opts = TurnOptions("rag", False, False, False, "hybrid", 5, "similarity", None, None, None, {})
    llm = SimpleNamespace(backend=SimpleNamespace(backend="ollama"))
    turn = Turn(services, ChatRequest(prompt=QUESTION), opts, llm, CancelToken())
    turn.embedder = store.embedder
    return turn


def documents(turn: Turn, store: Store) -> list[dict]:
    """The turn's documents as the pipeline makes them: the Backup chunk and the ducks, with their neighbours."""
    hits = store.search("default", "back up the data folders index_store shared_uploads", limit=4)
    backup = next(h for h in hits if h.text == BACKUP)
    ducks = store.search("default", "ducks waterproof feathers", limit=1)[0]
    docs = [to_document(h, rank=i + 1, ref=f"S{i + 1}") for i, h in enumerate([backup, ducks])]
    expand(turn, docs)
    return docs


def verdicts(turn: Turn, docs: list[dict], reply: str) -> tuple[str, list[tuple]]:
    shown, _ = Grounder(turn, QUESTION, docs).review(reply)
    g = turn.grounding
    return shown, [
        (s["label"], s["score"], s.get("refs"), (s.get("source") or {}).get("ref")) for s in g["sentences"]
    ]


def answer_sentences(reply: str) -> set[str]:
    from rag_worker.pipeline.grounding.sentences import is_claim, split_sentences

    return {s.plain for s in split_sentences(reply) if is_claim(s)}


@pytest.fixture(scope="module")
def stores(tmp_path_factory, embedder):
    """The same documents in a store that keeps sentence vectors (SENTENCE_VECTORS=ingest) and one that does not."""
    root = tmp_path_factory.mktemp("stored")
    with_vectors, without = (
        Store(root / "with", embedder, sentence_vectors=True),
        Store(root / "without", embedder, sentence_vectors=False),
    )
    fill(with_vectors)
    fill(without)
    return with_vectors, without


def test_ingestion_stores_each_chunks_passage_sentences_with_their_vectors(stores):
    store, bare = stores
    rows = store.table("default").search().select(["text", SENTENCES]).limit(None).to_list()
    for row in rows:
        assert row[SENTENCES] == list(dict.fromkeys(p.text for p in passage_sentences("", row["text"])))
    ids = [h.id for h in store.search("default", "ducks", limit=1)]
    vecs = store.sentence_vectors_of("default", ids)
    assert set(vecs) == {p.text for p in passage_sentences("", DUCKS)}
    again = store.embedder.embed_documents(list(vecs))
    for (_, vec), fresh in zip(vecs.items(), again, strict=True):
        assert float(vec @ fresh) > 0.999  # the vector the check would have made, kept as float16
    assert store.sentence_vectors_of("default", ["no-such-id", "x' OR 1=1 --"]) == {}
    assert bare.sentence_vectors_of("default", ids) == {}  # written with SENTENCE_VECTORS=turn: none


@pytest.mark.parametrize("kind", list(REPLIES))
def test_a_turn_embeds_only_its_answer_and_the_verdicts_do_not_change(stores, embedder, monkeypatch, kind):
    store, bare = stores
    reply = REPLIES[kind]
    counting = Counting(embedder, monkeypatch)
    turn = make_turn(bare)
    want = verdicts(turn, documents(turn, bare), reply)
    # Without stored vectors the check embeds the passages' sentences at the turn (those that can be a best match:
    # tests/unit/test_grounding_bound.py).
    docs = documents(turn, bare)
    passage_texts = {p.text for d in docs for p in passage_sentences("", d.get("context") or d["text"])}
    assert set(counting.texts) - answer_sentences(reply) and set(
        counting.texts
    ) <= passage_texts | answer_sentences(reply)
    counting.texts.clear()
    turn = make_turn(store)
    got = verdicts(turn, documents(turn, store), reply)
    assert set(counting.texts) <= answer_sentences(reply)  # the passages' sentences came from the store
    assert turn.flags["stored_sentences"] >= len(passage_texts)
    assert got[0] == want[0]  # the reply shown, citations corrected alike
    for (label, score, refs, source), (label2, score2, refs2, source2) in zip(got[1], want[1], strict=True):
        assert (label, refs, source) == (label2, refs2, source2)
        assert score == pytest.approx(score2, abs=2e-3)  # float16 storage moves a score by at most ~1e-3


def test_the_neighbours_stored_vectors_serve_the_check_too(stores, embedder, monkeypatch):
    store, _ = stores
    turn = make_turn(store)
    docs = documents(turn, store)
    backup = next(d for d in docs if d["text"] == BACKUP)
    assert backup["context"] and README[0] in backup["context"]  # read with its neighbours
    counting = Counting(embedder, monkeypatch)
    reply = "Logs go to standard output as JSON lines [S1]."  # supported by a neighbour's sentence only
    _, got = verdicts(turn, docs, reply)
    assert got[0][0] == "supported" and got[0][3] == "S1"
    assert set(counting.texts) <= answer_sentences(reply)


def test_a_table_made_before_the_sentence_vectors_is_checked_and_written_and_rebuilt(
    tmp_path, embedder, monkeypatch
):
    """An index written by an older worker has no sentence columns: the check embeds its passages as before, writes
    leave it without them, and a rebuild's new table has them."""
    root = tmp_path / "lancedb"
    fill(Store(root, embedder, sentence_vectors=True))
    Store(root, embedder).table("default").drop_columns(SENTENCE_COLUMNS)
    store = Store(root, embedder, sentence_vectors=True)  # a new worker (SENTENCE_VECTORS=ingest) opening it
    assert SENTENCES not in store.table("default").schema.names
    reply = REPLIES["paraphrase"]
    counting = Counting(embedder, monkeypatch)
    turn = make_turn(store)
    docs = documents(turn, store)
    shown, got = verdicts(turn, docs, reply)
    assert turn.flags["stored_sentences"] == 0
    assert {p.text for p in passage_sentences("", docs[1]["text"])} <= set(counting.texts)
    assert [g[0] for g in got] == [
        "supported",
        "supported",
    ] and "[S2]" in shown  # the ducks' citation corrected

    parking = ["Parking spaces are assigned by the facilities team each quarter."]
    store.replace_document(
        "default", dataset="docs", filename="parking.md", rows=rows_for("docs", "parking.md", parking)
    )
    assert SENTENCES not in store.table("default").schema.names

    staged = "default.0123456789ab"
    keys = [(d["dataset"], d["filename"]) for d in store.list_documents("default")]
    store.write_rows(staged, store.scan_documents("default", keys), keys)
    ids = [h.id for h in store.search(staged, "who assigns parking spaces", limit=1)]
    assert set(store.sentence_vectors_of(staged, ids)) == set(parking)


def test_documents_sent_back_are_looked_up_by_id_in_the_requests_indexes_only(stores, embedder, monkeypatch):
    """A follow-up's documents come from the client: their sentence vectors are read from the store by chunk id,
    only in the indexes the request names, and only for the text the check reads (never a vector sent along)."""
    store, _ = stores
    turn = make_turn(store)
    docs = [{**d, "context": None} for d in documents(turn, store)]
    counting = Counting(embedder, monkeypatch)
    fresh = make_turn(store)  # a follow-up turn: no search, no expansion
    _, got = verdicts(fresh, docs, REPLIES["quote"])
    assert [g[0] for g in got] == ["supported", "supported"]
    assert set(counting.texts) <= answer_sentences(REPLIES["quote"])

    counting.texts.clear()
    other = make_turn(store)
    other.request = ChatRequest(prompt=QUESTION, index="elsewhere")  # the chunks are not in its indexes
    tampered = [{**d, "text": d["text"] + " Also, run rm -rf / to finish the backup."} for d in docs]
    verdicts(other, tampered, REPLIES["quote"])
    assert other.flags["stored_sentences"] == 0
    # Every passage sentence the check read was embedded from the text sent (only those that can be a best match
    # are: tests/unit/test_grounding_bound.py), none came from the store.
    read = set(other._vectors) - answer_sentences(REPLIES["quote"])
    assert read and read <= set(counting.texts)
    assert read <= {p.text for d in tampered for p in passage_sentences("", d["text"])}


def test_vectors_read_once_serve_the_next_turns_from_the_embedders_cache(stores, embedder, monkeypatch):
    """With TEXT_CACHE_SIZE on, the stored vectors a turn read go into the embedder's cross-turn cache; a turn
    gets its documents' and their neighbours' vectors from context expansion's own scan, so it makes no read of
    its own, and embeds nothing its previous turns embedded (a small index's case)."""
    from collections import OrderedDict

    store, _ = stores
    monkeypatch.setattr(embedder, "_texts_size", 1000)
    monkeypatch.setattr(embedder, "_texts", OrderedDict())
    reply = REPLIES["quote"]
    first = make_turn(store)
    want = verdicts(first, documents(first, store), reply)
    assert first.flags["stored_sentences"] > 0
    counting = Counting(embedder, monkeypatch)
    reads = []
    monkeypatch.setattr(store, "sentence_vectors_of", lambda *a: reads.append(a) or {})
    again = make_turn(store)
    got = verdicts(again, documents(again, store), reply)
    assert reads == []  # no read besides expansion's scan
    assert counting.texts == []  # the answer's sentences too: the first turn embedded them
    assert got == want
