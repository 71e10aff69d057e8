"""`/api/keys`: a user's API keys, created (the secret shown once), listed (never the secret) and revoked.

Creating a key needs a signed-in session: a key cannot make more keys, so a leaked one cannot outlive its
revocation by minting a successor. A full key may list its user's keys and revoke them (a rotation script
revokes the key it replaces); a read-only key may list them (gateway/keys.py refuses it any change).
"""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator
from sqlalchemy.exc import IntegrityError
from sqlmodel import col, func, select, update
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from contract.text import bidi_control_in

from . import audit, keys
from .context import ctx, current_user, in_thread, path_id, read_json
from .db import ApiKey, iso, utcnow
from .errors import BadRequest, Conflict, Forbidden, NotFound
from .responses import Out
from .routing import ApiRoute, Operation

MAX_NAME = 100
_DATETIME = TypeAdapter(datetime)
# What the validator below allows, for the OpenAPI document: no control characters (DEL included), no
# bidirectional controls, at least one character that is not white space.
_NOT_IN_NAME = r"\x00-\x1f\x7f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
KEY_NAME = rf"^[^{_NOT_IN_NAME}]*[^{_NOT_IN_NAME}\s][^{_NOT_IN_NAME}]*$"


class KeyCreate(BaseModel):
    """A new key. Unknown fields are refused (unlike other bodies): a misspelt `read_only` must not make a
    key that can change everything."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(min_length=1, max_length=MAX_NAME, json_schema_extra={"pattern": KEY_NAME})
    expires_at: str | None = Field(
        default=None,
        max_length=64,
        description="ISO 8601 date and time (UTC when it names no zone), in the future; null: never",
        json_schema_extra={"format": "date-time"},
    )
    read_only: bool = Field(default=False, description="the key can only ask and read")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("the name is empty")
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
            raise ValueError("the name contains control characters")
        bidi = bidi_control_in(value)
        if bidi:
            raise ValueError(f"the name contains a bidirectional control ({bidi})")
        return value


class KeyOut(Out):
    id: int
    name: str
    prefix: str = Field(description="the key's first characters, to tell keys apart")
    read_only: bool
    created_at: str | None
    last_used_at: str | None
    expires_at: str | None
    expired: bool


class KeyCreated(KeyOut):
    key: str = Field(description="the secret: shown this once, never again")


def key_json(key: ApiKey) -> dict:
    return KeyOut(
        id=key.id,
        name=key.name,
        prefix=key.prefix,
        read_only=key.read_only,
        created_at=iso(key.created_at),
        last_used_at=iso(key.last_used_at),
        expires_at=iso(key.expires_at),
        expired=keys.is_expired(key),
    ).data()


def parse_expiry(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        if value.strip().lstrip("-").replace(".", "", 1).isdigit():
            raise ValueError("a number, not a date")  # pydantic would read it as seconds since 1970
        when = _DATETIME.validate_python(value.strip())  # RFC 3339 and ISO 8601 (`t`, `z`, any fraction)
    except (ValidationError, ValueError):
        raise BadRequest(
            f"expires_at must be an ISO 8601 date and time such as 2030-01-31T00:00:00Z, not {value[:64]!r}",
            code="invalid",
            field="expires_at",
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    when = when.astimezone(UTC)
    if when <= utcnow():
        raise BadRequest(
            f"expires_at ({iso(when)}) is in the past: a key must expire in the future, or never (null)",
            code="expiry_in_past",
            field="expires_at",
        )
    return when.replace(microsecond=when.microsecond // 1000 * 1000)


async def list_keys(request: Request) -> JSONResponse:
    user, c = await current_user(request), ctx(request)

    def load() -> list[dict]:
        with c.db.session() as s:
            rows = s.exec(
                select(ApiKey)
                .where(ApiKey.user_id == user.id)
                .where(col(ApiKey.revoked_at).is_(None))
                .order_by(col(ApiKey.id))
            )
            return [key_json(k) for k in rows]

    return JSONResponse(await in_thread(load))


async def create_key(request: Request) -> JSONResponse:
    user, c = await current_user(request), ctx(request)
    if keys.key_of(request) is not None:
        raise Forbidden(
            "API keys are created from a signed-in session, not with another key", code="session_required"
        )
    body = await read_json(request, KeyCreate)
    expires_at = parse_expiry(body.expires_at)
    secret = keys.new_secret()
    limit = c.settings.max_api_keys_per_user
    address = audit.address_of(request)

    def create() -> dict:
        with c.db.session() as s:
            held = s.exec(
                select(func.count())
                .select_from(ApiKey)
                .where(ApiKey.user_id == user.id)
                .where(col(ApiKey.revoked_at).is_(None))
            ).one()
            if held >= limit:
                raise Conflict(f"you already have {limit} API keys: revoke one first", code="too_many_keys")
            key = ApiKey(
                user_id=user.id,
                name=body.name,
                prefix=secret[: keys.VISIBLE_CHARS],
                secret_hash=keys.secret_hash(secret),
                read_only=body.read_only,
                expires_at=expires_at,
            )
            s.add(key)
            try:
                s.flush()  # the key's id, for its audit row (committed together, or neither)
                audit.record(
                    s,
                    user,
                    "key.create",
                    "key",
                    key.id,
                    {
                        "name": key.name,
                        "prefix": key.prefix,
                        "read_only": key.read_only,
                        "expires_at": iso(key.expires_at),
                    },
                    address,
                )
                s.commit()
            except IntegrityError:  # the same 256 random bits twice: never, but not a 500 either
                s.rollback()
                raise Conflict("the key could not be stored: try again", code="conflict") from None
            s.refresh(key)
            return KeyCreated(**key_json(key), key=secret).data()

    return JSONResponse(await in_thread(create), status_code=201)


async def revoke_key(request: Request) -> Response:
    user, c, key_id = await current_user(request), ctx(request), path_id(request)
    address, by_key = audit.address_of(request), keys.key_of(request)

    def revoke() -> None:
        with c.db.session() as s:
            done = s.exec(
                update(ApiKey)
                .where(col(ApiKey.id) == key_id)
                .where(col(ApiKey.user_id) == user.id)
                .where(col(ApiKey.revoked_at).is_(None))
                .values(revoked_at=utcnow())
            )
            if done.rowcount != 1:
                s.rollback()
                # Another user's key, a revoked one and one that never was read the same: ids reveal nothing.
                raise NotFound(f"no API key {key_id}", code="key_not_found")
            detail = {"by_key": by_key.id} if by_key is not None else {}
            audit.record(s, user, "key.revoke", "key", key_id, detail, address)
            s.commit()

    await in_thread(revoke)
    return Response(status_code=204)


routes = [
    ApiRoute(
        "GET",
        "/api/keys",
        list_keys,
        Operation("Your API keys (never their secrets); revoked ones are gone", answer=[KeyOut], tag="keys"),
    ),
    ApiRoute(
        "POST",
        "/api/keys",
        create_key,
        Operation(
            "Create an API key: the answer carries its secret, shown this once (a signed-in session only)",
            KeyCreate,
            KeyCreated,
            status=201,
            errors=(409, 429),
            tag="keys",
            links={"RevokeKey": ("delete_api_keys_id", {"id": "$response.body#/id"})},
        ),
    ),
    ApiRoute(
        "DELETE",
        "/api/keys/{id:int}",
        revoke_key,
        Operation("Revoke one of your API keys: it stops working at once", status=204, tag="keys"),
    ),
]
