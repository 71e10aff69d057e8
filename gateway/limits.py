"""Request body limits that answer in the API's JSON error shape (Starlette's built-in one answers plain text)."""

from __future__ import annotations

import re

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import PayloadTooLarge, json_error


class BodyLimit:
    """A limit on every request body, with larger ones for paths that take uploads.

    A declared Content-Length over the limit is refused before anything is read; a body that grows past it
    while being read raises PayloadTooLarge inside the route, which renders it like any other API error.
    """

    def __init__(self, app: ASGIApp, default: int, larger: list[tuple[str, int]] | None = None):
        self.app = app
        self.default = default
        self.larger = [(re.compile(pattern), limit) for pattern, limit in (larger or [])]

    def limit_for(self, path: str) -> int:
        for pattern, limit in self.larger:
            if pattern.fullmatch(path):
                return limit
        return self.default

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["path"])
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await json_error(_too_large(limit))(scope, receive, send)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _too_large(limit)
            return message

        await self.app(scope, limited_receive, send)


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"the request body is larger than the {limit} bytes this route accepts")
