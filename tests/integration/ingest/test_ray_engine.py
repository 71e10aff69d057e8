"""`python -m rag_worker index --engine ray` on a real two-node Ray cluster (two `ray start` on this machine).

The shared fixture corpus is indexed once by the local path and once through Ray into the same store: the two
indexes must hold the same documents (ids), the same chunk texts and counts, and the Ray run must have used both
nodes. A second Ray run skips every document; a changed file is replaced, not duplicated.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.ingest.helpers import StoreReader
from tests.servers import ROOT, SHARED, free_port

DOCLING_SOURCES = SHARED / "fixtures" / "docling" / "sources"

pytestmark = [
    # Two Ray nodes plus two full indexing runs of the fixture corpus: minutes on two cores.
    pytest.mark.timeout(1800),
    pytest.mark.skipif(
        not DOCLING_SOURCES.is_dir(), reason="needs ../shared/fixtures (absent beside a bare clone)"
    ),
    pytest.mark.skipif(
        shutil.which("ray", path=str(Path(sys.executable).parent)) is None,
        reason="Ray is an optional extra: bash scripts/setup.sh --ray",
    ),
]

RAY = str(Path(sys.executable).parent / "ray")
_TOKEN = secrets.token_hex(32)


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "INDEX_STORE": str(tmp / "index_store"),
        "UPLOADS_DIR": str(tmp / "uploads"),
        "LLM_BACKEND": "local",
        "OVERVIEW_SUMMARIES": "off",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
        # Ray's token authentication, as a real cluster should run it: every node and the driver share it.
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": _TOKEN,
    }
    env.pop("RAY_ADDRESS", None)
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A head node and a second node, one CPU each, both on loopback; stopped afterwards."""
    tmp = tmp_path_factory.mktemp("ray")
    port = free_port()
    env = _env(tmp)
    common = ["--num-cpus=1", "--disable-usage-stats", "--node-ip-address=127.0.0.1"]
    head = [RAY, "start", "--head", f"--port={port}", "--include-dashboard=false", *common]
    try:
        subprocess.run(head, env=env, check=True, capture_output=True, timeout=180)
        address = f"127.0.0.1:{port}"
        subprocess.run(
            [RAY, "start", f"--address={address}", *common],
            env=env,
            check=True,
            capture_output=True,
            timeout=180,
        )
        yield address
    finally:
        subprocess.run([RAY, "stop", "--force"], env=env, capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def indexed(cluster, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ray_index")
    folder = tmp / "corpus"
    shutil.copytree(DOCLING_SOURCES, folder / "docling")
    local = _index(tmp, folder, "viaLocal")
    ray = _index(tmp, folder, "viaRay", "--engine", "ray", "--ray-files-per-batch", "4", address=cluster)
    return tmp, folder, local, ray


def _index(tmp: Path, folder: Path, index: str, *args: str, address: str | None = None):
    env = _env(tmp, **({"RAY_ADDRESS": address} if address else {}))
    cmd = [sys.executable, "-m", "rag_worker", "index", str(folder), "--index", index, "--quiet", *args]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=1200)


def _chunks(reader: StoreReader, index: str) -> dict[tuple[str, str, str], list[tuple[int, str, dict]]]:
    table = reader.store._require(index)
    rows = table.search().select(["dataset", "filename", "document_id", "chunk_index", "text", "metadata"])
    out: dict[tuple[str, str, str], list] = {}
    for r in rows.limit(None).to_list():
        meta = json.loads(r["metadata"] or "{}")
        out.setdefault((r["dataset"], r["filename"], r["document_id"]), []).append(
            (r["chunk_index"], r["text"], meta)
        )
    return {k: sorted(v, key=lambda c: c[0]) for k, v in out.items()}


def test_ray_run_uses_both_nodes_and_reports_like_the_local_run(indexed):
    _, _, local, ray = indexed
    assert ray.returncode == local.returncode, ray.stderr[-3000:]
    assert "on 2 Ray nodes" in ray.stdout, ray.stdout + ray.stderr[-3000:]

    # Same summary apart from the time taken: documents, unchanged, chunks, failures.
    def summary(out: str) -> str:
        return out.split("': ", 1)[1].split(" in ")[0]

    assert summary(local.stdout) == summary(ray.stdout), (local.stdout, ray.stdout)
    failed_local = sorted(line for line in local.stderr.splitlines() if line.startswith("failed:"))
    failed_ray = sorted(line for line in ray.stderr.splitlines() if line.startswith("failed:"))
    assert failed_local == failed_ray


def test_ray_index_equals_the_local_index(indexed):
    tmp, _, _, _ = indexed
    reader = StoreReader(tmp)
    local, ray = _chunks(reader, "viaLocal"), _chunks(reader, "viaRay")
    assert local, "the local run indexed nothing"
    assert set(ray) == set(local)
    for key in local:
        assert [(i, t) for i, t, _ in ray[key]] == [(i, t) for i, t, _ in local[key]], key
        assert [m for _, _, m in ray[key]] == [m for _, _, m in local[key]], key
    # The Ray-built index answers searches: full text (the FTS index took the committed fragments) and vector.
    some_doc = sorted(local)[0]
    phrase = " ".join(local[some_doc][0][1].split()[:8])
    assert some_doc[1] in [h.filename for h in reader.search(phrase, "viaRay", mode="fts", limit=5)]
    assert reader.search(phrase, "viaRay", mode="vector", limit=3)
    overviews = tmp / "index_store" / "overviews"
    assert sorted(overviews.glob("viaRay*")), "no overview written for the Ray index"


def test_a_second_ray_run_skips_everything_and_a_changed_file_is_replaced(indexed, cluster):
    tmp, folder, _, _ = indexed
    changed = folder / "docling" / "duck.md"
    changed.write_text(changed.read_text(encoding="utf-8") + "\n\nThe quokka smiled at the ray cluster.\n")
    again = _index(tmp, folder, "viaRay", "--engine", "ray", address=cluster)
    assert again.returncode in (0, 1), again.stderr[-3000:]
    summary = again.stdout
    assert "1 documents (0 unchanged)" not in summary
    documents = int(summary.split("'viaRay': ")[1].split(" documents")[0])
    unchanged = int(summary.split("(")[1].split(" unchanged")[0])
    assert unchanged == documents - 1, summary
    reader = StoreReader(tmp)
    ducks = {k for k in _chunks(reader, "viaRay") if k[1] == "duck.md"}
    assert len(ducks) == 1, ducks  # the old version's rows are gone
    assert "duck.md" in [h.filename for h in reader.search("quokka smiled ray cluster", "viaRay", mode="fts")]
