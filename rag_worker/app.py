"""Flask application factory for the worker. Routes live in `routes/`, one blueprint per concern."""

from __future__ import annotations

import hmac
import logging

from flask import Flask, jsonify, request
from werkzeug.exceptions import HTTPException

from .errors import ApiError, Unauthorized
from .openai_compat import error_body, is_openai_path
from .services import Services
from .settings import Settings

log = logging.getLogger("rag_worker")

OPEN_PATHS = {"/health"}


def create_app(settings: Settings | None = None, services: Services | None = None) -> Flask:
    settings = settings or Settings()
    app = Flask("rag_worker")
    app.config["MAX_CONTENT_LENGTH"] = settings.max_upload_bytes + 1024 * 1024
    app.json.sort_keys = False
    app.extensions["rag"] = services or Services(settings)

    from .routes import chat, documents, meta, v1

    app.register_blueprint(meta.bp)
    app.register_blueprint(chat.bp)
    app.register_blueprint(documents.bp)
    app.register_blueprint(v1.bp)

    @app.before_request
    def require_api_key():
        key = settings.worker_api_key
        if key is None or request.path in OPEN_PATHS:
            return None
        sent = request.headers.get("Authorization", "")
        expected = f"Bearer {key.get_secret_value()}"
        if not hmac.compare_digest(sent.encode(), expected.encode()):
            raise Unauthorized("missing or wrong API key: send 'Authorization: Bearer <WORKER_API_KEY>'")
        return None

    def error(body: dict, status: int, headers: dict | None = None):
        # OpenAI clients read errors in OpenAI's shape; everything else gets the worker's own.
        if is_openai_path(request.path):
            body = error_body(status, body["error"], body.get("code"), body.get("field"))
        return jsonify(body), status, headers or {}

    @app.errorhandler(ApiError)
    def api_error(err: ApiError):
        retry_after = getattr(err, "retry_after_s", None)
        headers = {"Retry-After": str(retry_after)} if retry_after else None
        return error(err.to_dict(), err.status, headers)

    @app.errorhandler(HTTPException)
    def http_error(err: HTTPException):
        codes = {404: "not_found", 405: "method_not_allowed", 413: "too_large", 415: "unsupported_type"}
        body = {"error": err.description or err.name, "code": codes.get(err.code or 400, "bad_request")}
        allowed = getattr(err, "valid_methods", None)  # a 405 says what is allowed (RFC 9110)
        return error(body, err.code or 400, {"Allow": ", ".join(allowed)} if allowed else None)

    @app.errorhandler(Exception)
    def unexpected(err: Exception):
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error({"error": f"internal error: {type(err).__name__}", "code": "internal"}, 500)

    return app
