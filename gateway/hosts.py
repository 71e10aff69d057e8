"""The `Host` allow-list (contract/hosts.py) in front of every route: a request for a name the gateway is not
published as (a DNS-rebinding page's own name) is a 421 JSON error naming `GATEWAY_ALLOWED_HOSTS`."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from contract.hosts import AllowedHosts, host_refusal


class HostCheck:
    def __init__(self, app: ASGIApp, allowed: AllowedHosts):
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            host = Headers(scope=scope).get("host")
            if not self.allowed.allows(host):
                body = {
                    "error": host_refusal(host or "", "GATEWAY_ALLOWED_HOSTS"),
                    "code": "host_not_allowed",
                }
                await JSONResponse(body, status_code=421)(scope, receive, send)
                return
        await self.app(scope, receive, send)
