"""The audit log: append-only rows of who did what, to which object, when and from where.

`record` adds a row to the caller's session, so the event is committed with the change it describes (or not at
all). Nothing in the gateway updates or deletes a row; administrators read them at `GET /api/audit`.

Actions (object_type): auth.login_throttled (user), user.create, user.disable, user.enable, user.role (user),
group.create, group.rename, group.delete, group.member_add, group.member_remove (group), index.grant,
index.revoke, index.transfer, index.delete (index), document.delete (document), key.create, key.revoke (key),
settings.update (settings).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlmodel import Session, col, select
from starlette.requests import Request
from starlette.responses import JSONResponse

from .access import INT32_MAX
from .context import admin_user, ctx, in_thread, query_int
from .db import AuditEvent, User, iso, utcnow
from .errors import BadRequest
from .responses import AuditOut, AuditPage
from .routing import ApiRoute, Operation
from .schemas import MAX_ID


def address_of(request: Request | None) -> str | None:
    """The client's address as the gateway sees it (after ProxyHeaders)."""
    if request is None or request.client is None:
        return None
    return request.client.host[:64]


def record(
    session: Session,
    actor: User | None,
    action: str,
    object_type: str = "",
    object_id: Any = "",
    detail: dict | None = None,
    address: str | None = None,
) -> AuditEvent:
    """Add one audit row to `session` (the caller commits it with the change). `actor` None: the system or an
    unknown caller (a failed sign-in). `object_id` is stored as text; `detail` is a small JSON object."""
    event = AuditEvent(
        at=utcnow(),
        actor_id=actor.id if actor is not None else None,
        actor_name=actor.username if actor is not None else None,
        action=action[:64],
        object_type=object_type[:32],
        object_id=str(object_id if object_id is not None else "")[:128],
        detail=dict(detail or {}),
        address=address[:64] if address else None,
    )
    session.add(event)
    return event


def event_json(e: AuditEvent) -> dict:
    return AuditOut(
        id=e.id,
        at=iso(e.at),
        actor_id=e.actor_id,
        actor_name=e.actor_name,
        action=e.action,
        object_type=e.object_type,
        object_id=e.object_id,
        detail=e.detail,
        address=e.address,
    ).data()


MAX_PAGE = 200
FILTER = {"type": "string", "maxLength": 128, "pattern": "^[^\\u0000]*$"}  # a NUL: no database takes one
FILTERS = ("action", "actor_id", "object_type", "object_id", "since", "until", "before", "limit")


def _time(params, name: str) -> datetime | None:
    raw = params.get(name)
    if raw is None:
        return None
    try:
        value = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise BadRequest(f"{name} must be an ISO 8601 time", code="invalid", field=name) from None
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)


async def list_audit(request: Request) -> JSONResponse:
    """Administrators: the audit log, newest first, filtered by action (exact, or a prefix ending in `.`:
    `group.`), actor, object and time; paged by `before` (an event id) and `limit`."""
    await admin_user(request)
    c, params = ctx(request), request.query_params
    limit = query_int(params, "limit", 1, MAX_PAGE) or 50
    before = query_int(params, "before", 1, MAX_ID)
    actor_id = query_int(params, "actor_id", 1, MAX_ID)
    since, until = _time(params, "since"), _time(params, "until")
    action, object_type, object_id = (params.get(k) for k in ("action", "object_type", "object_id"))
    for name, value in (("action", action), ("object_type", object_type), ("object_id", object_id)):
        if value is not None and (len(value) > 128 or "\x00" in value):  # no database takes a NUL
            raise BadRequest(f"{name} is not a valid filter", code="invalid", field=name)

    def load() -> dict:
        nonlocal before
        with c.db.session() as s:
            if (
                s.get_bind().dialect.name == "postgresql"
            ):  # its ids are 32-bit: past them, nothing or everything
                if actor_id is not None and actor_id > INT32_MAX:
                    return AuditPage(events=[], next_before=None).data()
                if before is not None and before > INT32_MAX:
                    before = None
        query = select(AuditEvent)
        if action:
            if action.endswith("."):
                query = query.where(col(AuditEvent.action).startswith(action, autoescape=True))
            else:
                query = query.where(AuditEvent.action == action)
        if actor_id is not None:
            query = query.where(AuditEvent.actor_id == actor_id)
        if object_type:
            query = query.where(AuditEvent.object_type == object_type)
        if object_id:
            query = query.where(AuditEvent.object_id == object_id)
        if since is not None:
            query = query.where(col(AuditEvent.at) >= since)
        if until is not None:
            query = query.where(col(AuditEvent.at) < until)
        if before is not None:
            query = query.where(col(AuditEvent.id) < before)
        with c.db.session() as s:
            rows = list(s.exec(query.order_by(col(AuditEvent.id).desc()).limit(limit + 1)))
        more = len(rows) > limit
        rows = rows[:limit]
        return AuditPage(
            events=[event_json(e) for e in rows], next_before=rows[-1].id if more and rows else None
        ).data()

    return JSONResponse(await in_thread(load))


routes = [
    ApiRoute(
        "GET",
        "/api/audit",
        list_audit,
        Operation(
            "The audit log, newest first (administrators); it cannot be changed through the API",
            answer=AuditPage,
            errors=(400, 403),
            tag="teams",
            query={
                "action": (
                    FILTER,
                    "an action, or a prefix ending in '.' (group.)",
                ),
                "actor_id": ({"type": "integer", "minimum": 1, "maximum": MAX_ID}, "events by this user"),
                "object_type": (FILTER, "index, group, user, document, key"),
                "object_id": (FILTER, "with object_type: one object's events"),
                "since": ({"type": "string", "format": "date-time"}, "at or after this time"),
                "until": ({"type": "string", "format": "date-time"}, "before this time"),
                "before": (
                    {"type": "integer", "minimum": 1, "maximum": MAX_ID},
                    "older than this event id (next_before)",
                ),
                "limit": ({"type": "integer", "minimum": 1, "maximum": MAX_PAGE}, "events per page (50)"),
            },
        ),
    ),
]
