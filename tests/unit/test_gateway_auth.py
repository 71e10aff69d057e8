"""Tokens, passwords and the failed-login slow-down, without a server."""

from __future__ import annotations

import base64
import json
import time

import jwt
import pytest

from gateway.auth import LoginThrottle, hash_password, issue_token, read_token, verify_password
from gateway.errors import TooManyRequests, Unauthorized

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


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_failed_logins_are_free_then_slowed_then_refused_until_the_window_passes() -> None:
    clock = Clock()
    throttle = LoginThrottle(
        free=3, base_delay_s=0.5, max_delay_s=4.0, lock_after=8, window_s=600, clock=clock
    )
    keys = ["user:alice", "addr:10.0.0.1"]
    delays = []
    for _ in range(8):
        delays.append(throttle.delay_for(keys))
        throttle.failed(keys)
    assert delays == [0, 0, 0, 0.5, 1.0, 2.0, 4.0, 4.0]
    with pytest.raises(TooManyRequests) as err:
        throttle.delay_for(keys)
    assert err.value.headers["Retry-After"] == "600"
    # Another account from another address is not affected.
    assert throttle.delay_for(["user:bob", "addr:10.0.0.2"]) == 0
    # The same address guessing another account is.
    with pytest.raises(TooManyRequests):
        throttle.delay_for(["user:bob", "addr:10.0.0.1"])
    clock.now += 601
    assert throttle.delay_for(keys) == 0


def test_a_successful_login_clears_the_account_but_not_the_address() -> None:
    throttle = LoginThrottle(
        free=1, base_delay_s=1, max_delay_s=8, lock_after=50, window_s=600, clock=Clock()
    )
    for _ in range(3):
        throttle.failed(["user:alice", "addr:a"])
    throttle.succeeded(["user:alice"])
    assert throttle.delay_for(["user:alice", "addr:b"]) == 0
    assert throttle.delay_for(["user:carol", "addr:a"]) == 4
