"""Sliding-window rate limits counted in the database: new accounts per client address, requests per API key.

Every counted event is a row kept until its window ends, so every gateway process and replica sees the same
count, and a client spreading its requests over them gains nothing. A hit takes the key's lock first (Postgres:
an advisory lock on the key's hash, to the end of the transaction; SQLite runs one write transaction at a time,
BEGIN IMMEDIATE), drops the key's ended events, counts the rest and adds one when under the limit; otherwise a
429 whose Retry-After is when the oldest event leaves the window. Rows of keys no longer used are pruned when a
key starts a fresh window.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlmodel import col, delete, func, select

from .db import Database, RateEvent
from .errors import TooManyRequests

MAX_KEY = 200


def stored_key(key: str) -> str:
    """The key as stored: a long one (an odd forwarded address) by its digest, within the column's size."""
    if len(key) <= MAX_KEY:
        return key
    return "sha256:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass
class RateLimit:
    """At most `limit` events per key inside a sliding window of `window_s` seconds."""

    limit: int
    window_s: float

    def hit(
        self,
        db: Database,
        key: str,
        what: str = "requests",
        source: str = "from this address",
        now: float | None = None,
    ) -> None:
        """Count one event for `key` (run in a thread: it writes), or raise 429 (with Retry-After) when the key
        has used its allowance."""
        now = time.time() if now is None else now
        key = stored_key(key)
        with db.session() as s:
            if s.get_bind().dialect.name == "postgresql":
                s.connection().execute(text("SELECT pg_advisory_xact_lock(hashtext(:key))"), {"key": key})
            s.exec(delete(RateEvent).where(col(RateEvent.key) == key, col(RateEvent.expires_at) <= now))
            count, oldest = s.exec(
                select(func.count(), func.min(RateEvent.expires_at)).where(col(RateEvent.key) == key)
            ).one()
            if count >= self.limit:
                retry = max(1, math.ceil(oldest - now))
                raise TooManyRequests(
                    f"too many {what} {source}: try again in {retry} s",
                    code="rate_limited",
                    headers={"Retry-After": str(retry)},
                )
            s.add(RateEvent(key=key, expires_at=now + self.window_s))
            s.commit()
        if count == 0:
            prune_ended(db, RateEvent, now)


def prune_ended(db: Database, table, now: float) -> None:
    """Drop every ended window's rows of `table` (one with `expires_at`), so a spray of addresses, keys or
    usernames does not grow it for good. Shared by the rate limits and the login lockout."""
    try:
        with db.session() as s:
            s.exec(delete(table).where(col(table.expires_at) <= now))
            s.commit()
    except DBAPIError:  # another process pruning the same rows at once (Postgres): theirs does it
        pass
