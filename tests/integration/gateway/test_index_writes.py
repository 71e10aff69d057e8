"""Several processes, one index: the real gateway in front of a real worker running two gunicorn processes on one
store (as WORKER_WORKERS=2 or the replica compose file do), with the `demo` index built by the CLI beforehand.

Covers concurrent uploads, rebuilds that must not lose what they cannot rebuild, a worker killed mid-rebuild (the
build's job runs the broken pass again), and one file name on both sides.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import unquote

import httpx
import psutil
import pytest

from tests.integration.gateway.helpers import events, register
from tests.integration.ingest.helpers import StoreReader
from tests.servers import ROOT, gateway_process, wait_http, worker_process

WORKER_ENV = {
    "WORKER_WORKERS": "2",
    "LLM_BACKEND": "local",
    "OVERVIEW_SUMMARIES": "off",
    "TORCH_THREADS": "1",
    # Small embedding batches: a rebuild of 20 one-chunk files writes in several rounds, so there is a
    # "mid-rebuild" to kill the worker in.
    "EMBEDDING_BATCH_SIZE": "2",
    "INGEST_BATCH_CHUNKS": "8",
}
UPLOADS = 20


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("index-writes")


@pytest.fixture(scope="module")
def stack(tmp):
    # The demo index, as run_system.py makes it: the CLI indexes copies of the docs from a folder that the
    # worker's uploads folder never holds.
    source = tmp / "demo-src" / "docs"
    source.mkdir(parents=True)
    (source / "backup.md").write_text(
        "# Backups\n\nBack up the data with the heronry script.", encoding="utf-8"
    )
    (source / "security.md").write_text("# Security\n\nThe lynx key guards the worker.", encoding="utf-8")
    env = {
        "INDEX_STORE": str(tmp / "index_store"),
        "UPLOADS_DIR": str(tmp / "shared_uploads"),
        "HF_HUB_OFFLINE": "1",
        "TORCH_THREADS": "1",
        "OVERVIEW_SUMMARIES": "off",
        "LLM_BACKEND": "local",
    }
    cli = subprocess.run(
        [sys.executable, "-m", "rag_worker", "index", str(source.parent), "--index", "demo", "--quiet"],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert cli.returncode == 0, cli.stdout + cli.stderr
    with (
        worker_process(tmp, env=WORKER_ENV) as worker,
        # The load test's 20 uploads come from one account at once (MAX_UPLOADS_PER_USER defaults to 4).
        gateway_process(tmp, worker_url=worker.url, env={"MAX_UPLOADS_PER_USER": str(UPLOADS)}) as gateway,
    ):
        yield worker, gateway


@pytest.fixture(scope="module")
def worker(stack):
    return stack[0]


@pytest.fixture(scope="module")
def api(stack):
    with httpx.Client(base_url=stack[1].url, timeout=600) as client:
        yield client


@pytest.fixture(scope="module")
def admin(api):
    return register(api, "admin")  # the first account: it adopts the demo index


@pytest.fixture(scope="module")
def reader(tmp, stack):
    return StoreReader(tmp)


def new_index(api, user, name) -> dict:
    r = api.post("/api/indexes", json={"name": name}, headers=user)
    assert r.status_code == 201, r.text
    return r.json()


def upload(api, user, index_id, name, content: bytes, dataset="default") -> httpx.Response:
    return api.post(
        f"/api/indexes/{index_id}/documents?wait=1",
        headers=user,
        data={"dataset": dataset},
        files={"file": (name, content, "text/markdown")},
    )


def gateway_docs(api, user, index_id) -> dict[tuple[str, str], dict]:
    data = api.get(f"/api/indexes/{index_id}", headers=user).json()
    return {(d["dataset"], d["filename"]): d for d in data["documents"]}


def worker_docs(worker, table) -> list[tuple[str, str]]:
    r = httpx.get(worker.url + "/get_documents", params={"index": table}, timeout=60)
    assert r.status_code == 200, r.text
    return sorted((d["dataset"], d["filename"]) for d in r.json())


def build(api, user, index_id, **body) -> list[tuple[str, object]]:
    with api.stream("POST", f"/api/indexes/{index_id}/build", json=body, headers=user) as resp:
        assert resp.status_code == 200, resp.read()
        return [(e, d) for e, d in events(resp.iter_lines()) if e != ":"]


def settled(api, user, index_id, timeout=300.0) -> dict:
    """The index once the gateway has synced it after a build (its status leaves `building`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        data = api.get(f"/api/indexes/{index_id}", headers=user).json()
        if data["status"] != "building":
            return data
        time.sleep(0.3)
    raise AssertionError(f"index {index_id} still building after {timeout} s")


def worker_table(tmp, index_id: int) -> str:
    """The worker table behind a gateway index (the API does not show it), from the gateway's database."""
    with sqlite3.connect(tmp / "index_store" / "gateway.db") as db:
        return db.execute("SELECT worker_name FROM indexes WHERE id = ?", (index_id,)).fetchone()[0]


def marker(n: int) -> str:
    return f"kestrel{n:02d}"


def test_a_rebuild_of_the_adopted_demo_index_keeps_its_documents(api, admin, worker, reader):
    demo = next(i for i in api.get("/api/indexes", headers=admin).json() if i["name"] == "demo")
    assert set(gateway_docs(api, admin, demo["id"])) == {("docs", "backup.md"), ("docs", "security.md")}
    # Shared with everyone signed in, as readers: a newcomer finds it, asks it, and cannot rebuild it.
    newcomer = register(api, "demo_newcomer")
    shown = next(i for i in api.get("/api/indexes", headers=newcomer).json() if i["id"] == demo["id"])
    assert (shown["access"], shown["via"], shown["owner"]) == ("reader", "everyone", "admin")
    r = api.post(f"/api/indexes/{demo['id']}/build", json={"rebuild": True}, headers=newcomer)
    assert (r.status_code, r.json()["code"]) == (404, "index_not_found")

    frames = build(api, admin, demo["id"], rebuild=True)
    assert frames[-1][0] == "done", frames[-1]
    assert settled(api, admin, demo["id"])["document_count"] == 2
    assert set(gateway_docs(api, admin, demo["id"])) == {("docs", "backup.md"), ("docs", "security.md")}
    assert worker_docs(worker, "demo") == [("docs", "backup.md"), ("docs", "security.md")]
    assert reader.files_for("heronry", "demo") == ["backup.md"]


def test_twenty_concurrent_uploads_through_two_worker_processes_all_land_once(
    api, admin, tmp, worker, reader
):
    index = new_index(api, admin, "Load")

    def one(n: int) -> httpx.Response:
        with httpx.Client(base_url=str(api.base_url), timeout=600) as client:
            text = f"# Note {n}\n\nField note {n} records a {marker(n)} sighting near the river."
            return upload(client, admin, index["id"], f"note{n:02d}.md", text.encode())

    with ThreadPoolExecutor(UPLOADS) as pool:
        responses = list(pool.map(one, range(UPLOADS)))
    assert [r.status_code for r in responses] == [201] * UPLOADS, [
        r.text for r in responses if r.status_code != 201
    ]

    names = [("default", f"note{n:02d}.md") for n in range(UPLOADS)]
    listed = api.get(f"/api/indexes/{index['id']}", headers=admin).json()
    assert sorted((d["dataset"], d["filename"]) for d in listed["documents"]) == names  # each exactly once
    assert listed["document_count"] == UPLOADS
    table = worker_table(tmp, index["id"])
    assert worker_docs(worker, table) == names
    for n in range(UPLOADS):
        assert reader.files_for(marker(n), table)[:1] == [f"note{n:02d}.md"]
    for doc in listed["documents"]:
        r = api.get(f"/api/indexes/{index['id']}/documents/{doc['id']}/download", headers=admin)
        assert r.status_code == 200 and marker(int(doc["filename"][4:6])) in r.text


def test_a_file_named_with_a_percent_escape_keeps_its_name_everywhere(api, admin, tmp, worker, reader):
    index = new_index(api, admin, "Percent")
    r = upload(api, admin, index["id"], "per%22cent.md", b"The per cent file mentions the ocelot.")
    assert r.status_code == 201, r.text
    assert r.json()["filename"] == "per%22cent.md"
    table = worker_table(tmp, index["id"])
    assert set(gateway_docs(api, admin, index["id"])) == {("default", "per%22cent.md")}
    assert worker_docs(worker, table) == [("default", "per%22cent.md")]

    doc_id = r.json()["id"]
    got = api.get(f"/api/indexes/{index['id']}/documents/{doc_id}/download", headers=admin)
    assert got.status_code == 200 and got.content == b"The per cent file mentions the ocelot."
    disposition = got.headers["content-disposition"]
    assert unquote(disposition.split("filename*=UTF-8''", 1)[1]) == "per%22cent.md"

    gone = api.delete(f"/api/indexes/{index['id']}/documents/{doc_id}", headers=admin)
    assert gone.status_code == 204, gone.text
    assert gateway_docs(api, admin, index["id"]) == {}
    assert worker_docs(worker, table) == []
    assert reader.files_for("ocelot", table) == []


def test_a_delete_the_worker_did_not_do_is_not_reported_as_done(api, admin, tmp, worker, reader):
    index = new_index(api, admin, "Legacy")
    r = upload(api, admin, index["id"], "legacy.md", b"The legacy file mentions the pangolin.")
    assert r.status_code == 201, r.text
    # A record as an older gateway wrote it: its name differs from the worker's for the same document.
    with sqlite3.connect(tmp / "index_store" / "gateway.db") as db:
        db.execute("UPDATE index_documents SET filename = 'legacy%22.md' WHERE id = ?", (r.json()["id"],))

    answer = api.delete(f"/api/indexes/{index['id']}/documents/{r.json()['id']}", headers=admin)
    assert answer.status_code == 409, answer.text
    assert answer.json()["code"] == "not_deleted" and "legacy.md" in answer.json()["error"]
    assert set(gateway_docs(api, admin, index["id"])) == {("default", "legacy%22.md")}  # the record stays
    table = worker_table(tmp, index["id"])
    assert reader.files_for("pangolin", table) == ["legacy.md"]  # ... since the passage is still answerable


def test_a_dot_file_upload_survives_a_rebuild(api, admin, tmp, worker, reader):
    index = new_index(api, admin, "Dots")
    for name, text in (
        (".notes.md", "Hidden notes about the axolotl."),
        ("plain.md", "Plain text on the tapir."),
    ):
        assert upload(api, admin, index["id"], name, text.encode()).status_code == 201

    frames = build(api, admin, index["id"], rebuild=True)
    assert frames[-1][0] == "done", frames[-1]
    settled(api, admin, index["id"])
    assert set(gateway_docs(api, admin, index["id"])) == {("default", ".notes.md"), ("default", "plain.md")}
    table = worker_table(tmp, index["id"])
    assert worker_docs(worker, table) == [("default", ".notes.md"), ("default", "plain.md")]
    assert reader.files_for("axolotl", table) == [".notes.md"]


def test_a_worker_killed_mid_rebuild_leaves_the_index_and_the_gateway_rows_intact(
    api, admin, tmp, worker, reader
):
    index = next(i for i in api.get("/api/indexes", headers=admin).json() if i["name"] == "Load")
    table = worker_table(tmp, index["id"])
    names = [("default", f"note{n:02d}.md") for n in range(UPLOADS)]
    assert worker_docs(worker, table) == names

    seen = []
    with api.stream(
        "POST", f"/api/indexes/{index['id']}/build", json={"rebuild": True}, headers=admin
    ) as resp:
        assert resp.status_code == 200
        for event, data in events(resp.iter_lines()):
            seen.append(event)
            if event == "progress" and data["stage"] == "indexed" and "killed" not in seen:
                # Every gunicorn process dies at once (OOM killer, a node failure); the master starts new ones.
                for child in psutil.Process(worker.proc.pid).children():
                    child.kill()
                seen.append("killed")
    # The build is a job: the pass the crash broke is run again (the worker swaps a rebuilt table in only when
    # complete, so the broken pass left the index as it was) and the build ends done.
    assert "killed" in seen and seen[-1] == "done", seen

    data = settled(api, admin, index["id"])
    assert data["document_count"] == UPLOADS
    assert sorted(gateway_docs(api, admin, index["id"])) == names
    wait_http(worker.url + "/health", proc=worker.proc)
    assert worker_docs(worker, table) == names
    for n in range(UPLOADS):
        assert reader.files_for(marker(n), table)[:1] == [f"note{n:02d}.md"]

    frames = build(api, admin, index["id"], rebuild=True)  # and the next rebuild clears what the crash left
    assert frames[-1][0] == "done", frames[-1]
    settled(api, admin, index["id"])
    assert worker_docs(worker, table) == names
    assert reader.store.staged_tables(table) == []
