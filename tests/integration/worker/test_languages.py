"""Beyond English through the real worker: an index created in French (its full-text language), answered in French
with French fixed texts; the language of the latest message picks them, English for a language the catalogue
lacks; and the index-creation route's refusals."""

from __future__ import annotations

import httpx

from rag_worker.i18n.messages import CATALOGUE
from tests.ollama_server import default_responder
from tests.sse import post_events

FRENCH_DOC = (
    "# Congés\n\n"
    "Les salariés ont droit à vingt-cinq jours de congés payés par an.\n\n"
    "Les jours de congés non pris peuvent être reportés jusqu'à la fin du mois de mars.\n"
)
QUESTION = "Combien de jours de congés payés les salariés ont-ils par an ?"
INVENTED = "Les congés sont attribués par tirage au sort chaque lundi au ministère de la pêche [S1]."


def obeying(invented: str | None = None):
    """A model that answers in the language the system prompt asks for (as a real one does), from the sources, or
    invents `invented`; yes/no checks as the default model."""

    def responder(model: str, messages: list[dict], request: dict) -> str:
        if any("answer yes or no" in str(m.get("content") or "").lower() for m in messages):
            return default_responder(model, messages, request)
        if invented is not None:
            return invented
        reply = default_responder(model, messages, request)
        system = " ".join(str(m.get("content") or "") for m in messages if m.get("role") == "system")
        if "Answer in French" in system:
            return reply.replace("According to the sources, ", "D'après les sources, ")
        return reply

    return responder


def turn(worker, prompt: str, index: str, **options):
    body = {"prompt": prompt, "index": index, "options": {"route": "rag", **options}}
    datasets = options.pop("datasets", None)
    if datasets is not None:
        body = {**body, "datasets": datasets, "options": {"route": "rag", **options}}
    status, events = post_events(worker.url + "/chat_stream", body)
    assert status == 200, events
    events = [(e, d) for e, d in events if e != ":"]
    assert events[-1][0] == "done", events[-1]
    return events[-1][1]


def test_a_french_index_is_answered_in_french_with_french_fixed_texts(worker, fake_ollama):
    made = httpx.put(worker.url + "/indexes/conges_fr", json={"language": "fr"})
    assert made.status_code == 201, made.text
    assert made.json() == {"index": "conges_fr", "created": True, "embedder": "default", "language": "fr"}
    again = httpx.put(worker.url + "/indexes/conges_fr", json={"language": "fr"})
    assert again.status_code == 200 and again.json()["created"] is False
    clash = httpx.put(worker.url + "/indexes/conges_fr", json={"language": "de"})
    assert clash.status_code == 409 and clash.json()["code"] == "index_exists"
    up = httpx.post(
        worker.url + "/add_document",
        data={"index": "conges_fr", "dataset": "rh"},
        files={"file": ("conges.md", FRENCH_DOC.encode(), "text/markdown")},
        timeout=120,
    )
    assert up.status_code == 200, up.text

    fr = CATALOGUE["fr"]
    fake_ollama.responder = obeying()
    done = turn(worker, QUESTION, "conges_fr", grounding="refuse")
    chats = [r["body"] for r in fake_ollama.requests if r["path"] == "/api/chat" and r["body"].get("stream")]
    system = next(m["content"] for m in chats[-1]["messages"] if m["role"] == "system")
    assert "Answer in French" in system
    assert done["abstained"] is False and done["reply"].startswith("D'après les sources"), done["reply"]
    assert "vingt-cinq jours" in done["reply"]

    # An invented draft under `extract`: the French caveat, then quotes under "Extrait de <file> :".
    fake_ollama.responder = obeying(INVENTED)
    done = turn(worker, QUESTION, "conges_fr", grounding="extract")
    assert done["reply"].startswith(fr["extract_caveat"]), done["reply"]
    assert "Extrait de conges.md :" in done["reply"] and "vingt-cinq jours" in done["reply"]
    # ...and under `refuse`: the French refusal.
    done = turn(worker, QUESTION, "conges_fr", grounding="refuse")
    assert done["abstained"] is True and done["reply"] == fr["ungrounded"]

    # Nothing to answer from (a dataset the index does not have): the French abstention.
    done = turn(worker, QUESTION, "conges_fr", datasets=["archives"])
    assert done["abstained"] is True and done["reply"] == fr["abstain"]


def test_the_latest_message_picks_the_language_and_english_is_the_fallback(worker, fake_ollama):
    fake_ollama.responder = obeying("Der Eiffelturm wurde aus Schokolade gebaut und schwimmt im Meer [S1].")
    done = turn(worker, "Wie hoch ist der Eiffelturm in Paris?", "corpus", grounding="refuse")
    assert done["abstained"] is True and done["reply"] == CATALOGUE["de"]["ungrounded"]
    # Italian is detected, and the catalogue has no Italian: English (MiniLM may find nothing close enough in the
    # English corpus for an Italian question, so the abstention or the refusal, both in English).
    done = turn(worker, "Quanto è alta la Torre Eiffel a Parigi?", "corpus", grounding="refuse")
    en = CATALOGUE["en"]
    assert done["abstained"] is True and done["reply"] in (en["abstain"], en["ungrounded"])


def test_the_interface_language_decides_only_a_message_too_short_to_detect(worker, fake_ollama):
    """`options.language` (the interface's language): "merci ?" (lingua's guess: Italian, unsure) is answered with
    the French fixed texts; a clear German question in the French interface stays German; a bad tag is a 400."""
    fake_ollama.responder = obeying("Der Eiffelturm wurde aus Schokolade gebaut und schwimmt im Meer [S1].")
    done = turn(worker, "merci ?", "corpus", grounding="refuse", language="fr")
    fr = CATALOGUE["fr"]
    assert done["abstained"] is True and done["reply"] in (fr["abstain"], fr["ungrounded"]), done["reply"]
    assert done["language"] == {"code": "fr", "source": "hinted"}
    # Without the hint the same message gets the English texts (no catalogue for the guessed language).
    done = turn(worker, "merci ?", "corpus", grounding="refuse")
    en = CATALOGUE["en"]
    assert done["reply"] in (en["abstain"], en["ungrounded"]) and done["language"]["source"] == "guessed"

    done = turn(
        worker, "Wie hoch ist der Eiffelturm in Paris?", "corpus", grounding="refuse", language="fr-FR"
    )
    assert done["abstained"] is True and done["reply"] == CATALOGUE["de"]["ungrounded"], done["reply"]
    assert done["language"] == {"code": "de", "source": "detected"}

    for bad in ("xx", "fr_FR", "f", 5, "fr-" + "x" * 40):
        r = httpx.post(
            worker.url + "/chat", json={"prompt": "merci ?", "index": "corpus", "options": {"language": bad}}
        )
        assert r.status_code == 400 and r.json()["field"] == "options.language", (bad, r.text)


def test_bad_index_creations_are_4xx_json(worker):
    for body, status, field in [
        ({"embedder": "bge-m3"}, 400, "embedder"),
        ({"language": "klingon"}, 400, "language"),
        ({"embedder": 5}, 400, "embedder"),
        ({"language": ["fr"]}, 400, "language"),
    ]:
        r = httpx.put(worker.url + "/indexes/never_made", json=body)
        assert r.status_code == status and r.json()["field"] == field, r.text
    assert "multilingual-e5-small" in httpx.put(worker.url + "/indexes/x", json={"embedder": "?"}).text
    assert httpx.put(worker.url + "/indexes/bad%20name", json={}).status_code == 400
    assert (
        httpx.put(
            worker.url + "/indexes/never_made", content=b"{", headers={"Content-Type": "application/json"}
        ).status_code
        == 400
    )
    assert (
        httpx.put(
            worker.url + "/indexes/never_made", content=b"{}", headers={"Content-Type": "text/plain"}
        ).status_code
        == 415
    )
    names = httpx.get(worker.url + "/get_documents", params={"index": "never_made"})
    assert names.status_code == 404, "a refused creation made nothing"


KOREAN = [
    "서울에서 김치찌개를 먹었습니다. 정말 맛있었어요.",
    "부산 해운대 해수욕장은 여름에 사람들로 붐빈다.",
]


def test_a_korean_pdf_is_found_by_full_text_search(worker, corpus_root):
    """A Korean PDF through the worker's own upload (Docling reads its text layer) into an index made in Korean:
    its words, attached to particles in the text ("김치찌개를"), are found by the full-text index's 2-grams."""
    from rag_worker.embeddings import Embedder
    from rag_worker.settings import packaged_embedding_model
    from rag_worker.store import Store
    from tests.format_samples import cjk_pdf_bytes

    made = httpx.put(worker.url + "/indexes/hangul_pdf", json={"language": "ko"}, timeout=120)
    assert made.status_code == 201, made.text
    # What the gateway reads to fill in its rows: the table's settings; no table is a 404, a bad name a 400.
    settings = httpx.get(worker.url + "/indexes/hangul_pdf", timeout=30)
    assert settings.json() == {"index": "hangul_pdf", "embedder": "default", "language": "ko"}
    missing = httpx.get(worker.url + "/indexes/never_made_ko", timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]
    assert httpx.get(worker.url + "/indexes/bad%20name", timeout=30).status_code == 400

    up = httpx.post(
        worker.url + "/add_document",
        data={"index": "hangul_pdf", "dataset": "ko"},
        files={"file": ("seoul.pdf", cjk_pdf_bytes(KOREAN), "application/pdf")},
        timeout=300,
    )
    assert up.status_code == 200, up.text
    assert up.json()["chunks"] >= 1

    [table] = list(corpus_root.rglob("hangul_pdf*.lance"))
    # The worker's table read in this process (real LanceDB), its marker checked against the same MiniLM.
    embedder = Embedder(packaged_embedding_model(), batch_size=4, max_length=256, torch_threads=1)
    store = Store(table.parent, embedder)
    for word, line in (("김치찌개", KOREAN[0]), ("해수욕장", KOREAN[1]), ("해운대", KOREAN[1])):
        hits = store.search("hangul_pdf", word, mode="fts", limit=3)
        assert hits, word
        assert hits[0].filename == "seoul.pdf" and line in hits[0].text.replace("\n", " "), (
            word,
            hits[0].text,
        )
    assert store.search("hangul_pdf", "불고기", mode="fts", limit=3) == []  # a word the PDF does not have
