"""Typed events the chat pipeline yields; `/chat` drains them, `/chat_stream` frames each as SSE."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from contract.answer import Answer


@dataclass
class Step:
    step: str
    label: str
    elapsed_ms: int
    method: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    name = "step"

    @property
    def data(self) -> dict:
        out: dict[str, Any] = {"step": self.step, "label": self.label, "elapsed_ms": self.elapsed_ms}
        if self.method:
            out["method"] = self.method
        if self.detail:
            out["detail"] = self.detail
        return out


@dataclass
class Documents:
    documents: list[dict]
    name = "documents"

    @property
    def data(self) -> dict:
        return {"documents": self.documents}


@dataclass
class Token:
    token: str
    name = "token"

    @property
    def data(self) -> dict:
        return {"token": self.token}


@dataclass
class Done:
    answer: Answer
    name = "done"

    @property
    def data(self) -> dict:
        return self.answer.model_dump(mode="json", exclude_unset=True)


@dataclass
class Error:
    error: str
    code: str
    status: int = 500
    name = "error"

    @property
    def data(self) -> dict:
        return {"error": self.error, "code": self.code}


Event = Step | Documents | Token | Done | Error
