"""API keys per user: made, checked and used as `Authorization: Bearer rag_...` wherever a session token is.

A key is `rag_` and 43 URL-safe characters (256 random bits). Only its SHA-256 is stored: a fast hash is right
for a random secret of that size (nothing to guess from a leaked hash), where the password hash (argon2) would
cost a turn's worth of CPU on every request. Its first 12 characters are kept in clear as its visible prefix,
so a person can tell their keys apart; the secret itself is shown once, in the answer that creates it.

A key acts with its user's rights as they are at each request: the user's row is read every time, so a disabled
account's keys stop working and an administrator made an ordinary user loses the administrator's routes through
the key too. A revoked or expired key is a 401 that says which. A `read_only` key can only ask (GET anything it
may read, start and stop turns, `/v1/chat/completions`); anything else it sends is a 403. Each key has its own
allowance of requests per window (API_KEY_RATE_LIMIT per API_KEY_RATE_WINDOW_S, counted in this process like
the other limits), on top of the account's running-turn allowance every turn shares (gateway/quotas.py).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlmodel import col, select, update
from starlette.requests import Request

from .db import ApiKey, Database, User, utcnow
from .errors import Forbidden, Unauthorized
from .ratelimits import RateLimit

KEY_PREFIX = "rag_"
VISIBLE_CHARS = 12  # "rag_" and 8 characters of the secret: enough to tell keys apart, nothing to guess with
# Writing last_used_at on every request would make every read a write: once a minute per key is plenty.
LAST_USED_EVERY = timedelta(seconds=60)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# What a read-only key may send besides reading: asking (a chat to ask in, a turn, its stop) and /v1's answer.
ASKING = [
    ("POST", re.compile(r"/api/chats")),
    ("POST", re.compile(r"/api/chats/\d+/messages(?:/stream)?")),
    ("POST", re.compile(r"/api/chats/\d+/stop")),
    ("POST", re.compile(r"/v1/chat/completions")),
]


def new_secret() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def is_api_key(token: str) -> bool:
    """A Bearer value that is one of ours (a session token is a JWT, which starts `eyJ`)."""
    return token.startswith(KEY_PREFIX)


def aware(value: datetime | None) -> datetime | None:
    """SQLite hands datetimes back without their zone; they were stored in UTC."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


def is_expired(key: ApiKey, now: datetime | None = None) -> bool:
    expires = aware(key.expires_at)
    return expires is not None and expires <= (now or utcnow())


@dataclass(frozen=True)
class KeyUse:
    """The key a request was signed in with (`request.state.api_key`)."""

    id: int
    read_only: bool


def may_send(method: str, path: str) -> bool:
    """Whether a read-only key may send this request."""
    method = method.upper()
    if method in SAFE_METHODS:
        return True
    return any(method == m and pattern.fullmatch(path) for m, pattern in ASKING)


def _load(db: Database, digest: str) -> tuple[ApiKey | None, User | None]:
    """The key with this hash and its user; its last use is recorded (at most once a minute)."""
    now = utcnow()
    with db.session() as s:
        key = s.exec(select(ApiKey).where(ApiKey.secret_hash == digest)).first()
        if key is None:
            return None, None
        user = s.get(User, key.user_id)
        last = aware(key.last_used_at)
        if (
            key.revoked_at is None
            and not is_expired(key, now)
            and (last is None or now - last >= LAST_USED_EVERY)
        ):
            s.exec(update(ApiKey).where(col(ApiKey.id) == key.id).values(last_used_at=now))
            s.commit()
            key.last_used_at = now
        return key, user


def authenticate(db: Database, limits: RateLimit, secret: str, request: Request) -> User:
    """The user a key signs in (run in a thread: it reads the database). A 401 that says why for a key that is
    unknown, revoked or expired or whose account is disabled; a 429 past the key's allowance; a 403 for a
    read-only key sending anything but a question."""
    key, user = _load(db, secret_hash(secret))
    if key is None:
        raise Unauthorized("this API key is not valid", code="key_invalid")
    if key.revoked_at is not None:
        raise Unauthorized("this API key has been revoked", code="key_revoked")
    if is_expired(key):
        raise Unauthorized("this API key has expired: create a new one", code="key_expired")
    if user is None:
        raise Unauthorized("the account of this API key no longer exists", code="key_invalid")
    if user.disabled:
        raise Unauthorized("this account has been disabled by an administrator", code="account_disabled")
    limits.hit(db, f"key:{key.id}", "requests", "with this API key")
    if key.read_only and not may_send(request.method, request.url.path):
        raise Forbidden(
            "this API key is read-only: it can ask and read, not change anything", code="read_only_key"
        )
    request.state.api_key = KeyUse(id=key.id, read_only=key.read_only)
    return user


def key_of(request: Request) -> KeyUse | None:
    """The API key this request was signed in with, or None (a session)."""
    return getattr(request.state, "api_key", None)
