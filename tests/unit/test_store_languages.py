"""Indexes beyond English, on real LanceDB tables: the multilingual embedder an index is created with (its marker
records it, its searches use it), and the full-text tokenizer of its language (stemmed, or 2-grams for CJK)."""

from __future__ import annotations

import hashlib

import pytest

from contract.languages import EMBEDDERS, INDEX_LANGUAGES
from rag_worker import embedders
from rag_worker.errors import ApiError
from rag_worker.store import Store
from rag_worker.store.fts import LANGUAGES

ENGLISH = [
    "Employees are entitled to 25 days of paid vacation per calendar year.",
    "The office opens at 8 am and closes at 6 pm on weekdays.",
    "Either party may terminate this agreement with three months written notice.",
]
FRENCH = [
    "Les chevaux mangent des pommes vertes dans le pré.",
    "La voiture électrique se recharge pendant la nuit.",
]
KOREAN = [
    "서울에서 김치찌개를 먹었습니다. 정말 맛있었어요.",
    "부산 해운대 해수욕장은 여름에 사람들로 붐빈다.",
]


def rows(filename: str, chunks: list[str]) -> list[dict]:
    document_id = hashlib.sha256("\n".join(chunks).encode()).hexdigest()
    return [
        {
            "document_id": document_id,
            "filename": filename,
            "dataset": "default",
            "page": None,
            "chunk_index": i,
            "text": text,
            "metadata": {},
        }
        for i, text in enumerate(chunks)
    ]


@pytest.fixture(scope="module")
def store(tmp_path_factory, embedder) -> Store:
    return Store(tmp_path_factory.mktemp("lang") / "lancedb", embedder)


def test_the_shared_lists_match_what_the_worker_builds():
    assert tuple(embedders.NAMES) == EMBEDDERS
    assert tuple(sorted(LANGUAGES)) == tuple(sorted(INDEX_LANGUAGES))


def test_an_e5_index_is_searched_with_e5_and_finds_english_passages_for_a_german_question(store):
    assert store.create_index("handbook", embedder="multilingual-e5-small") is True
    store.add_chunks("handbook", rows("handbook.md", ENGLISH))
    assert store.index_settings("handbook") == {"embedder": "multilingual-e5-small", "language": "en"}
    assert store.marker("handbook")["embedding_model"] == "intfloat/multilingual-e5-small"
    emb = store.embedder_for("handbook")
    assert emb.name == "multilingual-e5-small" and emb is not store.embedder

    # Vector search only: nothing of the German words is in the English passages.
    for question, expected in [
        ("Wie viele Urlaubstage bekommen Mitarbeiter im Jahr?", ENGLISH[0]),
        ("Wann öffnet das Büro?", ENGLISH[1]),
        ("Mit welcher Frist kann man den Vertrag kündigen?", ENGLISH[2]),
    ]:
        hits = store.search("handbook", question, mode="vector", limit=3)
        assert hits[0].text == expected, (question, [h.text for h in hits])

    # A query vector of the wrong embedder's space cannot be slipped in; mixing embedders in one search is a 400.
    store.add_chunks("plain", rows("plain.md", ENGLISH[:1]))
    with pytest.raises(ApiError) as mixed:
        store.search(["handbook", "plain"], "vacation")
    assert mixed.value.status == 400 and mixed.value.code == "mixed_embedders"

    # A rebuild's new table is made with the index's embedder and language, not the worker's default.
    staged = store.new_staged("handbook")
    assert store.index_settings(staged) == {"embedder": "multilingual-e5-small", "language": "en"}
    store.discard(staged)

    # The index keeps its embedder: asking for it again is fine, asking for another is a conflict.
    assert store.create_index("handbook", embedder="multilingual-e5-small") is False
    with pytest.raises(ApiError) as other:
        store.create_index("handbook", embedder="default")
    assert other.value.status == 409
    with pytest.raises(ApiError) as unknown:
        store.create_index("fresh", embedder="bge-m3")
    assert unknown.value.status == 400 and "multilingual-e5-small" in unknown.value.message
    assert not store.exists("fresh")


def test_full_text_search_follows_the_index_language(store):
    store.create_index("fr_docs", language="fr")
    store.add_chunks("fr_docs", rows("fr.md", FRENCH))
    store.add_chunks("en_docs", rows("fr.md", FRENCH))  # the default: English stemming
    # French stemming: singular query words find the plural forms.
    for query in ("cheval", "pomme", "voitures électriques"):
        hits = store.search("fr_docs", query, mode="fts", limit=2)
        assert hits and hits[0].text == (FRENCH[1] if "voiture" in query else FRENCH[0]), query
    assert store.search("en_docs", "cheval", mode="fts", limit=2) == []

    # Korean (here as chunks; tests/integration/worker/test_languages.py uploads a Korean PDF): 2-grams find words
    # inside runs with particles attached ("김치찌개를"), which the simple tokenizer never splits.
    store.create_index("ko_docs", language="ko")
    store.add_chunks("ko_docs", rows("ko.md", KOREAN))
    store.add_chunks("ko_plain", rows("ko.md", KOREAN))
    assert store.search("ko_docs", "김치찌개", mode="fts", limit=2)[0].text == KOREAN[0]
    assert store.search("ko_docs", "해수욕장", mode="fts", limit=2)[0].text == KOREAN[1]
    assert store.search("ko_plain", "김치찌개", mode="fts", limit=2) == []

    with pytest.raises(ApiError) as bad:
        store.create_index("xx_docs", language="klingon")
    assert bad.value.status == 400 and "fr" in bad.value.message


def test_the_worker_services_load_the_named_embedder_once(tmp_path):
    """`Services.embedder_named`, the resolver the worker's store uses: each embedder loaded once (and the default
    one built on the way, not deadlocked on the build lock), an unknown name a 400."""
    from rag_worker.services import Services
    from rag_worker.settings import Settings

    services = Services(Settings(INDEX_STORE=str(tmp_path / "store")))
    e5 = services.embedder_named("multilingual-e5-small")
    assert e5 is services.embedder_named("multilingual-e5-small") and e5.name == "multilingual-e5-small"
    assert services.embedder_named(None) is services.embedder_named("default") is services.embedder
    with pytest.raises(ApiError) as bad:
        services.embedder_named("bge-m3")
    assert bad.value.status == 400
