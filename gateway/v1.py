"""The gateway's OpenAI-compatible surface: `GET /v1/models` and `POST /v1/chat/completions`, per user.

A program holding one of its user's API keys (or a session token) talks to the gateway as it would to OpenAI;
it never needs the worker's key, which reads every index of every user. The models are the worker's names for
them (docs/design/WORKER_API.md): `direct` (no retrieval) and `rag/<index>` for each index the user can read
now, `<index>` being the index's worker table name (`u7_handbook_3f9a1c2b`: unique, and kept across renames);
each model card also carries the index's own `name`, `index_id` and its owner as `owned_by`. Any other model,
another user's index among them, is a 404 that names no index.

A completion goes through the layer-1 gate (gateway/gate.py, as a web turn does): smalltalk over an index is
answered directly, anything else searches the index. It then goes to the worker's own `/v1/chat/completions`
with the administrator's turn defaults and the allowed options (gateway/policy.py), and the worker's answer is
relayed as it comes: the text keeps its `[S1]` marks and ends with a `Sources:` list, and the structured answer
(documents, citations, steps) rides in the extension field `rag` (of the last chunk when streaming). A turn
holds one of the user's running-turn slots (MAX_TURNS_PER_USER) like a web turn. Errors come in OpenAI's shape
`{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from sqlmodel import Session, col, select
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Match, Route

from . import access
from .context import ctx, current_user, in_thread, read_json
from .db import Index, User
from .errors import ApiError, BadRequest, NotFound, WorkerFailed, from_validation_error
from .gate import should_use_rag
from .keys import aware
from .policy import allowed_turn
from .responses import Out
from .routing import WORKER, ApiRoute, Operation
from .schemas import DatasetName, StopSequence, TurnChoice, TurnRequest, _dataset_names
from .sse import SSE_HEADERS
from .streams import send_once_more, unreachable
from .turns.plan import default_options, trim_history
from .turns.running import release_v1, take_v1

log = logging.getLogger("gateway.v1")

DIRECT = "direct"
RAG_PREFIX = "rag/"


# -- which indexes a user can read --------------------------------------------------------------------------


def readable_indexes(s: Session, user: User) -> list[Index]:
    """The indexes `user` may read now (gateway/access.py: owned, granted directly, through a group, to
    everyone; an administrator reads every index): GET /v1/models lists them, a completion may name only them."""
    return [a.index for a in access.readable_indexes(s, user)]


def model_id(index: Index) -> str:
    return f"{RAG_PREFIX}{index.worker_name}"


# -- errors in OpenAI's shape -------------------------------------------------------------------------------


class OpenAIErrorDetail(Out):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIError(Out):
    """Every /v1 error, as OpenAI sends it."""

    error: OpenAIErrorDetail


def openai_error(status: int, message: str, code: str | None, param: str | None = None, headers=None):
    kind = "server_error" if status >= 500 else "invalid_request_error"
    body = OpenAIError(error=OpenAIErrorDetail(message=message, type=kind, param=param, code=code))
    return JSONResponse(body.data(), status_code=status, headers=headers)


def openai_errors(
    endpoint: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """The route's errors (the gateway's own, a bad body) rendered in OpenAI's shape."""

    @functools.wraps(endpoint)
    async def wrapped(request: Request) -> Response:
        try:
            return await endpoint(request)
        except ApiError as err:
            return openai_error(err.status, err.message, err.code, err.field, err.headers)
        except ValidationError as exc:
            err = from_validation_error(exc)
            return openai_error(err.status, err.message, err.code, err.field)

    return wrapped


def model_not_found(model: str) -> NotFound:
    return NotFound(
        f"The model `{model[:200]}` does not exist: GET /v1/models lists `direct` and `rag/<index>` for each "
        "index you can read",
        code="model_not_found",
        field="model",
    )


# -- models -------------------------------------------------------------------------------------------------


class ModelCard(Out):
    model_config = ConfigDict(extra="allow")

    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    name: str | None = Field(default=None, description="the index's name (not on `direct`)")
    index_id: int | None = None


class ModelList(BaseModel):  # not an Out: its `data` field is OpenAI's, and would hide Out.data()
    model_config = ConfigDict(extra="forbid")

    object: Literal["list"]
    data: list[ModelCard]


def _cards(s: Session, user: User) -> list[dict]:
    indexes = readable_indexes(s, user)
    owner_ids = {i.owner_id for i in indexes}
    owners = (
        {u.id: u.username for u in s.exec(select(User).where(col(User.id).in_(owner_ids)))}
        if owner_ids
        else {}
    )
    cards = [ModelCard(id=DIRECT, object="model", created=0, owned_by="rag-gateway").data()]
    for index in indexes:
        card = ModelCard(
            id=model_id(index),
            object="model",
            created=int(aware(index.created_at).timestamp()),
            owned_by=owners.get(index.owner_id, ""),
            name=index.name,
            index_id=index.id,
        )
        cards.append(card.data())
    return cards


@openai_errors
async def list_models(request: Request) -> Response:
    user, c = await current_user(request), ctx(request)

    def load() -> list[dict]:
        with c.db.session() as s:
            return _cards(s, user)

    models = ModelList(object="list", data=await in_thread(load))
    return JSONResponse(models.model_dump(mode="json", exclude_none=True))


@openai_errors
async def get_model(request: Request) -> Response:
    user, c, model = await current_user(request), ctx(request), request.path_params["model"]

    def load() -> dict | None:
        with c.db.session() as s:
            return next((card for card in _cards(s, user) if card["id"] == model), None)

    card = await in_thread(load)
    if card is None:
        raise model_not_found(model)
    return JSONResponse(card)


# -- completions --------------------------------------------------------------------------------------------


class TextPart(BaseModel):
    """One part of a message's content: text only (images and audio are not read here)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    type: Literal["text"]
    text: str


class CompletionMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None

    @property
    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "\n".join(part.text for part in self.content)


# At least one user message with text: the last such is the question.
ASKS = {
    "contains": {
        "type": "object",
        "required": ["role", "content"],
        "properties": {"role": {"const": "user"}, "content": {"type": "string", "pattern": r"\S"}},
    }
}


class CompletionRequest(BaseModel):
    """OpenAI's chat-completions request. Fields OpenAI clients send that have no use here (top_p, user,
    tools...) are ignored, as OpenAI-compatible servers do; `datasets` and `options` (a turn's options, as on
    `/api/chats/{id}/messages`) are ours, sent as an SDK's `extra_body`."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str = Field(min_length=1, max_length=200)
    messages: list[CompletionMessage] = Field(min_length=1, max_length=1000, json_schema_extra=ASKS)
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: StopSequence | Annotated[list[StopSequence], Field(max_length=4)] | None = None
    n: int | None = Field(default=None, ge=1, le=1, description="only one choice is generated")
    datasets: list[DatasetName] = Field(default_factory=list, max_length=100)
    options: TurnChoice | None = None

    _check_datasets = field_validator("datasets")(_dataset_names)


def _conversation(c, body: CompletionRequest) -> tuple[str, list[dict]]:
    """The question (the last user message with text, within MAX_MESSAGE_CHARS) and the messages the worker gets:
    empty user messages left out (they say nothing), the ones before the question trimmed to what the worker
    takes (MAX_HISTORY_MESSAGES, MAX_HISTORY_CHARS; the oldest go first), as for a web turn."""
    said = [m for m in body.messages if m.role != "user" or m.text.strip()]
    at = max((i for i, m in enumerate(said) if m.role == "user"), default=-1)
    if at < 0:
        raise BadRequest(
            "the conversation needs a user message with text: the last one is the question",
            code="invalid_field",
            field="messages",
        )
    question = said[at].text
    settings = c.settings
    if len(question) > settings.max_message_chars:
        raise BadRequest(
            f"the question is longer than {settings.max_message_chars} characters",
            code="too_long",
            field="messages",
        )
    dumped = [m.model_dump(exclude_none=True) for m in said]
    before = trim_history(dumped[:at], settings.max_history_messages, settings.max_history_chars)
    return question, [*before, *dumped[at:]]


def _resolve(c, user: User, model: str) -> tuple[Index | None, dict]:
    """The index the model names, if the user can read it (else a 404), and the turn defaults."""
    with c.db.session() as s:
        defaults = default_options(s)
        if model == DIRECT:
            return None, defaults
        if model.startswith(RAG_PREFIX):
            name = model.removeprefix(RAG_PREFIX)
            for index in readable_indexes(s, user):
                if index.worker_name == name:
                    return index, defaults
    raise model_not_found(model)


def _options(c, body: CompletionRequest) -> TurnChoice:
    """The request's generation settings folded into a turn's options (OpenAI's top-level fields win). OpenAI's
    `max_tokens` is an upper bound: one above this server's MAX_TOKENS is that (clients send large ones)."""
    update: dict[str, Any] = {}
    if body.temperature is not None:
        update["temperature"] = body.temperature
    limit = body.max_completion_tokens or body.max_tokens
    if limit is not None:
        update["max_tokens"] = min(limit, c.settings.max_tokens)
    if body.stop is not None:
        update["stop"] = [body.stop] if isinstance(body.stop, str) else body.stop
    options = body.options or TurnChoice()
    try:
        return TurnChoice.model_validate({**options.model_dump(exclude_none=True), **update})
    except ValidationError as exc:  # a top-level value outside the turn's ranges (max_tokens over 8192)
        raise from_validation_error(exc) from None


@openai_errors
async def chat_completions(request: Request) -> Response:
    user, c = await current_user(request), ctx(request)
    body = await read_json(request, CompletionRequest)
    question, messages = _conversation(c, body)
    # The same checks as a web turn's: this server's limits, the models and prompts an administrator allows.
    turn = await allowed_turn(c, user, TurnRequest(message=question, options=_options(c, body)))
    index, defaults = await in_thread(_resolve, c, user, body.model)
    if index is not None and index.document_count == 0:
        index = None  # as for a web turn: an index with no documents yet has nothing to search (nor a table)
    route, _reason = should_use_rag(question, force_rag=False, has_indexes=index is not None)
    options = {**defaults, **(turn.options.as_options() if turn.options else {})}
    options.pop("prompt_preset", None)
    options["route"] = "direct" if route == "direct" else "auto"
    payload: dict[str, Any] = {
        "model": model_id(index) if index is not None else DIRECT,
        "messages": messages,
        "stream": body.stream,
        "datasets": body.datasets,
        "options": options,
    }
    # MAX_TURNS_PER_USER, shared with the user's chat turns: a row counted in the database on any process.
    turn_id = await in_thread(take_v1, c, user.id)
    try:
        resp = await _send(c, payload)
    except BaseException:
        await in_thread(release_v1, c, turn_id)
        raise
    if not body.stream:
        try:
            raw = await resp.aread()
        except httpx.HTTPError as exc:
            raise WorkerFailed(f"the worker's answer could not be read ({type(exc).__name__})") from None
        finally:
            await resp.aclose()
            await in_thread(release_v1, c, turn_id)
        return Response(raw, media_type="application/json")

    async def relay() -> AsyncIterator[bytes]:
        try:
            async for chunk in resp.aiter_raw():
                yield chunk
        except httpx.HTTPError as exc:  # the worker went away mid-answer: say so in the stream, as it would
            log.warning("the worker's /v1 stream broke: %s", type(exc).__name__)
            error = OpenAIError(
                error=OpenAIErrorDetail(
                    message=f"the worker stream broke ({type(exc).__name__})",
                    type="server_error",
                    code="worker_unavailable",
                )
            )
            yield f"\n\ndata: {json.dumps(error.data())}\n\n".encode()

    async def close() -> None:
        try:
            await resp.aclose()
        finally:
            await in_thread(release_v1, c, turn_id)

    return StreamingResponse(
        relay(), media_type="text/event-stream", headers=SSE_HEADERS, background=BackgroundTask(close)
    )


async def _send(c, payload: dict) -> httpx.Response:
    """The worker's /v1/chat/completions, opened; its refusal is passed on in OpenAI's shape (the worker speaks
    it), a failure of the worker itself is a 502/503."""
    http = c.worker.http
    request = http.build_request("POST", "/v1/chat/completions", json=payload)
    try:
        resp = await send_once_more(http, request, retry=False)
    except httpx.TransportError as exc:
        raise unreachable(c.settings.worker_url, exc) from None
    if resp.status_code < 400:
        return resp
    try:
        raw = await resp.aread()
    finally:
        await resp.aclose()
    try:
        detail = json.loads(raw)["error"]
        message, code, param = str(detail["message"]), detail.get("code"), detail.get("param")
    except (ValueError, KeyError, TypeError):
        message, code, param = f"the worker answered HTTP {resp.status_code}", "worker_error", None
    if resp.status_code in (401, 403):  # the gateway's WORKER_API_KEY is wrong: not the caller's fault
        log.error("the worker refused the gateway's key on /v1/chat/completions: %s", message)
        raise WorkerFailed("the gateway could not authenticate with the worker", code="worker_error")
    headers = {"Retry-After": resp.headers["Retry-After"]} if "Retry-After" in resp.headers else None
    raise ApiError(message, code=code, field=param, status=resp.status_code, headers=headers)


# -- routes -------------------------------------------------------------------------------------------------


async def v1_fallback(request: Request) -> Response:
    """Any other /v1 request: OpenAI's 405 (with `Allow`) for a known path, else its 404."""
    allowed: set[str] = set()
    for route in routes:
        match, _ = route.matches(request.scope)
        if match == Match.PARTIAL:
            allowed |= route.methods or set()
    if allowed:
        names = ", ".join(sorted(allowed))
        message = f"{request.method} is not allowed here (allowed: {names})"
        return openai_error(405, message, "method_not_allowed", headers={"Allow": names})
    return openai_error(404, f"no such route: {request.url.path}", "not_found")


class Completion(Out):
    """`POST /v1/chat/completions` without `stream`: OpenAI's completion, the structured answer under `rag`."""

    model_config = ConfigDict(extra="allow")

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[dict[str, Any]]
    rag: dict[str, Any] = Field(description="the worker's answer: reply, documents, citations, steps...")


COMPLETION_CHUNKS = {
    "text/event-stream": {
        "schema": {
            "type": "string",
            "description": "`data: {chat.completion.chunk}` frames, the last one carrying `rag` (the answer), "
            "then `data: [DONE]`",
        }
    }
}
MODEL_PARAM = {"model": {"type": "string", "minLength": 1, "maxLength": 200}}

routes = [
    ApiRoute(
        "GET",
        "/v1/models",
        list_models,
        Operation(
            "OpenAI's model list: `direct` and `rag/<index>` for each index you can read",
            answer=ModelList,
            error=OpenAIError,
            tag="openai",
        ),
    ),
    ApiRoute(
        "GET",
        "/v1/models/{model:path}",
        get_model,
        Operation(
            "One model of your list",
            answer=ModelCard,
            errors=(404,),
            error=OpenAIError,
            params=MODEL_PARAM,
            tag="openai",
        ),
    ),
    ApiRoute(
        "POST",
        "/v1/chat/completions",
        chat_completions,
        Operation(
            "OpenAI chat completion over one of your indexes (`stream: true`: chunks, then [DONE]); the answer "
            "carries its citations in `rag`",
            CompletionRequest,
            Completion,
            also=COMPLETION_CHUNKS,
            errors=(404, 409, 429, *WORKER),
            error=OpenAIError,
            tag="openai",
        ),
    ),
]
METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
fallback = Route("/v1/{rest:path}", v1_fallback, methods=METHODS)
