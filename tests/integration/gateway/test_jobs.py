"""Uploads as background jobs (issue 30): the answer is a job id at once, the file is indexed whatever the client
does next, any tab (or replica) follows it, a job outlives a gateway killed with SIGKILL, and a job is visible
to exactly those who may read its index.

The module's worker and gateway are the shared ones (conftest); the crash test runs a gateway of its own (it is
killed) in front of the same worker.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import sqlite3
import stat
import time
import uuid

import httpx
import psutil
import pytest

from tests.integration.gateway.helpers import DUCK, events, register
from tests.ollama_server import OLLAMA_ENV
from tests.servers import gateway_process, worker_process


def new_index(api, user, name=None) -> dict:
    r = api.post("/api/indexes", json={"name": name or f"jobs-{uuid.uuid4().hex[:8]}"}, headers=user)
    assert r.status_code == 201, r.text
    return r.json()


def upload(api, user, index_id, name: str, content: bytes, dataset="default", **params) -> httpx.Response:
    return api.post(
        f"/api/indexes/{index_id}/documents",
        params=params,
        headers=user,
        data={"dataset": dataset},
        files={"file": (name, content, "text/markdown")},
    )


def finished(api, user, job_id: int, timeout: float = 240.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = api.get(f"/api/jobs/{job_id}", headers=user)
        assert r.status_code == 200, r.text
        job = r.json()
        if job["state"] in ("done", "failed", "cancelled"):
            return job
        time.sleep(0.25)
    raise AssertionError(f"job {job_id} did not finish in {timeout} s: {job}")


def documents(api, user, index_id) -> dict[tuple[str, str], dict]:
    data = api.get(f"/api/indexes/{index_id}", headers=user).json()
    return {(d["dataset"], d["filename"]): d for d in data["documents"]}


def worker_documents(worker, table: str) -> list[dict]:
    r = httpx.get(worker.url + "/get_documents", params={"index": table}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def table_of(db_path, index_id: int) -> str:
    """The worker's table of an index (the gateway keeps it to itself), read from the gateway's SQLite file."""
    with contextlib.closing(sqlite3.connect(db_path)) as db:
        return db.execute("SELECT worker_name FROM indexes WHERE id = ?", (index_id,)).fetchone()[0]


def note(text: str) -> bytes:
    return f"# {text}\n\nThe {text} is written down here so that it can be found.\n".encode()


@pytest.fixture(scope="module")
def owner(api):
    return register(api, f"jobs-owner-{uuid.uuid4().hex[:6]}")


@pytest.fixture(scope="module")
def stranger(api):
    return register(api, f"jobs-stranger-{uuid.uuid4().hex[:6]}")


def test_an_upload_answers_202_with_its_job_and_is_indexed_in_the_background(api, owner):
    index = new_index(api, owner)
    r = upload(api, owner, index["id"], "duck.md", DUCK.read_bytes(), dataset="birds")
    assert r.status_code == 202, r.text
    job = r.json()
    assert r.headers["location"] == f"/api/jobs/{job['id']}"
    assert job["kind"] == "upload" and job["index_id"] == index["id"]
    assert job["state"] in ("queued", "running", "done")
    assert [(f["dataset"], f["filename"]) for f in job["files"]] == [("birds", "duck.md")]

    end = finished(api, owner, job["id"])
    assert end["state"] == "done", end
    assert (end["done"], end["failed"], end["total"]) == (1, 0, 1)
    (file,) = end["files"]
    assert file["state"] == "done" and file["chunks"] > 0
    assert file["document_id"] == hashlib.sha256(DUCK.read_bytes()).hexdigest()
    doc = documents(api, owner, index["id"])[("birds", "duck.md")]
    assert (doc["document_id"], doc["chunks"]) == (file["document_id"], file["chunks"])

    listed = api.get("/api/jobs", params={"index": index["id"]}, headers=owner).json()["jobs"]
    assert [j["id"] for j in listed] == [job["id"]] and listed[0]["state"] == "done"


def test_a_client_that_closes_right_after_sending_the_upload_still_gets_it_indexed(api, gateway, owner):
    """The issue's bug: the whole request sent, then the client's side shut and the socket closed at once."""
    index = new_index(api, owner)
    content = note("heron ledger")
    boundary = uuid.uuid4().hex
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="heron.md"\r\n'
            "Content-Type: text/markdown\r\n\r\n"
        ).encode()
        + content
        + f"\r\n--{boundary}--\r\n".encode()
    )
    head = (
        f"POST /api/indexes/{index['id']}/documents HTTP/1.1\r\nHost: 127.0.0.1:{gateway.port}\r\n"
        f"Authorization: {owner['Authorization']}\r\n"
        f"Content-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
        sock.sendall(head + body)
        sock.shutdown(socket.SHUT_WR)  # nothing more to send; and the client goes without reading

    deadline = time.monotonic() + 60
    jobs = []
    while time.monotonic() < deadline and not jobs:
        jobs = api.get("/api/jobs", params={"index": index["id"]}, headers=owner).json()["jobs"]
        time.sleep(0.2)
    assert len(jobs) == 1, "the gateway dropped the upload its client had sent whole"
    end = finished(api, owner, jobs[0]["id"])
    assert end["state"] == "done", end
    assert documents(api, owner, index["id"])[("default", "heron.md")]["chunks"] > 0


def test_the_events_stream_follows_the_job_to_its_end_from_another_tab(api, owner):
    index = new_index(api, owner)
    job = upload(api, owner, index["id"], "kettle.md", note("kettle")).json()
    with api.stream("GET", f"/api/jobs/{job['id']}/events", headers=owner) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        seen = [(e, d) for e, d in events(resp.iter_lines()) if e != ":"]
    assert seen[0][0] == "job" and seen[-1][0] == "job"
    assert seen[-1][1]["state"] == "done" and seen[-1][1]["files"][0]["chunks"] > 0
    stages = [d["stage"] for e, d in seen if e == "progress"]
    assert stages and stages[-1] in ("writing", "indexed"), stages
    assert all(d["filename"] == "kettle.md" for e, d in seen if e == "progress")


def test_wait_and_event_stream_keep_the_synchronous_answers_of_before(api, owner):
    index = new_index(api, owner)
    r = upload(api, owner, index["id"], "owl.md", note("owl"), wait="1")
    assert r.status_code == 201, r.text
    assert r.json()["filename"] == "owl.md" and r.json()["chunks"] > 0 and r.json()["replaced"] is False
    refused = upload(api, owner, index["id"], "blob.exe", b"MZ\x90\x00 not a document", wait="1")
    assert 400 <= refused.status_code < 500, refused.text
    assert refused.json()["error"] and refused.json()["code"]
    # The refusal is the job's failure, with the worker's words.
    failed = api.get("/api/jobs", params={"index": index["id"], "state": "failed"}, headers=owner).json()
    assert len(failed["jobs"]) == 1 and "files" not in failed["jobs"][0]  # a list leaves the files out
    assert failed["jobs"][0]["error"] == refused.json()["error"]


def test_a_queued_job_is_cancelled_at_once_and_its_file_never_indexed(api, owner):
    index = new_index(api, owner)
    # One index runs one job at a time: the second waits behind the first.
    first = upload(api, owner, index["id"], "first.md", note("first"))
    second = upload(api, owner, index["id"], "second.md", note("second"))
    assert first.status_code == second.status_code == 202
    r = api.post(f"/api/jobs/{second.json()['id']}/cancel", headers=owner)
    assert r.status_code == 200, r.text
    if r.json()["state"] == "cancelled":  # it was still queued (the usual case)
        assert r.json()["files"][0]["state"] == "cancelled"
    assert finished(api, owner, first.json()["id"])["state"] == "done"
    end = finished(api, owner, second.json()["id"])
    names = {name for _ds, name in documents(api, owner, index["id"])}
    assert ("second.md" in names) == (end["state"] == "done")
    assert "first.md" in names


def test_another_users_job_is_a_404_on_every_job_route(api, owner, stranger):
    index = new_index(api, owner)
    job = upload(api, owner, index["id"], "secret.md", note("secret")).json()
    for method, path in [
        ("GET", f"/api/jobs/{job['id']}"),
        ("GET", f"/api/jobs/{job['id']}/events"),
        ("POST", f"/api/jobs/{job['id']}/cancel"),
    ]:
        r = api.request(method, path, headers=stranger)
        assert r.status_code == 404, (path, r.text)
        assert r.json()["code"] == "job_not_found" and "secret" not in r.text
    r = api.get("/api/jobs", params={"index": index["id"]}, headers=stranger)
    assert r.status_code == 404 and "secret" not in r.text
    assert job["id"] not in [j["id"] for j in api.get("/api/jobs", headers=stranger).json()["jobs"]]
    with httpx.Client(base_url=str(api.base_url)) as signed_out:  # no session cookie, no token
        assert signed_out.get(f"/api/jobs/{job['id']}").status_code == 401
    assert finished(api, owner, job["id"])["state"] == "done"  # the stranger's cancel did nothing


def test_deleting_an_index_deletes_its_jobs(api, owner):
    index = new_index(api, owner)
    job = upload(api, owner, index["id"], "gone.md", note("gone")).json()
    assert finished(api, owner, job["id"])["state"] == "done"
    assert api.delete(f"/api/indexes/{index['id']}", headers=owner).status_code == 204
    assert api.get(f"/api/jobs/{job['id']}", headers=owner).status_code == 404
    assert job["id"] not in [j["id"] for j in api.get("/api/jobs", headers=owner).json()["jobs"]]


@pytest.mark.parametrize(
    "query, field",
    [
        ({"index": "abc"}, "index"),
        ({"index": "0"}, "index"),
        ({"index": "9" * 40}, "index"),
        ({"limit": "0"}, "limit"),
        ({"limit": "100000"}, "limit"),
        ({"state": "exploded"}, "state"),
        ({"state": "done\x00"}, "state"),
    ],
)
def test_bad_job_list_queries_are_400s_that_name_the_field(api, owner, query, field):
    r = api.get("/api/jobs", params=query, headers=owner)
    assert r.status_code == 400, r.text
    assert r.json()["field"] == field and r.json()["error"]


def test_ids_that_name_no_job_are_404_json(api, owner):
    for job_id in ("999999", str(2**31), str(2**63 - 1), "9" * 30):
        for method, suffix in (("GET", ""), ("GET", "/events"), ("POST", "/cancel")):
            r = api.request(method, f"/api/jobs/{job_id}{suffix}", headers=owner)
            assert r.status_code == 404, (job_id, suffix, r.text)
            assert r.json()["error"]
    r = api.post("/api/jobs/999999/cancel", headers=owner, content=b"\xff" * 1000)  # a body is ignored
    assert r.status_code == 404


def test_refused_uploads_store_nothing_and_queue_no_job(api, owner, gateway):
    index = new_index(api, owner)
    assert upload(api, owner, index["id"], "empty.md", b"").status_code == 400
    too_big = upload(api, owner, index["id"], "big.md", b"x" * (256 * 1024 + 1))
    assert too_big.status_code == 413 and too_big.json()["field"] == "file"
    assert upload(api, owner, index["id"], "../escape.md", note("escape")).status_code == 400
    bad_wait = upload(api, owner, index["id"], "fine.md", note("fine"), wait="soon")
    assert bad_wait.status_code == 400 and bad_wait.json()["field"] == "wait"
    assert api.get("/api/jobs", params={"index": index["id"]}, headers=owner).json()["jobs"] == []


# --- a gateway killed mid-job -----------------------------------------------------------------------------------


def scanned_pdf(path, pages: int):
    from tests.unit.test_ocr import text_image

    images = [text_image(f"Page {n} of the heron ledger holds entry {n * 7}.") for n in range(1, pages + 1)]
    images[0].save(path, "PDF", save_all=True, append_images=images[1:], resolution=200)
    return path


@pytest.mark.skipif(not os.path.exists("/usr/bin/tesseract"), reason="tesseract is not installed")
def test_a_gateway_killed_mid_job_finishes_it_after_restart_with_no_file_indexed_twice(
    stack, tmp_path, ollama_server
):
    worker, _shared_gateway = stack
    env = {
        "JOB_STALE_S": "2",
        "JOB_HEARTBEAT_S": "0.5",
        "OLLAMA_HOST": ollama_server.url,
        "MAX_UPLOADS_PER_USER": "10",
    }
    own = tmp_path / "gw"
    (own / "index_store").mkdir(parents=True)
    scan = scanned_pdf(tmp_path / "ledger.pdf", 4)
    notes = {f"note-{n}.md": note(f"crash note {n}") for n in range(3)}
    port = None
    proc = gateway_process(own, worker_url=worker.url, env=env)
    port = proc.port
    proc.start()
    try:
        with httpx.Client(base_url=proc.url, timeout=120) as api:
            user = register(api, "crash-owner")
            index = new_index(api, user, "crash")
            jobs = [upload(api, user, index["id"], "ledger.pdf", scan.read_bytes()).json()]
            jobs += [upload(api, user, index["id"], n, c).json() for n, c in notes.items()]
            # Wait until the scan is being converted, then kill the gateway without a chance to clean up.
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                stage = api.get(f"/api/jobs/{jobs[0]['id']}", headers=user).json()["files"][0]["stage"]
                if stage in ("converting", "ocr"):
                    break
                time.sleep(0.1)
            assert stage in ("converting", "ocr"), stage
        os.killpg(proc.proc.pid, signal.SIGKILL)
        proc.proc.wait(timeout=10)

        proc = gateway_process(own, worker_url=worker.url, env=env, port=port)
        proc.start()
        with httpx.Client(base_url=proc.url, timeout=120) as api:
            user = {"Authorization": user["Authorization"]}
            ends = [finished(api, user, j["id"], timeout=300) for j in jobs]
            assert [e["state"] for e in ends] == ["done"] * 4, ends
            assert ends[0]["attempts"] >= 2  # the scan's job was taken up again after the crash
            docs = documents(api, user, index["id"])
            assert sorted(name for _ds, name in docs) == sorted(["ledger.pdf", *notes])
        # On the worker: each file once, with the document id of its bytes and the chunks the gateway records.
        table = table_of(own / "index_store" / "gateway.db", index["id"])
        if table:
            listed = worker_documents(worker, table)
            assert sorted(d["filename"] for d in listed) == sorted(["ledger.pdf", *notes])
            by_name = {d["filename"]: d for d in listed}
            for (_ds, name), doc in docs.items():
                assert by_name[name]["document_id"] == doc["document_id"]
                assert by_name[name]["chunks"] == doc["chunks"]
        expected = {"ledger.pdf": hashlib.sha256(scan.read_bytes()).hexdigest()}
        expected |= {n: hashlib.sha256(c).hexdigest() for n, c in notes.items()}
        assert {name: d["document_id"] for (_ds, name), d in docs.items()} == expected
        # The stored uploads are gone once their jobs ended, and none was ever readable by others.
        stored = own / "index_store" / "jobs"
        assert not stored.exists() or not any(p.is_file() for p in stored.rglob("*"))
        if stored.exists():
            assert stat.S_IMODE(stored.stat().st_mode) == 0o700
    finally:
        proc.stop()


# --- cancel, and a worker killed mid-file -----------------------------------------------------------------------


@pytest.mark.skipif(not os.path.exists("/usr/bin/tesseract"), reason="tesseract is not installed")
def test_cancelling_a_running_upload_ends_its_conversion_and_records_nothing(stack, api, owner, tmp_path):
    from tests.integration.ingest.test_hostile_files import conversion_job

    worker, _gateway = stack
    index = new_index(api, owner)
    scan = scanned_pdf(tmp_path / "long.pdf", 8)
    job = upload(api, owner, index["id"], "long.pdf", scan.read_bytes()).json()
    child = conversion_job(worker, timeout=120)  # the worker's conversion of it, in a child process
    r = api.post(f"/api/jobs/{job['id']}/cancel", headers=owner)
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "cancelled", r.json()
    assert r.json()["files"][0]["state"] == "cancelled"
    child.wait(timeout=30)  # the conversion ended with the job
    assert not child.is_running()
    assert documents(api, owner, index["id"]) == {}
    assert api.get(f"/api/indexes/{index['id']}", headers=owner).json()["document_count"] == 0
    again = api.post(
        f"/api/jobs/{job['id']}/cancel", headers=owner
    )  # cancelling an ended job changes nothing
    assert again.status_code == 200 and again.json()["state"] == "cancelled"


@pytest.mark.skipif(not os.path.exists("/usr/bin/tesseract"), reason="tesseract is not installed")
def test_a_worker_killed_mid_file_is_retried_and_a_dead_one_fails_the_file_after_bounded_tries(
    tmp_path, ollama_server
):
    from tests.integration.ingest.test_hostile_files import conversion_job

    worker_env = {"OLLAMA_HOST": ollama_server.url, "TORCH_THREADS": "1", **OLLAMA_ENV}
    env = {"JOB_FILE_RETRIES": "2", "OLLAMA_HOST": ollama_server.url}
    scan = scanned_pdf(tmp_path / "ledger.pdf", 3)
    with (
        worker_process(tmp_path, env=worker_env) as worker,
        gateway_process(tmp_path, worker_url=worker.url, env=env) as gateway,
        httpx.Client(base_url=gateway.url, timeout=120) as api,
    ):
        user = register(api, "worker-crash")
        index = new_index(api, user, "worker-crash")
        job = upload(api, user, index["id"], "ledger.pdf", scan.read_bytes()).json()
        conversion_job(worker, timeout=120)
        # The gunicorn worker dies mid-file (with its conversion); the master starts a new one.
        for child in psutil.Process(worker.proc.pid).children():
            child.kill()
        end = finished(api, user, job["id"], timeout=300)
        assert end["state"] == "done", end
        (file,) = end["files"]
        assert file["attempts"] == 2 and file["chunks"] > 0, file
        table = table_of(tmp_path / "index_store" / "gateway.db", index["id"])
        listed = worker_documents(worker, table)
        assert [(d["filename"], d["document_id"], d["chunks"]) for d in listed] == [
            ("ledger.pdf", hashlib.sha256(scan.read_bytes()).hexdigest(), file["chunks"])
        ]

        # No worker at all: each try fails, and after JOB_FILE_RETRIES the file fails with the reason.
        worker.stop()
        lost = upload(api, user, index["id"], "lost.md", note("lost")).json()
        end = finished(api, user, lost["id"], timeout=120)
        assert end["state"] == "failed", end
        (file,) = end["files"]
        assert file["state"] == "failed" and file["attempts"] == 2
        assert file["error"].startswith("gave up after 2 tries: ") and file["code"] == "worker_unavailable"
        assert end["error"] == file["error"]
        assert sorted(name for _ds, name in documents(api, user, index["id"])) == ["ledger.pdf"]
