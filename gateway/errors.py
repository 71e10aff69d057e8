"""Errors that cross the HTTP boundary as `{"error", "code", "field"}` JSON, and the handlers that render them."""

from __future__ import annotations

import logging

from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

log = logging.getLogger("gateway")


class ApiError(Exception):
    """A failure the client should see: an HTTP status, a machine code and a human message."""

    status = 400
    code = "bad_request"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        field: str | None = None,
        status: int | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.message = message
        if code:
            self.code = code
        if status:
            self.status = status
        self.field = field
        self.headers = headers

    def to_dict(self) -> dict:
        body = {"error": self.message, "code": self.code}
        if self.field:
            body["field"] = self.field
        return body


class BadRequest(ApiError):
    status, code = 400, "bad_request"


class Unauthorized(ApiError):
    status, code = 401, "unauthorized"


class Forbidden(ApiError):
    status, code = 403, "forbidden"


class NotFound(ApiError):
    status, code = 404, "not_found"


class Conflict(ApiError):
    status, code = 409, "conflict"


class PayloadTooLarge(ApiError):
    status, code = 413, "too_large"


class TooManyRequests(ApiError):
    status, code = 429, "too_many_requests"


class WorkerFailed(ApiError):
    """The worker answered with an error, or not at all; `status` is what the browser gets."""

    status, code = 502, "worker_error"


class Unavailable(ApiError):
    status, code = 503, "unavailable"


def from_validation_error(exc: ValidationError) -> BadRequest:
    """The first pydantic error as a 400 naming the field (dotted path), in words a client can act on."""
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": str(exc)}
    field = ".".join(str(part) for part in first.get("loc", ()) if part != "__root__") or None
    message = first.get("msg", "invalid value")
    return BadRequest(f"{field}: {message}" if field else message, code="invalid", field=field)


def json_error(err: ApiError) -> JSONResponse:
    return JSONResponse(err.to_dict(), status_code=err.status, headers=err.headers)


async def api_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return json_error(exc)


async def validation_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ValidationError)
    return json_error(from_validation_error(exc))


HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    415: "unsupported_type",
}


async def http_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    code = HTTP_CODES.get(exc.status_code, "error")
    message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if exc.status_code == 413:
        message = "the request body is larger than this server accepts"
    return JSONResponse({"error": message, "code": code}, status_code=exc.status_code, headers=exc.headers)


async def unexpected_error_handler(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return JSONResponse(
        {"error": f"internal error: {type(exc).__name__}", "code": "internal"}, status_code=500
    )


HANDLERS = {
    ApiError: api_error_handler,
    ValidationError: validation_error_handler,
    HTTPException: http_error_handler,
    Exception: unexpected_error_handler,
}
