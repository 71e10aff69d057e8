"""The worker's contract (WORKER_API.md), machine-readable, generated from the pydantic models the routes use.

Nothing here describes a body by hand: requests come from schemas.py (and the routes' own request models),
answers from responses.py. A route is one `Operation` in ROUTES; its models end up in `components`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from contract.answer import Answer, Step

from . import __version__
from .names import FILENAME_PATTERN, NAME_RE
from .openai_compat import ChatCompletionRequest
from .responses import (
    Added,
    ChatCompletion,
    Config,
    Deleted,
    Dropped,
    ErrorBody,
    FileInfo,
    Health,
    ModelCard,
    ModelList,
    OpenAIError,
    Title,
)
from .schemas import ChatRequest, TitleRequest

REF = "#/components/schemas/{model}"
NAME_SCHEMA = {"type": "string", "pattern": NAME_RE.pattern}
FILENAME_SCHEMA = {"type": "string", "pattern": FILENAME_PATTERN, "maxLength": 255}


def _sse(description: str, events: list[str] | None = None) -> dict:
    """A text/event-stream; its schema describes one event (`event` name, `data` one line of JSON)."""
    event: dict[str, Any] = {"type": "string"}
    if events:
        event["enum"] = events
    schema = {
        "type": "object",
        "description": description,
        "required": ["data"],
        "properties": {"event": event, "data": {"type": "string", "contentMediaType": "application/json"}},
    }
    return {"text/event-stream": {"schema": schema}}


CHAT_EVENTS = _sse(
    "step (Step), documents {documents: [Document]}, token {token}, done (Answer) or error (ErrorBody); "
    "': keepalive' comments at least every 15 s",
    ["step", "documents", "token", "done", "error"],
)
INDEX_EVENTS = _sse(
    "progress {file, dataset, done, total, stage} (stage ocr: one per scanned page read, with ocr {page, done, "
    "total}), then done {documents, chunks, seconds, unchanged, failed} or error (ErrorBody)",
    ["progress", "done", "error"],
)
COMPLETION_CHUNKS = _sse("chat.completion.chunk objects, the last one carrying `rag` (Answer), then [DONE]")


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    summary: str
    body: type[BaseModel] | dict | None = None  # a model (JSON) or a raw multipart schema
    answer: type[BaseModel] | list[type[BaseModel]] | dict | None = (
        None  # model, [model] for a list, or content
    )
    also: dict | None = None  # another content type for the 200 (a stream)
    errors: tuple[int, ...] = (400,)
    params: tuple[dict, ...] = ()
    error: type[BaseModel] = ErrorBody
    open: bool = False  # no key needed
    extra: dict[str, Any] = field(default_factory=dict)


def _query(name: str, required: bool = True, schema: dict | None = None) -> dict:
    return {"name": name, "in": "query", "required": required, "schema": schema or NAME_SCHEMA}


def _routes() -> list[Operation]:
    from .routes.documents import DeleteRequest, IndexRequest

    index_q = _query("index", required=False)
    upload = {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "required": ["file"],
                "properties": {
                    "file": {"type": "string", "format": "binary"},
                    "dataset": NAME_SCHEMA,
                    "index": NAME_SCHEMA,
                    # The file's name, when the multipart header can't carry it verbatim (it wins over it).
                    "filename": FILENAME_SCHEMA,
                },
            }
        }
    }
    chat_errors = (400, 404, 409, 413, 503)
    return [
        Operation(
            "post", "/chat", "One chat turn, answered as JSON", ChatRequest, Answer, errors=chat_errors
        ),
        Operation(
            "post",
            "/chat_stream",
            "One chat turn, streamed as Server-Sent Events",
            ChatRequest,
            CHAT_EVENTS,
            # 503 code "busy" (with Retry-After) when MAX_QUEUED_TURNS turns already wait.
            errors=chat_errors,
        ),
        Operation(
            "post", "/create_title", "A short title for a chat", TitleRequest, Title, errors=(400, 503)
        ),
        Operation(
            "post",
            "/add_document",
            "Upload and index one file",
            upload,
            Added,
            # With `Accept: text/event-stream`: progress as each stage starts, then done (the JSON answer).
            also=_sse(
                "progress {file, dataset, stage, done, total} as each stage starts (converting, chunking, "
                "embedding, writing; ocr after each scanned page read, with ocr {page, done, total}), then done "
                "(Added) or error (ErrorBody)",
                ["progress", "done", "error"],
            ),
            # 422: the file broke CONVERT_MAX_MEMORY_MB / CONVERT_TIMEOUT_S or could not be converted.
            errors=(400, 404, 409, 413, 415, 422),
        ),
        Operation(
            "get",
            "/get_documents",
            "Files of an index",
            answer=[FileInfo],
            params=(index_q,),
            errors=(400, 404),
        ),
        Operation(
            "get",
            "/get_datasets",
            "Dataset names of an index",
            answer={"application/json": {"schema": {"type": "array", "items": {"type": "string"}}}},
            params=(index_q,),
            errors=(400, 404),
        ),
        Operation(
            "get",
            "/get_document",
            "Download an original file (always an attachment)",
            answer={"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
            params=(
                index_q,
                _query("dataset", False),
                _query("filename", True, FILENAME_SCHEMA),
            ),
            errors=(400, 404),
        ),
        Operation(
            "post",
            "/delete",
            "Remove one file: its rows, vectors and full-text entries",
            DeleteRequest,
            Deleted,
            errors=(400, 404),
        ),
        Operation(
            "post",
            "/index",
            "(Re)build an index from shared_uploads/<index>/",
            IndexRequest,
            INDEX_EVENTS,
            errors=(400, 404, 409),
        ),
        Operation(
            "delete",
            "/indexes/{index}",
            "Drop an index and its overviews",
            answer=Dropped,
            params=({"name": "index", "in": "path", "required": True, "schema": NAME_SCHEMA},),
            errors=(400, 404),
        ),
        Operation("get", "/config", "Effective defaults, secrets redacted", answer=Config, errors=()),
        Operation(
            "get",
            "/health",
            "Readiness of the LLM, embedder and store (503 when not ready)",
            answer=Health,
            errors=(503,),
            open=True,
        ),
        Operation(
            "get",
            "/openapi.json",
            "This document",
            answer={"application/json": {"schema": {"type": "object"}}},
            errors=(),
        ),
        Operation(
            "get",
            "/v1/models",
            "OpenAI model list: `direct` and `rag/<index>` per index",
            answer=ModelList,
            errors=(),
            error=OpenAIError,
        ),
        Operation(
            "get",
            "/v1/models/{model}",
            "One OpenAI model",
            answer=ModelCard,
            error=OpenAIError,
            errors=(404,),
            params=({"name": "model", "in": "path", "required": True, "schema": {"type": "string"}},),
        ),
        Operation(
            "post",
            "/v1/chat/completions",
            "OpenAI chat completion over an index (`stream: true`: chunks)",
            ChatCompletionRequest,
            ChatCompletion,
            also=COMPLETION_CHUNKS,
            error=OpenAIError,
            errors=(400, 404, 409, 413, 503),
        ),
    ]


def _models(routes: list[Operation]) -> list[type[BaseModel]]:
    seen: dict[type[BaseModel], None] = {Step: None}
    for op in routes:
        for item in (op.body, op.answer, op.error):
            model = item[0] if isinstance(item, list) else item
            if isinstance(model, type) and issubclass(model, BaseModel):
                seen[model] = None
    return list(seen)


def _content(item: Any) -> dict:
    if isinstance(item, list):
        return {
            "application/json": {
                "schema": {"type": "array", "items": {"$ref": REF.format(model=item[0].__name__)}}
            }
        }
    if isinstance(item, type):
        return {"application/json": {"schema": {"$ref": REF.format(model=item.__name__)}}}
    return item


def _operation(op: Operation, auth_required: bool) -> dict:
    out: dict[str, Any] = {
        "summary": op.summary,
        "operationId": f"{op.method}_{op.path.strip('/').replace('/', '_')}",
    }
    if op.params:
        out["parameters"] = list(op.params)
    if op.body is not None:
        out["requestBody"] = {"required": True, "content": _content(op.body)}
    ok = {"description": "success"}
    if op.answer is not None:
        ok["content"] = {**_content(op.answer), **(op.also or {})}
    responses = {"200": ok}
    codes = set(op.errors)
    if isinstance(op.body, type):  # a JSON body: anything but Content-Type application/json is a 415
        codes.add(415)
    if auth_required and not op.open:
        codes.add(401)
    if op.body is not None:
        codes |= {400, 413}  # bad JSON; bodies past the size limit
    for code in sorted(codes):
        responses[str(code)] = {"description": "error", "content": _content(op.error)}
    out["responses"] = responses
    if op.open or not auth_required:
        out["security"] = []
    return out


@cache
def spec(auth_required: bool = True) -> dict:
    """The OpenAPI document; `auth_required` says whether this worker has a WORKER_API_KEY."""
    routes = _routes()
    _, schemas = models_json_schema([(m, "validation") for m in _models(routes)], ref_template=REF)
    paths: dict[str, dict] = {}
    for op in routes:
        paths.setdefault(op.path, {})[op.method] = _operation(op, auth_required)
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "rag_worker",
            "version": __version__,
            "description": "Stateless RAG worker: every call carries the conversation; see WORKER_API.md",
        },
        "components": {"schemas": schemas.get("$defs", {})},
        "paths": paths,
    }
    if auth_required:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
    return doc
