"""Who is asking: the client address and scheme behind trusted proxies (`FORWARDED_ALLOW_IPS`).

Each proxy appends the address it received the request from to `X-Forwarded-For`, so only the right end of
the list was written by proxies we trust; anything to the left may be made up by the client. The client is the
right-most entry that is not a trusted proxy. With `*` (every peer trusted, as behind the compose load
balancer) the right-most entry is taken: the one our own proxy appended. Login throttling and registration
limits count per this address, so a client cannot escape them by writing its own `X-Forwarded-For`.
"""

from __future__ import annotations

import ipaddress

from starlette.types import ASGIApp, Receive, Scope, Send

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class TrustedProxies:
    def __init__(self, spec: str):
        items = [item.strip() for item in spec.split(",") if item.strip()]
        self.everyone = "*" in items
        self.networks: list[Network] = []
        self.literals: set[str] = set()
        for item in items:
            try:
                self.networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                self.literals.add(item)  # a unix socket path or a name

    def __contains__(self, host: str | None) -> bool:
        if not host:
            return False
        if self.everyone:
            return True
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return host in self.literals
        return any(address in net for net in self.networks)

    def client(self, peer: str | None, forwarded_for: list[str]) -> str | None:
        """The client's address given the socket peer and the X-Forwarded-For hops (left to right)."""
        if peer not in self:
            return peer
        hops = [_host(h) for h in forwarded_for if h.strip()]
        if not hops:
            return peer
        if self.everyone:
            return hops[-1]
        for hop in reversed(hops):
            if hop not in self:
                return hop
        return hops[0]  # all trusted: the client is itself one of our proxies


def _host(value: str) -> str:
    """`1.2.3.4`, `1.2.3.4:5678`, `[::1]:80` or `::1` -> the address alone."""
    value = value.strip()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        return value.rsplit(":", 1)[0]
    return value


class ProxyHeaders:
    """Rewrites `scope["client"]` and `scope["scheme"]` from the forwarded headers of a trusted peer."""

    def __init__(self, app: ASGIApp, trusted: str):
        self.app = app
        self.trusted = TrustedProxies(trusted)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            peer = scope.get("client")
            peer_host = peer[0] if peer else None
            if peer_host in self.trusted:
                forwarded: list[str] = []
                proto = None
                for name, value in scope.get("headers", []):
                    if name == b"x-forwarded-for":
                        forwarded.extend(value.decode("latin-1").split(","))
                    elif name == b"x-forwarded-proto":
                        proto = value.decode("latin-1").split(",")[-1].strip().lower()
                client = self.trusted.client(peer_host, forwarded)
                if client and client != peer_host:
                    scope = {**scope, "client": (client, 0)}
                if proto in ("http", "https") and scope["type"] == "http":
                    scope = {**scope, "scheme": proto}
        await self.app(scope, receive, send)
