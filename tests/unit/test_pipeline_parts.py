"""Model-free pieces of the chat pipeline: citations, follow-up cues, rewrite hygiene, titles, streaming splits."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rag_worker.pipeline import citations, cues, generate, rewrite
from rag_worker.pipeline.titles import fallback_title, make_title

DOCS = [
    {"ref": "S1", "id": "a", "filename": "a.md", "page": 2},
    {"ref": "S2", "id": "b", "filename": "b.pdf"},
]


def test_citations_keep_real_refs_in_order_of_first_use():
    reply, cited, invented = citations.validate("B says so [S2]. A agrees [S1][S2].", DOCS)
    assert [c["ref"] for c in cited] == ["S2", "S1"] and invented == []
    assert cited[1] == {"ref": "S1", "id": "a", "filename": "a.md", "page": 2}
    assert reply == "B says so [S2]. A agrees [S1][S2]."


@pytest.mark.parametrize(
    ("text", "expected", "invented"),
    [
        ("Made up [S7].", "Made up.", ["S7"]),
        ("Mixed [S1, S9] here.", "Mixed [S1] here.", ["S9"]),
        ("Group [S3; S4] gone, [S2] stays.", "Group gone, [S2] stays.", ["S3", "S4"]),
    ],
)
def test_invented_refs_are_removed_from_the_reply(text, expected, invented):
    reply, cited, found = citations.validate(text, DOCS)
    assert reply == expected and found == invented
    assert all(c["ref"] in {"S1", "S2"} for c in cited)


def test_no_documents_means_no_citations():
    reply, cited, invented = citations.validate("Claim [S1].", [])
    assert cited == [] and invented == ["S1"] and "[S1]" not in reply


@pytest.mark.parametrize(
    ("text", "follow_up"),
    [
        ("Tell me more about that", True),
        ("And the second one?", True),
        ("What about Paris?", True),
        ("Why?", True),
        ("What is the boiling point of mercury at sea level in kelvin", False),
        ("Summarise the quarterly revenue report for 2023", False),
        ("", False),
    ],
)
def test_follow_up_cues(text, follow_up):
    assert cues.is_follow_up(text) is follow_up


def test_rewrite_output_is_cleaned_and_sanity_checked():
    assert rewrite.clean('Rewritten question: "How far can owls turn their heads?"\nextra') == (
        "How far can owls turn their heads?"
    )
    assert rewrite.clean("Standalone query: owls heads") == "owls heads"
    assert not rewrite.plausible("", "q")
    assert not rewrite.plausible("I cannot help with that", "what about it?")
    assert not rewrite.plausible("x" * 1000, "short question")
    assert rewrite.plausible("How tall is the Eiffel Tower?", "how tall is it?")


def test_fallback_title_takes_the_first_words():
    assert fallback_title("What do ducks eat?") == "What do ducks eat"
    assert fallback_title("one two three four five six seven eight") == "one two three four five six…"
    assert fallback_title("   ") == "New chat"


def test_a_title_falls_back_to_the_question_when_no_model_can_be_resolved_or_answers(caplog):
    def unreachable():
        raise ConnectionError("Ollama not reachable")

    def failing(messages, **kw):
        raise TimeoutError("no answer")

    no_router = SimpleNamespace(llm=SimpleNamespace(resolve=unreachable))
    broken = SimpleNamespace(backend=SimpleNamespace(chat=failing), utility_model="small")
    no_answer = SimpleNamespace(llm=SimpleNamespace(resolve=lambda: broken))
    for services in (no_router, no_answer):
        assert make_title(services, "What do ducks eat?") == "What do ducks eat"
    failures = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(failures) == 2 and all("title from the model failed" in m for m in failures)


def test_canned_replies_stream_as_words_and_rejoin_exactly():
    text = "I could not find it.  Try again"
    pieces = list(generate.words_of(text))
    assert "".join(pieces) == text and len(pieces) >= 5


def test_provenance_sentences_carry_their_citations():
    from rag_worker.pipeline.provenance import sentences

    found = sentences("Ducks eat plants and insects [S1]. Drakes are males [S2, S3].\nShort.")
    assert found == [("Ducks eat plants and insects.", {"S1"}), ("Drakes are males.", {"S2", "S3"})]
