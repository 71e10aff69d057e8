"""The worker's contract (docs/design/WORKER_API.md), machine-readable, assembled from the routes themselves.

Each route declares its `Operation` where it is registered (`routes/table.py`): its request model, its answer
model or content, its errors. This module holds that vocabulary and turns the registered operations into the
document; nothing here lists a route or describes a body by hand. Models end up in `components`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from contract.answer import Step

from . import __version__
from .names import FILENAME_PATTERN, NAME_RE
from .responses import ErrorBody

REF = "#/components/schemas/{model}"
NAME_SCHEMA = {"type": "string", "pattern": NAME_RE.pattern}
FILENAME_SCHEMA = {"type": "string", "pattern": FILENAME_PATTERN, "maxLength": 255}

Content = dict[str, Any]  # {media type: {"schema": ...}}


@dataclass(frozen=True, eq=False)  # eq=False: hashed by identity, so a tuple of them can key spec()'s cache
class Operation:
    """One route as the document shows it; declared beside the view it describes."""

    method: str
    path: str
    summary: str
    body: type[BaseModel] | Content | None = None  # a model (JSON) or a raw content (multipart)
    answer: type[BaseModel] | list[type[BaseModel]] | Content | None = None  # model, [model] or content
    also: Content | None = None  # another content type for the 200 (a stream)
    errors: tuple[int, ...] = (400,)
    params: tuple[dict, ...] = ()
    error: type[BaseModel] = ErrorBody
    open: bool = False  # no key needed
    key_optional: bool = False  # the key is asked of some callers only (/metrics: not of loopback clients)
    created: bool = False  # a 201 with the same body when it made the thing (a 200 when it was there)
    # What an error status means here, when "error" says too little ({415: "a name without an extension ..."}).
    meanings: dict[int, str] = field(default_factory=dict)
    # OpenAPI links of the 200: the operations that act on what this one made ({name: {operationId, ...}}).
    links: dict[str, dict] = field(default_factory=dict)

    @property
    def operation_id(self) -> str:
        return f"{self.method}_{self.path.strip('/').replace('/', '_')}"


def openapi_path(rule: str) -> str:
    """A Flask rule in OpenAPI's spelling: `/indexes/<index>` → `/indexes/{index}`."""
    return re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule)


def sse(description: str, events: list[str] | None = None) -> Content:
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


def link(operation_id: str, *, parameters: dict | None = None, body: dict | None = None) -> dict:
    """An OpenAPI link to `operation_id`, its parameters (or JSON body fields) taken from this answer's body:
    `link("get_get_documents", parameters={"index": "index"})` passes the answer's `index` on."""
    out: dict[str, Any] = {"operationId": operation_id}
    if parameters:
        out["parameters"] = {name: f"$response.body#/{source}" for name, source in parameters.items()}
    if body:
        out["requestBody"] = {name: f"$response.body#/{source}" for name, source in body.items()}
    return out


def json_content(schema: dict) -> Content:
    return {"application/json": {"schema": schema}}


def query_param(name: str, required: bool = True, schema: dict | None = None) -> dict:
    return {"name": name, "in": "query", "required": required, "schema": schema or NAME_SCHEMA}


def path_param(name: str, schema: dict | None = None) -> dict:
    return {"name": name, "in": "path", "required": True, "schema": schema or NAME_SCHEMA}


def _models(operations: Iterable[Operation]) -> list[type[BaseModel]]:
    seen: dict[type[BaseModel], None] = {Step: None}
    for op in operations:
        for item in (op.body, op.answer, op.error):
            model = item[0] if isinstance(item, list) else item
            if isinstance(model, type) and issubclass(model, BaseModel):
                seen[model] = None
    return list(seen)


def _content(item: Any) -> Content:
    if isinstance(item, list):
        return json_content({"type": "array", "items": {"$ref": REF.format(model=item[0].__name__)}})
    if isinstance(item, type):
        return json_content({"$ref": REF.format(model=item.__name__)})
    return item


def _operation(op: Operation, auth_required: bool) -> dict:
    out: dict[str, Any] = {"summary": op.summary, "operationId": op.operation_id}
    if op.params:
        out["parameters"] = list(op.params)
    if op.body is not None:
        out["requestBody"] = {"required": True, "content": _content(op.body)}
    ok: dict[str, Any] = {"description": "success"}
    if op.answer is not None:
        ok["content"] = {**_content(op.answer), **(op.also or {})}
    if op.links:
        ok["links"] = op.links
    responses = {"200": ok}
    if op.created:
        responses["201"] = {**ok, "description": "made now"}
    codes = set(op.errors)
    if isinstance(op.body, type):  # a JSON body: anything but Content-Type application/json is a 415
        codes.add(415)
    if auth_required and not op.open:
        codes.add(401)
    if op.body is not None:
        codes |= {400, 413}  # bad JSON; bodies past the size limit
    for code in sorted(codes | set(op.meanings)):
        description = op.meanings.get(code, "error")
        responses[str(code)] = {"description": description, "content": _content(op.error)}
    out["responses"] = responses
    if op.open or not auth_required:
        out["security"] = []
    elif op.key_optional:
        out["security"] = [{}, {"bearer": []}]
    return out


@cache
def spec(operations: tuple[Operation, ...], auth_required: bool = True) -> dict:
    """The OpenAPI document of these operations; `auth_required` says whether this worker has a WORKER_API_KEY."""
    _, schemas = models_json_schema([(m, "validation") for m in _models(operations)], ref_template=REF)
    paths: dict[str, dict] = {}
    for op in operations:
        paths.setdefault(op.path, {})[op.method] = _operation(op, auth_required)
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "rag_worker",
            "version": __version__,
            "description": "Stateless RAG worker: every call carries the conversation; see docs/design/WORKER_API.md",
        },
        "components": {"schemas": schemas.get("$defs", {})},
        "paths": paths,
    }
    if auth_required:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
    return doc
