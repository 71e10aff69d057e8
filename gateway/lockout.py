"""Failed logins, counted in the database before the password is checked.

An attempt is counted as failed *before* its password hash is verified: the count goes up in one statement
(`UPDATE ... SET count = count + 1 WHERE count < lock RETURNING count`), so sixty guesses sent at once take
sixty numbers one after another and only those under the lock are checked at all; the rest are a 429 at once.
A right password then takes its attempt back. The rows are shared by every gateway replica, on SQLite (whose
write transactions run one at a time: BEGIN IMMEDIATE) and on Postgres (whose UPDATE locks the row, and a
second UPDATE re-reads it once the first commits). Keys are handled in sorted order, so two attempts never
wait on each other's rows crosswise.
"""

from __future__ import annotations

import hashlib
import math
import time

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, delete, select, update

from .auth import LoginThrottle
from .db import Database, LoginFailure
from .errors import TooManyRequests, Unavailable
from .ratelimits import prune_ended

Guard = tuple[str, LoginThrottle]  # a key and how its failures are answered
MAX_KEY = 200


def stored_key(key: str) -> str:
    """The key as stored: a long one (an odd forwarded address) by its digest, within the column's size."""
    if len(key) <= MAX_KEY:
        return key
    return "sha256:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def reserve(db: Database, guards: list[Guard], now: float | None = None) -> float:
    """Count one more failed attempt for every key, all or none: a 429 (with Retry-After) when a key has
    reached its lock, else the seconds to wait before checking the password (the worst key's delay)."""
    now = time.time() if now is None else now
    for _ in range(5):  # a row inserted by a concurrent attempt (Postgres): count again, now as an update
        try:
            with db.session() as s:
                delay, inserted = 0.0, False
                for key, throttle in sorted(guards, key=lambda g: g[0]):
                    failures, new = _count(s, stored_key(key), throttle, now)
                    delay, inserted = max(delay, throttle.delay(failures)), inserted or new
                s.commit()
        except IntegrityError:
            continue
        if inserted:
            prune_ended(db, LoginFailure, now)
        return delay
    raise Unavailable("the login could not be counted: try again", code="login_busy")


def _count(s: Session, key: str, throttle: LoginThrottle, now: float) -> tuple[int, bool]:
    """(failures before this attempt, whether its row is new); raises the 429 of a locked key."""
    s.exec(delete(LoginFailure).where(col(LoginFailure.key) == key, col(LoginFailure.expires_at) <= now))
    counted = s.exec(
        update(LoginFailure)
        .where(col(LoginFailure.key) == key, col(LoginFailure.count) < throttle.lock_after)
        .values(count=LoginFailure.count + 1)
        .returning(col(LoginFailure.count))
    ).first()
    if counted is not None:
        return counted[0] - 1, False
    expires_at = s.exec(select(LoginFailure.expires_at).where(col(LoginFailure.key) == key)).first()
    if expires_at is not None:
        retry = max(1, math.ceil(expires_at - now))
        raise TooManyRequests(
            f"too many failed logins: try again in {retry} s",
            code="login_throttled",
            headers={"Retry-After": str(retry)},
        )
    if throttle.lock_after < 1:
        raise TooManyRequests("logins are locked on this server", code="login_throttled")
    s.add(LoginFailure(key=key, count=1, expires_at=now + throttle.window_s))
    s.flush()
    return 0, True


def succeeded(db: Database, cleared: list[str], given_back: list[str]) -> None:
    """A right password: the `cleared` keys start afresh (this account at this address), the `given_back` ones
    only lose the attempt counted for it (the address keeps what it failed at other accounts)."""
    with db.session() as s:
        for key in sorted(stored_key(k) for k in cleared):
            s.exec(delete(LoginFailure).where(col(LoginFailure.key) == key))
        for key in sorted(stored_key(k) for k in given_back):
            s.exec(
                update(LoginFailure)
                .where(col(LoginFailure.key) == key, col(LoginFailure.count) > 0)
                .values(count=LoginFailure.count - 1)
            )
        s.commit()
