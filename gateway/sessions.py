"""How a request proves who it is: the web's session cookie, or a Bearer token (scripts).

The web chat never sees its token: login sets it as an `HttpOnly` cookie (script on the page, injected or not,
cannot read it), `SameSite=Strict` (other sites' pages do not send it), `Secure` when served over HTTPS. A
cookie is sent by the browser on its own, so a state-changing request that authenticates with it must also
come from one of our pages: its `Origin` must be the gateway's own (or one in GATEWAY_ALLOWED_ORIGINS).
A Bearer token is only ever sent on purpose, so it needs no such check.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from .auth import bearer_token
from .errors import Forbidden
from .settings import Settings

COOKIE = "rag_session"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def request_token(request: Request) -> tuple[str, bool]:
    """(token, from_cookie): the Authorization header wins; the cookie is the web's."""
    header = request.headers.get("authorization")
    if header:
        return bearer_token(header), False
    cookie = request.cookies.get(COOKIE)
    if cookie:
        return cookie, True
    return bearer_token(None), False  # raises the 401 that says how to sign in


def same_host(origin: str, request: Request) -> bool:
    """The Origin names the host (and port) this request was sent to. The scheme is not compared: a proxy
    that terminates TLS in front of another may pass `http` on although the page was `https`."""
    _scheme, sep, host = origin.partition("://")
    return bool(sep) and host == request.headers.get("host", "").strip().lower()


def check_origin(request: Request, settings: Settings, *, required: bool) -> None:
    """A 403 when the request comes from another site's page (or, if `required`, names no origin at all)."""
    origin = request.headers.get("origin")
    if origin is None:
        if required:
            raise Forbidden(
                "a request signed in by the session cookie must carry an Origin header",
                code="origin_required",
            )
        return
    origin = origin.strip().rstrip("/").lower()
    if not same_host(origin, request) and origin not in settings.origins():
        raise Forbidden(f"requests from {origin} are not accepted here", code="origin_not_allowed")


def check_cookie_request(request: Request, settings: Settings) -> None:
    if request.method.upper() not in SAFE_METHODS:
        check_origin(request, settings, required=True)


def set_session_cookie(response: Response, request: Request, token: str, ttl_s: int) -> None:
    response.set_cookie(
        COOKIE,
        token,
        max_age=ttl_s,
        path="/",
        httponly=True,
        secure=request.url.scheme == "https",
        samesite="strict",
    )


def clear_session_cookie(response: Response, request: Request) -> None:
    response.delete_cookie(
        COOKIE, path="/", httponly=True, secure=request.url.scheme == "https", samesite="strict"
    )
