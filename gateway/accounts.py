"""Accounts: register, login, logout, password change, me; an admin lists and disables accounts.

The first user to register is the administrator: the first-admin seat is a unique index (db.User), so two
registrations racing on an empty database cannot both take it. Every token carries the account's token version;
logout, a password change and disabling raise it, which ends all sessions issued before.
"""

from __future__ import annotations

import asyncio

from sqlalchemy.exc import IntegrityError
from sqlmodel import col, func, select, update
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from . import audit, lockout
from .access import get_row
from .auth import hash_password, issue_token, verify_password
from .context import Context, ctx, current_user, in_thread, path_id, read_json
from .db import Database, User, iso
from .errors import BadRequest, Conflict, Forbidden, NotFound, Unauthorized
from .responses import AccountOut, SessionOut, SignedIn, UserOut
from .routing import ApiRoute, Operation
from .schemas import Credentials, PasswordChange, PasswordReset, Registration, UserUpdate
from .sessions import COOKIE, check_origin, clear_session_cookie, set_session_cookie


def user_json(user: User) -> dict:
    return UserOut(id=user.id, username=user.username, is_admin=user.is_admin).data()


def account_json(user: User) -> dict:
    return AccountOut(**user_json(user), disabled=user.disabled, created_at=iso(user.created_at)).data()


def _username_taken() -> Conflict:
    return Conflict("this username is taken", code="username_taken", field="username")


def create_user(db: Database, username: str, password_hash: str, *, admin: bool = False) -> User:
    """A new account. The first account takes the first-admin seat (and is admin); `admin` makes any account
    an admin (create-admin). A seat lost to a concurrent registration makes this one an ordinary account."""
    with db.session() as s:
        if s.exec(select(User.id).where(func.lower(User.username) == username.lower())).first():
            raise _username_taken()
        claim_seat = s.exec(select(func.count()).select_from(User)).one() == 0
    attempts = [True, False] if claim_seat else [False]
    for seat in attempts:
        with db.session() as s:
            user = User(
                username=username,
                password_hash=password_hash,
                is_admin=seat or admin,
                first_admin=True if seat else None,
            )
            s.add(user)
            try:
                s.commit()
            except IntegrityError:
                s.rollback()
                continue  # the seat (or the name) was taken meanwhile: try as an ordinary account
            s.refresh(user)
            return user
    raise _username_taken()


def _client(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def _signed_in(request: Request, c: Context, user: User, body: dict, status: int = 200) -> JSONResponse:
    """The answer to a sign-in: the token in the body (scripts) and in the HttpOnly cookie (the web)."""
    token = issue_token(
        user.id, user.username, c.jwt_secret, c.settings.jwt_ttl_s, version=user.token_version
    )
    response = JSONResponse(
        {**body, **SignedIn(user=UserOut(**user_json(user)), token=token).data()}, status_code=status
    )
    set_session_cookie(response, request, token, c.settings.jwt_ttl_s)
    return response


async def register(request: Request) -> JSONResponse:
    c = ctx(request)
    if not c.settings.allow_registration:
        raise Forbidden(
            "registration is closed on this server: ask an administrator", code="registration_closed"
        )
    check_origin(request, c.settings, required=False)
    body = await read_json(request, Registration)
    await in_thread(c.registrations.hit, c.db, f"addr:{_client(request)}", "new accounts")
    password_hash = await in_thread(hash_password, body.password)
    user = await in_thread(create_user, c.db, body.username, password_hash)
    await in_thread(
        record_event, c.db, user, "user.create", "user", user.id, {"username": user.username}, request
    )
    if user.first_admin:
        from .indexes.demo import adopt_demo_index

        await adopt_demo_index(c, user.id)
    return _signed_in(request, c, user, {}, status=201)


# One answer for every failed sign-in (unknown name, wrong password, disabled account): which of them it was is
# nobody's business but the administrator's, or the answer would tell a guesser they found the password.
BAD_CREDENTIALS = "wrong username or password, or the account is disabled"


async def login(request: Request) -> JSONResponse:
    c = ctx(request)
    check_origin(request, c.settings, required=False)
    body = await read_json(request, Credentials)
    address = _client(request)
    # Counted per (account, address) and per address, never per account alone: guessing at an account from
    # one address must not lock its owner out everywhere else. The attempt is counted before the password is
    # checked (gateway/lockout.py), so concurrent guesses cannot slip past the lock.
    pair_key, address_key = f"acct:{body.username.lower()}@{address}", f"addr:{address}"
    guards = [(pair_key, c.throttle), (address_key, c.address_throttle)]
    delay = await in_thread(lockout.reserve, c.db, guards)
    if delay:
        await asyncio.sleep(delay)

    def load() -> User | None:
        with c.db.session() as s:
            return s.exec(select(User).where(func.lower(User.username) == body.username.lower())).first()

    user = await in_thread(load)
    ok = await in_thread(verify_password, body.password, user.password_hash if user else None)
    if not ok or user is None or user.disabled:
        if delay:  # past the throttle's free attempts: worth an administrator's look
            detail = {"username": body.username[:64], "delay_s": delay}
            await in_thread(
                record_event,
                c.db,
                None,
                "auth.login_throttled",
                "user",
                user.id if user else "",
                detail,
                request,
            )
        # A disabled account's right password stays counted as a failure, like a wrong one: same answer.
        raise Unauthorized(BAD_CREDENTIALS, code="bad_credentials")
    # This account's counter starts afresh; the address only gets this attempt back: logging into one's own
    # account must not reset an address that is guessing at others.
    await in_thread(lockout.succeeded, c.db, [pair_key], [address_key])
    if user.first_admin:
        from .indexes.demo import adopt_demo_index

        await adopt_demo_index(c, user.id)  # an admin made by create-admin has not met the demo yet
    return _signed_in(request, c, user, {})


def record_event(
    db: Database, actor: User | None, action: str, kind: str, object_id, detail: dict, request
) -> None:
    """One audit row in a transaction of its own (for events that change nothing else)."""
    with db.session() as s:
        audit.record(s, actor, action, kind, object_id, detail, audit.address_of(request))
        s.commit()


def revoke_tokens(db: Database, user_id: int, **values) -> User | None:
    """Raise the user's token version (ending every session) and apply `values`, in one statement."""
    with db.session() as s:
        s.exec(
            update(User).where(col(User.id) == user_id).values(token_version=User.token_version + 1, **values)
        )
        s.commit()
        return s.get(User, user_id)


async def logout(request: Request) -> Response:
    """Ends every session of the signed-in user (all tabs and scripts); the cookie is cleared in any case."""
    c = ctx(request)
    response = Response(status_code=204)
    clear_session_cookie(response, request)
    try:
        user = await current_user(request)
    except Unauthorized:
        return response  # already signed out: nothing to end
    await in_thread(revoke_tokens, c.db, user.id)
    return response


async def change_password(request: Request) -> JSONResponse:
    c = ctx(request)
    user = await current_user(request)
    body = await read_json(request, PasswordChange)
    pair_key = f"acct:{user.username.lower()}@{_client(request)}"
    delay = await in_thread(lockout.reserve, c.db, [(pair_key, c.throttle)])
    if delay:
        await asyncio.sleep(delay)
    if not await in_thread(verify_password, body.current_password, user.password_hash):
        # Well-formed, but the caller failed to prove it is the owner: a 403 (a 401 would end the web session).
        raise Forbidden("the current password is wrong", code="wrong_password", field="current_password")
    await in_thread(lockout.succeeded, c.db, [pair_key], [])
    password_hash = await in_thread(hash_password, body.new_password)
    updated = await in_thread(revoke_tokens, c.db, user.id, password_hash=password_hash)
    if updated is None:
        raise Unauthorized("the account no longer exists", code="token_invalid")
    # Every other session has ended; this one continues with a fresh token.
    return _signed_in(request, c, updated, {})


async def me(request: Request) -> JSONResponse:
    return JSONResponse(user_json(await current_user(request)))


async def session_user(request: Request) -> JSONResponse:
    """Who this browser is signed in as: `{"user": {...}}`, or `{"user": null}` (a 200 either way, so a page
    can ask at load without an error; a dead cookie is cleared)."""
    try:
        user = await current_user(request)
    except (Unauthorized, Forbidden):
        response = JSONResponse(SessionOut(user=None).data())
        if request.cookies.get(COOKIE):
            clear_session_cookie(response, request)
        return response
    return JSONResponse(SessionOut(user=UserOut(**user_json(user))).data())


async def users_admin(request: Request) -> User:
    """The signed-in administrator; anyone else gets the 404 of a route that does not exist (the user
    administration is not there for them, and its ids say nothing)."""
    user = await current_user(request)
    if not user.is_admin:
        raise NotFound(f"no such API route: {request.url.path}", code="not_found")
    return user


def _load_user(c: Context, user_id: int) -> User:
    with c.db.session() as s:
        user = get_row(s, User, user_id)  # an id past Postgres' integers is a 404 too, not a 500
    if user is None:
        raise NotFound(f"no user {user_id}", code="user_not_found")
    return user


async def list_users(request: Request) -> JSONResponse:
    await users_admin(request)
    c = ctx(request)

    def load() -> list[dict]:
        with c.db.session() as s:
            return [account_json(u) for u in s.exec(select(User).order_by(col(User.id)))]

    return JSONResponse(await in_thread(load))


async def update_user(request: Request) -> JSONResponse:
    """Disable or re-enable an account, make it an administrator or an ordinary user. Rights are read at every
    request, so a change applies at once to its sessions and API keys; disabling also ends its sessions."""
    admin, c, user_id = await users_admin(request), ctx(request), path_id(request)
    body = await read_json(request, UserUpdate)
    if body.disabled is None and body.is_admin is None:
        raise BadRequest("send `disabled` or `is_admin` (or both)", code="invalid", field="disabled")
    # Conflicts with who is asking, not malformed requests (the same body changes anyone else): an
    # administrator cannot lock themself out, so there is always one left.
    if user_id == admin.id and body.disabled:
        raise Conflict("you cannot disable your own account", code="cannot_disable_self", field="disabled")
    if user_id == admin.id and body.is_admin is False:
        raise Conflict(
            "you cannot take away your own administrator rights: another administrator can",
            code="cannot_demote_self",
            field="is_admin",
        )

    address = audit.address_of(request)

    def apply() -> dict:
        before = _load_user(c, user_id)
        values = {} if body.is_admin is None else {"is_admin": body.is_admin}
        with c.db.session() as s:
            changes = update(User).where(col(User.id) == user_id)
            if body.disabled:
                # Disabling ends every session (the token version goes up), in the same statement.
                changes = changes.values(token_version=User.token_version + 1, disabled=True, **values)
            elif body.disabled is False:
                changes = changes.values(disabled=False, **values)
            else:
                changes = changes.values(**values)
            s.exec(changes)
            who = {"username": before.username}
            if body.disabled is not None and body.disabled != before.disabled:
                action = "user.disable" if body.disabled else "user.enable"
                audit.record(s, admin, action, "user", user_id, who, address)
            if body.is_admin is not None and body.is_admin != before.is_admin:
                audit.record(
                    s, admin, "user.role", "user", user_id, {**who, "is_admin": body.is_admin}, address
                )
            s.commit()
            user = s.get(User, user_id)
        if user is None:  # deleted meanwhile
            raise NotFound(f"no user {user_id}", code="user_not_found")
        return account_json(user)

    return JSONResponse(await in_thread(apply))


async def reset_password(request: Request) -> JSONResponse:
    """An administrator sets a new password for someone who lost theirs: every session of the account ends
    (its API keys go on working: revoke them on its keys page, or disable the account)."""
    admin, c, user_id = await users_admin(request), ctx(request), path_id(request)
    body = await read_json(request, PasswordReset)
    if user_id == admin.id:
        raise Conflict(
            "change your own password with POST /api/auth/password (it asks for the current one)",
            code="use_password_change",
        )
    target = await in_thread(_load_user, c, user_id)
    password_hash = await in_thread(hash_password, body.new_password)
    address = audit.address_of(request)

    def apply() -> User | None:
        with c.db.session() as s:
            s.exec(
                update(User)
                .where(col(User.id) == user_id)
                .values(token_version=User.token_version + 1, password_hash=password_hash)
            )
            detail = {"username": target.username}
            audit.record(s, admin, "user.password_reset", "user", user_id, detail, address)
            s.commit()
            return s.get(User, user_id)

    user = await in_thread(apply)
    if user is None:
        raise NotFound(f"no user {user_id}", code="user_not_found")
    return JSONResponse(account_json(user))


routes = [
    ApiRoute(
        "POST",
        "/api/auth/register",
        register,
        Operation(
            "Create an account (the first one is the administrator) and sign in",
            Registration,
            SignedIn,
            status=201,
            errors=(403, 409, 429),
            public=True,
            tag="accounts",
        ),
    ),
    ApiRoute(
        "POST",
        "/api/auth/login",
        login,
        Operation(
            "Sign in: the token in the body (scripts) and the HttpOnly session cookie (the web)",
            Credentials,
            SignedIn,
            errors=(401, 403, 429),
            public=True,
            tag="accounts",
        ),
    ),
    ApiRoute(
        "POST",
        "/api/auth/logout",
        logout,
        Operation(
            "End every session of the signed-in user; clears the cookie in any case",
            status=204,
            public=True,
            tag="accounts",
        ),
    ),
    ApiRoute(
        "POST",
        "/api/auth/password",
        change_password,
        Operation(
            "Change the password: every other session ends, this one gets a fresh token",
            PasswordChange,
            SignedIn,
            errors=(403, 429),
            tag="accounts",
        ),
    ),
    ApiRoute("GET", "/api/auth/me", me, Operation("The signed-in user", answer=UserOut, tag="accounts")),
    ApiRoute(
        "GET",
        "/api/auth/session",
        session_user,
        Operation(
            "Who this browser is signed in as (`user: null` when nobody)",
            answer=SessionOut,
            public=True,
            tag="accounts",
        ),
    ),
    ApiRoute(
        "GET",
        "/api/users",
        list_users,
        Operation(
            "Every account (administrators; a 404 for anyone else)", answer=[AccountOut], tag="accounts"
        ),
    ),
    ApiRoute(
        "PATCH",
        "/api/users/{id:int}",
        update_user,
        Operation(
            "Disable or re-enable an account, make it an administrator or not (administrators); disabling "
            "ends its sessions",
            UserUpdate,
            AccountOut,
            errors=(404, 409),
            tag="accounts",
        ),
    ),
    ApiRoute(
        "POST",
        "/api/users/{id:int}/password",
        reset_password,
        Operation(
            "Set a new password for another account (administrators); every session of it ends",
            PasswordReset,
            AccountOut,
            errors=(404, 409),
            tag="accounts",
        ),
    ),
]
