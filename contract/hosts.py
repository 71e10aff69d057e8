"""The `Host` allow-list both services apply to every request (DNS rebinding).

A page on `evil.example` whose name the attacker re-points at 127.0.0.1 (or at a private address) makes the
visitor's browser send its requests to a service there; they are same-origin for the browser, so it sends no
`Origin` and reads the answers. What gives such a request away is its `Host: evil.example`. So a request is
answered only when its Host (port aside) is

- a loopback name (`localhost`), or any IP address literal (`127.0.0.1`, `[::1]`, `10.0.0.5`): a rebinding
  attack needs a name the attacker controls, and a page whose origin is the address itself is the service's own;
- one of the names configured for the service (`WORKER_ALLOWED_HOSTS`, `GATEWAY_ALLOWED_HOSTS`): exact names,
  or `.example.org` for that name and every name under it;
- anything, when the setting is `*` (behind a proxy that checks or rewrites Host itself).

A request without a Host header (HTTP/1.0) comes from no browser and passes.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

LOOPBACK_NAMES = frozenset({"localhost"})


def host_name(value: str) -> str:
    """`Example.org:8000` -> `example.org`, `[::1]:8001` -> `::1`, `localhost.` -> `localhost`."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        return value[1:end] if end > 0 else value
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value[:-1] if value.endswith(".") else value


def is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class AllowedHosts:
    """A service's allow-list, parsed from its setting (comma- or space-separated names, or `*`)."""

    names: frozenset[str]
    suffixes: tuple[str, ...]  # `.example.org` entries, kept with their leading dot
    everyone: bool = False

    @classmethod
    def parse(cls, raw: str | None) -> AllowedHosts:
        items = [item.strip().lower() for item in re.split(r"[,\s]+", raw or "") if item.strip()]
        suffixes = tuple(item.rstrip(".") for item in items if item.startswith(".") and len(item) > 1)
        names = frozenset(host_name(item) for item in items if not item.startswith("."))
        return cls(names=names, suffixes=suffixes, everyone="*" in items)

    def allows(self, host: str | None) -> bool:
        if host is None or self.everyone:
            return True
        name = host_name(host)
        if name in LOOPBACK_NAMES or name in self.names or is_ip_literal(name):
            return True
        return any(name == suffix[1:] or name.endswith(suffix) for suffix in self.suffixes)


def host_refusal(host: str, setting: str) -> str:
    """What a refused request is told: which name was refused and what to set."""
    shown = host.strip()[:100]
    return (
        f"requests for the host name '{shown}' are not answered here (a guard against DNS rebinding): if this "
        f"service is reached by that name, add it to {setting} (comma-separated; '*' turns the check off "
        "behind a proxy that checks the Host itself)"
    )
