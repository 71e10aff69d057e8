"""Every `/api` route that names an index, a group or the audit log, and the gateway's `/v1`, for every kind of
caller (people, and the owner's API keys: read-only, revoked, expired): the exact status of each cell, on SQLite
and (TEST_DATABASE_URL) Postgres.

One in-process gateway per database (the real app, its real database, no worker process: a route that passes the
access check and then needs the worker answers 503 `worker_unavailable`, which is how a cell shows the gate let
the caller through; the positive paths with a real worker are in test_turn_lifecycle.py's revocation scenario).

The table is data: `COLUMNS` are the principals (who is asking), `ROWS` one route each with one status per
principal. Adding a principal (an API key of some kind) means adding it to `COLUMNS`, a way to sign it in to
`PRINCIPALS` (see `principals`) and its status to every row; `test_every_cell_is_covered` keeps the table whole.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.db import Index, IndexDocument, IndexSource, Job
from gateway.settings import Settings
from tests.integration.ops.postgres import database_urls, fresh_database
from tests.servers import free_port

PASSWORD = "a long enough passphrase"
# Who asks. Each signs in as a user whose only link to the index under test ("the index") is the one named;
# `reader_everyone` asks about an index shared with everyone signed in (and nothing else).
HUMANS = (
    "owner",  # owns the index
    "admin",  # an administrator, no grant
    "editor",  # a user grant, editor
    "reader_user",  # a user grant, reader
    "reader_group",  # a member of a group with a reader grant
    "reader_everyone",  # the index is shared with everyone signed in
    "non_member",  # signed in, nothing shared with them
    "disabled",  # had a reader grant; the account was disabled
)
# The owner's API keys (gateway/keys.py): each acts as the owner would, within what it may do.
KEYS = (
    "read_only_key",  # may ask and read, change nothing: 403 `read_only_key` for anything else
    "revoked_key",  # revoked: 401 `key_revoked`
    "expired_key",  # past its expiry: 401 `key_expired`
    "full_key",  # a full key: exactly the owner, but it cannot make keys (403 `session_required`)
    "disabled_key",  # a key of the disabled account: 401 `account_disabled`
)
COLUMNS = HUMANS + KEYS
UNAUTHORIZED = {
    "disabled": "account_disabled",
    "revoked_key": "key_revoked",
    "expired_key": "key_expired",
    "disabled_key": "account_disabled",
}

W = 503  # passed the access check, then needed the worker (absent here)
Q = 202  # passed the access check and queued a job (which needs the worker later, in the background)
S = 200  # passed the access check and queued a job, whose stream this is (it fails: no worker)
READ = (200, 200, 200, 200, 200, 200, 404, 401, 200, 401, 401, 200, 401)  # whoever may read the index
EDIT = (200, 200, 200, 404, 404, 404, 404, 401, 403, 401, 401, 200, 401)  # whoever may change it


@dataclass
class Row:
    method: str
    path: str  # {index} {document} {grant} {group} {member} {chat} {model} {key} {spare} {job} {source}: per cell
    expect: tuple[int, ...]
    body: dict | Callable[[], dict] | None = None
    fresh: bool = False  # the cell changes what it acts on: each cell gets its own copy of the index
    files: bool = False  # a multipart upload

    def __post_init__(self) -> None:
        assert len(self.expect) == len(COLUMNS), f"{self.method} {self.path}: one status per principal"


_names = itertools.count()

#       owner admin editor r_user r_group r_every non_member disabled
ROWS = [
    Row("GET", "/api/indexes", (200, 200, 200, 200, 200, 200, 200, 401, 200, 401, 401, 200, 401)),
    Row("GET", "/api/indexes/{index}", (200, 200, 200, 200, 200, 200, 404, 401, 200, 401, 401, 200, 401)),
    Row(
        "GET",
        "/api/indexes/{index}/datasets",
        (200, 200, 200, 200, 200, 200, 404, 401, 200, 401, 401, 200, 401),
    ),
    Row(
        "PATCH",
        "/api/indexes/{index}",
        (200, 200, 200, 404, 404, 404, 404, 401, 403, 401, 401, 200, 401),
        {"description": "changed"},
    ),
    Row(
        "POST",
        "/api/indexes/{index}/documents",
        (Q, Q, Q, 404, 404, 404, 404, 401, 403, 401, 401, Q, 401),
        files=True,
    ),
    # Index sources (gateway/sync/): read by readers, changed and synced by editors.
    Row("GET", "/api/indexes/{index}/sources", READ),
    Row(
        "POST",
        "/api/indexes/{index}/sources",
        (201, 201, 201, 404, 404, 404, 404, 401, 403, 401, 401, 201, 401),
        {"kind": "s3", "bucket": "handbook-two"},
        fresh=True,
    ),
    Row("GET", "/api/indexes/{index}/sources/{source}", READ),
    Row("PATCH", "/api/indexes/{index}/sources/{source}", EDIT, {"prefix": "docs/"}),
    Row(
        "POST",
        "/api/indexes/{index}/sources/{source}/sync",
        (Q, Q, Q, 404, 404, 404, 404, 401, 403, 401, 401, Q, 401),
        fresh=True,
    ),
    Row(
        "DELETE",
        "/api/indexes/{index}/sources/{source}",
        (204, 204, 204, 404, 404, 404, 404, 401, 403, 401, 401, 204, 401),
        fresh=True,
    ),
    Row("GET", "/api/jobs?index={index}", READ),
    Row("GET", "/api/jobs/{job}", READ),
    Row("GET", "/api/jobs/{job}/events", READ),
    Row("POST", "/api/jobs/{job}/cancel", EDIT),
    Row(
        "GET",
        "/api/indexes/{index}/documents/{document}/download",
        (W, W, W, W, W, W, 404, 401, W, 401, 401, W, 401),
    ),
    Row(
        "DELETE",
        "/api/indexes/{index}/documents/{document}",
        (W, W, W, 404, 404, 404, 404, 401, 403, 401, 401, W, 401),
    ),
    Row(
        "GET", "/api/indexes/{index}/build", (204, 204, 204, 204, 204, 204, 404, 401, 204, 401, 401, 204, 401)
    ),
    Row(
        "POST",
        "/api/indexes/{index}/build",
        (S, S, S, 404, 404, 404, 404, 401, 403, 401, 401, S, 401),
        {},
        fresh=True,
    ),
    Row("DELETE", "/api/indexes/{index}", (W, W, 404, 404, 404, 404, 404, 401, 403, 401, 401, W, 401)),
    Row(
        "GET",
        "/api/indexes/{index}/grants",
        (200, 200, 404, 404, 404, 404, 404, 401, 200, 401, 401, 200, 401),
    ),
    Row(
        "POST",
        "/api/indexes/{index}/grants",
        (200, 200, 404, 404, 404, 404, 404, 401, 403, 401, 401, 200, 401),
        {"subject_type": "user", "username": "spare", "role": "reader"},  # spare already reads it: 200
    ),
    Row(
        "PATCH",
        "/api/indexes/{index}/grants/{grant}",
        (200, 200, 404, 404, 404, 404, 404, 401, 403, 401, 401, 200, 401),
        {"role": "reader"},
    ),
    Row(
        "DELETE",
        "/api/indexes/{index}/grants/{grant}",
        (204, 204, 404, 404, 404, 404, 404, 401, 403, 401, 401, 204, 401),
        fresh=True,
    ),
    Row(
        "POST",
        "/api/indexes/{index}/owner",
        (200, 200, 404, 404, 404, 404, 404, 401, 403, 401, 401, 200, 401),
        {"username": "spare"},
        fresh=True,
    ),
    Row(
        "POST",
        "/api/chats",
        (201, 201, 201, 201, 201, 201, 404, 401, 201, 401, 401, 201, 401),
        {"index_ids": ["{index}"]},
    ),
    Row(
        "PATCH",
        "/api/chats/{chat}",
        (200, 200, 200, 200, 200, 200, 404, 401, 403, 401, 401, 200, 401),
        {"index_ids": ["{index}"]},
    ),
    Row("GET", "/api/groups", (200, 200, 200, 200, 200, 200, 200, 401, 200, 401, 401, 200, 401)),
    Row(
        "POST",
        "/api/groups",
        (403, 201, 403, 403, 403, 403, 403, 401, 403, 401, 401, 403, 401),
        lambda: {"name": f"team {next(_names)}"},
    ),
    Row("GET", "/api/groups/{group}", (404, 200, 404, 404, 200, 404, 404, 401, 404, 401, 401, 404, 401)),
    Row(
        "PATCH",
        "/api/groups/{group}",
        (404, 200, 404, 404, 403, 404, 404, 401, 403, 401, 401, 404, 401),
        {"description": "x"},
    ),
    Row(
        "POST",
        "/api/groups/{group}/members",
        (404, 200, 404, 404, 403, 404, 404, 401, 403, 401, 401, 404, 401),
        {"username": "spare"},
    ),
    Row(
        "DELETE",
        "/api/groups/{group}/members/{member}",
        (404, 204, 404, 404, 403, 404, 404, 401, 403, 401, 401, 404, 401),
        fresh=True,
    ),
    Row(
        "DELETE",
        "/api/groups/{group}",
        (404, 204, 404, 404, 403, 404, 404, 401, 403, 401, 401, 404, 401),
        fresh=True,
    ),
    Row("GET", "/api/audit", (403, 200, 403, 403, 403, 403, 403, 401, 403, 401, 401, 403, 401)),
    # API keys ({key}: a key of the owner's, made for the cell) and the user administration ({spare}: a user).
    Row("GET", "/api/keys", (200, 200, 200, 200, 200, 200, 200, 401, 200, 401, 401, 200, 401)),
    Row(
        "POST",
        "/api/keys",
        (201, 201, 201, 201, 201, 201, 201, 401, 403, 401, 401, 403, 401),
        {"name": "cell"},
    ),
    Row("DELETE", "/api/keys/{key}", (204, 404, 404, 404, 404, 404, 404, 401, 403, 401, 401, 204, 401)),
    Row("GET", "/api/users", (404, 200, 404, 404, 404, 404, 404, 401, 404, 401, 401, 404, 401)),
    Row(
        "PATCH",
        "/api/users/{spare}",
        (404, 200, 404, 404, 404, 404, 404, 401, 403, 401, 401, 404, 401),
        {"is_admin": False},
    ),
    # The gateway's OpenAI-compatible surface ({model}: the index's `rag/<worker table>`); errors in OpenAI's shape.
    Row("GET", "/v1/models", (200, 200, 200, 200, 200, 200, 200, 401, 200, 401, 401, 200, 401)),
    Row("GET", "/v1/models/{model}", (200, 200, 200, 200, 200, 200, 404, 401, 200, 401, 401, 200, 401)),
    Row(
        "POST",
        "/v1/chat/completions",
        (W, W, W, W, W, W, 404, 401, W, 401, 401, W, 401),
        {"model": "{model}", "messages": [{"role": "user", "content": "What does the handbook say?"}]},
    ),
    # The routes that name no index: the caller's own things, another's chat, the administrator's.
    Row("GET", "/api/auth/me", (200, 200, 200, 200, 200, 200, 200, 401, 200, 401, 401, 200, 401)),
    # {"user": null} for the disabled account and the dead keys: a 200 either way.
    Row("GET", "/api/auth/session", (200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200)),
    Row("GET", "/api/chats", (200, 200, 200, 200, 200, 200, 200, 401, 200, 401, 401, 200, 401)),
    Row("GET", "/api/chats/{chat}", (200, 200, 200, 200, 200, 200, 200, 401, 200, 401, 401, 200, 401)),
    Row("GET", "/api/chats/{owner_chat}", (200, 404, 404, 404, 404, 404, 404, 401, 200, 401, 401, 200, 401)),
    Row(
        "PATCH",
        "/api/chats/{owner_chat}",
        (200, 404, 404, 404, 404, 404, 404, 401, 403, 401, 401, 200, 401),
        {"title": "mine"},
    ),
    Row(
        "POST",
        "/api/chats/{owner_chat}/messages",
        (W, 404, 404, 404, 404, 404, 404, 401, W, 401, 401, W, 401),
        {"message": "hi"},
    ),
    Row("POST", "/api/chats/{chat}/stop", (409, 409, 409, 409, 409, 409, 409, 401, 409, 401, 401, 409, 401)),
    Row("GET", "/api/chats/{chat}/stream", (204, 204, 204, 204, 204, 204, 204, 401, 204, 401, 401, 204, 401)),
    Row(
        "GET",
        "/api/chats/{owner_chat}/stream",
        (204, 404, 404, 404, 404, 404, 404, 401, 204, 401, 401, 204, 401),
    ),
    Row(
        "DELETE",
        "/api/chats/{owner_chat}",
        (204, 404, 404, 404, 404, 404, 404, 401, 403, 401, 401, 204, 401),
        fresh=True,
    ),
    Row("GET", "/api/settings", (200, 200, 200, 200, 200, 200, 200, 401, 200, 401, 401, 200, 401)),
    Row("PUT", "/api/settings", (403, 200, 403, 403, 403, 403, 403, 401, 403, 401, 401, 403, 401), {}),
    Row("GET", "/api/openapi.json", (200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200)),
]
# Left out on purpose: register and login (no principal), logout and the password change (they end the
# principal's sessions; tests/unit/test_gateway_api.py and test_accounts_security.py cover them).


@dataclass
class World:
    """The signed-in principals and the objects the table's paths name."""

    client: TestClient
    headers: dict[str, dict] = field(default_factory=dict)
    ids: dict[str, int] = field(default_factory=dict)  # user ids by name
    group: int = 0
    group_name: str = ""

    def call(self, who: str, method: str, path: str, **kw):
        return self.client.request(method, path, headers=self.headers[who], **kw)


def settings_for(tmp: Path, database_url: str) -> Settings:
    return Settings(
        INDEX_STORE=tmp / "store",
        UPLOADS_DIR=tmp / "uploads",
        WORKER_URL=f"http://127.0.0.1:{free_port()}",  # no worker: a call that reaches it is a 503
        DATABASE_URL=database_url,
        GATEWAY_ALLOWED_HOSTS="testserver",
        REGISTER_LIMIT=100,
        MAX_UPLOAD_BYTES=4096,
        JOB_FILE_RETRIES=1,  # a job needing the absent worker fails at its first try
    )


def _register(w: World, name: str) -> None:
    r = w.client.post("/api/auth/register", json={"username": name, "password": PASSWORD})
    assert r.status_code == 201, r.text
    w.client.cookies.clear()  # Bearer tokens, as a script signs in
    w.headers[name] = {"Authorization": f"Bearer {r.json()['token']}"}
    w.ids[name] = r.json()["user"]["id"]


def new_key(w: World, who: str, **fields) -> dict:
    r = w.call(who, "POST", "/api/keys", json={"name": "matrix", **fields})
    assert r.status_code == 201, r.text
    return r.json()


def principals(w: World) -> None:
    """Sign every principal in (the first account is the administrator)."""
    for name in ("admin", "owner", "editor", "reader_user", "reader_group", "reader_everyone", "non_member"):
        _register(w, name)
    _register(w, "disabled")
    _register(w, "spare")  # a user the table shares with, adds to groups and transfers to
    # The owner's keys; the expired one is made to expire a moment from now (a past expiry is refused).
    w.headers["read_only_key"] = {"Authorization": f"Bearer {new_key(w, 'owner', read_only=True)['key']}"}
    revoked = new_key(w, "owner")
    assert w.call("owner", "DELETE", f"/api/keys/{revoked['id']}").status_code == 204
    w.headers["revoked_key"] = {"Authorization": f"Bearer {revoked['key']}"}
    soon = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
    w.headers["expired_key"] = {"Authorization": f"Bearer {new_key(w, 'owner', expires_at=soon)['key']}"}
    w.headers["full_key"] = {"Authorization": f"Bearer {new_key(w, 'owner')['key']}"}
    w.headers["disabled_key"] = {"Authorization": f"Bearer {new_key(w, 'disabled')['key']}"}  # disabled later


def wait_expired(w: World) -> None:
    deadline = time.monotonic() + 30
    while w.call("expired_key", "GET", "/api/auth/me").status_code == 200:
        assert time.monotonic() < deadline, "the key never expired"
        time.sleep(0.1)


def share(w: World, index_id: int, everyone: bool) -> None:
    """The index as the table's principals see it: shared with each as their column says."""
    grants = (
        [{"subject_type": "everyone", "role": "reader"}]
        if everyone
        else [
            {"subject_type": "user", "username": "editor", "role": "editor"},
            {"subject_type": "user", "username": "reader_user", "role": "reader"},
            {"subject_type": "group", "group_id": w.group, "role": "reader"},
            {"subject_type": "user", "username": "disabled", "role": "reader"},
        ]
    )
    for body in [*grants, {"subject_type": "user", "username": "spare", "role": "reader"}]:
        # The owner shares with users; the group (which the owner is not in) is shared by the administrator.
        who = "admin" if body["subject_type"] == "group" else "owner"
        r = w.call(who, "POST", f"/api/indexes/{index_id}/grants", json=body)
        assert r.status_code == 201, r.text


def make_index(w: World, everyone: bool) -> dict:
    """An index owned by `owner`, with one document row, shared as the table needs; the ids its paths name."""
    r = w.call("owner", "POST", "/api/indexes", json={"name": f"handbook {next(_names)}"})
    assert r.status_code == 201, r.text
    index_id = r.json()["id"]
    share(w, index_id, everyone)
    with w.client.app.state.ctx.db.session() as s:  # a document the worker would have indexed
        doc = IndexDocument(index_id=index_id, dataset="default", filename="a.md", chunks=1, bytes=3)
        s.add(doc)
        s.commit()
        document = doc.id
        worker_name = s.get(Index, index_id).worker_name
        job = Job(kind="upload", index_id=index_id, user_id=w.ids["owner"], state="done", total=1, done=1)
        s.add(job)  # an upload the owner made, finished
        s.commit()
        job_id = job.id
        source = IndexSource(index_id=index_id, kind="s3", bucket="handbook", created_by=w.ids["owner"])
        s.add(source)  # a bucket it syncs from (on demand only)
        s.commit()
        source_id = source.id
    grants = w.call("owner", "GET", f"/api/indexes/{index_id}/grants").json()
    spare = next(g["id"] for g in grants if g["subject_name"] == "spare")
    return {
        "index": index_id,
        "document": document,
        "grant": spare,
        "model": f"rag/{worker_name}",
        "job": job_id,
        "source": source_id,
    }


def make_group(w: World) -> dict:
    r = w.call("admin", "POST", "/api/groups", json={"name": f"readers {next(_names)}"})
    assert r.status_code == 201, r.text
    group = r.json()["id"]
    for name in ("reader_group", "spare"):
        assert (
            w.call("admin", "POST", f"/api/groups/{group}/members", json={"username": name}).status_code
            == 200
        )
    return {"group": group, "member": w.ids["spare"]}


@pytest.fixture(scope="module", params=database_urls(), ids=lambda url: url.split(":", 1)[0].split("+")[0])
def world(request, tmp_path_factory):
    with contextlib.ExitStack() as stack:
        url = "" if request.param == "sqlite" else stack.enter_context(fresh_database(request.param))
        client = stack.enter_context(
            TestClient(create_app(settings_for(tmp_path_factory.mktemp("acl"), url)))
        )
        w = World(client)
        principals(w)
        w.group = make_group(w)["group"]
        w.group_name = w.call("admin", "GET", f"/api/groups/{w.group}").json()["name"]
        w.shared = make_index(w, everyone=False)
        w.public = make_index(w, everyone=True)
        w.chats = {}
        for who in HUMANS[:-1]:
            w.chats[who] = w.call(who, "POST", "/api/chats", json={}).json()["id"]
        for who in KEYS:  # the keys ask about the owner's chat (the disabled account's key gets no further)
            w.chats[who] = w.chats["owner"]
        # Disabled last: everything above it was set up while it could still sign in.
        w.chats["disabled"] = w.call("disabled", "POST", "/api/chats", json={}).json()["id"]
        r = w.call("admin", "PATCH", f"/api/users/{w.ids['disabled']}", json={"disabled": True})
        assert r.status_code == 200, r.text
        wait_expired(w)
        yield w


def _fill(value, ids: dict):
    if isinstance(value, str) and value.startswith("{") and value.endswith("}"):
        return ids[value[1:-1]]
    if isinstance(value, list):
        return [_fill(v, ids) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, ids) for k, v in value.items()}
    return value


def run_cell(w: World, row: Row, who: str) -> tuple[int, dict | None, int]:
    """(status, JSON body, the id of the index the cell asked about)."""
    everyone = who == "reader_everyone"
    objects = dict(w.public if everyone else w.shared)
    if row.fresh and "{index}" in row.path:
        objects = make_index(w, everyone)
    group = (
        make_group(w) if row.fresh and "{group}" in row.path else {"group": w.group, "member": w.ids["spare"]}
    )
    ids = {**objects, **group, "chat": w.chats[who], "owner_chat": w.chats["owner"], "spare": w.ids["spare"]}
    if row.fresh and "{owner_chat}" in row.path:  # a chat of the owner's that others try to delete
        ids["owner_chat"] = w.call("owner", "POST", "/api/chats", json={}).json()["id"]
    if "{key}" in row.path:
        ids["key"] = new_key(w, "owner")["id"]
    path = row.path.format(**ids)
    body = row.body() if callable(row.body) else row.body
    kw: dict = {}
    if row.files:
        kw["files"] = {"file": ("notes.md", b"# notes\n", "text/markdown")}
    elif body is not None:
        kw["json"] = _fill(body, ids)
    r = w.call(who, row.method, path, **kw)
    body = r.json() if r.headers.get("content-type", "").startswith("application/json") else None
    return r.status_code, body, objects["index"]


@pytest.mark.parametrize("row", ROWS, ids=lambda row: f"{row.method} {row.path}")
def test_each_route_answers_each_principal_with_its_status(world, row) -> None:
    got = {who: run_cell(world, row, who) for who in COLUMNS}
    statuses = tuple(got[who][0] for who in COLUMNS)
    assert statuses == row.expect, dict(zip(COLUMNS, statuses, strict=True))
    for who, (status, body, index_id) in got.items():
        if status == 404 and "{index}" in row.path and "/grants/" not in row.path:
            # A forbidden index is exactly a missing one: same body, so an id says nothing about what exists.
            assert body == {"error": f"no index {index_id}", "code": "index_not_found"} or (
                body.get("field") == "index_ids" and body["code"] == "index_not_found"
            ), (who, body)
        if status == W:
            assert code_of(body) == "worker_unavailable", (who, body)
        if status == 401:
            assert code_of(body) == UNAUTHORIZED[who], (who, body)
        if who == "read_only_key" and status == 403 and row.method != "GET":
            assert code_of(body) == "read_only_key", body
        if who == "full_key" and status == 403 and (row.method, row.path) == ("POST", "/api/keys"):
            assert code_of(body) == "session_required", body
        if status == 404 and row.path.startswith("/v1/"):
            assert code_of(body) == "model_not_found", (who, body)  # another user's index: no such model


def code_of(body: dict) -> str:
    """The error's code: `/api`'s `{"error", "code"}` or `/v1`'s OpenAI `{"error": {"code", ...}}`."""
    return body["error"]["code"] if isinstance(body.get("error"), dict) else body["code"]


def test_every_cell_is_covered() -> None:
    assert len({(r.method, r.path) for r in ROWS}) == len(ROWS)
    assert all(len(r.expect) == len(COLUMNS) for r in ROWS)


def test_the_index_list_says_what_each_user_may_do_and_where_it_comes_from(world) -> None:
    w = world
    shared, public = w.shared["index"], w.public["index"]

    def listed(who: str) -> dict[int, dict]:
        r = w.call(who, "GET", "/api/indexes")
        assert r.status_code == 200
        return {i["id"]: i for i in r.json()}

    seen = {who: listed(who) for who in HUMANS[:-1]}
    expected = {
        "owner": ("owner", "owner", None),
        "admin": ("owner", "admin", None),
        "editor": ("editor", "direct", None),
        "reader_user": ("reader", "direct", None),
        "reader_group": ("reader", "group", w.group_name),
    }
    for who, (access, via, group) in expected.items():
        row = seen[who][shared]
        assert (row["access"], row["via"], row["via_group"]) == (access, via, group), who
        assert (row["owner"], row["owner_id"]) == ("owner", w.ids["owner"])
    # Shared with everyone: every signed-in user reads it, and learns who owns it; nobody else sees the other one.
    for who in ("editor", "reader_user", "reader_group", "reader_everyone", "non_member"):
        assert (seen[who][public]["access"], seen[who][public]["via"]) == ("reader", "everyone"), who
    assert shared not in seen["reader_everyone"] and shared not in seen["non_member"]
    # The owner's own list shows their indexes as owned, the administrator sees every index.
    assert seen["owner"][public]["access"] == "owner"
    assert set(seen["admin"]) >= set(seen["owner"])


def test_bad_shares_and_groups_are_4xx_that_say_what_is_wrong(world) -> None:
    w, shared = world, world.shared["index"]
    grants = f"/api/indexes/{shared}/grants"
    cases = [
        (
            {"subject_type": "user", "username": "nobody_here", "role": "reader"},
            404,
            "user_not_found",
            "username",
        ),
        ({"subject_type": "user", "user_id": 2**62, "role": "reader"}, 404, "user_not_found", "user_id"),
        ({"subject_type": "group", "group_id": 2**62, "role": "reader"}, 404, "group_not_found", "group_id"),
        ({"subject_type": "user", "username": "editor", "role": "owner"}, 400, "invalid", "role"),
        ({"subject_type": "user", "username": "editor", "role": "admin"}, 400, "invalid", "role"),
        ({"subject_type": "robots", "role": "reader"}, 400, "invalid", "subject_type"),
        ({"subject_type": "user", "role": "reader"}, 400, "invalid", "user_id"),
        ({"subject_type": "user", "username": "owner", "role": "reader"}, 409, "grant_to_owner", "user_id"),
        ({"subject_type": "everyone", "username": "x", "role": "reader"}, 400, "invalid", "subject_type"),
        ({"subject_type": "user", "username": "x" * 65, "role": "reader"}, 400, "invalid", "username"),
        ({"subject_type": "user", "user_id": "1", "role": "reader"}, 400, "invalid", "user_id"),
    ]
    for body, status, code, fieldname in cases:
        r = w.call("owner", "POST", grants, json=body)
        assert (r.status_code, r.json()["code"], r.json().get("field")) == (status, code, fieldname), (
            body,
            r.json(),
        )
    # A group the owner is not in is, to them, a group that does not exist.
    r = w.call("owner", "POST", grants, json={"subject_type": "group", "group_id": w.group, "role": "reader"})
    assert (r.status_code, r.json()["code"]) == (404, "group_not_found")
    for raw in (
        b"[1, 2]",
        b"{not json",
        b'{"subject_type": "user", "username": "\\ud800", "role": "reader"}',
    ):
        r = w.client.post(
            grants, content=raw, headers={**w.headers["owner"], "Content-Type": "application/json"}
        )
        assert r.status_code == 400 and "error" in r.json(), raw
    r = w.client.post(
        grants, content=b'{"x": "' + b"a" * (2 * 1024 * 1024) + b'"}', headers=w.headers["owner"]
    )
    assert r.status_code == 413 and r.json()["code"] == "too_large"
    # Nothing half-written: the grants are as the table set them.
    names = sorted(g["subject_name"] for g in w.call("owner", "GET", grants).json())
    assert names == sorted(["editor", "reader_user", "disabled", "spare", w.group_name])

    taken = w.call("admin", "POST", "/api/groups", json={"name": w.group_name.upper()})
    assert (taken.status_code, taken.json()["code"], taken.json()["field"]) == (409, "group_exists", "name")
    for name in ("", "   ", "a" * 65, "tab\there", "semi;colon"):
        r = w.call("admin", "POST", "/api/groups", json={"name": name})
        assert (r.status_code, r.json()["field"]) == (400, "name"), name
    r = w.call("admin", "POST", f"/api/groups/{w.group}/members", json={"username": "nobody_here"})
    assert (r.status_code, r.json()["code"]) == (404, "user_not_found")
    r = w.call("admin", "POST", f"/api/groups/{w.group}/members", json={})
    assert r.status_code == 400
    r = w.call("admin", "DELETE", f"/api/groups/{w.group}/members/{w.ids['owner']}")
    assert (r.status_code, r.json()["code"]) == (404, "member_not_found")

    # Transfers: to someone who already has an index of that name, to nobody, to the owner.
    mine = w.call("spare", "POST", "/api/indexes", json={"name": "clash"}).json()["id"]
    theirs = w.call("owner", "POST", "/api/indexes", json={"name": "clash"}).json()["id"]
    r = w.call("owner", "POST", f"/api/indexes/{theirs}/owner", json={"username": "spare"})
    assert (r.status_code, r.json()["code"]) == (409, "index_exists")
    r = w.call("owner", "POST", f"/api/indexes/{theirs}/owner", json={"username": "owner"})
    assert (r.status_code, r.json()["code"]) == (409, "already_owner")
    r = w.call("owner", "POST", f"/api/indexes/{theirs}/owner", json={"username": "nobody_here"})
    assert (r.status_code, r.json()["code"]) == (404, "user_not_found")
    assert w.call("spare", "GET", f"/api/indexes/{theirs}").status_code == 404
    assert w.call("spare", "GET", f"/api/indexes/{mine}").json()["access"] == "owner"


def test_the_user_administration_answers_an_id_past_the_databases_integers_with_404(world) -> None:
    """A client's id too large for Postgres' integers names no account: a 404 that says so, not a 500."""
    w, huge = world, 2**62
    for method, path, body in (
        ("PATCH", f"/api/users/{huge}", {"disabled": True}),
        ("POST", f"/api/users/{huge}/password", {"new_password": "a-long-new-password"}),
    ):
        r = w.call("admin", method, path, json=body)
        assert (r.status_code, r.json()["code"]) == (404, "user_not_found"), (method, path, r.text)


def test_a_transfer_hands_the_index_over_and_the_audit_log_tells_who_did_what(world) -> None:
    w = world
    index = w.call("owner", "POST", "/api/indexes", json={"name": "to hand over"}).json()["id"]
    r = w.call("owner", "POST", f"/api/indexes/{index}/owner", json={"username": "spare"})
    assert r.status_code == 200 and (r.json()["owner"], r.json()["access"], r.json()["via"]) == (
        "spare",
        "editor",
        "direct",
    )
    assert w.call("spare", "GET", f"/api/indexes/{index}").json()["access"] == "owner"
    # The previous owner is an editor now: no more sharing or deleting.
    assert w.call("owner", "GET", f"/api/indexes/{index}/grants").status_code == 404
    assert (
        w.call("owner", "PATCH", f"/api/indexes/{index}", json={"description": "still mine?"}).status_code
        == 200
    )

    page = w.call(
        "admin", "GET", "/api/audit", params={"object_type": "index", "object_id": str(index)}
    ).json()
    assert [e["action"] for e in page["events"]] == ["index.transfer"]
    [event] = page["events"]
    assert event["actor_name"] == "owner" and event["actor_id"] == w.ids["owner"]
    assert event["detail"]["from"] == "owner" and event["detail"]["to"] == "spare"
    assert event["address"] == "testclient" and event["at"].endswith("Z")

    # Grants, groups, the disabled account: each recorded once, newest first, paged.
    grants = w.call("admin", "GET", "/api/audit", params={"action": "index.grant", "limit": 2}).json()
    assert len(grants["events"]) == 2 and grants["next_before"] == grants["events"][-1]["id"]
    older = w.call(
        "admin",
        "GET",
        "/api/audit",
        params={"action": "index.grant", "limit": 2, "before": grants["next_before"]},
    ).json()
    assert older["events"][0]["id"] < grants["events"][-1]["id"]
    groups = w.call("admin", "GET", "/api/audit", params={"action": "group."}).json()["events"]
    assert {"group.create", "group.member_add"} <= {e["action"] for e in groups}
    mine = w.call("admin", "GET", "/api/audit", params={"actor_id": w.ids["owner"], "limit": 200}).json()[
        "events"
    ]
    assert mine and all(e["actor_id"] == w.ids["owner"] for e in mine)
    created = w.call("admin", "GET", "/api/audit", params={"action": "user.create", "limit": 200}).json()[
        "events"
    ]
    assert {e["detail"]["username"] for e in created} >= set(HUMANS)

    assert w.call("admin", "PUT", "/api/settings", json={"allowed_models": []}).status_code == 200
    settings = w.call("admin", "GET", "/api/audit", params={"action": "settings.update", "limit": 1}).json()
    [changed] = settings["events"]
    assert changed["actor_name"] == "admin" and "allowed_models" in changed["detail"]["fields"]

    for bad in (
        {"limit": "0"},
        {"limit": "201"},
        {"before": "x"},
        {"since": "yesterday"},
        {"action": "a\x00"},
    ):
        r = w.call("admin", "GET", "/api/audit", params=bad)
        assert r.status_code == 400 and r.json()["field"] == next(iter(bad)), bad
    # Append-only: the API has no way to change or remove an event.
    for method in ("PUT", "PATCH", "DELETE", "POST"):
        assert w.call("admin", method, "/api/audit").status_code == 405
        assert w.call("admin", method, f"/api/audit/{event['id']}").status_code in (404, 405)


@pytest.mark.parametrize("database", database_urls(), ids=lambda url: url.split(":", 1)[0].split("+")[0])
def test_a_database_from_before_teams_upgrades_in_place_and_shares_nothing(tmp_path, database) -> None:
    from sqlalchemy import inspect
    from sqlmodel import select

    from gateway.access import readable_indexes
    from gateway.db import MIGRATIONS, SCHEMA_VERSION, Database, Index, IndexGrant, SchemaMigration, User

    with contextlib.ExitStack() as stack:
        url = (
            f"sqlite:///{tmp_path / 'old.db'}"
            if database == "sqlite"
            else stack.enter_context(fresh_database(database))
        )
        db = Database(url)
        stack.callback(db.dispose)
        SchemaMigration.__table__.create(db.engine)
        with db.engine.begin() as conn:
            for version, name, change in MIGRATIONS[:5]:  # the schema as it was before teams
                change(conn)
                conn.execute(SchemaMigration.__table__.insert().values(version=version, name=name))
        with db.session() as s:
            alice, bob = (
                User(username="alice", password_hash="x", is_admin=True),
                User(username="bob", password_hash="x"),
            )
            s.add_all([alice, bob])
            s.flush()
            s.add_all([Index(owner_id=bob.id, name="notes", worker_name="u2_notes_1")])
            s.commit()
        assert not inspect(db.engine).has_table("index_grants")

        assert db.migrate() == SCHEMA_VERSION
        assert db.migrate() == SCHEMA_VERSION  # a second start applies nothing twice
        for name in ("groups", "group_members", "index_grants", "audit_log"):
            assert inspect(db.engine).has_table(name), name
        with db.session() as s:
            assert s.exec(select(IndexGrant)).all() == []
            bob = s.exec(select(User).where(User.username == "bob")).one()
            carol = User(username="carol", password_hash="x")
            s.add(carol)
            s.commit()
            assert [(a.index.name, a.role) for a in readable_indexes(s, bob)] == [("notes", "owner")]
            assert readable_indexes(s, carol) == []


def test_leaving_the_group_or_an_index_made_private_ends_the_access_at_once(world) -> None:
    w = world
    group = make_group(w)  # reader_group and spare are its members
    index = w.call("owner", "POST", "/api/indexes", json={"name": f"private {next(_names)}"}).json()["id"]
    grants = f"/api/indexes/{index}/grants"
    body = {"subject_type": "group", "group_id": group["group"], "role": "editor"}
    assert w.call("admin", "POST", grants, json=body).status_code == 201
    everyone = w.call("owner", "POST", grants, json={"subject_type": "everyone", "role": "reader"}).json()
    chat = w.call("reader_group", "POST", "/api/chats", json={"index_ids": [index]}).json()["id"]
    assert (
        w.call("reader_group", "GET", f"/api/indexes/{index}").json()["access"] == "editor"
    )  # the best grant
    assert w.call("non_member", "GET", f"/api/indexes/{index}").json()["via"] == "everyone"

    r = w.call("admin", "DELETE", f"/api/groups/{group['group']}/members/{w.ids['reader_group']}")
    assert r.status_code == 204
    shown = w.call("reader_group", "GET", f"/api/indexes/{index}").json()
    assert (shown["access"], shown["via"]) == ("reader", "everyone")  # what is left: everyone's reader grant
    assert (
        w.call("reader_group", "PATCH", f"/api/indexes/{index}", json={"description": "x"}).status_code == 404
    )

    assert w.call("owner", "DELETE", f"{grants}/{everyone['id']}").status_code == 204  # made private
    for who in ("reader_group", "non_member"):
        assert w.call(who, "GET", f"/api/indexes/{index}").status_code == 404, who
        assert index not in {i["id"] for i in w.call(who, "GET", "/api/indexes").json()}, who
    assert w.call("reader_group", "GET", f"/api/chats/{chat}").json()["index_ids"] == []
    # The group deleted: its grants go with it; spare, still a member until then, loses the index too.
    assert w.call("spare", "GET", f"/api/indexes/{index}").status_code == 200
    assert w.call("admin", "DELETE", f"/api/groups/{group['group']}").status_code == 204
    assert w.call("spare", "GET", f"/api/indexes/{index}").status_code == 404
    assert [g["subject_type"] for g in w.call("owner", "GET", grants).json()] == []
