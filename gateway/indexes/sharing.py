"""Sharing an index: its grants (to a user, a group, everyone signed in; reader or editor) and the transfer of
its ownership. Only the owner or an administrator may see or change them; anyone else gets the index's 404.

A second grant to the same subject changes the role of the first (200) instead of adding a row. Every change is
written to the audit log in the transaction that makes it.
"""

from __future__ import annotations

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, delete, select
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .. import audit
from ..access import OWNER, Access, access_of, get_row, require_index
from ..context import ctx, current_user, in_thread, path_id, read_json
from ..db import Group, GroupMember, Index, IndexGrant, User, iso
from ..errors import BadRequest, Conflict, NotFound
from ..groups import find_user, group_not_found
from ..responses import GrantOut, IndexFull
from ..routing import ApiRoute, Operation
from ..schemas import GrantCreate, GrantUpdate, OwnerTransfer
from .records import index_json


def grant_json(s: Session, g: IndexGrant) -> dict:
    if g.subject_type == "user":
        user = s.get(User, g.subject_id)
        name = user.username if user else f"user {g.subject_id}"
    elif g.subject_type == "group":
        group = s.get(Group, g.subject_id)
        name = group.name if group else f"group {g.subject_id}"
    else:
        name = "everyone"
    return GrantOut(
        id=g.id,
        index_id=g.index_id,
        subject_type=g.subject_type,
        subject_id=g.subject_id if g.subject_type != "everyone" else None,
        subject_name=name,
        role=g.role,
        created_at=iso(g.created_at),
    ).data()


def _grants(s: Session, index_id: int) -> list[IndexGrant]:
    order = {"everyone": 0, "group": 1, "user": 2}
    rows = list(s.exec(select(IndexGrant).where(IndexGrant.index_id == index_id)))
    return sorted(rows, key=lambda g: (order.get(g.subject_type, 3), g.id))


def _subject(s: Session, actor: User, index: Index, body: GrantCreate) -> tuple[str, int, str]:
    """(subject_type, subject_id, name) for the grant asked; an unknown user or group is a 404 naming the field."""
    if body.subject_type == "everyone":
        if body.user_id is not None or body.username is not None or body.group_id is not None:
            raise BadRequest(
                "a grant to everyone names no user or group", code="invalid", field="subject_type"
            )
        return "everyone", 0, "everyone"
    if body.subject_type == "group":
        if body.group_id is None or body.user_id is not None or body.username is not None:
            raise BadRequest("a grant to a group names it by group_id", code="invalid", field="group_id")
        group = get_row(s, Group, body.group_id)
        # Anyone may share with a group they are in; an administrator with any group.
        if group is None or (not actor.is_admin and s.get(GroupMember, (group.id, actor.id)) is None):
            raise group_not_found(body.group_id, field="group_id")
        return "group", group.id, group.name
    if body.group_id is not None:
        raise BadRequest("a grant to a user names no group", code="invalid", field="group_id")
    user = find_user(s, body.user_id, body.username)
    if user.id == index.owner_id:
        raise Conflict(
            "the owner already has every right on this index", code="grant_to_owner", field="user_id"
        )
    return "user", user.id, user.username


async def list_grants(request: Request) -> JSONResponse:
    user, c, index_id = await current_user(request), ctx(request), path_id(request)

    def load() -> list[dict]:
        with c.db.session() as s:
            index = require_index(s, user, index_id, OWNER)
            return [grant_json(s, g) for g in _grants(s, index.id)]

    return JSONResponse(await in_thread(load))


async def create_grant(request: Request) -> JSONResponse:
    user, c, index_id = await current_user(request), ctx(request), path_id(request)
    body = await read_json(request, GrantCreate)
    address = audit.address_of(request)

    def grant() -> tuple[dict, int]:
        with c.db.session() as s:
            index = require_index(s, user, index_id, OWNER)
            kind, subject_id, name = _subject(s, user, index, body)
            existing = s.exec(
                select(IndexGrant).where(
                    IndexGrant.index_id == index.id,
                    IndexGrant.subject_type == kind,
                    IndexGrant.subject_id == subject_id,
                )
            ).first()
            status = 200 if existing is not None else 201
            row = existing or IndexGrant(index_id=index.id, subject_type=kind, subject_id=subject_id, role="")
            previous = row.role or None
            row.role, row.created_by = body.role, user.id
            s.add(row)
            try:
                s.flush()
            except IntegrityError:
                raise Conflict("this index was just shared with them: reload", code="grant_exists") from None
            if previous != body.role:
                detail = {
                    "index": index.name,
                    "subject_type": kind,
                    "subject_id": subject_id,
                    "subject": name,
                }
                audit.record(
                    s,
                    user,
                    "index.grant",
                    "index",
                    index.id,
                    {**detail, "role": body.role, "was": previous},
                    address,
                )
            s.commit()
            return grant_json(s, row), status

    data, status = await in_thread(grant)
    return JSONResponse(data, status_code=status)


def _own_grant(s: Session, user: User, index_id: int, grant_id: int) -> tuple[Index, IndexGrant]:
    index = require_index(s, user, index_id, OWNER)
    row = get_row(s, IndexGrant, grant_id)
    if row is None or row.index_id != index.id:
        raise NotFound(f"no grant {grant_id} on this index", code="grant_not_found")
    return index, row


async def update_grant(request: Request) -> JSONResponse:
    user, c, index_id = await current_user(request), ctx(request), path_id(request)
    grant_id = path_id(request, "grant_id")
    body = await read_json(request, GrantUpdate)
    address = audit.address_of(request)

    def change() -> dict:
        with c.db.session() as s:
            index, row = _own_grant(s, user, index_id, grant_id)
            if row.role != body.role:
                detail = grant_json(s, row)
                audit.record(
                    s,
                    user,
                    "index.grant",
                    "index",
                    index.id,
                    {
                        "index": index.name,
                        "subject_type": row.subject_type,
                        "subject_id": row.subject_id,
                        "subject": detail["subject_name"],
                        "role": body.role,
                        "was": row.role,
                    },
                    address,
                )
                row.role = body.role
                s.add(row)
                s.commit()
            return grant_json(s, row)

    return JSONResponse(await in_thread(change))


async def delete_grant(request: Request) -> Response:
    user, c, index_id = await current_user(request), ctx(request), path_id(request)
    grant_id = path_id(request, "grant_id")
    address = audit.address_of(request)

    def remove() -> None:
        with c.db.session() as s:
            index, row = _own_grant(s, user, index_id, grant_id)
            detail = grant_json(s, row)
            audit.record(
                s,
                user,
                "index.revoke",
                "index",
                index.id,
                {
                    "index": index.name,
                    "subject_type": row.subject_type,
                    "subject_id": row.subject_id,
                    "subject": detail["subject_name"],
                    "role": row.role,
                },
                address,
            )
            s.delete(row)
            s.commit()

    await in_thread(remove)
    return Response(status_code=204)


async def transfer_index(request: Request) -> JSONResponse:
    """Give the index to another user; the previous owner keeps `previous_owner_role` access (editor by
    default, none when null)."""
    user, c, index_id = await current_user(request), ctx(request), path_id(request)
    body = await read_json(request, OwnerTransfer)
    address = audit.address_of(request)

    def transfer() -> dict:
        with c.db.session() as s:
            index = require_index(s, user, index_id, OWNER)
            new_owner = find_user(s, body.user_id, body.username)
            if new_owner.disabled:
                raise Conflict("this account is disabled", code="user_disabled", field="user_id")
            previous = index.owner_id
            if new_owner.id == previous:
                raise Conflict("they already own this index", code="already_owner", field="user_id")
            clash = s.exec(
                select(Index.id).where(Index.owner_id == new_owner.id, Index.name == index.name)
            ).first()
            if clash:
                raise Conflict(
                    "the new owner already has an index with this name: rename one first",
                    code="index_exists",
                    field="user_id",
                )
            # Their own grant is now redundant; the previous owner's (if any) is replaced by the one asked.
            s.exec(
                delete(IndexGrant).where(
                    col(IndexGrant.index_id) == index.id,
                    col(IndexGrant.subject_type) == "user",
                    col(IndexGrant.subject_id).in_([new_owner.id, previous]),
                )
            )
            index.owner_id = new_owner.id
            s.add(index)
            if body.previous_owner_role is not None:
                s.add(
                    IndexGrant(
                        index_id=index.id,
                        subject_type="user",
                        subject_id=previous,
                        role=body.previous_owner_role,
                        created_by=user.id,
                    )
                )
            old = s.get(User, previous)
            audit.record(
                s,
                user,
                "index.transfer",
                "index",
                index.id,
                {
                    "index": index.name,
                    "from_id": previous,
                    "from": old.username if old else None,
                    "to_id": new_owner.id,
                    "to": new_owner.username,
                    "previous_owner_role": body.previous_owner_role,
                },
                address,
            )
            try:
                s.commit()
            except IntegrityError:
                raise Conflict(
                    "the new owner already has an index with this name: rename one first",
                    code="index_exists",
                    field="user_id",
                ) from None
            # The caller may have kept nothing: then it is shown as its new owner has it (they just gave it).
            access = access_of(s, user, index) or Access(index, OWNER, "owner")
            return index_json(s, access, with_documents=True)

    return JSONResponse(await in_thread(transfer))


GRANTS = "/api/indexes/{id:int}/grants"
routes = [
    ApiRoute(
        "GET",
        GRANTS,
        list_grants,
        Operation(
            "Who the index is shared with (its owner or an administrator)",
            answer=[GrantOut],
            errors=(404,),
            tag="teams",
        ),
    ),
    ApiRoute(
        "POST",
        GRANTS,
        create_grant,
        Operation(
            "Share the index with a user, a group or everyone, as reader or editor (a second grant to the same "
            "subject changes its role: 200)",
            GrantCreate,
            GrantOut,
            status=201,
            same=(200,),
            errors=(400, 404, 409),
            tag="teams",
            links={
                "RemoveGrant": (
                    "delete_api_indexes_id_grants_grant_id",
                    {"id": "$request.path.id", "grant_id": "$response.body#/id"},
                )
            },
        ),
    ),
    ApiRoute(
        "PATCH",
        GRANTS + "/{grant_id:int}",
        update_grant,
        Operation("Change a grant's role", GrantUpdate, GrantOut, errors=(404,), tag="teams"),
    ),
    ApiRoute(
        "DELETE",
        GRANTS + "/{grant_id:int}",
        delete_grant,
        Operation(
            "Revoke a grant: the next turn of their chats no longer reads the index",
            status=204,
            errors=(404,),
            tag="teams",
        ),
    ),
    ApiRoute(
        "POST",
        "/api/indexes/{id:int}/owner",
        transfer_index,
        Operation(
            "Transfer the index to another user (its owner or an administrator)",
            OwnerTransfer,
            IndexFull,
            errors=(400, 404, 409),
            tag="teams",
        ),
    ),
]
