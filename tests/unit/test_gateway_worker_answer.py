"""The gateway reads the worker's answer through one model: a contract-breaking answer is an error, not a
half-stored turn; fields the gateway does not know pass through."""

from __future__ import annotations

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
    "documents": [{"id": "c1", "filename": "duck.md", "ref": "S1"}],
    "fetched_new_documents": True,
    "route": "rag",
    "citations": [{"ref": "S1", "id": "c1", "filename": "duck.md", "page": None}],
    "abstained": False,
    "model": "qwen3:8b",
    "timings": {"total_ms": 10},
    "grounding": {"supported_share": 1.0},
    "flags": {"evidence": 0.7},
}


def test_a_valid_answer_becomes_typed_and_keeps_unknown_fields():
    rec = TurnRecord()
    rec.see(Frame(raw="", event="done", data=GOOD))
    assert rec.error is None and rec.done.reply == GOOD["reply"] and rec.done.route == "rag"
    assert rec.done.history_json() == GOOD["history"]
    assert rec.done.model_extra["flags"] == {"evidence": 0.7}
    # The grounding check rides with the stored message's details (the web marks the answer with it).
    assert rec.done.details["grounding"] == {"supported_share": 1.0}


def test_an_answer_that_breaks_the_contract_is_an_error():
    for broken in ({**GOOD, "reply": None}, {**GOOD, "history": "nope"}, {"reply": "x"}, []):
        rec = TurnRecord()
        rec.see(Frame(raw="", event="done", data=broken))
        assert rec.done is None and rec.error["code"] == "worker_contract", broken
