"""Sources that sync into a real index (real LanceDB, the real embedder): a server folder and an S3 bucket (moto's
standalone S3 server on loopback, the allowed stand-in), through the worker's own target and the CLI.

Between two runs files are added, changed and deleted; the index must then hold exactly the new state, with the
unchanged files not indexed again and a document uploaded by hand untouched."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from contract.sync import S3Source, Summary, run_to_end, sync
from tests.servers import ROOT


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def text(topic: str) -> bytes:
    return f"# {topic}\n\nThis note is about {topic}. It says {topic} twice: {topic}.\n".encode()


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("sync")
    return {
        "INDEX_STORE": str(tmp / "store"),
        "UPLOADS_DIR": str(tmp / "uploads"),
        "TORCH_THREADS": "1",
        "LLM_BACKEND": "local",
        "OVERVIEW_SUMMARIES": "off",
    }


@pytest.fixture(scope="module")
def services(env):
    from rag_worker.services import Services
    from rag_worker.settings import Settings

    svc = Services(Settings(**env))
    yield svc
    svc.close()


def hand_upload(services, index: str, name: str, data: bytes, tmp: Path) -> None:
    """A file uploaded by hand, indexed as the upload route indexes it (its original kept)."""
    from rag_worker.ingest.document import ingest_file, uploads_path

    path = tmp / name
    path.write_bytes(data)
    ingest_file(
        services, index, "default", path, name, keep_at=uploads_path(services, index, "default", name)
    )


def docs(services, index: str) -> dict[tuple[str, str], dict]:
    return {(d["dataset"], d["filename"]): d for d in services.store.list_documents(index)}


def counts(summary: Summary) -> tuple[int, int, int, int]:
    return summary.added, summary.changed, summary.removed, summary.unchanged


def test_folder_sync_between_two_runs(services, env, tmp_path):
    from rag_worker.ingest.sync import sync_folder

    folder = tmp_path / "team-docs"
    (folder / "specs").mkdir(parents=True)
    (folder / "alpha.md").write_bytes(text("alpha"))
    (folder / "beta.md").write_bytes(text("beta"))
    (folder / "specs" / "gamma.md").write_bytes(text("gamma"))
    hand_upload(services, "syncf", "manual.md", text("manual"), tmp_path)

    first = run_to_end(sync_folder(services, "syncf", folder))
    assert counts(first) == (3, 0, 0, 0), first.failed
    before = docs(services, "syncf")
    assert set(before) == {
        ("default", "alpha.md"),
        ("default", "beta.md"),
        ("specs", "gamma.md"),
        ("default", "manual.md"),
    }

    (folder / "alpha.md").write_bytes(text("alpha revised"))
    (folder / "beta.md").unlink()
    (folder / "specs" / "delta.md").write_bytes(text("delta"))
    events = []
    second = run_to_end(sync_folder(services, "syncf", folder), events.append)
    assert counts(second) == (1, 1, 1, 1), second.failed
    assert {(e.file, e.stage) for e in events} == {
        ("alpha.md", "changed"),
        ("beta.md", "removed"),
        ("specs/delta.md", "added"),
    }
    after = docs(services, "syncf")
    assert set(after) == {
        ("default", "alpha.md"),
        ("specs", "gamma.md"),
        ("specs", "delta.md"),
        ("default", "manual.md"),
    }
    assert after[("default", "alpha.md")]["document_id"] == sha(text("alpha revised"))
    assert after[("specs", "delta.md")]["document_id"] == sha(text("delta"))
    for untouched in (("specs", "gamma.md"), ("default", "manual.md")):  # not indexed again
        assert after[untouched]["document_id"] == before[untouched]["document_id"]
        assert after[untouched]["indexed_at"] == before[untouched]["indexed_at"]

    # The CLI, as cron would run it: one more change, the counts printed.
    (folder / "specs" / "gamma.md").write_bytes(text("gamma revised"))
    cli = subprocess.run(
        [sys.executable, "-m", "rag_worker", "sync", str(folder), "--index", "syncf"],
        cwd=ROOT,
        env={**os.environ, **env, "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert cli.returncode == 0, cli.stderr
    assert "added 0, changed 1, removed 0, unchanged 2, failed 0" in cli.stdout
    assert docs(services, "syncf")[("specs", "gamma.md")]["document_id"] == sha(text("gamma revised"))
    assert docs(services, "syncf")[("default", "manual.md")]["document_id"] == sha(text("manual"))


def test_cli_refuses_a_folder_outside_sync_roots(env, tmp_path):
    (tmp_path / "allowed").mkdir()
    cli = subprocess.run(
        [sys.executable, "-m", "rag_worker", "sync", str(tmp_path), "--index", "syncf"],
        cwd=ROOT,
        env={**os.environ, **env, "SYNC_ROOTS": str(tmp_path / "allowed")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert cli.returncode == 2 and "outside the allowed roots" in cli.stderr


@pytest.fixture(scope="module")
def s3():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def bucket_client(endpoint: str):
    import boto3

    return boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s"
    )


def s3_source(endpoint: str, bucket: str, prefix: str) -> S3Source:
    return S3Source(bucket, prefix, endpoint_url=endpoint, access_key="k", secret_key="s")


def test_s3_sync_between_two_runs(services, s3, tmp_path):
    from contract.sync import MemoryState
    from rag_worker.ingest.sync import StoreTarget

    client = bucket_client(s3)
    client.create_bucket(Bucket="team")
    client.put_object(Bucket="team", Key="docs/alpha.md", Body=text("alpha"))
    client.put_object(Bucket="team", Key="docs/beta.md", Body=text("beta"))
    client.put_object(Bucket="team", Key="docs/specs/gamma.md", Body=text("gamma"))
    client.put_object(Bucket="team", Key="other/outside-prefix.md", Body=text("outside"))
    hand_upload(services, "syncs3", "manual.md", text("manual"), tmp_path)
    state = MemoryState()
    target = StoreTarget(services, "syncs3")

    first = run_to_end(sync(s3_source(s3, "team", "docs"), target, state))
    assert counts(first) == (3, 0, 0, 0), first.failed
    before = docs(services, "syncs3")

    client.put_object(Bucket="team", Key="docs/alpha.md", Body=text("alpha revised"))
    client.delete_object(Bucket="team", Key="docs/beta.md")
    client.put_object(Bucket="team", Key="docs/specs/delta.md", Body=text("delta"))
    second = run_to_end(sync(s3_source(s3, "team", "docs/"), target, state))
    assert counts(second) == (1, 1, 1, 1), second.failed
    assert second.hashed == 2  # gamma's ETag and date were the recorded ones: not fetched
    after = docs(services, "syncs3")
    assert set(after) == {
        ("default", "alpha.md"),
        ("specs", "gamma.md"),
        ("specs", "delta.md"),
        ("default", "manual.md"),
    }
    assert after[("default", "alpha.md")]["document_id"] == sha(text("alpha revised"))
    for untouched in (("specs", "gamma.md"), ("default", "manual.md")):
        assert after[untouched]["indexed_at"] == before[untouched]["indexed_at"]

    # A bucket that refuses (here: does not exist) is a failed listing: nothing is removed.
    refused = run_to_end(sync(s3_source(s3, "no-such-bucket", "docs"), target, state))
    assert not refused.listed and refused.failed[0]["code"] == "source_unreachable"
    assert "NoSuchBucket" in refused.failed[0]["error"]
    assert set(docs(services, "syncs3")) == set(after)
