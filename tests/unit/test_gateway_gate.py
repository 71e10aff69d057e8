"""The layer-1 gate: a table of messages and the route a user should get, with no model involved."""

from __future__ import annotations

import pytest

from gateway.gate import should_use_rag

WITH_INDEX = [
    # smalltalk, as the whole message, in the ways people type it
    ("hello", "direct", "smalltalk"),
    ("Hello!", "direct", "smalltalk"),
    ("hi there", "direct", "smalltalk"),
    ("Hey 👋", "direct", "smalltalk"),
    ("Good morning!", "direct", "smalltalk"),
    ("thanks!", "direct", "smalltalk"),
    ("Thank you so much", "direct", "smalltalk"),
    ("thx", "direct", "smalltalk"),
    ("ok", "direct", "smalltalk"),
    ("OK.", "direct", "smalltalk"),
    ("okay cool", "direct", "smalltalk"),
    ("Ok, thanks! Bye.", "direct", "smalltalk"),
    ("hello, how are you?", "direct", "smalltalk"),
    ("got it", "direct", "smalltalk"),
    ("bye", "direct", "smalltalk"),
    ("Goodbye!", "direct", "smalltalk"),
    ("see you later", "direct", "smalltalk"),
    ("helloooo", "direct", "smalltalk"),
    ("how are you?", "direct", "smalltalk"),
    ("", "direct", "smalltalk"),
    ("!!!", "direct", "smalltalk"),
    # about the assistant itself
    ("Who are you?", "direct", "about_assistant"),
    ("what can you do", "direct", "about_assistant"),
    ("What is your name?", "direct", "about_assistant"),
    ("are you a bot?", "direct", "about_assistant"),
    ("hi, who are you?", "direct", "about_assistant"),
    # everything else searches the documents
    ("What does the contract say about termination?", "rag", "default"),
    ("hello, what does clause 4 say?", "rag", "default"),
    ("thanks, and what about the second clause?", "rag", "default"),
    ("who are you, and what does the policy say on leave?", "rag", "default"),
    ("ok so what is the notice period", "rag", "default"),
    ("duck", "rag", "default"),
    ("Who is the CEO?", "rag", "default"),
    ("what can you do with the budget report", "rag", "default"),
    ("hello hello hello hello hello hello hello", "rag", "default"),  # more than six words is never smalltalk
]


@pytest.mark.parametrize(("message", "route", "reason"), WITH_INDEX)
def test_gate_with_an_index(message: str, route: str, reason: str) -> None:
    assert should_use_rag(message, force_rag=False, has_indexes=True) == (route, reason)


@pytest.mark.parametrize("message", ["What does the contract say?", "hello", "who are you"])
def test_no_index_is_always_direct(message: str) -> None:
    assert should_use_rag(message, force_rag=False, has_indexes=False) == ("direct", "no_index")


@pytest.mark.parametrize("message", ["hello", "thanks!", "who are you", "What is in clause 4?"])
@pytest.mark.parametrize("has_indexes", [True, False])
def test_force_rag_always_wins(message: str, has_indexes: bool) -> None:
    assert should_use_rag(message, force_rag=True, has_indexes=has_indexes) == ("rag", "force_rag")
