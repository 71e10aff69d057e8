"""The gateway reads the worker's answer through the contract's `Answer`: a contract-breaking answer is an error,
not a half-stored turn; fields the gateway does not know pass through."""

from __future__ import annotations

from gateway.answers import stored_json
from gateway.sse import Frame
from gateway.turns.state import TurnRecord

GOOD = {
    "reply": "Ducks eat plants [S1].",
    "question": "What do ducks eat?",
    "rewritten": None,
    "history": [
        {"role": "user", "content": "What do ducks eat?"},
        {"role": "assistant", "content": "Plants."},
    ],
    "documents": [{"id": "c1", "filename": "duck.md", "ref": "S1", "text": "Ducks eat aquatic plants."}],
    "fetched_new_documents": True,
    "route": "rag",
    "citations": [{"ref": "S1", "id": "c1", "filename": "duck.md", "page": None}],
    "abstained": False,
    "model": "qwen3:8b",
    "timings": {"total_ms": 10},
    "grounding": {
        "supported_share": 1.0,
        "supported": 1,
        "checked": 1,
        "sentences": [{"text": "Ducks eat plants [S1].", "label": "supported", "score": 0.9, "refs": ["S1"]}],
    },
    "flags": {"evidence": 0.7},
    "verdict": {"new": "a field the gateway does not type yet"},
}


def test_a_valid_answer_becomes_typed_and_keeps_unknown_fields():
    rec = TurnRecord()
    rec.see(Frame(raw="", event="done", data=GOOD))
    assert rec.error is None and rec.done.reply == GOOD["reply"] and rec.done.route == "rag"
    assert rec.done.question == GOOD["question"] and rec.done.flags == {"evidence": 0.7}
    # Stored whole, it reads back as the worker sent it: nothing added, nothing lost.
    assert stored_json(rec.done) == GOOD


def test_an_answer_that_breaks_the_contract_is_an_error():
    broken_documents = {**GOOD, "documents": [{"id": "c1"}]}  # a document without its text
    for broken in (
        {**GOOD, "reply": None},
        {**GOOD, "history": "nope"},
        {"reply": "x"},
        [],
        broken_documents,
    ):
        rec = TurnRecord()
        rec.see(Frame(raw="", event="done", data=broken))
        assert rec.done is None and rec.error["code"] == "worker_contract", broken
