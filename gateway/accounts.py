"""Accounts: register, login, me. The first user to register is the administrator."""

from __future__ import annotations

import asyncio

from sqlalchemy.exc import IntegrityError
from sqlmodel import func, select
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .auth import hash_password, issue_token, verify_password
from .context import ctx, current_user, in_thread, read_json
from .db import User
from .errors import Conflict, Forbidden, Unauthorized
from .schemas import Credentials, Registration


def user_json(user: User) -> dict:
    return {"id": user.id, "username": user.username, "is_admin": user.is_admin}


async def register(request: Request) -> JSONResponse:
    c = ctx(request)
    if not c.settings.allow_registration:
        raise Forbidden(
            "registration is closed on this server: ask an administrator", code="registration_closed"
        )
    body = await read_json(request, Registration)
    password_hash = await in_thread(hash_password, body.password)

    def create() -> User:
        with c.db.session() as s:
            if s.exec(select(User.id).where(func.lower(User.username) == body.username.lower())).first():
                raise Conflict("this username is taken", code="username_taken", field="username")
            first = s.exec(select(func.count()).select_from(User)).one() == 0
            user = User(username=body.username, password_hash=password_hash, is_admin=first)
            s.add(user)
            try:
                s.commit()
            except IntegrityError:
                raise Conflict("this username is taken", code="username_taken", field="username") from None
            s.refresh(user)
            return user

    user = await in_thread(create)
    if user.is_admin:
        from .indexes import adopt_demo_index

        await adopt_demo_index(c, user.id)
    token = issue_token(user.id, user.username, c.jwt_secret, c.settings.jwt_ttl_s)
    return JSONResponse({"user": user_json(user), "token": token}, status_code=201)


async def login(request: Request) -> JSONResponse:
    c = ctx(request)
    body = await read_json(request, Credentials)
    address = request.client.host if request.client else "unknown"
    user_key, address_key = f"user:{body.username.lower()}", f"addr:{address}"
    delay = c.throttle.delay_for([user_key, address_key])
    if delay:
        await asyncio.sleep(delay)

    def load() -> User | None:
        with c.db.session() as s:
            return s.exec(select(User).where(func.lower(User.username) == body.username.lower())).first()

    user = await in_thread(load)
    ok = await in_thread(verify_password, body.password, user.password_hash if user else None)
    if not ok or user is None:
        c.throttle.failed([user_key, address_key])
        raise Unauthorized("wrong username or password", code="bad_credentials")
    # Only the account's counter is cleared: logging into one's own account must not reset an address
    # that is guessing at others.
    c.throttle.succeeded([user_key])
    token = issue_token(user.id, user.username, c.jwt_secret, c.settings.jwt_ttl_s)
    return JSONResponse({"token": token, "user": user_json(user)})


async def me(request: Request) -> JSONResponse:
    return JSONResponse(user_json(await current_user(request)))


routes = [
    Route("/api/auth/register", register, methods=["POST"]),
    Route("/api/auth/login", login, methods=["POST"]),
    Route("/api/auth/me", me, methods=["GET"]),
]
