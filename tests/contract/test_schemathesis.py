"""Schemathesis (a tool nobody here wrote) against the running worker: every check, every phase, stateful
included. It must report nothing: no 5xx, no answer that contradicts /openapi.json, no schema-valid request
refused and no invalid one accepted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
    from tests.corpus import corpus_copy

    root = corpus_copy(tmp_path_factory, "fuzzed")  # its own store: the fuzzer may drop or fill indexes
    with FakeOllama(models=["qwen3:8b", "qwen3:0.6b"]) as fake:
        env = {"OLLAMA_HOST": fake.url, "WORKER_API_KEY": KEY, **OLLAMA_ENV}
        with worker_process(root, env=env) as proc:
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
