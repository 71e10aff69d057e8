"""The pure parts of the OpenAI-compatible surface: stop sequences, the sources list and its removal."""

from __future__ import annotations

from contract.answer import Answer
from rag_worker.openai_compat import sources_list, strip_sources
from rag_worker.pipeline.generate import StopFilter


def run(stops: list[str], pieces: list[str]) -> tuple[str, bool]:
    f, out = StopFilter(stops), []
    for piece in pieces:
        text, hit = f.feed(piece)
        out.append(text)
        if hit:
            return "".join(out), True
    return "".join(out) + f.flush(), False


def test_stop_sequences_cut_the_text_even_when_split_across_pieces():
    assert run(["END"], ["one ", "two E", "N", "D three"]) == ("one two ", True)
    assert run(["\n\n", "xyz"], ["a", "b\n", "\nc"]) == ("ab", True)
    assert run(["zzz"], ["no ", "stop ", "here z"]) == ("no stop here z", False)


def answer(reply: str, citations: list[dict], documents: list[dict]) -> Answer:
    return Answer.model_validate(
        {
            "reply": reply,
            "question": "What do ducks eat?",
            "history": [],
            "documents": documents,
            "fetched_new_documents": True,
            "route": "rag",
            "citations": citations,
            "abstained": False,
            "model": "qwen3:8b",
        }
    )


def test_the_sources_list_names_cited_documents_and_comes_off_again():
    ducks = answer(
        "Ducks eat plants [S2].",
        [{"ref": "S2", "id": "b", "filename": "ducks.pdf"}],
        [
            {"ref": "S1", "filename": "owls.txt", "page": None, "id": "a", "text": "Owls hunt."},
            {"ref": "S2", "filename": "ducks.pdf", "page": 3, "id": "b", "text": "Ducks eat plants."},
        ],
    )
    tail = sources_list(ducks)
    assert tail == "\n\nSources:\n[S2] ducks.pdf, page 3"
    assert strip_sources(ducks.reply + tail) == ducks.reply
    assert (
        strip_sources("A text that mentions Sources: in passing.")
        == "A text that mentions Sources: in passing."
    )
    assert sources_list(answer("I do not know.", [], [])) == ""
