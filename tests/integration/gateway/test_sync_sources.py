"""Index sources through the gateway (issue 30): a folder under SYNC_ROOTS and an S3 bucket (moto's standalone
S3 server on loopback, the allowed stand-in) synced as jobs by the real gateway into the real worker; who may
see and change them; bad and hostile source definitions; the schedule.

The worker is the shared one (conftest); this module's gateway has SYNC_ROOTS, SYNC_S3_ENDPOINTS and a short
SYNC_POLL_S of its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import time
import uuid

import httpx
import pytest

from tests.integration.gateway.helpers import register
from tests.integration.ops.postgres import database_urls, fresh_database
from tests.servers import gateway_process


@pytest.fixture(scope="module")
def s3():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    root = tmp_path_factory.mktemp("sync-roots")
    (root / "allowed").mkdir()
    return root


@pytest.fixture(scope="module", params=database_urls(), ids=lambda url: url.split(":", 1)[0].split("+")[0])
def stack(request, stack_worker, ollama_server, s3, roots):
    worker, tmp = stack_worker
    env = {
        "SSE_KEEPALIVE_S": "5",
        "OLLAMA_HOST": ollama_server.url,
        "SYNC_ROOTS": str(roots / "allowed"),
        "SYNC_S3_ENDPOINTS": s3,
        "SYNC_POLL_S": "0.5",
    }
    with contextlib.ExitStack() as stack:
        if request.param != "sqlite":
            env["DATABASE_URL"] = stack.enter_context(fresh_database(request.param))
        gateway = stack.enter_context(gateway_process(tmp, worker_url=worker.url, env=env))
        yield worker, gateway


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def note(topic: str) -> bytes:
    return f"# {topic}\n\nThis note is about {topic}; {topic} is written down here.\n".encode()


@pytest.fixture(scope="module")
def owner(api):
    return register(api, f"src-owner-{uuid.uuid4().hex[:6]}")


@pytest.fixture(scope="module")
def stranger(api):
    return register(api, f"src-stranger-{uuid.uuid4().hex[:6]}")


def new_index(api, user) -> dict:
    r = api.post("/api/indexes", json={"name": f"src-{uuid.uuid4().hex[:8]}"}, headers=user)
    assert r.status_code == 201, r.text
    return r.json()


def documents(api, user, index_id) -> dict[tuple[str, str], dict]:
    data = api.get(f"/api/indexes/{index_id}", headers=user).json()
    return {(d["dataset"], d["filename"]): d for d in data["documents"]}


def finished(api, user, job_id: int, timeout: float = 240.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = api.get(f"/api/jobs/{job_id}", headers=user).json()
        if job["state"] in ("done", "failed", "cancelled"):
            return job
        time.sleep(0.25)
    raise AssertionError(f"job {job_id} did not finish: {job}")


def sync_now(api, user, index_id, source_id) -> dict:
    r = api.post(f"/api/indexes/{index_id}/sources/{source_id}/sync", headers=user)
    assert r.status_code in (200, 202), r.text
    return finished(api, user, r.json()["id"])


def hand_upload(api, user, index_id, name: str, content: bytes) -> None:
    r = api.post(
        f"/api/indexes/{index_id}/documents",
        params={"wait": "1"},
        headers=user,
        files={"file": (name, content, "text/markdown")},
    )
    assert r.status_code == 201, r.text


def actions(job: dict) -> set[tuple[str, str]]:
    """(file name, stage) of each file of a job: an indexed file ends `done`, a removed one `removed`."""
    return {(f["filename"], f["stage"]) for f in job["files"]}


def test_folder_source_add_change_delete_between_two_runs(api, owner, roots):
    folder = roots / "allowed" / f"team-{uuid.uuid4().hex[:6]}"
    (folder / "specs").mkdir(parents=True)
    (folder / "alpha.md").write_bytes(note("alpha"))
    (folder / "beta.md").write_bytes(note("beta"))
    (folder / "specs" / "gamma.md").write_bytes(note("gamma"))
    index = new_index(api, owner)
    hand_upload(api, owner, index["id"], "manual.md", note("manual"))
    r = api.post(
        f"/api/indexes/{index['id']}/sources", json={"kind": "folder", "path": str(folder)}, headers=owner
    )
    assert r.status_code == 201, r.text
    source = r.json()

    first = sync_now(api, owner, index["id"], source["id"])
    assert first["state"] == "done", first
    assert {f["filename"] for f in first["files"]} == {"alpha.md", "beta.md", "gamma.md"}
    before = documents(api, owner, index["id"])
    assert set(before) == {
        ("default", "alpha.md"),
        ("default", "beta.md"),
        ("specs", "gamma.md"),
        ("default", "manual.md"),
    }

    (folder / "alpha.md").write_bytes(note("alpha revised"))
    (folder / "beta.md").unlink()
    (folder / "specs" / "delta.md").write_bytes(note("delta"))
    second = sync_now(api, owner, index["id"], source["id"])
    assert second["state"] == "done", (second.get("error"), second.get("code"), second["files"])
    summary = api.get(f"/api/indexes/{index['id']}/sources/{source['id']}", headers=owner).json()[
        "last_summary"
    ]
    assert {k: summary[k] for k in ("added", "changed", "removed", "unchanged", "failed")} == {
        "added": 1,
        "changed": 1,
        "removed": 1,
        "unchanged": 1,
        "failed": 0,
    }
    assert {f["filename"] for f in second["files"]} == {"alpha.md", "beta.md", "delta.md"}
    assert actions(second) == {("alpha.md", "done"), ("beta.md", "removed"), ("delta.md", "done")}
    after = documents(api, owner, index["id"])
    assert set(after) == {
        ("default", "alpha.md"),
        ("specs", "gamma.md"),
        ("specs", "delta.md"),
        ("default", "manual.md"),
    }
    assert after[("default", "alpha.md")]["document_id"] == sha(note("alpha revised"))
    assert after[("default", "manual.md")]["document_id"] == sha(note("manual"))  # uploaded by hand: kept
    assert after[("specs", "gamma.md")]["id"] == before[("specs", "gamma.md")]["id"]  # not re-indexed

    third = sync_now(api, owner, index["id"], source["id"])
    assert third["state"] == "done" and third["files"] == []  # nothing changed: nothing to do

    # Deleting the index takes its sources and their records with it (the folder is left as it is).
    assert api.delete(f"/api/indexes/{index['id']}", headers=owner).status_code == 204
    assert api.get(f"/api/indexes/{index['id']}/sources/{source['id']}", headers=owner).status_code == 404
    assert (folder / "alpha.md").read_bytes() == note("alpha revised")


def refused_adds(worker) -> float:
    """How many /add_document requests the worker has answered 415 (its own metrics)."""
    text = httpx.get(f"{worker.url}/metrics", timeout=30).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("rag_worker_http_requests_total{")
        and "add_document" in line
        and 'status="415"' in line
    )


def test_a_file_the_worker_refused_is_not_sent_again_until_it_changes(api, owner, roots, stack):
    worker, _ = stack
    folder = roots / "allowed" / f"refused-{uuid.uuid4().hex[:6]}"
    folder.mkdir()
    (folder / "tool.exe").write_bytes(b"MZ\x90\x00 not a document")
    (folder / "fine.md").write_bytes(note("fine"))
    index = new_index(api, owner)
    r = api.post(
        f"/api/indexes/{index['id']}/sources", json={"kind": "folder", "path": str(folder)}, headers=owner
    )
    assert r.status_code == 201, r.text
    source = r.json()
    summary_url = f"/api/indexes/{index['id']}/sources/{source['id']}"

    refused = refused_adds(worker)
    first = sync_now(api, owner, index["id"], source["id"])
    assert first["state"] == "done", first
    [exe] = [f for f in first["files"] if f["filename"] == "tool.exe"]
    assert exe["state"] == "failed" and exe["code"] == "unsupported_type" and exe["attempts"] == 1, exe
    assert refused_adds(worker) == refused + 1

    second = sync_now(api, owner, index["id"], source["id"])
    assert second["state"] == "done", (second.get("error"), second.get("code"), second["files"])
    [again] = second["files"]  # fine.md unchanged (counted), tool.exe failing still
    assert (again["filename"], again["state"], again["code"], again["error"]) == (
        "tool.exe",
        "failed",
        "unsupported_type",
        exe["error"],
    )
    assert again["stage"] == "unchanged" and again["attempts"] == 0, again
    assert refused_adds(worker) == refused + 1  # not sent to the worker again
    summary = api.get(summary_url, headers=owner).json()["last_summary"]
    assert (summary["unchanged"], summary["failed"], summary["failed_unchanged"]) == (1, 1, 1), summary
    assert set(documents(api, owner, index["id"])) == {("default", "fine.md")}

    (folder / "tool.exe").write_bytes(b"MZ\x90\x00 a new build, still not a document")
    third = sync_now(api, owner, index["id"], source["id"])
    [retried] = third["files"]
    assert retried["filename"] == "tool.exe" and retried["attempts"] == 1 and retried["stage"] != "unchanged"
    assert refused_adds(worker) == refused + 2  # changed: tried again
    assert api.get(summary_url, headers=owner).json()["last_summary"]["failed_unchanged"] == 0


def test_s3_source_with_write_only_credentials(api, owner, s3):
    import boto3

    client = boto3.client(
        "s3", endpoint_url=s3, region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s"
    )
    bucket = f"team-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    client.put_object(Bucket=bucket, Key="docs/alpha.md", Body=note("alpha"))
    client.put_object(Bucket=bucket, Key="docs/beta.md", Body=note("beta"))
    client.put_object(Bucket=bucket, Key="elsewhere/outside.md", Body=note("outside"))
    index = new_index(api, owner)
    hand_upload(api, owner, index["id"], "manual.md", note("manual"))
    secret = f"secret-{uuid.uuid4().hex}"
    body = {
        "kind": "s3",
        "bucket": bucket,
        "prefix": "docs/",
        "endpoint": s3,
        "access_key": "AKIAEXAMPLEKEY",
        "secret_key": secret,
    }
    r = api.post(f"/api/indexes/{index['id']}/sources", json=body, headers=owner)
    assert r.status_code == 201, r.text
    source = r.json()
    assert source["has_credentials"] is True
    for answer in (
        r.text,
        api.get(f"/api/indexes/{index['id']}/sources", headers=owner).text,
        api.get(f"/api/indexes/{index['id']}/sources/{source['id']}", headers=owner).text,
    ):
        assert secret not in answer and "AKIAEXAMPLEKEY" not in answer

    assert sync_now(api, owner, index["id"], source["id"])["state"] == "done"
    client.put_object(Bucket=bucket, Key="docs/alpha.md", Body=note("alpha revised"))
    client.delete_object(Bucket=bucket, Key="docs/beta.md")
    client.put_object(Bucket=bucket, Key="docs/gamma.md", Body=note("gamma"))
    second = sync_now(api, owner, index["id"], source["id"])
    assert second["state"] == "done", (second.get("error"), second.get("code"), second["files"])
    docs = documents(api, owner, index["id"])
    assert set(docs) == {("default", "alpha.md"), ("default", "gamma.md"), ("default", "manual.md")}
    assert docs[("default", "alpha.md")]["document_id"] == sha(note("alpha revised"))

    # A bucket that refuses (here: one that does not exist): the job fails saying so, nothing is removed.
    r = api.patch(
        f"/api/indexes/{index['id']}/sources/{source['id']}",
        json={"bucket": "no-such-bucket-x"},
        headers=owner,
    )
    assert r.status_code == 200, r.text
    refused = sync_now(api, owner, index["id"], source["id"])
    assert refused["state"] == "failed" and refused["code"] == "source_unreachable", refused
    assert "NoSuchBucket" in refused["error"]
    assert set(documents(api, owner, index["id"])) == set(docs)


def test_a_scheduled_source_is_synced_once_per_period(api, owner, roots):
    folder = roots / "allowed" / f"sched-{uuid.uuid4().hex[:6]}"
    folder.mkdir()
    (folder / "scheduled.md").write_bytes(note("schedule"))
    index = new_index(api, owner)
    r = api.post(
        f"/api/indexes/{index['id']}/sources",
        json={"kind": "folder", "path": str(folder), "every": 60},
        headers=owner,
    )
    assert r.status_code == 201, r.text
    source_id = r.json()["id"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and ("default", "scheduled.md") not in documents(
        api, owner, index["id"]
    ):
        time.sleep(0.5)
    assert ("default", "scheduled.md") in documents(api, owner, index["id"])
    time.sleep(2)  # several polls later: still the one run (the next is due in an hour)
    jobs = api.get("/api/jobs", params={"index": index["id"]}, headers=owner).json()["jobs"]
    assert [j["kind"] for j in jobs] == ["sync"]
    source = api.get(f"/api/indexes/{index['id']}/sources/{source_id}", headers=owner).json()
    assert source["last_job_id"] == jobs[0]["id"] and source["next_run_at"] is not None


def test_sources_of_an_index_are_404_to_others_and_read_only_to_readers(api, owner, stranger, roots):
    folder = roots / "allowed" / f"iso-{uuid.uuid4().hex[:6]}"
    folder.mkdir()
    index = new_index(api, owner)
    r = api.post(
        f"/api/indexes/{index['id']}/sources", json={"kind": "folder", "path": str(folder)}, headers=owner
    )
    source = r.json()
    base = f"/api/indexes/{index['id']}/sources"
    one = f"{base}/{source['id']}"
    for method, path, body in (
        ("GET", base, None),
        ("POST", base, {"kind": "folder", "path": str(folder)}),
        ("GET", one, None),
        ("PATCH", one, {"every": 5}),
        ("DELETE", one, None),
        ("POST", one + "/sync", None),
    ):
        r = api.request(method, path, json=body, headers=stranger)
        assert r.status_code == 404, (method, path, r.text)
        assert str(folder) not in r.text

    # A reader sees the sources but cannot change or sync them (404, as for a stranger).
    stranger_name = api.get("/api/auth/me", headers=stranger).json()["username"]
    r = api.post(
        f"/api/indexes/{index['id']}/grants",
        json={"subject_type": "user", "username": stranger_name, "role": "reader"},
        headers=owner,
    )
    assert r.status_code in (200, 201), r.text
    assert api.get(one, headers=stranger).status_code == 200
    assert [s["id"] for s in api.get(base, headers=stranger).json()] == [source["id"]]
    for method, path, body in (
        ("POST", base, {"kind": "folder", "path": str(folder)}),
        ("PATCH", one, {"every": 5}),
        ("DELETE", one, None),
        ("POST", one + "/sync", None),
    ):
        assert api.request(method, path, json=body, headers=stranger).status_code == 404, (method, path)
    # A source of another index under this index's path is a 404 too.
    other = new_index(api, owner)
    assert api.get(f"/api/indexes/{other['id']}/sources/{source['id']}", headers=owner).status_code == 404
    assert api.get(f"{base}/{2**63}", headers=owner).status_code == 404
    assert api.get(f"{base}/{2**70}", headers=owner).status_code == 404
    assert api.get(one, headers=owner).json()["every"] is None  # nothing above changed it
    assert api.delete(one, headers=owner).status_code == 204  # the owner may; then it is gone for everyone
    assert api.get(one, headers=owner).status_code == 404
    assert api.get(base, headers=stranger).json() == []


def test_bad_and_hostile_source_definitions_are_4xx_json_and_write_nothing(api, owner, roots, s3):
    index = new_index(api, owner)
    base = f"/api/indexes/{index['id']}/sources"
    escape = roots / "allowed" / "escape"
    if not escape.is_symlink():  # the roots are the module's: made by the first database's run
        escape.symlink_to(roots)
    cases = [
        ({"kind": "folder", "path": str(roots)}, "outside_roots"),
        ({"kind": "folder", "path": str(roots / "allowed" / ".." / "..")}, "outside_roots"),
        ({"kind": "folder", "path": str(roots / "allowed" / "escape")}, "outside_roots"),
        ({"kind": "folder", "path": "/etc"}, "outside_roots"),
        ({"kind": "folder", "path": "relative/folder"}, "outside_roots"),
        ({"kind": "folder", "path": str(roots / "allowed") + "\x00/x"}, None),
        ({"kind": "folder"}, "invalid"),
        ({"kind": "folder", "path": str(roots / "allowed"), "bucket": "abc"}, "invalid"),
        ({"kind": "s3"}, "invalid"),
        ({"kind": "s3", "bucket": "Not_A_Bucket"}, None),
        ({"kind": "s3", "bucket": "abc", "endpoint": "http://169.254.169.254"}, "endpoint_not_allowed"),
        ({"kind": "s3", "bucket": "abc", "endpoint": s3, "access_key": "k"}, "invalid"),
        ({"kind": "s3", "bucket": "abc", "prefix": "../../etc"}, None),
        ({"kind": "s3", "bucket": "abc", "every": 0}, None),
        ({"kind": "s3", "bucket": "abc", "every": "5"}, None),
        ({"kind": "ftp", "path": "/"}, None),
        ({"kind": "folder", "path": "x" * 5000}, None),
        ({"kind": "s3", "bucket": "abc", "secret_key": "\ud800"}, None),
    ]
    for body, code in cases:
        if body.get("secret_key") == "\ud800":  # a lone surrogate: sent as the JSON escape a client can send
            raw = b'{"kind": "s3", "bucket": "abc", "access_key": "k", "secret_key": "\\ud800"}'
            r = api.post(base, content=raw, headers={**owner, "Content-Type": "application/json"})
        else:
            r = api.post(base, json=body, headers=owner)
        assert 400 <= r.status_code < 500, (body, r.status_code, r.text)
        error = r.json()
        assert error.get("error"), (body, error)
        if code:
            assert error.get("code") == code, (body, error)
    for raw in (b"not json", b"[1, 2]", b'{"kind": "folder", "path": ' + b'"a' * 600_000 + b'"}'):
        r = api.post(base, content=raw, headers={**owner, "Content-Type": "application/json"})
        assert r.status_code in (400, 413), (raw[:40], r.status_code)
        assert r.json().get("error")
    assert api.get(base, headers=owner).json() == []  # nothing was written

    good = api.post(base, json={"kind": "folder", "path": str(roots / "allowed")}, headers=owner).json()
    r = api.patch(f"{base}/{good['id']}", json={"path": "/etc"}, headers=owner)
    assert r.status_code == 400 and r.json()["code"] == "outside_roots"
    r = api.patch(f"{base}/{good['id']}", json={"every": -1}, headers=owner)
    assert r.status_code == 400
    assert api.get(f"{base}/{good['id']}", headers=owner).json()["path"] == str(roots / "allowed")


@pytest.mark.skipif(not os.path.exists("/usr/bin/tesseract"), reason="tesseract is not installed")
def test_a_gateway_killed_mid_sync_finishes_it_after_restart_with_no_file_indexed_twice(
    stack, roots, tmp_path, ollama_server
):
    from tests.integration.gateway.test_jobs import scanned_pdf, table_of, worker_documents

    worker, _shared = stack
    folder = roots / "allowed" / f"crash-{uuid.uuid4().hex[:6]}"
    folder.mkdir()
    notes = {f"a-note-{n}.md": note(f"crash note {n}") for n in range(3)}  # listed first: in before the kill
    for name, content in notes.items():
        (folder / name).write_bytes(content)
    scanned_pdf(folder / "z-ledger.pdf", 2)  # listed last: being converted when the gateway dies
    env = {
        "JOB_STALE_S": "2",
        "JOB_HEARTBEAT_S": "0.5",
        "OLLAMA_HOST": ollama_server.url,
        "SYNC_ROOTS": str(roots / "allowed"),
    }
    own = tmp_path / "gw"
    (own / "index_store").mkdir(parents=True)
    proc = gateway_process(own, worker_url=worker.url, env=env)
    port = proc.port
    proc.start()
    try:
        with httpx.Client(base_url=proc.url, timeout=120) as api:
            user = register(api, "sync-crash-owner")
            index = new_index(api, user)
            source = api.post(
                f"/api/indexes/{index['id']}/sources",
                json={"kind": "folder", "path": str(folder)},
                headers=user,
            ).json()
            job = api.post(f"/api/indexes/{index['id']}/sources/{source['id']}/sync", headers=user).json()
            deadline = time.monotonic() + 120
            stage = None
            while time.monotonic() < deadline:
                files = api.get(f"/api/jobs/{job['id']}", headers=user).json()["files"]
                ledger = [f for f in files if f["filename"] == "z-ledger.pdf"]
                stage = ledger[0]["stage"] if ledger else None
                if stage in ("converting", "ocr"):
                    break
                time.sleep(0.1)
            assert stage in ("converting", "ocr"), files
        os.killpg(proc.proc.pid, signal.SIGKILL)
        proc.proc.wait(timeout=10)

        proc = gateway_process(own, worker_url=worker.url, env=env, port=port)
        proc.start()
        with httpx.Client(base_url=proc.url, timeout=120) as api:
            end = finished(api, user, job["id"], timeout=300)
            assert end["state"] == "done" and end["attempts"] >= 2, end
            docs = documents(api, user, index["id"])
            assert sorted(name for _ds, name in docs) == sorted([*notes, "z-ledger.pdf"])
            # The notes were in before the crash: the run after it found them unchanged, sent nothing again.
            assert [
                f["filename"] for f in end["files"] if f["state"] == "done" and f["stage"] == "done"
            ].count("a-note-0.md") == 1
        table = table_of(own / "index_store" / "gateway.db", index["id"])
        listed = worker_documents(worker, table)
        assert sorted(d["filename"] for d in listed) == sorted([*notes, "z-ledger.pdf"])  # each once
        by_name = {d["filename"]: d for d in listed}
        for name, content in notes.items():
            assert by_name[name]["document_id"] == sha(content)
            assert docs[("default", name)]["chunks"] == by_name[name]["chunks"]
    finally:
        proc.stop()
