"""A route and its contract, declared together: each module's `routes` are `ApiRoute`s carrying both the
Starlette route (one method) and its `Operation` (the OpenAPI metadata). gateway/openapi.py assembles the
document from the app's real route list, so a route cannot exist undocumented or be documented without existing.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from starlette.routing import Route

WORKER = (502, 503)  # the worker failed or is not there

Links = dict[str, tuple[str, dict[str, str]]]


@dataclass(frozen=True)
class Operation:
    summary: str
    body: type[BaseModel] | dict | None = None  # a model (JSON) or a raw content
    answer: type[BaseModel] | list[type[BaseModel]] | dict | None = None  # model, [model] or content
    status: int = 200
    also: dict | None = None  # another content type for the success (a stream)
    errors: tuple[int, ...] = ()
    public: bool = False  # no sign-in needed
    sign_in_optional: bool = False  # asked of some callers only (/metrics: not of loopback clients)
    empty: tuple[int, ...] = ()  # other successes without a body (204)
    same: tuple[int, ...] = ()  # other successes with the same body (a create that found it there: 200)
    tag: str = ""
    # OpenAPI links from the success: {name: (operationId, {parameter: runtime expression})}, so a client (and
    # schemathesis' stateful phase) knows which ids this answer hands on.
    links: Links | None = None
    # Optional query parameters: {name: (JSON schema, description)}.
    query: dict[str, tuple[dict, str]] | None = None
    # The errors' body when it is not ErrorBody (/v1 answers in OpenAI's shape), and the schemas of path
    # parameters that are not row ids.
    error: type[BaseModel] | None = None
    params: dict[str, dict] | None = None
    # Other successes with another body: {status: (model or content, description)} (an upload's 202 job
    # beside its `?wait=1` 201 document).
    others: dict[int, tuple[Any, str]] | None = None


class ApiRoute(Route):
    """One method of one path, with its operation."""

    def __init__(self, method: str, path: str, endpoint: Callable[..., Any], operation: Operation):
        super().__init__(path, endpoint, methods=[method])
        self.method = method.lower()
        self.operation = operation

    @property
    def doc_path(self) -> str:
        """The path as OpenAPI writes it: `{id}` for Starlette's `{id:int}`."""
        return re.sub(r"\{(\w+):\w+\}", r"{\1}", self.path)

    @property
    def operation_id(self) -> str:
        return operation_id(self.method, self.doc_path)


def operation_id(method: str, doc_path: str) -> str:
    return f"{method}_{doc_path.strip('/').replace('/', '_').replace('{', '').replace('}', '')}"


def event_stream(description: str, events: list[str]) -> dict:
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


def json_content(schema: dict) -> dict:
    return {"application/json": {"schema": schema}}


def each(targets: list[str], params: dict[str, str]) -> Links:
    """The same parameters handed on to each of the `targets` (operationIds)."""
    return {target: (target, params) for target in targets}
