"""Tokens, passwords and the failed-login slow-down, without a server."""

from __future__ import annotations

import base64
import contextlib
import json
import threading
import time
from collections.abc import Iterator

import jwt
import pytest

from gateway import lockout
from gateway.auth import LoginThrottle, hash_password, issue_token, read_token, verify_password
from gateway.db import Database
from gateway.errors import TooManyRequests, Unauthorized
from tests.integration.ops.postgres import database_urls, fresh_database

SECRET = "s" * 64


def _b64(data: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def test_a_fresh_token_names_its_user() -> None:
    assert read_token(issue_token(7, "alice", SECRET, ttl_s=60), SECRET) == 7


def test_an_expired_token_is_refused_as_expired() -> None:
    token = issue_token(7, "alice", SECRET, ttl_s=60, now=time.time() - 3600)
    with pytest.raises(Unauthorized) as err:
        read_token(token, SECRET)
    assert err.value.code == "token_expired"
    assert "expired" in err.value.message


def test_a_token_read_once_still_expires_on_time_and_only_its_exact_bytes_are_taken_for_it() -> None:
    # Valid for another 3 s (room for a loaded CI box before the first read): read (and remembered) now,
    # refused as expired once its exp has passed.
    exp = time.time() + 3.0
    token = jwt.encode({"sub": "7", "exp": exp, "ver": 0}, SECRET, algorithm="HS256")
    assert read_token(token, SECRET) == 7 and read_token(token, SECRET) == 7
    head, body, signature = token.split(".")
    forged_body = _b64({**json.loads(base64.urlsafe_b64decode(body + "==")), "sub": "8"})
    with pytest.raises(Unauthorized) as forged:
        read_token(f"{head}.{forged_body}.{signature}", SECRET)  # the same signature on another body
    assert forged.value.code == "token_invalid"
    with pytest.raises(Unauthorized) as other_secret:
        read_token(token, "another secret entirely, also long")
    assert other_secret.value.code == "token_invalid"
    time.sleep(max(0.0, exp - time.time()) + 0.1)
    for _ in range(2):
        with pytest.raises(Unauthorized) as err:
            read_token(token, SECRET)
        assert err.value.code == "token_expired"


def test_a_token_signed_with_another_secret_is_refused() -> None:
    token = issue_token(7, "alice", "another secret entirely, also long", ttl_s=60)
    with pytest.raises(Unauthorized) as err:
        read_token(token, SECRET)
    assert err.value.code == "token_invalid"


def test_an_unsigned_alg_none_token_is_refused() -> None:
    claims = {"sub": "1", "exp": int(time.time()) + 600}
    token = f"{_b64({'alg': 'none', 'typ': 'JWT'})}.{_b64(claims)}."
    with pytest.raises(Unauthorized) as err:
        read_token(token, SECRET)
    assert err.value.status == 401


def test_a_token_with_another_algorithm_is_refused() -> None:
    token = jwt.encode({"sub": "1", "exp": int(time.time()) + 600}, SECRET, algorithm="HS512")
    with pytest.raises(Unauthorized):
        read_token(token, SECRET)


def test_a_token_without_expiry_is_refused() -> None:
    token = jwt.encode({"sub": "1"}, SECRET, algorithm="HS256")
    with pytest.raises(Unauthorized):
        read_token(token, SECRET)


@pytest.mark.parametrize("garbage", ["", "abc", "a.b.c", "x" * 500])
def test_garbage_is_refused(garbage: str) -> None:
    with pytest.raises(Unauthorized):
        read_token(garbage, SECRET)


def test_passwords_are_hashed_with_argon2_and_verified() -> None:
    stored = hash_password("correct horse")
    assert stored.startswith("$argon2")
    assert verify_password("correct horse", stored)
    assert not verify_password("wrong horse", stored)
    assert not verify_password("correct horse", None)  # unknown user
    assert not verify_password("correct horse", "not a hash")


@pytest.fixture(params=database_urls(), ids=lambda url: url.split(":", 1)[0].split("+")[0])
def db(request, tmp_path) -> Iterator[Database]:
    """The failed-login counts on SQLite, and on Postgres when TEST_DATABASE_URL names one."""
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{tmp_path / 'gateway.db'}"
        else:
            url = stack.enter_context(fresh_database(request.param))
        database = Database(url)
        stack.callback(database.dispose)
        database.migrate()
        yield database


def test_failed_logins_are_free_then_slowed_then_refused_until_the_window_passes(db) -> None:
    throttle = LoginThrottle(free=3, base_delay_s=0.5, max_delay_s=4.0, lock_after=8, window_s=600)
    now = 1000.0
    guards = [("user:alice", throttle), ("addr:10.0.0.1", throttle)]
    delays = [lockout.reserve(db, guards, now) for _ in range(8)]  # each counted as failed until proven
    assert delays == [0, 0, 0, 0.5, 1.0, 2.0, 4.0, 4.0]
    with pytest.raises(TooManyRequests) as err:
        lockout.reserve(db, guards, now)
    assert err.value.headers["Retry-After"] == "600"
    # Another account from another address is not affected.
    assert lockout.reserve(db, [("user:bob", throttle), ("addr:10.0.0.2", throttle)], now) == 0
    # The same address guessing another account is, and the refused attempt counted nothing.
    with pytest.raises(TooManyRequests):
        lockout.reserve(db, [("user:carol", throttle), ("addr:10.0.0.1", throttle)], now)
    assert lockout.reserve(db, [("user:carol", throttle)], now) == 0
    assert lockout.reserve(db, guards, now + 601) == 0


def test_a_successful_login_clears_the_account_but_not_the_address(db) -> None:
    throttle = LoginThrottle(free=1, base_delay_s=1, max_delay_s=8, lock_after=50, window_s=600)
    now = 1000.0
    for _ in range(3):
        lockout.reserve(db, [("user:alice", throttle), ("addr:a", throttle)], now)
    lockout.reserve(db, [("user:alice", throttle), ("addr:a", throttle)], now)  # the right password...
    lockout.succeeded(db, ["user:alice"], ["addr:a"])  # ...takes its attempt back
    assert lockout.reserve(db, [("user:alice", throttle), ("addr:b", throttle)], now) == 0
    assert lockout.reserve(db, [("user:carol", throttle), ("addr:a", throttle)], now) == 4


def test_concurrent_attempts_are_counted_one_by_one(db) -> None:
    """Sixty attempts at once against a lock at 20: exactly 20 are let through to the password check."""
    throttle = LoginThrottle(free=100, lock_after=20, window_s=600)
    barrier = threading.Barrier(60)
    outcomes: list[str] = []

    def attempt() -> None:
        barrier.wait()
        try:
            lockout.reserve(db, [("user:target@a", throttle), ("addr:a", LoginThrottle(lock_after=1000))])
            outcomes.append("checked")
        except TooManyRequests:
            outcomes.append("locked")

    threads = [threading.Thread(target=attempt) for _ in range(60)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert outcomes.count("checked") == 20 and outcomes.count("locked") == 40, outcomes
