"""Folder indexing commits files in batches: the indexing CLI killed at any moment leaves only whole documents,
and running it again skips what is already in. Real processes, real LanceDB, the real embedder."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.ingest.helpers import open_store as open_lancedb
from tests.servers import ROOT

FILES = 40


def write_folder(folder: Path) -> None:
    folder.mkdir(parents=True)
    for i in range(FILES):
        sections = []
        for s in range(3):  # three headed sections of ~120 words: several chunks per file
            words = " ".join(f"topic{i:02d}s{s}w{w}" if w % 10 == 0 else "measurement" for w in range(120))
            sections.append(f"## Section {s} of file {i}\n\n{words}.")
        (folder / f"file{i:02d}.md").write_text(f"# File {i}\n\n" + "\n\n".join(sections), encoding="utf-8")


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("resume")
    return {
        **os.environ,
        "INDEX_STORE": str(tmp / "store"),
        "UPLOADS_DIR": str(tmp / "uploads"),
        "HF_HUB_OFFLINE": "1",
        "TORCH_THREADS": "1",
        "LLM_BACKEND": "local",
        "OVERVIEW_SUMMARIES": "off",
        "EMBEDDING_BATCH_SIZE": "4",
        "INGEST_BATCH_CHUNKS": "16",  # a commit every 16 chunks: many commits over the folder
    }


def expected_chunks(env, folder: Path) -> dict[str, int]:
    """Chunks per file as the pipeline's own converter and chunker make them, computed independently here."""
    from rag_worker.services import Services
    from rag_worker.settings import Settings

    services = Services(Settings(INDEX_STORE=env["INDEX_STORE"], EMBEDDING_BATCH_SIZE=4))
    converter, chunker = services.converter, services.chunker
    try:
        return {p.name: len(chunker.chunk(converter.convert(p).document)) for p in sorted(folder.iterdir())}
    finally:
        services.close()


def stored(env) -> dict[str, int]:
    """{filename: chunks} as a reader in another process sees the index now (polled every 0.2 s: the reader's
    embedder is loaded once, not per look)."""
    store = open_store(env)
    if not store.exists("resume"):
        return {}
    return {d["filename"]: d["chunks"] for d in store.list_documents("resume")}


def open_store(env):
    return open_lancedb(Path(env["INDEX_STORE"]) / "lancedb")


def found_by_full_text(env, names: list[str]) -> set[str]:
    """The files whose own words (topicNNs0w0, unique to each file) full-text search finds."""
    store = open_store(env)
    found = set()
    for name in names:
        number = int(re.search(r"\d+", name).group())
        hits = store.search("resume", f"topic{number:02d}s0w0", mode="fts", limit=3)
        found.update(h.filename for h in hits if h.filename == name)
    return found


def unindexed_rows(env) -> int:
    """Rows the full-text index does not cover yet (searched exhaustively until it does)."""
    table = open_store(env).table("resume")
    fts = next(i for i in table.list_indices() if i.index_type == "FTS")
    return table.index_stats(fts.name).num_unindexed_rows


def cli(env, folder) -> list[str]:
    return [sys.executable, "-m", "rag_worker", "index", str(folder), "--index", "resume", "--quiet"]


def test_a_killed_run_leaves_whole_documents_and_a_second_run_skips_them(env, tmp_path):
    folder = tmp_path / "folder"
    write_folder(folder)
    want = expected_chunks(env, folder)
    assert all(n >= 2 for n in want.values()), want

    proc = subprocess.Popen(
        cli(env, folder),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 600
        while proc.poll() is None and not stored(env) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # mid-run: a crash, no chance to clean up
        proc.wait(timeout=30)
    after_crash = stored(env)
    assert after_crash, "nothing was committed before the kill"
    for name, chunks in after_crash.items():
        assert chunks == want[name], f"{name} is half written: {chunks} of {want[name]} chunks"
    # What was committed is searchable at once, also where the run died before updating the full-text index.
    assert found_by_full_text(env, sorted(after_crash)) == set(after_crash)

    again = subprocess.run(cli(env, folder), cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert again.returncode == 0, again.stdout + again.stderr
    summary = re.search(r"(\d+) documents \((\d+) unchanged\)", again.stdout)
    assert summary, again.stdout
    assert int(summary.group(1)) == FILES
    assert int(summary.group(2)) == len(after_crash)  # what the killed run committed is skipped
    assert stored(env) == want
    # A finished run leaves its full-text index complete (it is brought up to date at the end of the run).
    assert unindexed_rows(env) == 0
    assert found_by_full_text(env, sorted(want)) == set(want)
