"""Passwords (passlib, argon2), tokens (PyJWT, HS256 with an expiry) and the slow-down of failed logins."""

from __future__ import annotations

import time
from dataclasses import dataclass

import jwt
from passlib.context import CryptContext

from .errors import Unauthorized

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


def issue_token(
    user_id: int, username: str, secret: str, ttl_s: int, now: float | None = None, version: int = 0
) -> str:
    """A signed token for the user; `version` is the account's token version (see TokenClaims)."""
    issued = int(now if now is not None else time.time())
    claims = {"sub": str(user_id), "name": username, "iat": issued, "exp": issued + ttl_s, "ver": version}
    return jwt.encode(claims, secret, algorithm=ALGORITHM)


@dataclass(frozen=True)
class TokenClaims:
    """Who a valid token is for, and the account's token version when it was issued: logout, a password change
    and disabling raise the stored version, which ends every token issued before."""

    user_id: int
    version: int


def read_token(token: str, secret: str) -> int:
    """The user id in a valid token; a 401 that says why for anything else (expired, forged, `alg: none`)."""
    return read_claims(token, secret).user_id


# Tokens verified already, with their expiry: every request of a signed-in browser sends the same token, and
# checking its signature and claims again is a large part of what a turn costs the gateway's event loop. A
# token's validity changes only with time (its `exp`; the account's state is read at every request), so the
# entry answers until then. Keyed by the token and the secret, so any other bytes are verified in full.
_VERIFIED: dict[tuple[str, str], tuple[TokenClaims, float]] = {}
_VERIFIED_MAX = 4096


def read_claims(token: str, secret: str) -> TokenClaims:
    """The claims of a valid token; a 401 that says why for anything else."""
    known = _VERIFIED.get((token, secret))
    if known is not None:
        if known[1] > time.time():  # PyJWT's test: expired once exp <= now
            return known[0]
        _VERIFIED.pop((token, secret), None)
        raise Unauthorized("the session token has expired: log in again", code="token_expired")
    claims = _verified(token, secret)
    if len(_VERIFIED) >= _VERIFIED_MAX:
        _VERIFIED.clear()
    exp = claims.pop("exp")
    read = _claims(claims)
    if isinstance(exp, int | float) and not isinstance(exp, bool):
        _VERIFIED[(token, secret)] = (read, float(exp))
    return read


def _verified(token: str, secret: str) -> dict:
    try:
        return jwt.decode(token, secret, algorithms=[ALGORITHM], options={"require": ["exp", "sub"]})
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


def _claims(claims: dict) -> TokenClaims:
    try:
        user_id = int(claims["sub"])
    except (TypeError, ValueError):
        raise Unauthorized("the token names no user: log in again", code="token_invalid") from None
    version = claims.get("ver", 0)
    if not isinstance(version, int) or isinstance(version, bool):
        raise Unauthorized("the token's version is not a number: log in again", code="token_invalid")
    return TokenClaims(user_id=user_id, version=version)


def bearer_token(header: str | None) -> str:
    if not header:
        raise Unauthorized("log in first: send 'Authorization: Bearer <token>'")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("the Authorization header must be 'Bearer <token>'")
    return token.strip()


@dataclass(frozen=True)
class LoginThrottle:
    """How failed logins of one kind of key (a username at an address, an address) are answered.

    The first `free` failures cost nothing extra; after that each attempt waits a delay that doubles up to
    `max_delay_s`; from `lock_after` failures the key is refused (429) until the window has passed. The counts
    live in the database (gateway/lockout.py), so concurrent attempts and gateway replicas share them.
    """

    free: int = 5
    base_delay_s: float = 0.5
    max_delay_s: float = 5.0
    lock_after: int = 20
    window_s: float = 900.0

    def delay(self, failures: int) -> float:
        """Seconds to wait before checking an attempt that follows `failures` failed ones."""
        if failures < self.free:
            return 0.0
        return min(self.max_delay_s, self.base_delay_s * 2 ** (failures - self.free))
