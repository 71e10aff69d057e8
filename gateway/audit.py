"""The audit log: append-only rows of who did what, to which object, when and from where.

`record` adds a row to the caller's session, so the event is committed with the change it describes (or not at
all). Nothing in the gateway updates or deletes a row; administrators read them at `GET /api/audit`.

Actions (object_type): auth.login_throttled (user), user.create, user.disable, user.enable, user.role (user),
group.create, group.rename, group.delete, group.member_add, group.member_remove (group), index.grant,
index.revoke, index.transfer, index.delete (index), document.delete (document), key.create, key.revoke (key),
settings.update (settings).
"""

from __future__ import annotations

from typing import Any

from sqlmodel import Session
from starlette.requests import Request

from .db import AuditEvent, User, utcnow


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
