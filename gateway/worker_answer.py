"""The worker's answer (its `done` event), validated once when it arrives, then used as typed attributes.

The worker's contract (WORKER_API.md, its /openapi.json) says what the answer holds; fields the gateway does
not use pass through untouched (extra="allow"), so the worker can add to its answer without a gateway change.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class WorkerMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["user", "assistant", "system"]
    content: str


class WorkerAnswer(BaseModel):
    model_config = ConfigDict(extra="allow")

    reply: str
    history: list[WorkerMessage]
    documents: list[dict[str, Any]]
    citations: list[dict[str, Any]] = Field(default_factory=list)
    rewritten: str | None = None
    route: Literal["rag", "direct", "sql"]
    timings: dict[str, int] = Field(default_factory=dict)
    model: str | None = None
    abstained: bool = False
    fetched_new_documents: bool = False
    # The per-sentence grounding check (issue 16); the web marks the stored answer with it.
    grounding: dict[str, Any] | None = None

    @property
    def details(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "abstained": self.abstained,
            "fetched_new_documents": self.fetched_new_documents,
            "grounding": self.grounding,
        }

    def history_json(self) -> list[dict]:
        return [m.model_dump() for m in self.history]


def read_answer(data: object) -> tuple[WorkerAnswer | None, str | None]:
    """The answer, or None and what is wrong with it (the worker broke its contract)."""
    try:
        return WorkerAnswer.model_validate(data), None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the answer"
        return None, f"the worker's answer does not match its contract: {where}: {first['msg']}"
