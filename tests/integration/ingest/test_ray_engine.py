"""`python -m rag_worker index --engine ray` on a real two-node Ray cluster (two `ray start` on this machine).

The shared fixture corpus (less its two longest PDFs; with e-mails whose attachments become documents, and
spreadsheets that become SQL tables) is indexed once by the local path and once through Ray into the same store:
the two indexes must hold the same documents (ids), the same chunk texts and counts, the same SQL tables and
overviews, and the Ray run must have used both nodes. A second Ray run skips every document; a changed file is
replaced, not duplicated. A Ray rebuild builds a new table and swaps it in, so one that fails leaves the index as
it was.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.format_samples import PHRASES, eml_bytes, msg_bytes
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
# The corpus's two longest conversions (layout and tables over many pages: most of a run's conversion time, and
# each is converted twice here). Every format stays in, PDFs with five others; test_fixture_corpus converts these
# two through the worker.
LONG_SCANS = {"redp5110_sampled.pdf", "amt_handbook_sample.pdf"}
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
    # Its own temp folder (short: Ray's socket paths must fit 107 bytes), so that only this cluster's processes
    # are stopped afterwards: `ray stop` would stop every Ray process of the machine, other test runs' too.
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    common = ["--num-cpus=1", "--disable-usage-stats", "--node-ip-address=127.0.0.1"]
    head = [
        RAY,
        "start",
        "--head",
        f"--port={port}",
        "--include-dashboard=false",
        f"--temp-dir={temp_dir}",
        *common,
    ]
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
        _stop_processes_using(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _stop_processes_using(temp_dir: str) -> None:
    """Stop the processes of the cluster started with `temp_dir` (their command lines name it), no others."""
    import psutil

    def ours() -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            try:
                if any(temp_dir in part for part in proc.info["cmdline"] or []):
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return found

    procs = ours()
    children = [c for p in procs for c in _children(p)]
    for proc in procs + children:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    _, alive = psutil.wait_procs(procs + children, timeout=30)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


def _children(proc) -> list:
    import psutil

    try:
        return proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


@pytest.fixture(scope="module")
def indexed(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ray_index")
    folder = tmp / "corpus"
    shutil.copytree(DOCLING_SOURCES, folder / "docling", ignore=lambda _dir, names: LONG_SCANS & set(names))
    (folder / "mail").mkdir()
    (folder / "mail" / "invoice.eml").write_bytes(eml_bytes())
    (folder / "mail" / "costs.eml").write_bytes(_eml_with_a_spreadsheet())
    (folder / "mail" / "audit.msg").write_bytes(msg_bytes())
    local = _index(tmp, folder, "viaLocal")
    # The cluster starts once the local run is done: its idle daemons would take CPU from that run.
    cluster = request.getfixturevalue("cluster")
    ray = _index(tmp, folder, "viaRay", "--engine", "ray", "--ray-files-per-batch", "4", address=cluster)
    return tmp, folder, local, ray


COSTS_PHRASE = "the ward cost sheet for the winter quarter"


def _eml_with_a_spreadsheet() -> bytes:
    """A message whose CSV attachment is a document of its own and an SQL table."""
    from email.message import EmailMessage

    msg = EmailMessage()
    msg["From"] = "Finance <finance@example.org>"
    msg["To"] = "Wards <wards@example.org>"
    msg["Subject"] = "Costs per ward"
    msg.set_content(f"Attached is {COSTS_PHRASE}.")
    rows = "ward,cost,admitted\nNorth,1200.50,2024-03-02\nSouth,980.00,2024-03-15\nEast,1430.25,2024-04-01\n"
    msg.add_attachment(rows.encode(), maintype="text", subtype="csv", filename="ward costs.csv")
    return msg.as_bytes()


def _index(tmp: Path, folder: Path, index: str, *args: str, address: str | None = None, **env_extra: str):
    env = _env(tmp, **({"RAY_ADDRESS": address} if address else {}), **env_extra)
    cmd = [sys.executable, "-m", "rag_worker", "index", str(folder), "--index", index, "--quiet", *args]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=1200)


def _chunks(reader: StoreReader, index: str) -> dict[tuple[str, str, str], list[tuple[int, str, dict]]]:
    table = reader.store.table(index)
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


def _tables(tmp: Path, index: str) -> dict[str, tuple[dict, object]]:
    """The index's SQL tables: name -> (card, the Parquet file's rows)."""
    import pyarrow.parquet as pq

    folder = tmp / "index_store" / "tables" / index
    out = {}
    for card_path in sorted(folder.glob("*.json")):
        card = json.loads(card_path.read_text(encoding="utf-8"))
        out[card["name"]] = (card, pq.read_table(folder / f"{card['name']}.parquet").to_pylist())
    return out


def _overviews(tmp: Path, index: str) -> dict[tuple[str, str], tuple[str, str]]:
    lines = (tmp / "index_store" / "overviews" / f"{index}.jsonl").read_text(encoding="utf-8").splitlines()
    entries = [json.loads(line) for line in lines if line.strip()]
    return {(e["dataset"], e["filename"]): (e["document_id"], e["overview"]) for e in entries}


def test_ray_makes_the_same_sql_tables_and_attachment_documents_as_the_local_path(indexed):
    tmp, _, _, _ = indexed
    reader = StoreReader(tmp)
    local, ray = _chunks(reader, "viaLocal"), _chunks(reader, "viaRay")
    # Each e-mail attachment is a document of its own, linked back to its message, on both paths.
    for path_chunks in (local, ray):
        attached = {k[1]: m[0][2]["attached_to"] for k, m in path_chunks.items() if "attached_to" in m[0][2]}
        assert attached == {
            "invoice.eml.contract.txt": "invoice.eml",
            "costs.eml.ward costs.csv": "costs.eml",
            "audit.msg.appendix.txt": "audit.msg",
            "audit.msg.ward costs.csv": "audit.msg",
        }
    assert reader.files_for(PHRASES["attachment"], "viaRay")[0] == "invoice.eml.contract.txt"
    assert reader.files_for(COSTS_PHRASE, "viaRay")[0] == "costs.eml"
    assert reader.files_for(PHRASES["msg"], "viaRay")[0] == "audit.msg"
    assert reader.files_for(PHRASES["msg_attachment"], "viaRay")[0] == "audit.msg.appendix.txt"

    # The same SQL tables (the fixture's CSV and workbooks, and the attached CSV): cards and rows.
    local_tables, ray_tables = _tables(tmp, "viaLocal"), _tables(tmp, "viaRay")
    attached_tables = {"costs.eml.ward costs.csv", "audit.msg.ward costs.csv"}
    assert attached_tables <= {card["filename"] for card, _ in local_tables.values()}
    assert any(card["filename"].endswith(".xlsx") for card, _ in local_tables.values())
    assert set(ray_tables) == set(local_tables)
    for name, (card, rows) in local_tables.items():
        assert ray_tables[name][0] == card, name
        assert ray_tables[name][1] == rows, name
    costs = next(rows for card, rows in ray_tables.values() if card["filename"] == "costs.eml.ward costs.csv")
    assert sum(r["cost"] for r in costs) == 1200.50 + 980.00 + 1430.25

    # The same overviews, the tables' descriptions included.
    local_overviews, ray_overviews = _overviews(tmp, "viaLocal"), _overviews(tmp, "viaRay")
    assert ray_overviews == local_overviews
    assert "Tables:" in local_overviews[("mail", "costs.eml.ward costs.csv")][1]


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


def _state(tmp: Path, index: str) -> tuple[dict, list[dict]]:
    reader = StoreReader(tmp)
    return _chunks(reader, index), reader.store.list_documents(index)


def test_a_ray_rebuild_that_fails_leaves_the_index_searchable(indexed, cluster):
    tmp, folder, _, _ = indexed
    chunks_before, docs_before = _state(tmp, "viaRay")
    # The driver cannot join the cluster (its token is not the cluster's): the rebuild fails after it has made
    # its new table, which is where a rebuild that dropped the index first had already lost it.
    failed = _index(
        tmp, folder, "viaRay", "--rebuild", "--engine", "ray", address=cluster, RAY_AUTH_TOKEN="0" * 64
    )
    assert failed.returncode not in (0, 1), failed.stdout + failed.stderr[-3000:]
    assert "error:" in failed.stderr and "Ray cluster" in failed.stderr, failed.stderr[-3000:]
    reader = StoreReader(tmp)
    assert _chunks(reader, "viaRay") == chunks_before
    assert reader.store.list_documents("viaRay") == docs_before
    assert reader.store.staged_tables("viaRay") == []  # the unfinished table is gone
    phrase = " ".join(next(iter(chunks_before.values()))[0][1].split()[:8])
    assert reader.search(phrase, "viaRay", mode="fts", limit=5)
    assert (tmp / "index_store" / "overviews" / "viaRay.jsonl").is_file()


def test_a_ray_rebuild_swaps_in_a_new_table_and_keeps_documents_not_in_the_folder(indexed, cluster):
    tmp, folder, _, _ = indexed
    chunks_before, _ = _state(tmp, "viaRay")
    # The rebuild reads a folder holding a few of the corpus's text files (the PDFs were converted three times
    # already in this module): those are converted and embedded again by the cluster, every other document of
    # the index (wiki_duck.html among them) is carried over into the new table.
    partial = tmp / "partial"
    rebuilt_names = ["duck.md", "mixed.md", "nested.md", "example_01.html"]
    (partial / "docling").mkdir(parents=True, exist_ok=True)
    for name in rebuilt_names:
        shutil.copy(folder / "docling" / name, partial / "docling" / name)
    rebuilt = _index(tmp, partial, "viaRay", "--rebuild", "--engine", "ray", address=cluster)
    assert rebuilt.returncode in (0, 1), rebuilt.stderr[-3000:]
    assert f"'viaRay': {len(rebuilt_names)} documents (0 unchanged)" in rebuilt.stdout, rebuilt.stdout
    assert f"{len(chunks_before) - len(rebuilt_names)} kept from before" in rebuilt.stdout, rebuilt.stdout
    reader = StoreReader(tmp)
    serving = reader.store.serving_table("viaRay")
    assert serving.startswith("viaRay.")  # a new table, named by the index's alias
    assert reader.store.staged_tables("viaRay") == []
    after = _chunks(reader, "viaRay")
    assert set(after) == set(chunks_before)  # the moved file's document was carried over
    for key in chunks_before:
        assert [t for _, t, _ in after[key]] == [t for _, t, _ in chunks_before[key]], key
    carried = next(k for k in after if k[1] == "wiki_duck.html")
    phrase = " ".join(after[carried][1][1].split()[:10])
    assert "wiki_duck.html" in [h.filename for h in reader.search(phrase, "viaRay", mode="fts", limit=5)]
