"""The grounding check: sentence splitting with citations, scoring against passages, citation correction, the
three policies, the extractive answer and the embedded model's context budget (real embedder, no LLM)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rag_worker.llm import CancelToken, LocalBackend
from rag_worker.pipeline import generate
from rag_worker.pipeline.grounding import Grounder, check, quotes, sentences
from rag_worker.pipeline.grounding.policy import policy_for
from rag_worker.pipeline.turn import Turn, TurnOptions
from rag_worker.schemas import ChatRequest
from rag_worker.settings import Settings

BACKUP = (
    "- **Health**: `python run_system.py --health` prints Ollama, worker and gateway with their state.\n"
    "- **Backup**: all state is in two folders, `index_store/` (LanceDB tables, overviews, the SQLite database\n"
    "  and the JWT secret) and `shared_uploads/` (the original files). Stop the system (or at least pause\n"
    "  uploads), then copy both, e.g. `tar czf rag-backup.tgz index_store shared_uploads`. Restore by putting\n"
    "  them back before starting.\n"
    "- **Docker**: `docker compose up -d --build` starts the worker and the gateway in containers."
)
DUCKS = (
    "Ducks eat aquatic plants, small fish, insects and worms. A male duck is called a drake and a female duck is "
    "called a hen. Ducks have waterproof feathers thanks to an oil gland near the base of the tail."
)
DOCS = [
    {"ref": "S1", "id": "r", "filename": "README.md", "text": BACKUP, "context": None},
    {"ref": "S2", "id": "d", "filename": "ducks.md", "text": DUCKS, "context": None},
]
INVENTED = (
    "To back up your data, run `sudo wget https://storage.example.com/backup.php` on the server. "
    "You may need to install a client such as Heroku first."
)


def make_turn(embedder, backend="ollama", **settings) -> Turn:
    """`backend`: a backend's name (the policy only reads it), or a real backend object (the embedded model's
    context budget counts with its tokenizer)."""
    services = SimpleNamespace(settings=Settings(**settings), embedder=embedder)
    opts = TurnOptions("rag", False, False, False, "hybrid", 5, "similarity", None, None, None, {})
    llm = SimpleNamespace(backend=SimpleNamespace(backend=backend) if isinstance(backend, str) else backend)
    return Turn(services, ChatRequest(prompt="How do I back up the data?"), opts, llm, CancelToken())


def passages(docs=DOCS) -> dict[str, str]:
    return {d["ref"]: d["text"] for d in docs}


def review(turn: Turn, reply: str) -> tuple[str, dict, bool]:
    """The policy's review of a generated `reply` to the backup question: (reply shown, grounding, refused)."""
    shown, refused = Grounder(turn, "How do I back up the data?", DOCS).review(reply)
    return shown, turn.grounding, refused


# -- splitting ----------------------------------------------------------------------------------------------------


def test_sentences_keep_their_citations_before_or_after_the_full_stop():
    found = sentences.split_sentences(
        "Ducks eat fish [S1]. Drakes are males.[S2, S3] Hens lay eggs. [S4]\nEnd"
    )
    assert [s.refs for s in found] == [["S1"], ["S2", "S3"], ["S4"], []]
    assert [s.plain for s in found] == ["Ducks eat fish.", "Drakes are males.", "Hens lay eggs.", "End"]
    text = "Ducks eat fish [S1]. Drakes are males.[S2, S3] Hens lay eggs. [S4]\nEnd"
    assert all(text[s.start : s.end] == s.text for s in found)


def test_abbreviations_code_spans_and_hard_wrapped_lines_do_not_end_a_sentence():
    text = "Copy both, e.g. `tar czf a.tgz index_store` now.\nIt keeps\nthe uploads too [S1]. Dr. Who agrees."
    found = sentences.split_sentences(text)
    assert [s.plain for s in found] == [
        "Copy both, e.g. `tar czf a.tgz index_store` now.",
        "It keeps the uploads too.",
        "Dr. Who agrees.",
    ]


def test_list_items_and_headings_are_their_own_sentences():
    found = sentences.split_sentences("## Backup\n- copy `index_store`\n1. stop the system\n2. copy both")
    assert [s.plain for s in found] == ["Backup", "copy `index_store`", "stop the system", "copy both"]


# -- scoring ------------------------------------------------------------------------------------------------------


def test_a_quote_and_a_paraphrase_are_supported_an_invention_is_not(embedder):
    turn = make_turn(embedder)
    reply = (
        "All state is kept in two folders, index_store and shared_uploads [S1]. "
        "Ducks have waterproof feathers because of an oil gland near the tail [S2]. " + INVENTED
    )
    fixed, g = check.check(turn, reply, passages(), DOCS)
    labels = [s["label"] for s in g["sentences"]]
    assert labels[:2] == ["supported", "supported"], g["sentences"]
    assert labels[2:] == ["unsupported", "unsupported"], g["sentences"]
    assert g["supported_share"] == 0.5 and fixed == reply
    first = g["sentences"][0]
    assert first["source"]["ref"] == "S1" and "two folders" in first["source"]["text"]
    assert BACKUP[first["source"]["start"] : first["source"]["end"]].startswith("- **Backup**")
    assert "source" not in g["sentences"][2]


def test_a_wrong_or_invented_citation_is_corrected_to_the_supporting_source(embedder):
    turn = make_turn(embedder)
    reply = "A male duck is called a drake [S1]. Stop the system, then copy both folders with tar [S9]."
    fixed, g = check.check(turn, reply, passages(), DOCS)
    assert (
        fixed == "A male duck is called a drake [S2]. Stop the system, then copy both folders with tar [S1]."
    )
    first, second = g["sentences"]
    assert first["corrected_from"] == ["S1"] and first["refs"] == ["S2"] and not first["citation_ok"]
    assert second["corrected_from"] == ["S9"] and second["refs"] == ["S1"]
    assert fixed[first["start"] : first["end"]] == first["text"] == "A male duck is called a drake [S2]."
    assert fixed[second["start"] : second["end"]] == second["text"]


def test_a_right_citation_is_left_alone(embedder):
    reply = "Ducks eat aquatic plants, small fish and insects [S2]."
    fixed, g = check.check(make_turn(embedder), reply, passages(), DOCS)
    assert fixed == reply and g["sentences"][0]["citation_ok"] and "corrected_from" not in g["sentences"][0]


def test_a_supported_sentence_without_a_citation_gets_its_sources_and_an_unsupported_one_none(embedder):
    # Qwen2.5-1.5B answered the README's demo question in its own words, every sentence supported, and cited
    # nothing: the answer showed no source to open.
    turn = make_turn(embedder)
    reply = (
        "To back up the data, stop the system, then copy both folders `index_store` and `shared_uploads`.\n"
        "- A male duck is called a drake\n\n" + INVENTED
    )
    fixed, g = check.check(turn, reply, passages(), DOCS)
    assert fixed == (
        "To back up the data, stop the system, then copy both folders `index_store` and `shared_uploads` [S1].\n"
        "- A male duck is called a drake [S2]\n\n" + INVENTED
    )
    first, second, *invented = g["sentences"]
    assert first["citation_added"] and first["refs"] == ["S1"] and second["refs"] == ["S2"]
    assert all(not s.get("citation_added") and s["refs"] == [] for s in invented)
    for s in g["sentences"]:
        assert fixed[s["start"] : s["end"]] == s["text"]
    # Through the policy: the shown answer cites the README (S1), and the flags say the check added it.
    turn = make_turn(embedder)
    shown, g, refused = review(turn, reply.split("\n")[0])
    assert shown.endswith("`shared_uploads` [S1].") and not refused and g["action"] == "none"
    assert turn.flags["added_citations"] == 1


def test_cite_uncited_off_leaves_an_uncited_answer_as_written(embedder):
    reply = "To back up the data, stop the system, then copy both folders `index_store` and `shared_uploads`."
    fixed, g = check.check(make_turn(embedder, CITE_UNCITED=False), reply, passages(), DOCS)
    assert fixed == reply and g["sentences"][0]["label"] == "supported" and g["sentences"][0]["refs"] == []


# -- policies -----------------------------------------------------------------------------------------------------


def test_default_policy_is_extract_for_the_embedded_model_and_flag_for_ollama(embedder, smollm2):
    assert policy_for(make_turn(embedder, backend="local")) == "extract"
    # Each packaged model carries the default chosen on measurements (both `extract`: docs/benchmarks.md).
    assert policy_for(make_turn(embedder, backend=smollm2)) == smollm2.grounding_policy == "extract"
    assert policy_for(make_turn(embedder, backend=smollm2, GROUNDING_POLICY="flag")) == "flag"
    assert policy_for(make_turn(embedder, backend="ollama")) == "flag"
    assert policy_for(make_turn(embedder, backend="ollama", GROUNDING_POLICY="refuse")) == "refuse"
    turn = make_turn(embedder, backend="local")
    turn.options.grounding = "flag"
    assert policy_for(turn) == "flag"


def test_flag_keeps_the_invented_answer_and_marks_it(embedder):
    turn = make_turn(embedder, GROUNDING_POLICY="flag")
    reply, g, refused = review(turn, INVENTED)
    assert reply == INVENTED and not refused
    assert g["action"] == "flagged" and g["supported_share"] == 0.0
    assert {s["label"] for s in g["sentences"]} == {"unsupported"}


def test_extract_replaces_the_invented_answer_with_quotes_and_a_caveat(embedder):
    turn = make_turn(embedder, GROUNDING_POLICY="extract")
    reply, g, refused = review(turn, INVENTED)
    assert not refused and g["action"] == "extracted" and g["answer_mode"] == "extractive"
    assert reply.startswith(turn.prompt("extract_caveat"))
    assert "From README.md:" in reply and "index_store" in reply and "[S1]" in reply
    assert "wget" not in reply and "Heroku" not in reply
    assert g["supported_share"] == 1.0 and g["draft"]["supported_share"] == 0.0


def test_refuse_abstains_and_says_why(embedder):
    turn = make_turn(embedder, GROUNDING_POLICY="refuse")
    reply, g, refused = review(turn, INVENTED)
    assert refused and g["action"] == "refused" and reply == turn.prompt("ungrounded")
    assert "not supported" in reply


def test_a_grounded_answer_passes_every_policy_unchanged(embedder):
    answer = "All state is in two folders, `index_store/` and `shared_uploads/` [S1]."
    for policy in ("flag", "extract", "refuse"):
        turn = make_turn(embedder, GROUNDING_POLICY=policy)
        reply, g, refused = review(turn, answer)
        assert (reply, g["action"], refused) == (answer, "none", False)


def test_the_stream_watch_stops_an_invented_draft_early(embedder):
    watch = check.StreamWatch(make_turn(embedder), passages(), DOCS)
    stopped_at = None
    words = (INVENTED + " It also deletes old copies every night.").split(" ")
    for i, word in enumerate(words):
        if watch.feed(word + " "):
            stopped_at = i
            break
    assert stopped_at is not None and stopped_at < len(words) - 1


# -- the extractive answer ----------------------------------------------------------------------------------------


def test_extractive_answer_quotes_the_best_sentences_in_document_order_with_a_lead(embedder):
    turn = make_turn(embedder)
    reply = quotes.answer(turn, "How do I back up the data?", passages(), DOCS)
    assert reply.startswith("From README.md:\n\n> ")
    assert reply.rstrip().endswith("[S1]") and "ducks" not in reply.lower()
    # document order inside the passage: the folders come before the tar command
    assert reply.index("two folders") < reply.index("tar czf")
    _, g = check.check(turn, reply, passages(), DOCS)
    assert g["supported_share"] == 1.0


def test_extractive_answer_never_quotes_two_near_identical_sentences(embedder):
    text = (
        "The Eiffel Tower is 330 metres tall. The Eiffel Tower is 330 metres high. "
        "It was completed in 1889 for the World's Fair."
    )
    docs = [{"ref": "S1", "id": "e", "filename": "eiffel.md", "text": text}]
    reply = quotes.answer(make_turn(embedder), "How tall is the Eiffel Tower?", passages(docs), docs)
    assert reply.count("330 metres") == 1


# -- the embedded model's context ------------------------------------------------------------------------------


def context_docs():
    long = " ".join(["Ducks eat aquatic plants, small fish, insects and worms."] * 12)
    return [
        {"ref": "S1", "id": "a", "filename": "a.md", "text": BACKUP, "context": None},
        {"ref": "S2", "id": "b", "filename": "b.md", "text": long, "context": None},
        {"ref": "S3", "id": "c", "filename": "c.md", "text": DUCKS, "context": None},
    ]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """The embedded model for real (its tokenizer is llama.cpp's; it loads in about a second)."""
    settings = Settings(
        EMBEDDED_MODEL="smollm2", LOCAL_N_CTX=1024, MODEL_CACHE_DIR=str(tmp_path_factory.mktemp("m"))
    )
    return LocalBackend(settings)


def local_turn(embedder, smollm2, budget: int) -> Turn:
    return make_turn(embedder, backend=smollm2, LOCAL_CONTEXT_TOKENS=budget)


def test_local_context_keeps_the_best_passages_whole_and_leaves_out_what_does_not_fit(embedder, smollm2):
    docs = context_docs()
    sizes = [smollm2.count_tokens(d["text"]) for d in docs]  # the model's tokens, not the embedder's
    budget = sizes[0] + sizes[2] + 20  # room for the first and the third, not the long second one
    assert sizes[1] > 20
    turn = local_turn(embedder, smollm2, budget)
    message = generate.sources_message(turn, docs)
    assert turn.read == {"S1": BACKUP, "S3": DUCKS}  # whole, never cut; the long one left out
    assert "[S2] b.md" not in message and "[S1] a.md" in message and "[S3] c.md" in message


def test_local_context_cuts_only_a_first_passage_that_alone_is_too_long(embedder, smollm2):
    turn = local_turn(embedder, smollm2, 40)
    generate.sources_message(turn, context_docs())
    assert list(turn.read) == ["S1"] and BACKUP.startswith(turn.read["S1"]) and turn.read["S1"]
    assert smollm2.count_tokens(turn.read["S1"]) <= 40
    # One paragraph longer than the budget is cut by tokens, not characters.
    one = " ".join(["Ducks eat aquatic plants, small fish, insects and worms."] * 30)
    turn = local_turn(embedder, smollm2, 25)
    generate.sources_message(
        turn, [{"ref": "S1", "id": "a", "filename": "a.md", "text": one, "context": None}]
    )
    assert 20 <= smollm2.count_tokens(turn.read["S1"]) <= 25 and one.startswith(turn.read["S1"])


def test_local_context_is_sized_to_the_models_context_window(embedder, smollm2):
    # LOCAL_CONTEXT_TOKENS asks for more than a 1,024-token context holds beside the answer and instructions.
    big = [
        {"ref": f"S{i}", "id": str(i), "filename": f"{i}.md", "text": DUCKS, "context": None}
        for i in range(40)
    ]
    turn = local_turn(embedder, smollm2, 5000)
    generate.sources_message(turn, big)
    read = sum(smollm2.count_tokens(t) + 8 for t in turn.read.values())
    assert (
        0 < len(turn.read) < 40
        and read <= 1024 - turn.settings.local_max_tokens - generate.INSTRUCTIONS_TOKENS
    )


def test_ollama_reads_every_passage(embedder):
    turn = make_turn(embedder, backend="ollama", LOCAL_CONTEXT_TOKENS=10)
    generate.sources_message(turn, DOCS)
    assert set(turn.read) == {"S1", "S2"}
