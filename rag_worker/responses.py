"""What the worker answers, as pydantic models: the source of /openapi.json and of what clients may rely on.

Every model allows extra fields: a new field (e.g. a grounding verdict on the answer) is added here as one
typed line, and until then it still passes through, so adding to the contract never breaks a client.
Requests live in schemas.py; openapi.py assembles both into the document.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from contract.answer import Answer


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorBody(_Open):
    error: str = Field(description="what is wrong, for a human")
    code: str = Field(description="machine code, e.g. index_not_found, invalid_field, too_large")
    field: str | None = Field(default=None, description="the request field at fault, when there is one")


class Title(_Open):
    title: str


class Added(_Open):
    index: str = Field(description="the index the file went into")
    filename: str
    dataset: str
    document_id: str = Field(description="sha256 of the file's bytes")
    chunks: int
    replaced: bool = Field(description="an older file of the same name was replaced")
    unchanged: bool = Field(default=False, description="identical bytes were already indexed: nothing done")


class FileInfo(_Open):
    filename: str
    dataset: str
    document_id: str
    chunks: int
    bytes: int | None = None
    indexed_at: str | None = None


class Deleted(_Open):
    count: int = Field(description="chunks removed")


class IndexCreated(_Open):
    index: str
    created: bool
    embedder: str
    language: str


class IndexSettings(_Open):
    index: str
    embedder: str
    language: str


class Dropped(_Open):
    index: str
    dropped: bool


class Health(_Open):
    status: Literal["ok", "degraded", "down"]
    llm: dict[str, Any] | None = None
    embedder: dict[str, Any] | None = None
    store: dict[str, Any] | None = None
    reranker: dict[str, Any] | None = None
    degraded: list[str] | None = Field(
        default=None,
        description="parts working less well (e.g. a reranker that cannot load): turns still answer",
    )


class Config(_Open):
    settings: dict[str, Any]
    defaults: dict[str, Any]
    prompts: dict[str, str]


class ModelCard(_Open):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(_Open):
    object: Literal["list"]
    data: list[ModelCard]


class OpenAIErrorDetail(_Open):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIError(_Open):
    error: OpenAIErrorDetail


class CompletionMessage(_Open):
    role: Literal["assistant"]
    content: str


class CompletionChoice(_Open):
    index: int
    message: CompletionMessage
    finish_reason: str


class ChatCompletion(_Open):
    """`POST /v1/chat/completions` without `stream`; the structured answer (with `steps`) is under `rag`."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    rag: Answer
