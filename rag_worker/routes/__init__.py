"""HTTP routes of the worker, one blueprint per concern, and the two helpers they all use."""

from __future__ import annotations

import hmac

from flask import current_app, request

from contract.text import lone_surrogate_at, surrogate_refusal

from ..errors import BadRequest, UnsupportedType
from ..services import Services


def services() -> Services:
    """The process-wide models and store of the app serving this request."""
    return current_app.extensions["rag"]


def has_valid_key() -> bool:
    """No WORKER_API_KEY is configured, or the request carries it as `Authorization: Bearer <key>`."""
    key = services().settings.worker_api_key
    if key is None:
        return True
    sent = request.headers.get("Authorization", "")
    expected = f"Bearer {key.get_secret_value()}"
    return hmac.compare_digest(sent.encode(), expected.encode())


def json_body() -> dict:
    """The request's JSON; another Content-Type is a 415, a body that is not JSON a 400.

    Only `application/json` is accepted: a web page can send `text/plain` or a form cross-site without a CORS
    preflight, never JSON. Nesting too deep for the parser is a 400 too, not a RecursionError.
    """
    if request.mimetype != "application/json":
        sent = request.mimetype or "none"
        raise UnsupportedType(
            f"the body must be JSON sent with Content-Type: application/json (got {sent})",
            code="json_required",
        )
    try:
        data = request.get_json(silent=True)
    except RecursionError:
        raise BadRequest("the JSON body is nested too deeply", code="bad_json") from None
    if data is None:
        raise BadRequest("the body must be valid JSON (Content-Type: application/json)", code="bad_json")
    where = lone_surrogate_at(data)
    if where:
        raise BadRequest(surrogate_refusal(where), code="invalid_text", field=where)
    return data
