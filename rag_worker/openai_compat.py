"""OpenAI's chat-completions protocol over the chat pipeline: requests in, completions and chunks out.

Most chat front-ends and agent frameworks speak this protocol, so the worker offers each index as a model
(`rag/<index>`, plus `direct` for no retrieval). The translation is pure: an OpenAI request becomes a
`ChatRequest`, the pipeline's events become a completion or `chat.completion.chunk`s. The answer keeps its
`[S1]` citations and ends with a short sources list a plain client can show; everything our own clients use
(documents, steps, rewritten question, abstention, citations...) rides in the extension field `rag`.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from contract.answer import Answer

from .errors import ApiError, BadRequest, NotFound
from .names import is_name
from .pipeline.events import Documents, Done, Error, Event, Step, Token
from .schemas import ChatRequest, Document, Name, Options, StopSequence, int_between, parse
from .services import Services

DIRECT = "direct"
RAG_PREFIX = "rag/"
EXTENSION = "rag"  # the field carrying our structured answer on the last chunk and on the completion
MAX_TOKENS_CAP = 8192  # the pipeline's own limit; a larger max_tokens is an upper bound it never reaches
SOURCES_HEADING = "Sources:"
_SOURCES_TAIL = re.compile(r"\n\nSources:\n(?:\[S\d+\][^\n]*(?:\n|$))+\s*$")


class _Lenient(BaseModel):
    # OpenAI clients send many fields we have no use for (top_p, tools, user, ...): ignored, not refused.
    model_config = ConfigDict(extra="ignore", strict=True)


class ChatCompletionMessage(_Lenient):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict[str, Any]] | None = None

    @property
    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        texts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise BadRequest(
                    f"only text content parts are supported, not {str(part.get('type'))[:40]!r}",
                    code="invalid_field",
                    field="messages",
                )
            texts.append(part["text"])
        return "\n".join(texts)


class ChatCompletionRequest(_Lenient):
    """`POST /v1/chat/completions`; `datasets`, `docs` and `options` are ours (an SDK's `extra_body`)."""

    model: str = Field(min_length=1, max_length=200)
    messages: list[ChatCompletionMessage] = Field(
        min_length=1, json_schema_extra={"contains": {"properties": {"role": {"const": "user"}}}}
    )
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    max_tokens: int_between(1) | None = None
    max_completion_tokens: int_between(1) | None = None
    stop: StopSequence | Annotated[list[StopSequence], Field(max_length=4)] | None = None
    n: int_between(1, 1) | None = Field(default=None, description="only one choice is generated")
    datasets: list[Name] = Field(default_factory=list)
    docs: list[Document] = Field(default_factory=list)
    options: Options | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: str | list[str] | None) -> list[str] | None:
        return ([value] if isinstance(value, str) else value) or None


def model_ids(services: Services) -> list[str]:
    return [DIRECT, *(f"{RAG_PREFIX}{name}" for name in services.store.indexes())]


def model_card(model: str, created: int) -> dict:
    return {"id": model, "object": "model", "created": created, "owned_by": "rag-worker"}


def _model_not_found(model: str) -> NotFound:
    return NotFound(
        f"The model `{model[:200]}` does not exist: GET /v1/models lists `direct` and `rag/<index>` for each index",
        code="model_not_found",
        field="model",
    )


def index_of(services: Services, model: str) -> str | None:
    """The index a model name searches (None for `direct`); 404 in OpenAI's words for any other name."""
    if model == DIRECT:
        return None
    index = model.removeprefix(RAG_PREFIX)
    if model.startswith(RAG_PREFIX) and is_name(index) and services.store.exists(index):
        return index
    raise _model_not_found(model)


def strip_sources(text: str) -> str:
    """An assistant message without the sources list this API appended to it (the model need not reread it)."""
    return _SOURCES_TAIL.sub("", text)


def to_chat_request(services: Services, req: ChatCompletionRequest) -> ChatRequest:
    """The pipeline's request: the last user message is the prompt, the messages before it the history."""
    index = index_of(services, req.model)
    # The last user message is the question; anything after it (a system note, say) is context before it.
    at = max((i for i, m in enumerate(req.messages) if m.role == "user"), default=-1)
    if at < 0 or not req.messages[at].text.strip():
        raise BadRequest(
            "the conversation needs a user message with text: the last one is the question",
            code="invalid_field",
            field="messages",
        )
    last = req.messages[at]
    earlier = req.messages[:at] + req.messages[at + 1 :]
    history = [
        {
            "role": "system" if m.role == "developer" else m.role,
            "content": strip_sources(m.text) if m.role == "assistant" else m.text,
        }
        for m in earlier
    ]
    options = req.options or Options()
    update: dict[str, Any] = {}
    if index is None:
        update["route"] = "direct"
    if req.temperature is not None:
        update["temperature"] = req.temperature
    limit = req.max_completion_tokens or req.max_tokens
    if limit is not None:
        update["max_tokens"] = min(limit, MAX_TOKENS_CAP)
    if req.stop:
        update["stop"] = req.stop
    body = {
        "prompt": last.text,
        "history": history,
        "docs": [] if index is None else [d.model_dump() for d in req.docs],
        "datasets": req.datasets,
        "index": index or "default",
        "options": options.model_copy(update=update).model_dump(exclude_none=True),
    }
    return parse(ChatRequest, body)


# -- answers -----------------------------------------------------------------------------------------------


def sources_list(answer: Answer | None) -> str:
    """`Sources:` and one line per cited document, for clients that show only the text."""
    if answer is None:
        return ""
    cited = {c.ref for c in answer.citations}
    lines = []
    for doc in answer.documents:
        if doc.ref in cited:
            where = doc.filename or doc.id
            if doc.page is not None:
                where = f"{where}, page {doc.page}"
            lines.append(f"[{doc.ref}] {where}")
    return f"\n\n{SOURCES_HEADING}\n" + "\n".join(lines) if lines else ""


class Collector:
    """Follows the pipeline's events: the steps seen, then the answer (or the error)."""

    def __init__(self) -> None:
        self.steps: list[dict] = []
        self.done: Done | None = None

    @property
    def answer(self) -> Answer | None:
        return self.done.answer if self.done else None

    def see(self, event: Event) -> None:
        if isinstance(event, Step):
            self.steps.append(event.data)
        elif isinstance(event, Done):
            self.done = event

    def extension(self) -> dict:
        return {**(self.done.data if self.done else {}), "steps": self.steps}


def completion(model: str, events: Iterable[Event]) -> dict:
    """Drain the pipeline into one `chat.completion`; an error event becomes the HTTP error it describes."""
    seen = Collector()
    for event in events:
        if isinstance(event, Error):
            raise ApiError(event.error, code=event.code, status=event.status if event.status >= 400 else 500)
        seen.see(event)
    content = (seen.answer.reply if seen.answer else "") + sources_list(seen.answer)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        EXTENSION: seen.extension(),
    }


def data_frame(payload: object) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def chunks(model: str, events: Iterable[Event]) -> Iterator[str]:
    """The pipeline as `data: {chat.completion.chunk}` frames, ending with `data: [DONE]` (or an error)."""
    head = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
    }

    def chunk(delta: dict, finish: str | None = None, **extra: Any) -> str:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return data_frame({**head, "model": model, "choices": [choice], **extra})

    seen = Collector()
    yield chunk({"role": "assistant", "content": ""})
    for event in events:
        seen.see(event)
        if isinstance(event, Token):
            yield chunk({"content": event.token})
        elif isinstance(event, Error):
            yield data_frame(error_body(event.status, event.error, event.code))
            return
        elif isinstance(event, Documents | Step):
            continue
    tail = sources_list(seen.answer)
    if tail:
        yield chunk({"content": tail})
    yield chunk({}, "stop", **{EXTENSION: seen.extension()})
    yield "data: [DONE]\n\n"


# -- errors ------------------------------------------------------------------------------------------------


def error_body(status: int, message: str, code: str | None, param: str | None = None) -> dict:
    """OpenAI's error shape: `{"error": {"message", "type", "param", "code"}}`."""
    if status == 401:
        kind, code = "invalid_request_error", "invalid_api_key"
    elif status >= 500:
        kind = "server_error"
    else:
        kind = "invalid_request_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def is_openai_path(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/")
