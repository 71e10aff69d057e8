"""Any other `/api/...` request: a JSON 405 (with `Allow`) when the path exists for other methods, else a JSON 404.

Without it such a request would fall through to the web files, which answer 405 without `Allow` to every
non-GET method, so `POST /api/chats/abc/stop` (not a chat id) would read as a wrong method, not a missing chat.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.routing import BaseRoute, Match, Route

from .errors import ApiError, NotFound


def fallback_for(api_routes: list[BaseRoute]) -> Route:
    async def fallback(request: Request):
        allowed: set[str] = set()
        for route in api_routes:
            match, _ = route.matches(request.scope)
            if match == Match.PARTIAL and isinstance(route, Route) and route.methods:
                allowed |= route.methods
        if allowed:
            raise ApiError(
                f"{request.method} is not allowed here (allowed: {', '.join(sorted(allowed))})",
                code="method_not_allowed",
                status=405,
                headers={"Allow": ", ".join(sorted(allowed))},
            )
        raise NotFound(f"no such API route: {request.url.path}", code="not_found")

    methods = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"]
    return Route("/api/{rest:path}", fallback, methods=methods)
