"""The gateway's contract (docs/design/GATEWAY_API.md), machine-readable at `GET /api/openapi.json`, assembled
from the app's own route list: each route is an `ApiRoute` (gateway/routing.py) declaring its `Operation` next to
it, with the pydantic models it uses: requests from schemas.py (read_json validates every body through them),
answers from responses.py (the routes build their JSON through them). Nothing describes a body by hand.

The same approach as the worker's rag_worker/openapi.py (pydantic's models_json_schema for `components`); the
gateway ships without the worker's package (deploy/Dockerfile.gateway), so it has its own copy of the few lines
that assemble the paths.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute

from .context import MAX_ID, ctx
from .responses import DocumentOut, ErrorBody, Health
from .routing import ApiRoute, Operation, json_content
from .sessions import COOKIE
from .settings import Settings

REF = "#/components/schemas/{model}"
ID_SCHEMA = {"type": "integer", "minimum": 0, "maximum": MAX_ID}


def _path(id_names: tuple[str, ...], schemas: dict[str, dict] | None = None) -> tuple[dict, ...]:
    schemas = schemas or {}
    return tuple(
        {"name": n, "in": "path", "required": True, "schema": schemas.get(n, ID_SCHEMA)} for n in id_names
    )


def _models(ops: list[Operation]) -> list[type[BaseModel]]:
    seen: dict[type[BaseModel], None] = {DocumentOut: None, ErrorBody: None}
    for op in ops:
        for item in (op.body, op.answer, op.error, *(a for a, _d in (op.others or {}).values())):
            model = item[0] if isinstance(item, list) else item
            if isinstance(model, type) and issubclass(model, BaseModel):
                seen[model] = None
    return list(seen)


def _content(item: Any) -> dict:
    if isinstance(item, list):
        return json_content({"type": "array", "items": {"$ref": REF.format(model=item[0].__name__)}})
    if isinstance(item, type):
        return json_content({"$ref": REF.format(model=item.__name__)})
    return item


def _has_required(model: type[BaseModel]) -> bool:
    """A body that must be sent: a required field, or (UserUpdate) one of several ones it names."""
    extra = model.model_config.get("json_schema_extra")
    one_of_them = isinstance(extra, dict) and any("required" in branch for branch in extra.get("anyOf", ()))
    return one_of_them or any(f.is_required() for f in model.model_fields.values())


def _operation(route: ApiRoute) -> dict:
    op = route.operation
    ids = tuple(part[1:-1] for part in route.doc_path.split("/") if part.startswith("{"))
    out: dict[str, Any] = {"summary": op.summary, "operationId": route.operation_id}
    if op.tag:
        out["tags"] = [op.tag]
    if ids:
        out["parameters"] = list(_path(ids, op.params))
    for name, (schema, description) in (op.query or {}).items():
        out.setdefault("parameters", []).append(
            {"name": name, "in": "query", "required": False, "description": description, "schema": schema}
        )
    if op.body is not None:
        # A JSON body whose fields are all optional may be left out (an empty body reads as `{}`).
        # One that must name one of its fields (oneOf) is required as well.
        required = (
            not isinstance(op.body, type) or _has_required(op.body) or "oneOf" in op.body.model_json_schema()
        )
        out["requestBody"] = {"required": required, "content": _content(op.body)}
    ok: dict[str, Any] = {"description": "success"}
    if op.answer is not None:
        ok["content"] = {**_content(op.answer), **(op.also or {})}
    if op.links:
        ok["links"] = {
            name: {"operationId": target, "parameters": params} for name, (target, params) in op.links.items()
        }
    responses: dict[str, Any] = {str(op.status): ok}
    for code in op.same:
        responses[str(code)] = {**ok, "description": "success (it was there already)"}
    for code in op.empty:
        responses[str(code)] = {"description": "nothing to send"}
    for code, (answer, description) in (op.others or {}).items():
        responses[str(code)] = {"description": description, "content": _content(answer)}
    codes = set(op.errors)
    if op.body is not None:
        codes |= {400, 413}  # a body that is not valid JSON, a wrong field; bodies past the size limit
    if ids:
        codes.add(404)  # not one of the user's (another user's chat is a 404 too: no probing)
    if not op.public:
        codes.add(401)
        codes.add(403)  # an administrator's route, or a cookie-signed change from another site's page
    for code in sorted(codes):
        responses[str(code)] = {"description": "error", "content": _content(op.error or ErrorBody)}
    if route.doc_path == "/health":
        responses["503"] = {"description": "a part is down", "content": _content(Health)}
    out["responses"] = responses
    if op.public:
        out["security"] = []
    elif op.sign_in_optional:
        out["security"] = [{}, {"bearer": []}, {"session": []}]
    return out


def spec(app_routes: Iterable[BaseRoute], settings: Settings | None = None) -> dict:
    """The OpenAPI document of the `ApiRoute`s among `app_routes` (the rest, the web files and the JSON 404,
    are no operations); limits that are settings (the longest message) come from `settings`."""
    settings = settings or Settings()
    routes = [r for r in app_routes if isinstance(r, ApiRoute)]
    ops = [r.operation for r in routes]
    _, schemas = models_json_schema(
        [(m, "validation" if _is_request(m, ops) else "serialization") for m in _models(ops)],
        ref_template=REF,
    )
    components = schemas.get("$defs", {})
    # Two limits are this server's settings (MAX_MESSAGE_CHARS, MAX_TOKENS), narrower than the models' own.
    components["TurnRequest"]["properties"]["message"]["maxLength"] = settings.max_message_chars
    for options in ("TurnOptions", "TurnChoice"):  # the defaults' options, a turn's
        for branch in components[options]["properties"]["max_tokens"]["anyOf"]:
            if branch.get("type") == "integer":
                branch["maximum"] = min(branch.get("maximum", settings.max_tokens), settings.max_tokens)
    paths: dict[str, dict] = {}
    for route in routes:
        paths.setdefault(route.doc_path, {})[route.method] = _operation(route)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "rag-chat gateway",
            "version": "1",
            "description": "Accounts, chats and indexes for the web chat and scripts; see "
            "docs/design/GATEWAY_API.md. Sign in with `Authorization: Bearer <token>` (from register or login, or "
            "an API key from /api/keys) "
            f"or the HttpOnly `{COOKIE}` cookie the web gets; a change signed in by the cookie must come from "
            "this site (its Origin header).",
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


def _is_request(model: type[BaseModel], ops: list[Operation]) -> bool:
    return any(op.body is model for op in ops)


_SPECS: dict[tuple[int, int], dict] = {}  # built on first request, by the settings the document depends on


async def openapi_json(request: Request) -> JSONResponse:
    settings = ctx(request).settings
    key = (settings.max_message_chars, settings.max_tokens)
    doc = _SPECS.get(key)
    if doc is None:
        doc = _SPECS[key] = spec(request.app.routes, settings)
    return JSONResponse(doc)


routes = [
    ApiRoute(
        "GET",
        "/api/openapi.json",
        openapi_json,
        Operation("This document", answer=json_content({"type": "object"}), public=True, tag="operations"),
    )
]
