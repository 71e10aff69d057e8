"""Passwords (passlib, argon2), tokens (PyJWT, HS256 with an expiry) and the slow-down of failed logins."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import jwt
from passlib.context import CryptContext

from .errors import TooManyRequests, Unauthorized

ALGORITHM = "HS256"
_passwords = CryptContext(schemes=["argon2"], deprecated="auto")
# Verified against when the username is unknown, so both failures cost the same time (no user probing).
_DUMMY_HASH = _passwords.hash("not a real password")


def hash_password(password: str) -> str:
    return _passwords.hash(password)


def verify_password(password: str, password_hash: str | None) -> bool:
    """True when the password matches; an unknown user (None) still pays for one verification."""
    if password_hash is None:
        _passwords.verify(password, _DUMMY_HASH)
        return False
    try:
        return _passwords.verify(password, password_hash)
    except ValueError:  # an unreadable stored hash
        return False


def issue_token(user_id: int, username: str, secret: str, ttl_s: int, now: float | None = None) -> str:
    issued = int(now if now is not None else time.time())
    claims = {"sub": str(user_id), "name": username, "iat": issued, "exp": issued + ttl_s}
    return jwt.encode(claims, secret, algorithm=ALGORITHM)


def read_token(token: str, secret: str) -> int:
    """The user id in a valid token; a 401 that says why for anything else (expired, forged, `alg: none`)."""
    try:
        claims = jwt.decode(token, secret, algorithms=[ALGORITHM], options={"require": ["exp", "sub"]})
    except jwt.ExpiredSignatureError:
        raise Unauthorized("the session token has expired: log in again", code="token_expired") from None
    except jwt.InvalidAlgorithmError:
        raise Unauthorized(
            f"the token is not signed with {ALGORITHM}: log in again", code="token_invalid"
        ) from None
    except jwt.InvalidSignatureError:
        raise Unauthorized("the token signature is not valid: log in again", code="token_invalid") from None
    except jwt.InvalidTokenError as exc:
        raise Unauthorized(f"the token is not valid ({exc}): log in again", code="token_invalid") from None
    try:
        return int(claims["sub"])
    except (TypeError, ValueError):
        raise Unauthorized("the token names no user: log in again", code="token_invalid") from None


def bearer_token(header: str | None) -> str:
    if not header:
        raise Unauthorized("log in first: send 'Authorization: Bearer <token>'")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("the Authorization header must be 'Bearer <token>'")
    return token.strip()


@dataclass
class _Failures:
    count: int = 0
    first_at: float = 0.0


@dataclass
class LoginThrottle:
    """Counts failed logins per key (a username, an address) inside a window.

    The first `free` failures cost nothing extra; after that each attempt waits a delay that doubles up to
    `max_delay_s`; from `lock_after` failures the key is refused (429) until the window has passed.
    """

    free: int = 5
    base_delay_s: float = 0.5
    max_delay_s: float = 5.0
    lock_after: int = 20
    window_s: float = 900.0
    clock: Callable[[], float] = time.monotonic
    _failures: dict[str, _Failures] = field(default_factory=dict)

    def _current(self, key: str) -> _Failures:
        entry = self._failures.get(key)
        if entry is not None and self.clock() - entry.first_at > self.window_s:
            del self._failures[key]
            entry = None
        return entry or _Failures()

    def delay_for(self, keys: list[str]) -> float:
        """Seconds to wait before answering this attempt; raises 429 when a key is locked."""
        worst = max((self._current(k).count for k in keys), default=0)
        if worst >= self.lock_after:
            oldest = min(self._current(k).first_at for k in keys if self._current(k).count >= self.lock_after)
            retry = max(1, math.ceil(self.window_s - (self.clock() - oldest)))
            raise TooManyRequests(
                f"too many failed logins: try again in {retry} s",
                code="login_throttled",
                headers={"Retry-After": str(retry)},
            )
        if worst < self.free:
            return 0.0
        return min(self.max_delay_s, self.base_delay_s * 2 ** (worst - self.free))

    def failed(self, keys: list[str]) -> None:
        now = self.clock()
        for key in keys:
            entry = self._current(key)
            if entry.count == 0:
                entry.first_at = now
            entry.count += 1
            self._failures[key] = entry
        if len(self._failures) > 10_000:  # keep memory bounded under a spray of usernames
            for key in [k for k in self._failures if now - self._failures[k].first_at > self.window_s]:
                del self._failures[key]

    def succeeded(self, keys: list[str]) -> None:
        for key in keys:
            self._failures.pop(key, None)
