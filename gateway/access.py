"""Who may do what with an index: the one place every route resolves an index for a user.

An index has an owner (`indexes.owner_id`) and grants (`index_grants`): to a user, to a group, or to everyone
signed in, each `reader` (ask, see documents and datasets, download) or `editor` (reader + upload, delete
documents, build, rename, describe). Only the owner, or an administrator, shares, transfers and deletes.
Administrators hold owner rights on every index.

An index the user may not read is a 404 with exactly the body of a missing one, so ids reveal nothing; one the
user may read but not change as asked is a 404 as well (a reader learns nothing from probing editor routes).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

from sqlmodel import Session, col, or_, select

from .context import Context
from .db import GroupMember, Index, IndexGrant, User
from .errors import NotFound

T = TypeVar("T")
READER, EDITOR, OWNER = "reader", "editor", "owner"
GRANT_ROLES = (READER, EDITOR)  # what a grant can give; owner is the index's owner_id
RANK = {READER: 1, EDITOR: 2, OWNER: 3}
# Where access comes from: the user owns it, a grant to them, a group they are in, everyone, or admin rights.
SOURCES = ("owner", "direct", "group", "everyone", "admin")
_SOURCE_PREFERENCE = {"owner": 0, "admin": 1, "direct": 2, "group": 3, "everyone": 4}


@dataclass(frozen=True)
class Access:
    """A user's access to one index: the role (owner / editor / reader), where it comes from, and for a group
    grant the group's id."""

    index: Index
    role: str
    source: str
    group_id: int | None = None

    def allows(self, need: str) -> bool:
        return RANK[self.role] >= RANK[need]


INT32_MAX = 2**31 - 1  # Postgres `integer` ids (SQLModel's int primary keys); SQLite's are 64-bit


def beyond_ids(s: Session, row_id: int) -> bool:
    """An id past the database's integers, which names no row (Postgres would refuse the query: a client's
    `2**62` is a 404, not a 500)."""
    return s.get_bind().dialect.name == "postgresql" and row_id > INT32_MAX


def get_row(s: Session, model: type[T], row_id: int) -> T | None:
    """`s.get(model, row_id)`, with an id past the database's integers naming no row."""
    if beyond_ids(s, row_id):
        return None
    return s.get(model, row_id)


def not_found(index_id: int) -> NotFound:
    """The one answer for an index that does not exist or that the caller may not use as asked."""
    return NotFound(f"no index {index_id}", code="index_not_found")


def user_group_ids(s: Session, user_id: int) -> list[int]:
    return list(s.exec(select(GroupMember.group_id).where(GroupMember.user_id == user_id)))


def _grants_for(s: Session, user: User, index_ids: Iterable[int] | None) -> list[IndexGrant]:
    groups = user_group_ids(s, user.id)
    who = [
        (col(IndexGrant.subject_type) == "user") & (col(IndexGrant.subject_id) == user.id),
        col(IndexGrant.subject_type) == "everyone",
    ]
    if groups:
        who.append((col(IndexGrant.subject_type) == "group") & col(IndexGrant.subject_id).in_(groups))
    query = select(IndexGrant).where(or_(*who))
    if index_ids is not None:
        query = query.where(col(IndexGrant.index_id).in_(list(index_ids)))
    return list(s.exec(query))


def _best(index: Index, grants: list[IndexGrant]) -> Access | None:
    best: Access | None = None
    for g in grants:
        source = {"user": "direct", "group": "group", "everyone": "everyone"}[g.subject_type]
        candidate = Access(index, g.role, source, g.subject_id if source == "group" else None)
        if best is None or (RANK[candidate.role], -_SOURCE_PREFERENCE[source]) > (
            RANK[best.role],
            -_SOURCE_PREFERENCE[best.source],
        ):
            best = candidate
    return best


def access_of(s: Session, user: User, index: Index) -> Access | None:
    """The user's access to this index, or None when they may not read it."""
    if index.owner_id == user.id:
        return Access(index, OWNER, "owner")
    if user.is_admin:
        return Access(index, OWNER, "admin")
    return _best(index, _grants_for(s, user, [index.id]))


def index_access(s: Session, user: User, index_id: int, need: str = READER) -> Access:
    """The index with the user's access to it, when that access is at least `need` (reader / editor / owner);
    otherwise a 404 with the body of a missing index."""
    index = get_row(s, Index, index_id)
    if index is None:
        raise not_found(index_id)
    access = access_of(s, user, index)
    if access is None or not access.allows(need):
        raise not_found(index_id)
    return access


def require_index(s: Session, user: User, index_id: int, need: str = READER) -> Index:
    """`index_access(...).index`: the index itself, for routes that need only the check."""
    return index_access(s, user, index_id, need).index


def read_index(c: Context, user: User, index_id: int, need: str = READER) -> Index:
    """`require_index` in a session of its own (for `in_thread`)."""
    with c.db.session() as s:
        return require_index(s, user, index_id, need)


def readable_indexes(s: Session, user: User) -> list[Access]:
    """Every index the user may read, by name then id: their own, those shared with them (directly, by a group,
    with everyone) and, for an administrator, every index."""
    if user.is_admin:
        rows = s.exec(select(Index).order_by(col(Index.name), col(Index.id))).all()
        return [a for a in (access_of(s, user, i) for i in rows) if a is not None]
    grants = _grants_for(s, user, None)
    by_index: dict[int, list[IndexGrant]] = {}
    for g in grants:
        by_index.setdefault(g.index_id, []).append(g)
    query = select(Index).where(or_(Index.owner_id == user.id, col(Index.id).in_(list(by_index) or [0])))
    out = []
    for index in s.exec(query.order_by(col(Index.name), col(Index.id))):
        access = access_of(s, user, index) if index.owner_id == user.id else _best(index, by_index[index.id])
        if access is not None:
            out.append(access)
    return out


def readable_subset(s: Session, user: User, indexes: Iterable[Index]) -> list[Index]:
    """Those of `indexes` (in order) the user may still read: a chat's linked indexes at each turn."""
    indexes = list(indexes)
    if not indexes:
        return []
    if user.is_admin:
        return indexes
    granted = {g.index_id for g in _grants_for(s, user, [i.id for i in indexes])}
    return [i for i in indexes if i.owner_id == user.id or i.id in granted]


def require_indexes(s: Session, user: User, index_ids: list[int], need: str = READER) -> list[Index]:
    """The indexes, in the order asked (duplicates dropped); one the user may not read is a 404 naming it, with
    `field: index_ids`."""
    out = []
    for index_id in dict.fromkeys(index_ids):
        try:
            out.append(require_index(s, user, index_id, need))
        except NotFound:
            raise NotFound(f"no index {index_id}", code="index_not_found", field="index_ids") from None
    return out


def readable_worker_names(s: Session, user: User, worker_names: Iterable[str]) -> set[str]:
    """Which of these worker tables (a carried document's `index`) belong to indexes the user may read."""
    names = {n for n in worker_names if n}
    if not names:
        return set()
    rows = list(s.exec(select(Index).where(col(Index.worker_name).in_(list(names)))))
    return {i.worker_name for i in readable_subset(s, user, rows)}


def readable_documents(s: Session, user: User, documents: list) -> list:
    """Carried documents (chat state, a snapshot) without those of an index the user can no longer read; a
    document that names no index (none was searched) stays."""
    names = readable_worker_names(s, user, (d.get("index") for d in documents if isinstance(d, dict)))
    return [d for d in documents if not isinstance(d, dict) or not d.get("index") or d.get("index") in names]
