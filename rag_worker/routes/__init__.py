"""HTTP routes of the worker, one blueprint per concern, and the two helpers they all use."""

from __future__ import annotations

from flask import current_app, request

from ..errors import BadRequest
from ..services import Services


def services() -> Services:
    """The process-wide models and store of the app serving this request."""
    return current_app.extensions["rag"]


def json_body() -> dict:
    """The request's JSON (any content type), or a 400 saying it must be JSON."""
    data = request.get_json(silent=True, force=True)
    if data is None:
        raise BadRequest("the body must be JSON (Content-Type: application/json)", code="bad_json")
    return data
