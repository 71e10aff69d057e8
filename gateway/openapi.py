"""The gateway's contract (GATEWAY_API.md), machine-readable at `GET /api/openapi.json`, generated from the
pydantic models the routes use: requests from schemas.py (read_json validates every body through them),
answers from responses.py (the routes build their JSON through them). Nothing describes a body by hand.

The same approach as the worker's rag_worker/openapi.py (an `Operation` list, pydantic's models_json_schema for
`components`); the gateway ships without the worker's package (deploy/Dockerfile.gateway), so it has its own
copy of the few lines that assemble the paths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .context import MAX_ID, ctx
from .responses import (
    AccountOut,
    ChatFull,
    ChatSummary,
    DocumentOut,
    ErrorBody,
    Health,
    IndexFull,
    IndexOut,
    SessionOut,
    SettingsOut,
    SignedIn,
    StopResult,
    TurnResult,
    UploadedDocument,
    UserOut,
)
from .schemas import (
    NAME_RE,
    BuildRequest,
    ChatCreate,
    ChatUpdate,
    Credentials,
    IndexCreate,
    IndexUpdate,
    PasswordChange,
    Registration,
    SettingsUpdate,
    StopRequest,
    TurnRequest,
    UserUpdate,
)
from .sessions import COOKIE
from .settings import Settings

REF = "#/components/schemas/{model}"
ID_SCHEMA = {"type": "integer", "minimum": 0, "maximum": MAX_ID}
WORKER = (502, 503)  # the worker failed or is not there


def _sse(description: str, events: list[str]) -> dict:
    """A text/event-stream; its schema describes one event (`event` name, `data` one line of JSON)."""
    schema = {
        "type": "object",
        "description": description,
        "required": ["data"],
        "properties": {
            "event": {"type": "string", "enum": events},
            "data": {"type": "string", "contentMediaType": "application/json"},
        },
    }
    return {"text/event-stream": {"schema": schema}}


TURN_EVENTS = _sse(
    "route {layer, route, reason} first; then the worker's step, documents, token and done (its answer); then "
    "saved {message_id, user_message_id} and, for a new chat, title {title}; or error {error, code}, or "
    "interrupted {error, code, message_id, user_message_id} when stopped. ': keepalive' comments meanwhile",
    ["route", "step", "documents", "token", "done", "saved", "title", "error", "interrupted"],
)
REJOIN_EVENTS = _sse(
    "snapshot {message_id, question, status, steps, documents, answer, ...} of the running turn, then its live "
    "events as in messages/stream",
    ["snapshot", "step", "documents", "token", "done", "saved", "title", "error", "interrupted"],
)
BUILD_EVENTS = _sse(
    "snapshot (on rejoin), progress {file, dataset, done, total, stage} per file, then done "
    "{documents, chunks, ...} or error {error, code}",
    ["snapshot", "progress", "done", "error"],
)
UPLOAD_EVENTS = _sse(
    "With `Accept: text/event-stream`: progress {file, dataset, stage} as each stage starts (converting, "
    "chunking, embedding, writing), then done (the stored document) or error {error, code}",
    ["progress", "done", "error"],
)
UPLOAD_FORM = {
    "multipart/form-data": {
        "schema": {
            "type": "object",
            "required": ["file"],
            "properties": {
                "file": {"type": "string", "format": "binary", "description": "the file, with its name"},
                "dataset": {"type": "string", "pattern": NAME_RE.pattern, "default": "default"},
            },
        }
    }
}


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    summary: str
    body: type[BaseModel] | dict | None = None  # a model (JSON) or a raw content
    answer: type[BaseModel] | list[type[BaseModel]] | dict | None = None  # model, [model] or content
    status: int = 200
    also: dict | None = None  # another content type for the success (a stream)
    errors: tuple[int, ...] = ()
    public: bool = False  # no sign-in needed
    empty: tuple[int, ...] = ()  # other successes without a body (204)
    tag: str = ""
    # OpenAPI links from the success: {name: (operationId, {parameter: runtime expression})}, so a client (and
    # schemathesis' stateful phase) knows which ids this answer hands on.
    links: dict[str, tuple[str, dict[str, str]]] | None = None


CHAT_OPS = [
    "get_api_chats_id",
    "patch_api_chats_id",
    "post_api_chats_id_messages",
    "post_api_chats_id_messages_stream",
    "post_api_chats_id_stop",
    "get_api_chats_id_stream",
    "delete_api_chats_id",
]
INDEX_OPS = [
    "get_api_indexes_id",
    "patch_api_indexes_id",
    "post_api_indexes_id_documents",
    "get_api_indexes_id_datasets",
    "post_api_indexes_id_build",
    "get_api_indexes_id_build",
    "delete_api_indexes_id",
]
DOCUMENT_OPS = [
    "get_api_indexes_id_documents_document_id_download",
    "delete_api_indexes_id_documents_document_id",
]


def _each(targets: list[str], params: dict[str, str]) -> dict[str, tuple[str, dict[str, str]]]:
    return {target: (target, params) for target in targets}


def _path(id_names: tuple[str, ...]) -> tuple[dict, ...]:
    return tuple({"name": n, "in": "path", "required": True, "schema": ID_SCHEMA} for n in id_names)


def _routes() -> list[Operation]:
    chat_turn_errors = (400, 404, 409, 429, *WORKER)
    return [
        # -- accounts
        Operation(
            "post",
            "/api/auth/register",
            "Create an account (the first one is the administrator) and sign in",
            Registration,
            SignedIn,
            status=201,
            errors=(403, 409, 429),
            public=True,
            tag="accounts",
        ),
        Operation(
            "post",
            "/api/auth/login",
            "Sign in: the token in the body (scripts) and the HttpOnly session cookie (the web)",
            Credentials,
            SignedIn,
            errors=(401, 403, 429),
            public=True,
            tag="accounts",
        ),
        Operation(
            "post",
            "/api/auth/logout",
            "End every session of the signed-in user; clears the cookie in any case",
            status=204,
            public=True,
            tag="accounts",
        ),
        Operation(
            "post",
            "/api/auth/password",
            "Change the password: every other session ends, this one gets a fresh token",
            PasswordChange,
            SignedIn,
            errors=(403, 429),
            tag="accounts",
        ),
        Operation("get", "/api/auth/me", "The signed-in user", answer=UserOut, tag="accounts"),
        Operation(
            "get",
            "/api/auth/session",
            "Who this browser is signed in as (`user: null` when nobody)",
            answer=SessionOut,
            public=True,
            tag="accounts",
        ),
        Operation("get", "/api/users", "Every account (administrators)", answer=[AccountOut], tag="accounts"),
        Operation(
            "patch",
            "/api/users/{id}",
            "Disable or re-enable an account (administrators); disabling ends its sessions",
            UserUpdate,
            AccountOut,
            errors=(404, 409),
            tag="accounts",
        ),
        # -- chats
        Operation("get", "/api/chats", "The user's chats, newest first", answer=[ChatSummary], tag="chats"),
        Operation(
            "post",
            "/api/chats",
            "A new chat, optionally linked to indexes",
            ChatCreate,
            ChatFull,
            status=201,
            errors=(404,),
            tag="chats",
            links=_each(CHAT_OPS, {"id": "$response.body#/id"}),
        ),
        Operation(
            "get", "/api/chats/{id}", "A chat with its messages and state", answer=ChatFull, errors=(404,)
        ),
        Operation(
            "patch",
            "/api/chats/{id}",
            "Rename, relink or rescope a chat",
            ChatUpdate,
            ChatFull,
            errors=(404,),
            tag="chats",
        ),
        Operation("delete", "/api/chats/{id}", "Delete a chat", status=204, errors=(404,), tag="chats"),
        # -- turns
        Operation(
            "post",
            "/api/chats/{id}/messages",
            "One turn, answered once it is stored (502/503 carry the stored turn and the error)",
            TurnRequest,
            TurnResult,
            errors=chat_turn_errors,
            tag="turns",
        ),
        Operation(
            "post",
            "/api/chats/{id}/messages/stream",
            "One turn, streamed as it is written; it is stored even if the client leaves",
            TurnRequest,
            TURN_EVENTS,
            errors=chat_turn_errors,
            tag="turns",
        ),
        Operation(
            "post",
            "/api/chats/{id}/stop",
            "Stop the chat's running turn (from any replica); answers once it is stored",
            StopRequest,
            StopResult,
            errors=(404, 409),
            tag="turns",
        ),
        Operation(
            "get",
            "/api/chats/{id}/stream",
            "Rejoin the chat's running turn (204 when none runs)",
            answer=REJOIN_EVENTS,
            empty=(204,),
            errors=(404,),
            tag="turns",
        ),
        # -- indexes
        Operation("get", "/api/indexes", "The user's indexes", answer=[IndexOut], tag="indexes"),
        Operation(
            "post",
            "/api/indexes",
            "A new, empty index",
            IndexCreate,
            IndexFull,
            status=201,
            errors=(409,),
            tag="indexes",
            links=_each(INDEX_OPS, {"id": "$response.body#/id"}),
        ),
        Operation(
            "get",
            "/api/indexes/{id}",
            "One index with its documents (a list) and document_count",
            answer=IndexFull,
            errors=(404,),
            tag="indexes",
        ),
        Operation(
            "patch",
            "/api/indexes/{id}",
            "Rename an index or change its description",
            IndexUpdate,
            IndexFull,
            errors=(404, 409),
            tag="indexes",
        ),
        Operation(
            "delete",
            "/api/indexes/{id}",
            "Drop an index with its table and files",
            status=204,
            errors=(404, *WORKER),
            tag="indexes",
        ),
        Operation(
            "get",
            "/api/indexes/{id}/datasets",
            "The dataset names of an index, for scoping a chat",
            answer={"application/json": {"schema": {"type": "array", "items": {"type": "string"}}}},
            errors=(404,),
            tag="indexes",
        ),
        Operation(
            "post",
            "/api/indexes/{id}/documents",
            "Upload one file and index it",
            UPLOAD_FORM,
            UploadedDocument,
            status=201,
            links=_each(DOCUMENT_OPS, {"id": "$request.path.id", "document_id": "$response.body#/id"}),
            also=UPLOAD_EVENTS,
            # 415: a type the worker cannot read; 422: the file could not be converted within the limits.
            errors=(404, 409, 415, 422, *WORKER),
            tag="indexes",
        ),
        Operation(
            "get",
            "/api/indexes/{id}/documents/{document_id}/download",
            "The original file, as an attachment",
            answer={"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
            errors=(404, *WORKER),
            tag="indexes",
        ),
        Operation(
            "delete",
            "/api/indexes/{id}/documents/{document_id}",
            "Remove a file everywhere: its rows, vectors and the original",
            status=204,
            errors=(404, 409, *WORKER),
            tag="indexes",
        ),
        Operation(
            "post",
            "/api/indexes/{id}/build",
            "(Re)build an index from its uploads folder; the build outlives the request",
            BuildRequest,
            BUILD_EVENTS,
            errors=(404, 409, *WORKER),
            tag="indexes",
        ),
        Operation(
            "get",
            "/api/indexes/{id}/build",
            "Rejoin the index's running build (204 when none runs)",
            answer=BUILD_EVENTS,
            empty=(204,),
            errors=(404,),
            tag="indexes",
        ),
        # -- settings, health, this document
        Operation(
            "get",
            "/api/settings",
            "The turn defaults; the worker's configuration too for administrators",
            answer=SettingsOut,
            tag="settings",
        ),
        Operation(
            "put",
            "/api/settings",
            "Set the turn defaults (administrators)",
            SettingsUpdate,
            SettingsOut,
            errors=(403,),
            tag="settings",
        ),
        Operation(
            "get",
            "/health",
            "Database, worker and the LLM named by its backend; 503 naming the failing part",
            answer=Health,
            public=True,
            tag="operations",
        ),
        Operation(
            "get",
            "/api/openapi.json",
            "This document",
            answer={"application/json": {"schema": {"type": "object"}}},
            public=True,
            tag="operations",
        ),
    ]


def _models(routes: list[Operation]) -> list[type[BaseModel]]:
    seen: dict[type[BaseModel], None] = {DocumentOut: None, ErrorBody: None}
    for op in routes:
        for item in (op.body, op.answer):
            model = item[0] if isinstance(item, list) else item
            if isinstance(model, type) and issubclass(model, BaseModel):
                seen[model] = None
    return list(seen)


def _content(item: Any) -> dict:
    if isinstance(item, list):
        ref = {"$ref": REF.format(model=item[0].__name__)}
        return {"application/json": {"schema": {"type": "array", "items": ref}}}
    if isinstance(item, type):
        return {"application/json": {"schema": {"$ref": REF.format(model=item.__name__)}}}
    return item


def _has_required(model: type[BaseModel]) -> bool:
    return any(f.is_required() for f in model.model_fields.values())


def _operation(op: Operation) -> dict:
    ids = tuple(part[1:-1] for part in op.path.split("/") if part.startswith("{"))
    out: dict[str, Any] = {
        "summary": op.summary,
        "operationId": f"{op.method}_{op.path.strip('/').replace('/', '_').replace('{', '').replace('}', '')}",
    }
    if op.tag:
        out["tags"] = [op.tag]
    if ids:
        out["parameters"] = list(_path(ids))
    if op.body is not None:
        # A JSON body whose fields are all optional may be left out (an empty body reads as `{}`).
        required = not isinstance(op.body, type) or _has_required(op.body)
        out["requestBody"] = {"required": required, "content": _content(op.body)}
    ok: dict[str, Any] = {"description": "success"}
    if op.answer is not None:
        ok["content"] = {**_content(op.answer), **(op.also or {})}
    if op.links:
        ok["links"] = {
            name: {"operationId": target, "parameters": params} for name, (target, params) in op.links.items()
        }
    responses: dict[str, Any] = {str(op.status): ok}
    for code in op.empty:
        responses[str(code)] = {"description": "nothing to send"}
    codes = set(op.errors)
    if op.body is not None:
        codes |= {400, 413}  # a body that is not valid JSON, a wrong field; bodies past the size limit
    if ids:
        codes.add(404)  # not one of the user's (another user's chat is a 404 too: no probing)
    if not op.public:
        codes.add(401)
        codes.add(403)  # an administrator's route, or a cookie-signed change from another site's page
    for code in sorted(codes):
        responses[str(code)] = {"description": "error", "content": _content(ErrorBody)}
    if op.path == "/health":
        responses["503"] = {"description": "a part is down", "content": _content(Health)}
    out["responses"] = responses
    if op.public:
        out["security"] = []
    return out


def spec(settings: Settings | None = None) -> dict:
    """The OpenAPI document; limits that are settings (the longest message) come from `settings`."""
    settings = settings or Settings()
    routes = _routes()
    _, schemas = models_json_schema(
        [(m, "validation" if _is_request(m, routes) else "serialization") for m in _models(routes)],
        ref_template=REF,
    )
    components = schemas.get("$defs", {})
    # Two limits are this server's settings (MAX_MESSAGE_CHARS, MAX_TOKENS), narrower than the models' own.
    components["TurnRequest"]["properties"]["message"]["maxLength"] = settings.max_message_chars
    for branch in components["TurnOptions"]["properties"]["max_tokens"]["anyOf"]:
        if branch.get("type") == "integer":
            branch["maximum"] = min(branch.get("maximum", settings.max_tokens), settings.max_tokens)
    paths: dict[str, dict] = {}
    for op in routes:
        paths.setdefault(op.path, {})[op.method] = _operation(op)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "rag-chat gateway",
            "version": "1",
            "description": "Accounts, chats and indexes for the web chat and scripts; see GATEWAY_API.md. "
            "Sign in with `Authorization: Bearer <token>` (from register or login) or the HttpOnly "
            f"`{COOKIE}` cookie the web gets; a change signed in by the cookie must come from this site "
            "(its Origin header).",
        },
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"},
                "session": {"type": "apiKey", "in": "cookie", "name": COOKIE},
            },
        },
        "security": [{"bearer": []}, {"session": []}],
        "paths": paths,
    }


def _is_request(model: type[BaseModel], routes: list[Operation]) -> bool:
    return any(op.body is model for op in routes)


_SPECS: dict[tuple[int, int], dict] = {}  # built on first request, by the settings the document depends on


async def openapi_json(request: Request) -> JSONResponse:
    settings = ctx(request).settings
    key = (settings.max_message_chars, settings.max_tokens)
    doc = _SPECS.get(key)
    if doc is None:
        doc = _SPECS[key] = spec(settings)
    return JSONResponse(doc)


routes = [Route("/api/openapi.json", openapi_json, methods=["GET"])]
