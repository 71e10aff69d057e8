"""The grounding check embeds only the passage sentences that can matter (issue 31): the best word overlap first
(among the cited passages' sentences, if any), where a near-quote settles the sentence, then those whose ceiling (a
cosine of 1 with their word overlap) reaches the best score found, or could still make a citation hold. Labels and
citation checks are exactly those of embedding every passage sentence; so are scores and sources, but for a settled
near-quote, whose source is the sentence it quotes (real embedder, no LLM).

Reproduced first: on the code before, a quote of one source embedded the sentences of every passage the model read
(`test_a_quote_of_its_cited_source_embeds_that_source_only` failed with the ducks' sentences embedded too).
"""

from __future__ import annotations

import random

import pytest

from rag_worker.pipeline.grounding import check
from rag_worker.pipeline.grounding.sentences import is_claim, passage_sentences, split_sentences
from rag_worker.settings import Settings
from tests.unit.test_grounding import BACKUP, DOCS, INVENTED, make_turn, passages

README = (
    "The worker serves searches and chat turns; the gateway checks who may read what. Logs go to standard "
    "output as JSON lines. Set LOG_LEVEL=debug for more detail about each request. The gateway listens on "
    "port 8000 and the worker on port 8001 by default."
)
BIRDS = (
    "Geese fly in a V formation to save energy on long migrations. Swans mate for life and defend their nests "
    "fiercely. A young swan is called a cygnet, and its feathers are grey for the first year."
)
MANY = [
    *DOCS,
    {"ref": "S3", "id": "o", "filename": "ops.md", "text": README, "context": None},
    {"ref": "S4", "id": "b", "filename": "birds.md", "text": BIRDS, "context": None},
]
REPLIES = [
    "All state is in two folders, `index_store/` and `shared_uploads/` [S1]. Stop the system, then copy both [S1].",
    "Copy the index_store and shared_uploads folders after stopping the system [S1]. "
    "Ducks have waterproof feathers thanks to an oil gland [S1].",
    "A male duck is called a drake [S1]. Stop the system, then copy both folders with tar [S9].",
    "The gateway listens on port 8000 [S3]. A young swan is a cygnet with grey feathers [S2, S4].",
    "Geese save energy flying in formation. Logs are JSON lines on standard output. " + INVENTED,
    "To back up the data, stop the system, then copy both folders `index_store` and `shared_uploads`.\n"
    "- A male duck is called a drake\n\n" + INVENTED,
    "Swans defend their nests and mate for life [S4]; debug logging shows more about each request [S4].",
]


def full(embedder, reply: str, docs: list[dict]):
    """The check embedding every passage sentence: a ceiling no passage sentence stays under, and no near-quote
    settling an answer sentence (no cosine reaches 2)."""
    saved = check.CEILING_COSINE, check.SETTLED_COSINE
    check.CEILING_COSINE, check.SETTLED_COSINE = 1e9, 2.0
    try:
        return check.check(make_turn(embedder), reply, passages(docs), docs)
    finally:
        check.CEILING_COSINE, check.SETTLED_COSINE = saved


def sentences_of(ref: str) -> set[str]:
    return {p.text for d in MANY if d["ref"] == ref for p in passage_sentences(ref, d["text"])}


def same(got, want) -> None:
    (fixed, g), (fixed2, g2) = got, want
    assert (g["supported"], g["checked"], g["supported_share"]) == (
        g2["supported"],
        g2["checked"],
        g2["supported_share"],
    )
    own_source = False
    for a, b in zip(g["sentences"], g2["sentences"], strict=True):
        a, b = dict(a), dict(b)
        for key in ("label", "citation_ok", "corrected_from", "citation_added"):
            assert a.get(key) == b.get(key)
        if a["label"] == "supported" and a["similarity"] >= check.SETTLED_COSINE:
            # Settled on the near-quote found first: the same verdict, and the sentence it quotes as its source
            # (the full check may prefer one scoring a little higher on its neighbours' words).
            assert a["score"] >= Settings().grounded_above
            assert a["source"]["text"] in sentences_of(a["source"]["ref"])
            assert a["refs"] == b["refs"] or a.get("citation_added")
            own_source = own_source or a["refs"] != b["refs"]
            continue
        for key in ("score", "similarity", "overlap"):
            assert a.pop(key) == pytest.approx(b.pop(key), abs=2e-4)  # one batched pass against two
        assert a == b  # label, source and its span, refs, citation_ok, corrected_from, citation_added
    if not own_source:
        assert fixed == fixed2  # citations corrected and added alike


@pytest.mark.parametrize("reply", REPLIES)
def test_the_verdicts_are_those_of_embedding_every_passage_sentence(embedder, reply):
    same(check.check(make_turn(embedder), reply, passages(MANY), MANY), full(embedder, reply, MANY))


def test_random_answers_made_of_passage_sentences_and_inventions_get_the_same_verdicts(embedder):
    """Answers spliced from the passages' sentences (quoted, cut short, cited right, wrong or not at all) and
    invented ones: the same verdicts as the full check, every one."""
    rng = random.Random(31)
    pool = [p.text for d in MANY for p in passage_sentences(d["ref"], d["text"])]
    pool += [s.plain for s in split_sentences(INVENTED)]
    for _ in range(12):
        parts = []
        for text in rng.sample(pool, 3):
            words = text.rstrip(".").split()
            cut = " ".join(words[: rng.randint(max(3, len(words) // 2), len(words))])
            cite = rng.choice(["", " [S1]", " [S2]", " [S3]", " [S4]", " [S2, S3]", " [S7]"])
            parts.append(f"{cut}{cite}.")
        reply = " ".join(parts)
        same(check.check(make_turn(embedder), reply, passages(MANY), MANY), full(embedder, reply, MANY))


def asked(turn) -> set[str]:
    """The texts this turn had embedded (or found in the embedder's cache): every vector it holds."""
    return set(turn._vectors)


def test_a_quote_of_its_cited_source_embeds_that_source_only(embedder):
    turn = make_turn(embedder)
    reply = "All state is in two folders, `index_store/` and `shared_uploads/` [S1]. Stop the system, then copy both [S1]."
    fixed, g = check.check(turn, reply, passages(MANY), MANY)
    assert [s["label"] for s in g["sentences"]] == ["supported", "supported"] and fixed == reply
    answer = {s.plain for s in split_sentences(reply) if is_claim(s)}
    cited = {p.text for p in passage_sentences("S1", BACKUP)}
    assert asked(turn) <= answer | cited
    others = {p.text for d in MANY[1:] for p in passage_sentences(d["ref"], d["text"])}
    assert not asked(turn) & others  # the ducks, the operations notes and the birds were never embedded
    assert len(asked(turn) & cited) < len(cited)  # nor every sentence of the Backup passage


def test_a_quote_is_settled_on_the_sentence_it_quotes_not_on_a_neighbour_sharing_its_words(embedder):
    """Word overlap counts a passage sentence's neighbours' words too: the sentence before a quoted one scores the
    same overlap. The first candidate is the one sharing the words itself, and the quote settles there."""
    turn = make_turn(embedder)
    quoted = "The gateway listens on port 8000 and the worker on port 8001 by default."
    reply = quoted[:-1] + " [S3]."
    _, g = check.check(turn, reply, passages(MANY), MANY)
    (entry,) = g["sentences"]
    assert entry["label"] == "supported" and entry["citation_ok"]
    assert entry["source"]["ref"] == "S3" and entry["source"]["text"] == quoted
    assert asked(turn) & sentences_of("S3") == {quoted}  # one passage sentence embedded, the quoted one


def test_an_invention_still_reads_what_could_back_it(embedder):
    """A sentence no source backs has a low best score: every passage sentence whose ceiling reaches it is
    embedded, so its label is not settled by the first candidate alone."""
    turn = make_turn(embedder)
    _, g = check.check(turn, INVENTED, passages(DOCS), DOCS)
    assert [s["label"] for s in g["sentences"]] == ["unsupported", "unsupported"]
    every = {p.text for d in DOCS for p in passage_sentences(d["ref"], d["text"])}
    assert len(asked(turn) & every) > 1


def test_a_citation_is_judged_on_the_sources_it_cites_even_when_the_sentence_quotes_another(embedder):
    """The second sentence quotes the ducks file word for word (the first sentence brought that quote in) but
    cites a source that also backs it, in other words: its citation holds, as the full check says; the quote of
    a source it does not cite must not settle it and leave its own sources unread."""
    quote = "Ducks stay dry because an oil gland coats their feathers."
    docs = [
        {
            "ref": "S1",
            "id": "w",
            "filename": "waterfowl.md",
            "context": None,
            "text": "Oil prices and gland surgery were in the news. Waterfowl remain dry since a secretion waterproofs their plumage.",
        },
        {"ref": "S2", "id": "d", "filename": "ducks.md", "text": quote, "context": None},
    ]
    reply = f"{quote} {quote[:-1]} [S1]."
    got = check.check(make_turn(embedder), reply, passages(docs), docs)
    want = full(embedder, reply, docs)
    second, second_full = got[1]["sentences"][1], want[1]["sentences"][1]
    assert second_full["citation_ok"] and "corrected_from" not in second_full  # the full check's verdict
    assert (
        second["citation_ok"] and "corrected_from" not in second and got[0] == want[0]
    )  # [S2] added to the first
