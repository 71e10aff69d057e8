"""Schemathesis (a tool nobody here wrote) against the running worker: every check, every phase, stateful
included. It must report nothing: no 5xx, no answer that contradicts /openapi.json, no schema-valid request
refused and no invalid one accepted, and no warning (an operation it could only ever answer with a 404 or a
refusal is an operation it never tested).

The store holds what worker.toml's `[parameters]` name: the corpus index with its original files (so a download
finds the file), and an index `fuzzbuild` built from its uploads folder, whose `delete-me.md` the delete removes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.ollama_server import OLLAMA_ENV, FakeOllama
from tests.servers import worker_process

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent
KEY = "schemathesis-key"


def schemathesis(schema_url: str, config: Path, tmp: Path, *extra: str) -> subprocess.CompletedProcess:
    cli = Path(sys.executable).with_name("schemathesis")
    args = [str(cli), "--config-file", str(config), "run", schema_url, "--checks", "all"]
    args += ["--phases", "examples,coverage,fuzzing,stateful", "--max-examples", "25", "--seed", "7"]
    args += [
        "--wait-for-schema",
        "120",
        "--request-timeout",
        "60",
        "--report",
        "junit",
        "--report-dir",
        str(tmp),
        *extra,
    ]
    return subprocess.run(args, cwd=tmp, capture_output=True, text=True, timeout=1500)


@pytest.fixture(scope="module")
def fuzzed_worker(tmp_path_factory):
    from tests.corpus import corpus_copy, corpus_docs

    root = corpus_copy(tmp_path_factory, "fuzzed")  # its own store: the fuzzer may drop or fill indexes
    uploads = root / "shared_uploads"
    for (dataset, filename), text in corpus_docs().items():  # the originals, as uploads would have kept them
        (uploads / "corpus" / dataset).mkdir(parents=True, exist_ok=True)
        (uploads / "corpus" / dataset / filename).write_text(text, encoding="utf-8")
    build = uploads / "fuzzbuild" / "default"
    build.mkdir(parents=True)
    (build / "keep.md").write_text("# Kept\n\nThe kept note names the heron.", encoding="utf-8")
    (build / "delete-me.md").write_text("# Doomed\n\nThe doomed note names the egret.", encoding="utf-8")
    with FakeOllama(models=["qwen3:8b", "qwen3:0.6b"]) as fake:
        env = {"OLLAMA_HOST": fake.url, "WORKER_API_KEY": KEY, **OLLAMA_ENV}
        with worker_process(root, env=env) as proc:
            auth = {"Authorization": f"Bearer {KEY}"}
            with httpx.stream(
                "POST", proc.url + "/index", json={"index": "fuzzbuild"}, headers=auth, timeout=300
            ) as r:
                assert r.status_code == 200 and "event: done" in r.read().decode(), r.status_code
            yield proc, root


@pytest.mark.timeout(1800)
def test_schemathesis_finds_nothing_wrong_with_the_worker(fuzzed_worker):
    proc, root = fuzzed_worker
    result = schemathesis(
        proc.url + "/openapi.json",
        HERE / "worker.toml",
        root,
        "-H",
        f"Authorization: Bearer {KEY}",
    )
    report = result.stdout[-12000:] + result.stderr[-2000:]
    assert result.returncode == 0, report
    assert "No issues found" in result.stdout or " passed" in result.stdout, report
    assert "WARNINGS" not in result.stdout, report
