"""What keeps an open worker safe from web pages and its configuration private.

- A browser sends an `Origin` header with every cross-site POST (and with fetches); other programs (the gateway,
  curl, scripts) send none. A request whose Origin is not listed in `WORKER_ALLOWED_ORIGINS` is refused, so a
  page on another site cannot drive the worker through a visitor's browser, key or no key.
- A request for a host name other than `localhost`, an IP address or one in `WORKER_ALLOWED_HOSTS` is a 421
  (contract/hosts.py): a DNS-rebinding page, same-origin for the browser and so sending no Origin, is refused.
- JSON routes only accept `Content-Type: application/json`, which a page cannot send cross-site without a CORS
  preflight (that the worker never answers).
- Listening beyond loopback without `WORKER_API_KEY` is refused unless `WORKER_ALLOW_OPEN=1` says it is meant.
- Anything shown about the configuration has the credentials in URLs masked.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s?#]+@")
_URL_QUERY = re.compile(r"(?P<url>[A-Za-z][A-Za-z0-9+.-]*://[^\s?#]+)\?[^\s#]*")
MASK = "***"


def mask_url(text: str) -> str:
    """`http://user:pass@host:11434/?token=x` -> `http://***@host:11434/?***`, in any string."""
    text = _URL_CREDENTIALS.sub(lambda m: f"{m.group('scheme')}{MASK}@", text)
    return _URL_QUERY.sub(lambda m: f"{m.group('url')}?{MASK}", text)


def mask_credentials(value: Any) -> Any:
    """A copy of a JSON-like value with every URL's user:password and query masked."""
    if isinstance(value, str):
        return mask_url(value)
    if isinstance(value, dict):
        return {k: mask_credentials(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [mask_credentials(v) for v in value]
    return value


def parse_origins(raw: str) -> frozenset[str]:
    """`WORKER_ALLOWED_ORIGINS`: comma- or space-separated origins (`https://app.example:8443`), compared exactly
    after dropping a trailing slash and lower-casing."""
    return frozenset(o.strip().rstrip("/").lower() for o in re.split(r"[,\s]+", raw or "") if o.strip())


def origin_allowed(origin: str | None, allowed: frozenset[str]) -> bool:
    """Requests without an Origin (non-browser clients) pass; a browser's must be listed."""
    if origin is None:
        return True
    return origin.strip().rstrip("/").lower() in allowed


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1, `localhost` and unix sockets; everything else (0.0.0.0, ::, names) is open."""
    host = host.strip()
    if host.startswith("unix:"):
        return True
    if host.startswith("[") and "]" in host:
        host = host[1 : host.index("]")]
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_host(bind: str) -> str:
    """The host part of a gunicorn bind (`host:port`, `[::1]:8001`, `unix:/path`)."""
    if bind.startswith("unix:"):
        return bind
    if bind.startswith("["):
        return bind[: bind.index("]") + 1]
    return bind.rsplit(":", 1)[0] if ":" in bind else bind


def open_bind_refusal(binds: list[str], *, has_key: bool, allow_open: bool) -> str | None:
    """Why the worker must not start on `binds`, or None when it may."""
    if has_key or allow_open:
        return None
    open_binds = [b for b in binds if not is_loopback(bind_host(b))]
    if not open_binds:
        return None
    return (
        f"refusing to listen on {', '.join(open_binds)} without an API key: anyone who can reach that address "
        "could read, change and delete every index. Set WORKER_API_KEY (and give the gateway the same value), "
        "listen on 127.0.0.1, or set WORKER_ALLOW_OPEN=1 if the network in front of the worker is private "
        "(as in deploy/docker-compose.yml)."
    )
