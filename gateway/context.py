"""What every route needs: the app's shared parts, the signed-in user, and a validated JSON body."""

from __future__ import annotations

import asyncio
import functools
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
from pydantic import BaseModel
from sqlalchemy import bindparam
from sqlmodel import col, select
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request

from contract import observe
from contract.text import lone_surrogate_at, surrogate_refusal

from . import keys
from .auth import LoginThrottle, read_claims
from .db import Database, User, read_only
from .errors import BadRequest, Forbidden, NotFound, Unauthorized
from .quotas import TurnSlots, upload_slots
from .ratelimits import RateLimit
from .schemas import MAX_ID
from .sessions import check_cookie_request, request_token
from .settings import Settings
from .worker_client import WorkerClient

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


@dataclass
class Context:
    settings: Settings
    db: Database
    worker: WorkerClient
    jwt_secret: str
    throttle: LoginThrottle
    # Failed logins per client address (any account), and new accounts per address (both in the database).
    address_throttle: LoginThrottle = field(default_factory=LoginThrottle)
    registrations: RateLimit = field(default_factory=lambda: RateLimit(limit=10, window_s=3600))
    # The rows of the /v1 turns this process relays (gateway/turns/running.py), kept alive by its heartbeat.
    v1_turns: set[int] = field(default_factory=set)
    # Uploads being indexed per user (MAX_UPLOADS_PER_USER), counted in this process.
    upload_slots: TurnSlots = field(default_factory=lambda: upload_slots(4))
    # Requests per API key (API_KEY_RATE_LIMIT per API_KEY_RATE_WINDOW_S), counted in the database.
    key_limits: RateLimit = field(default_factory=lambda: RateLimit(limit=120, window_s=60))
    # Turns still being read from the worker, kept referenced so a browser disconnect cannot drop them.
    running: set[asyncio.Task] = field(default_factory=set)
    # This process's name as a turn owner (gateway/lifecycle.py), and its running turns by chat id.
    replica: str = field(default_factory=lambda: uuid.uuid4().hex)
    turns: dict[int, Any] = field(default_factory=dict)
    # Index builds this process runs (gateway/indexes/builds.py), by index id.
    builds: dict[int, Any] = field(default_factory=dict)
    # The background job runner of this process (gateway/jobs/runner.py), made on first use.
    job_runner: Any = None
    # The running turns' beats with nothing to save, read together (gateway/turns/checks.py), made on first use.
    turn_checker: Any = None
    # The turn lane (in_lane): at most TURN_DB_THREADS threads run the turns' database work at once.
    turn_lane: anyio.CapacityLimiter = field(default_factory=lambda: anyio.CapacityLimiter(1))

    @property
    def jobs(self):
        if self.job_runner is None:
            from .jobs import kinds  # noqa: F401  (registers the kinds)
            from .jobs.runner import JobRunner

            self.job_runner = JobRunner(self)
        return self.job_runner

    @property
    def turn_checks(self):
        if self.turn_checker is None:
            from .turns.checks import TurnChecks

            self.turn_checker = TurnChecks(self.db, self.settings.turn_heartbeat_s, self.turn_lane)
        return self.turn_checker


def ctx(request: Request) -> Context:
    return request.app.state.ctx


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Database work off the event loop, so one slow query never stalls every open stream."""
    return await run_in_threadpool(fn, *args, **kwargs)


async def in_lane(lane: anyio.CapacityLimiter, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """A turn's database work off the event loop, as `in_thread`, on at most `lane`'s threads at once (the turn
    lane, Context.turn_lane, TURN_DB_THREADS). Every turn of a burst reads its user, starts, saves its progress
    and ends in a few short statements: run on the thread pool's forty threads at once, they spent twice the CPU
    on the GIL and SQLite's lock as on their statements (docs/benchmarks.md, the thirteenth round); queued here,
    they run one after another. Cancelled while queued, the work never starts; once running, it runs to its end
    (as in_thread's: the cancelled caller does not wait for it)."""
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs), limiter=lane)


async def current_user(request: Request) -> User:
    """The signed-in user: a valid, unrevoked token of an enabled account (cookie or Bearer) or a valid API key
    of one (Bearer, gateway/keys.py), else a 401; a state-changing request signed in by the cookie from another
    site's page is a 403, and so is a change sent with a read-only key."""
    c = ctx(request)
    token, from_cookie = request_token(request)
    if not from_cookie and keys.is_api_key(token):
        return await in_lane(c.turn_lane, keys.authenticate, c.db, c.key_limits, token, request)
    claims = read_claims(token, c.jwt_secret)
    if from_cookie:
        check_cookie_request(request, c.settings)

    user = await in_lane(c.turn_lane, load_user, c.db, claims.user_id)
    if user is None:
        raise Unauthorized("the account in this token no longer exists: log in again", code="token_invalid")
    if user.disabled:
        raise Unauthorized("this account has been disabled by an administrator", code="account_disabled")
    if claims.version != user.token_version:
        raise Unauthorized(
            "this session has ended (signed out, password changed or account disabled): log in again",
            code="token_revoked",
        )
    observe.user_id.set(user.id)  # on this request's log lines (and its turn's)
    return user


# Built once, as every request signed in with a token reads it (gateway/lifecycle.py says why).
USER = select(User.__table__).where(col(User.id) == bindparam("b_user"))


def load_user(db: Database, user_id: int) -> User | None:
    """The account, to read only (db.read_only)."""
    with db.read_engine.connect() as conn:
        row = conn.execute(USER, {"b_user": user_id}).first()
    return read_only(User, row) if row is not None else None


async def admin_user(request: Request) -> User:
    user = await current_user(request)
    if not user.is_admin:
        raise Forbidden("only an administrator can change this", code="admin_only")
    return user


def _number(text: str) -> float | int:
    """A JSON number with a fraction or exponent: `1.0` and `1e2` are integers in JSON Schema's sense (and
    the models are strict), so an integral value is read as an int; a float field takes an int as well."""
    value = float(text)
    return int(value) if value.is_integer() else value


async def read_json(request: Request, model: type[M]) -> M:
    """The request body as `model`; not JSON, not an object or a wrong field is a 400 that says which."""
    try:
        raw = await request.body()
    except ClientDisconnect:
        raise BadRequest("the request body was not received completely") from None
    if not raw.strip():
        data: Any = {}
    else:
        try:
            data = json.loads(raw, parse_float=_number)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadRequest(f"the body is not valid JSON ({exc})", code="invalid_json") from None
        except RecursionError:
            raise BadRequest("the JSON body is nested too deeply", code="invalid_json") from None
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object", code="invalid_json")
    where = lone_surrogate_at(data)
    if where:
        raise BadRequest(surrogate_refusal(where), code="invalid_text", field=where)
    return model.model_validate(data)


def query_int(params, name: str, low: int, high: int) -> int | None:
    """An optional whole-number query parameter within [low, high]; a 400 naming it otherwise."""
    raw = params.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"{name} must be a whole number", code="invalid", field=name) from None
    if not low <= value <= high:
        raise BadRequest(f"{name} must be between {low} and {high}", code="invalid", field=name)
    return value


def path_id(request: Request, name: str = "id") -> int:
    """The {name:int} path parameter; one past the database's integers is a 404 (it names no row)."""
    value = int(request.path_params[name])
    if value > MAX_ID:
        raise NotFound(f"no {name.replace('_', ' ')} {value}", code="not_found")
    return value
