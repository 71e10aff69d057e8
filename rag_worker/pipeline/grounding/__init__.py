"""Grounding: is the answer backed by the sources, and what a turn does when it is not.

- `sentences`: the sentences of an answer and of a passage, and their content words.
- `check`: each answer sentence scored against the passages the model read (and citations corrected).
- `quotes`: the extractive answer, quoting the passage sentences that best answer the question.
- `policy`: flag, extract or refuse; `Grounder` is the one entry point the chat pipeline calls.
"""

from .policy import Grounder

__all__ = ["Grounder"]
