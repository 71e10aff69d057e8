"""What every route needs: the app's shared parts, the signed-in user, and a validated JSON body."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request

from .auth import LoginThrottle, bearer_token, read_token
from .db import Database, User
from .errors import BadRequest, Forbidden, Unauthorized
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
    # Turns still being read from the worker, kept referenced so a browser disconnect cannot drop them.
    running: set[asyncio.Task] = field(default_factory=set)


def ctx(request: Request) -> Context:
    return request.app.state.ctx


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Database work off the event loop, so one slow query never stalls every open stream."""
    return await run_in_threadpool(fn, *args, **kwargs)


async def current_user(request: Request) -> User:
    c = ctx(request)
    user_id = read_token(bearer_token(request.headers.get("authorization")), c.jwt_secret)

    def load() -> User | None:
        with c.db.session() as s:
            return s.get(User, user_id)

    user = await in_thread(load)
    if user is None:
        raise Unauthorized("the account in this token no longer exists: log in again", code="token_invalid")
    return user


async def admin_user(request: Request) -> User:
    user = await current_user(request)
    if not user.is_admin:
        raise Forbidden("only an administrator can change this", code="admin_only")
    return user


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
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadRequest(f"the body is not valid JSON ({exc})", code="invalid_json") from None
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object", code="invalid_json")
    return model.model_validate(data)


def path_id(request: Request, name: str = "id") -> int:
    # Routes use the {id:int} convertor, so this is always an int; kept in one place for readability.
    return int(request.path_params[name])
