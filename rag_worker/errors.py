"""Errors that cross the HTTP boundary as `{"error", "code", "field"}` JSON."""

from __future__ import annotations


class ApiError(Exception):
    """A failure the client should see: an HTTP status, a machine code and a human message."""

    status = 400
    code = "bad_request"

    def __init__(
        self, message: str, *, code: str | None = None, field: str | None = None, status: int | None = None
    ):
        super().__init__(message)
        self.message = message
        if code:
            self.code = code
        if status:
            self.status = status
        self.field = field

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


class IndexNotFound(NotFound):
    code = "index_not_found"

    def __init__(self, message: str, *, field: str | None = "index", **kw):
        super().__init__(message, field=field, **kw)


class DocumentNotFound(NotFound):
    code = "document_not_found"

    def __init__(self, index: str, dataset: str, filename: str):
        super().__init__(
            f"no document '{filename}' in dataset '{dataset}' of index '{index}'", field="filename"
        )


class Conflict(ApiError):
    status, code = 409, "conflict"


class EmbedderMismatch(Conflict):
    code = "embedder_mismatch"


class PayloadTooLarge(ApiError):
    status, code = 413, "too_large"


class UnsupportedType(ApiError):
    status, code = 415, "unsupported_type"


class Unavailable(ApiError):
    status, code = 503, "unavailable"


class LLMUnavailable(Unavailable):
    code = "llm_unavailable"


class RerankerUnavailable(Unavailable):
    code = "reranker_unavailable"
