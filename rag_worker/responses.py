"""What the worker answers, as pydantic models: the source of /openapi.json and of what clients may rely on.

Every model allows extra fields: a new field (e.g. a grounding verdict on the answer) is added here as one
typed line, and until then it still passes through, so adding to the contract never breaks a client.
Requests live in schemas.py; openapi.py assembles both into the document.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .schemas import Document, Message


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorBody(_Open):
    error: str = Field(description="what is wrong, for a human")
    code: str = Field(description="machine code, e.g. index_not_found, invalid_field, too_large")
    field: str | None = Field(default=None, description="the request field at fault, when there is one")


class Citation(_Open):
    ref: str
    id: str
    filename: str
    page: int | None = None


class GroundedSentence(_Open):
    text: str
    label: Literal["supported", "weak", "unsupported"]
    score: float
    refs: list[str] = Field(default_factory=list)


class Grounding(_Open):
    """Each answer sentence checked against the passages the model read (pipeline/grounding.py)."""

    supported_share: float = Field(ge=0, le=1)
    supported: int
    checked: int
    policy: Literal["flag", "extract", "refuse"] | None = None
    answer_mode: Literal["generated", "extractive"] | None = None
    action: Literal["none", "flagged", "extracted", "refused"] | None = None
    sentences: list[GroundedSentence]


class Answer(_Open):
    """`POST /chat`'s answer and the `done` event of `/chat_stream`."""

    reply: str
    question: str
    rewritten: str | None = None
    history: list[Message] = Field(description="send it back unchanged next turn")
    documents: list[Document]
    fetched_new_documents: bool
    route: Literal["rag", "direct", "sql"]
    citations: list[Citation]
    abstained: bool
    model: str
    llm_backend: str | None = None
    flags: dict[str, Any] = Field(default_factory=dict)
    timings: dict[str, int] = Field(default_factory=dict)
    grounding: Grounding | None = Field(
        default=None, description="null: no sources (direct or sql route, or abstained)"
    )


class Step(_Open):
    step: str
    label: str
    elapsed_ms: int
    method: str | None = Field(
        default=None, description="which path decided: retrieval_score, similarity, llm, ..."
    )
    detail: dict[str, Any] | None = None


class Title(_Open):
    title: str


class Added(_Open):
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


class Dropped(_Open):
    index: str
    dropped: bool


class Health(_Open):
    status: Literal["ok", "degraded", "down"]
    llm: dict[str, Any] | None = None
    embedder: dict[str, Any] | None = None
    store: dict[str, Any] | None = None


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
