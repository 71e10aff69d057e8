"""Flask application factory for the worker. Routes live in `routes/`, one blueprint per concern."""

from __future__ import annotations

import logging

from flask import Flask, jsonify, request
from werkzeug.exceptions import HTTPException

from contract.hosts import host_refusal

from .errors import ApiError, Forbidden, Unauthorized
from .openai_compat import error_body, is_openai_path
from .security import origin_allowed
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

    from .routes import chat, documents, has_valid_key, meta, v1
    from .routes.meta import metrics_allowed

    route_tables = (meta.routes, chat.routes, documents.routes, v1.routes)
    for table in route_tables:
        app.register_blueprint(table.blueprint)
    # What /openapi.json is assembled from: each route's Operation, declared where the route is.
    app.extensions[meta.OPERATIONS] = tuple(op for table in route_tables for op in table.operations)

    from . import telemetry

    telemetry.install(app)  # request ids, HTTP metrics, access lines; spans when OTLP export is configured
    hosts = settings.hosts

    @app.before_request
    def refuse_foreign_hosts():
        # DNS rebinding: a page whose name now points at the worker sends its own name as Host, and no Origin.
        host = request.headers.get("Host")
        if not hosts.allows(host):
            raise ApiError(
                host_refusal(host or "", "WORKER_ALLOWED_HOSTS"), code="host_not_allowed", status=421
            )
        return None

    @app.before_request
    def refuse_foreign_origins():
        # Browsers send Origin on cross-site requests; other programs send none. A page on another site must not
        # drive the worker through a visitor's browser (a text/plain or multipart POST needs no preflight).
        origin = request.headers.get("Origin")
        if not origin_allowed(origin, settings.origins):
            raise Forbidden(
                f"requests from the web origin '{origin}' are not allowed; "
                "list it in WORKER_ALLOWED_ORIGINS to let pages there call the worker",
                code="origin_not_allowed",
            )
        return None

    @app.before_request
    def answer_preflight():
        # A listed origin's browser asks first before a JSON or authorised request; it carries no key.
        if request.method == "OPTIONS" and request.headers.get("Origin"):
            return app.response_class(status=204)
        return None

    @app.before_request
    def require_api_key():
        if request.path in OPEN_PATHS or has_valid_key():
            return None
        if request.path == "/metrics" and metrics_allowed():  # a scrape from this machine needs no key
            return None
        raise Unauthorized("missing or wrong API key: send 'Authorization: Bearer <WORKER_API_KEY>'")

    @app.after_request
    def cors_for_listed_origins(response):
        origin = request.headers.get("Origin")
        if origin and settings.origins and origin_allowed(origin, settings.origins):
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Allow-Headers"] = "Authorization, Content-Type"
            response.headers["Access-Control-Allow-Methods"] = "GET, POST, DELETE"
            response.headers["Access-Control-Max-Age"] = "600"
        response.vary.add("Origin")
        return response

    register_error_handlers(app)
    return app


def register_error_handlers(app: Flask) -> None:
    """Every failure answers JSON: the worker's `{error, code, field}`, or OpenAI's shape on /v1."""

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
        codes = {
            404: "not_found",
            405: "method_not_allowed",
            413: "too_large",
            415: "unsupported_type",
            416: "range_not_satisfiable",
        }
        body = {"error": err.description or err.name, "code": codes.get(err.code or 400, "bad_request")}
        allowed = getattr(err, "valid_methods", None)  # a 405 says what is allowed (RFC 9110)
        headers = {"Allow": ", ".join(allowed)} if allowed else None
        if err.code == 416 and getattr(err, "length", None) is not None:  # a 416 says the size (RFC 9110)
            headers = {"Content-Range": f"bytes */{err.length}"}
        return error(body, err.code or 400, headers)

    @app.errorhandler(Exception)
    def unexpected(err: Exception):
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error({"error": f"internal error: {type(err).__name__}", "code": "internal"}, 500)
