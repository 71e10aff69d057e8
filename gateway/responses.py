"""What the gateway answers, typed once: the routes build their JSON through these models, and /api/openapi.json
is generated from them (gateway/openapi.py), so the document cannot drift from what is sent.

A value that does not fit its model is a bug that fails loudly (500) instead of reaching a client unchecked.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer

from contract.answer import Answer, Document, Step
from contract.answer import Message as ChatMessage

Json = dict[str, Any]


class Out(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def data(self) -> dict:
        """The JSON-ready dict a route sends."""
        return self.model_dump(mode="json")


def as_sent(value: BaseModel | list[BaseModel] | None) -> Any:
    """A contract model (the worker's answer, a document) as it was sent: the fields it set, no defaults added,
    so a stored answer reads back exactly as the worker's `done`."""
    if isinstance(value, list):
        return [as_sent(v) for v in value]
    return None if value is None else value.model_dump(mode="json", exclude_unset=True)


class ErrorBody(Out):
    """Every error: what went wrong in words, a machine code, and the field at fault when there is one."""

    model_config = ConfigDict(extra="allow")  # e.g. retry_after_s

    error: str
    code: str
    field: str | None = None


class UserOut(Out):
    id: int
    username: str
    is_admin: bool


class AccountOut(UserOut):
    disabled: bool
    created_at: str | None


class SignedIn(Out):
    """A sign-in: the token for scripts (the web gets it as the HttpOnly `rag_session` cookie as well)."""

    user: UserOut
    token: str


class SessionOut(Out):
    user: UserOut | None


class MessageOut(Out):
    """A stored message. A finished assistant message carries its `answer` whole (the worker's `done`, question,
    history and flags included); `documents`, `citations`, `rewritten`, `timings` and `details` are the older
    fields, derived from it (for a turn that did not finish: the documents it had, and `details.stopped`)."""

    id: int
    role: Literal["user", "assistant"]
    content: str = Field(description="the reply, or the text so far of a turn that did not finish")
    status: Literal["running", "complete", "interrupted", "failed"]
    error: str | None
    route: str | None
    gate: Json
    answer: Answer | None = Field(
        description="the finished answer; null while running or if it did not finish"
    )
    steps: list[Step]
    documents: list[Json]
    citations: list[Json]
    rewritten: str | None
    timings: Json
    details: Json
    created_at: str | None

    @field_serializer("answer", "steps")
    def _as_sent(self, value: Any) -> Any:
        return as_sent(value)


class ChatSummary(Out):
    id: int
    title: str | None
    created_at: str | None
    updated_at: str | None
    index_ids: list[int]
    datasets: list[str]


class ChatState(Out):
    """What the next turn sends the worker: the conversation, the documents in hand and the dataset scope."""

    history: list[ChatMessage]
    documents: list[Document]
    datasets: list[str]

    @field_serializer("history", "documents")
    def _as_sent(self, value: Any) -> Any:
        return as_sent(value)


class ChatFull(ChatSummary):
    messages: list[MessageOut]
    state: ChatState
    busy: bool


class TurnResult(Out):
    """`POST /api/chats/{id}/messages`: the finished turn; on failure (502/503) with the error fields too."""

    route: Json
    status: Literal["complete", "interrupted", "failed", "running"]
    user_message: MessageOut | None
    message: MessageOut | None
    title: str | None
    error: str | None = None
    code: str | None = None
    retry_after_s: int | None = None

    def data(self) -> dict:
        return self.model_dump(mode="json", exclude_unset=True)  # the error fields only on a failure


class StopResult(Out):
    status: Literal["running", "complete", "interrupted", "failed"]
    busy: bool
    message: MessageOut | None
    user_message: MessageOut | None


class DocumentOut(Out):
    id: int
    filename: str
    dataset: str
    document_id: str
    chunks: int
    bytes: int
    created_at: str | None


class UploadedDocument(DocumentOut):
    replaced: bool


class IndexOut(Out):
    id: int
    name: str
    description: str
    status: Literal["empty", "ready", "building", "failed"]
    document_count: int
    chunks: int
    created_at: str | None
    updated_at: str | None
    datasets: list[str]
    access: Literal["owner", "editor", "reader"] = Field(description="what the signed-in user may do with it")
    owner_id: int
    owner: str = Field(description="the owner's username")
    via: Literal["owner", "direct", "group", "everyone", "admin"] = Field(
        description="where the access comes from: the user owns it, a grant to them, a group, everyone, or "
        "administrator rights"
    )
    via_group: str | None = Field(default=None, description="the group's name when `via` is group")
    # Fixed when the index is made; the worker's table keeps them (docs/configuration.md, "Languages").
    embedder: str | None = Field(
        default=None,
        description="the embedding model of its passages: `default` (MiniLM) or `multilingual-e5-small`; null "
        "only on an index from before the gateway stored it, until the worker's marker has been read",
    )
    language: str | None = Field(
        default=None,
        description="the ISO 639-1 code of its full-text index's language (stemmer, or n-grams for zh/ja/ko); "
        "null as `embedder`",
    )


class IndexFull(IndexOut):
    documents: list[DocumentOut]


class SettingsOut(Out):
    options: Json
    # The worker's configuration (models, hosts, prompts), for administrators only.
    worker_defaults: Json | None = None
    # Models a turn may name besides the worker's own (set by administrators), and all it may name.
    allowed_models: list[str] = Field(default_factory=list)
    models: list[str] | None = None
    # The prompt presets' names (`options.prompt_preset`); their prompts for administrators only.
    presets: list[str] = Field(default_factory=list)
    prompt_presets: dict[str, dict[str, str]] | None = None


class Health(Out):
    model_config = ConfigDict(extra="allow")  # *_error details, the worker's own status

    status: Literal["ok", "down"]
    database: Literal["ok", "down"]
    worker: Literal["ok", "down", "degraded"]
    llm: Literal["ok", "down", "unknown"]
    llm_backend: str = Field(description="ollama, openai, local (the embedded model) or unknown")
    llm_model: str | None = None
    ollama: Literal["ok", "down", "unknown"] | None = None
    down: list[str] | None = None


class MemberOut(Out):
    id: int
    username: str


class GroupOut(Out):
    id: int
    name: str
    description: str
    created_at: str | None
    members: list[MemberOut]


class GrantOut(Out):
    """One share of an index: to whom (`subject_type`, `subject_id`, `subject_name`) and the role."""

    id: int
    index_id: int
    subject_type: Literal["user", "group", "everyone"]
    subject_id: int | None
    subject_name: str
    role: Literal["reader", "editor"]
    created_at: str | None


class AuditOut(Out):
    id: int
    at: str | None
    actor_id: int | None
    actor_name: str | None
    action: str
    object_type: str
    object_id: str
    detail: Json
    address: str | None


class AuditPage(Out):
    """One page of the audit log, newest first; `next_before` is the `before` of the next (older) page."""

    events: list[AuditOut]
    next_before: int | None
