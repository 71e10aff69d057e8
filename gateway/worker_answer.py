"""The worker's answer (its `done` event), read once into the contract's `Answer` when it arrives.

What the answer holds is `contract.answer.Answer` (the worker's /openapi.json is generated from it); fields the
gateway does not type pass through untouched (extra="allow"), so the worker can add to its answer without a
gateway change. An answer that breaks the contract is an error with a clear message, never a half-stored turn.
"""

from __future__ import annotations

from pydantic import ValidationError

from contract.answer import Answer


def read_answer(data: object) -> tuple[Answer | None, str | None]:
    """The answer, or None and what is wrong with it (the worker broke its contract)."""
    try:
        return Answer.model_validate(data), None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the answer"
        return None, f"the worker's answer does not match its contract: {where}: {first['msg']}"
