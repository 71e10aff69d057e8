"""Groups: administrators create, rename and delete them and add or remove members; a user sees the groups they
are in. A group the caller may not see is a 404 (the body of a missing one); a member asking to change it is a
403 (they can see it, only an administrator changes it).

Deleting a group removes its memberships and every index grant made to it, in one transaction.
"""

from __future__ import annotations

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, delete, func, select
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from . import audit
from .access import get_row
from .context import ctx, current_user, in_thread, path_id, read_json
from .db import Group, GroupMember, IndexGrant, User, iso
from .errors import BadRequest, Conflict, Forbidden, NotFound
from .responses import GroupOut
from .routing import ApiRoute, Operation
from .schemas import GroupCreate, GroupUpdate, MemberAdd


def _admin_only() -> Forbidden:
    return Forbidden("only an administrator can change groups", code="admin_only")


def _taken() -> Conflict:
    return Conflict("a group with this name already exists", code="group_exists", field="name")


def group_not_found(group_id: int, field: str | None = None) -> NotFound:
    return NotFound(f"no group {group_id}", code="group_not_found", field=field)


def visible_group(s: Session, user: User, group_id: int) -> Group:
    """The group when the user may see it (an administrator, or a member); else a 404."""
    group = get_row(s, Group, group_id)
    if group is None:
        raise group_not_found(group_id)
    if not user.is_admin:
        member = s.get(GroupMember, (group_id, user.id))
        if member is None:
            raise group_not_found(group_id)
    return group


def changeable_group(s: Session, user: User, group_id: int) -> Group:
    group = visible_group(s, user, group_id)
    if not user.is_admin:
        raise _admin_only()
    return group


def group_json(s: Session, group: Group) -> dict:
    members = s.exec(
        select(User)
        .join(GroupMember, col(GroupMember.user_id) == col(User.id))
        .where(GroupMember.group_id == group.id)
        .order_by(func.lower(User.username))
    ).all()
    return GroupOut(
        id=group.id,
        name=group.name,
        description=group.description,
        created_at=iso(group.created_at),
        members=[{"id": u.id, "username": u.username} for u in members],
    ).data()


def find_user(s: Session, user_id: int | None, username: str | None, field: str = "user_id") -> User:
    """A user named by id or by username (exactly one); an unknown one is a 404 naming the field."""
    if (user_id is None) == (username is None):
        raise BadRequest("name the user by user_id or by username (one of them)", code="invalid", field=field)
    if user_id is not None:
        user = get_row(s, User, user_id)
        if user is None:
            raise NotFound(f"no user {user_id}", code="user_not_found", field="user_id")
        return user
    user = s.exec(select(User).where(func.lower(User.username) == username.lower())).first()
    if user is None:
        raise NotFound(f"no user named {username!r}", code="user_not_found", field="username")
    return user


async def list_groups(request: Request) -> JSONResponse:
    user, c = await current_user(request), ctx(request)

    def load() -> list[dict]:
        with c.db.session() as s:
            query = select(Group).order_by(col(Group.name_key))
            if not user.is_admin:
                query = query.join(GroupMember, col(GroupMember.group_id) == col(Group.id)).where(
                    GroupMember.user_id == user.id
                )
            return [group_json(s, g) for g in s.exec(query)]

    return JSONResponse(await in_thread(load))


async def create_group(request: Request) -> JSONResponse:
    user, c = await current_user(request), ctx(request)
    if not user.is_admin:
        raise _admin_only()
    body = await read_json(request, GroupCreate)
    address = audit.address_of(request)

    def create() -> dict:
        with c.db.session() as s:
            key = body.name.lower()
            if s.exec(select(Group.id).where(Group.name_key == key)).first():
                raise _taken()
            group = Group(name=body.name, name_key=key, description=body.description)
            s.add(group)
            try:
                s.flush()
                audit.record(s, user, "group.create", "group", group.id, {"name": group.name}, address)
                s.commit()
            except IntegrityError:
                raise _taken() from None
            return group_json(s, group)

    return JSONResponse(await in_thread(create), status_code=201)


async def get_group(request: Request) -> JSONResponse:
    user, c, group_id = await current_user(request), ctx(request), path_id(request)

    def load() -> dict:
        with c.db.session() as s:
            return group_json(s, visible_group(s, user, group_id))

    return JSONResponse(await in_thread(load))


async def update_group(request: Request) -> JSONResponse:
    user, c, group_id = await current_user(request), ctx(request), path_id(request)
    body = await read_json(request, GroupUpdate)
    address = audit.address_of(request)

    def change() -> dict:
        with c.db.session() as s:
            group = changeable_group(s, user, group_id)
            detail: dict = {}
            if body.name is not None and body.name != group.name:
                key = body.name.lower()
                if key != group.name_key and s.exec(select(Group.id).where(Group.name_key == key)).first():
                    raise _taken()
                detail = {"from": group.name, "to": body.name}
                group.name, group.name_key = body.name, key
            if body.description is not None:
                group.description = body.description
            s.add(group)
            if detail:
                audit.record(s, user, "group.rename", "group", group.id, detail, address)
            try:
                s.commit()
            except IntegrityError:
                raise _taken() from None
            return group_json(s, group)

    return JSONResponse(await in_thread(change))


async def delete_group(request: Request) -> Response:
    user, c, group_id = await current_user(request), ctx(request), path_id(request)
    address = audit.address_of(request)

    def remove() -> None:
        with c.db.session() as s:
            group = changeable_group(s, user, group_id)
            s.exec(delete(GroupMember).where(col(GroupMember.group_id) == group.id))
            s.exec(
                delete(IndexGrant).where(
                    col(IndexGrant.subject_type) == "group", col(IndexGrant.subject_id) == group.id
                )
            )
            audit.record(s, user, "group.delete", "group", group.id, {"name": group.name}, address)
            s.delete(group)
            s.commit()

    await in_thread(remove)
    return Response(status_code=204)


async def add_member(request: Request) -> JSONResponse:
    user, c, group_id = await current_user(request), ctx(request), path_id(request)
    body = await read_json(request, MemberAdd)
    address = audit.address_of(request)

    def add() -> dict:
        with c.db.session() as s:
            group = changeable_group(s, user, group_id)
            member = find_user(s, body.user_id, body.username)
            if s.get(GroupMember, (group.id, member.id)) is None:
                s.add(GroupMember(group_id=group.id, user_id=member.id))
                audit.record(
                    s,
                    user,
                    "group.member_add",
                    "group",
                    group.id,
                    {"name": group.name, "user_id": member.id, "username": member.username},
                    address,
                )
                try:
                    s.commit()
                except IntegrityError:  # added by a concurrent request: the same outcome
                    s.rollback()
            return group_json(s, group)

    return JSONResponse(await in_thread(add))


async def remove_member(request: Request) -> Response:
    user, c, group_id = await current_user(request), ctx(request), path_id(request)
    member_id = path_id(request, "user_id")
    address = audit.address_of(request)

    def remove() -> None:
        with c.db.session() as s:
            group = changeable_group(s, user, group_id)
            row = s.get(GroupMember, (group.id, member_id)) if get_row(s, User, member_id) else None
            if row is None:
                raise NotFound(f"user {member_id} is not in this group", code="member_not_found")
            member = s.get(User, member_id)
            s.delete(row)
            audit.record(
                s,
                user,
                "group.member_remove",
                "group",
                group.id,
                {"name": group.name, "user_id": member_id, "username": member.username if member else None},
                address,
            )
            s.commit()

    await in_thread(remove)
    return Response(status_code=204)


GROUP = "/api/groups/{id:int}"
routes = [
    ApiRoute(
        "GET",
        "/api/groups",
        list_groups,
        Operation(
            "The groups the user is in (every group, for an administrator)", answer=[GroupOut], tag="teams"
        ),
    ),
    ApiRoute(
        "POST",
        "/api/groups",
        create_group,
        Operation(
            "A new group (administrators)",
            GroupCreate,
            GroupOut,
            status=201,
            errors=(403, 409),
            tag="teams",
            links={"DeleteGroup": ("delete_api_groups_id", {"id": "$response.body#/id"})},
        ),
    ),
    ApiRoute(
        "GET",
        GROUP,
        get_group,
        Operation("One group with its members", answer=GroupOut, errors=(404,), tag="teams"),
    ),
    ApiRoute(
        "PATCH",
        GROUP,
        update_group,
        Operation(
            "Rename a group or change its description (administrators)",
            GroupUpdate,
            GroupOut,
            errors=(403, 404, 409),
            tag="teams",
        ),
    ),
    ApiRoute(
        "DELETE",
        GROUP,
        delete_group,
        Operation(
            "Delete a group, its memberships and its index grants (administrators)",
            status=204,
            errors=(403, 404),
            tag="teams",
        ),
    ),
    ApiRoute(
        "POST",
        GROUP + "/members",
        add_member,
        Operation(
            "Add a member by user_id or username (administrators); adding one twice is the same",
            MemberAdd,
            GroupOut,
            errors=(403, 404),
            tag="teams",
            links={
                "RemoveMember": (
                    "delete_api_groups_id_members_user_id",
                    {"id": "$request.path.id", "user_id": "$response.body#/members/0/id"},
                )
            },
        ),
    ),
    ApiRoute(
        "DELETE",
        GROUP + "/members/{user_id:int}",
        remove_member,
        Operation("Remove a member (administrators)", status=204, errors=(403, 404), tag="teams"),
    ),
]
