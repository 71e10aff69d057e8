"""The LLM part of the gateway's /health, read from the worker's /health `llm` as each backend reports it."""

from __future__ import annotations

from gateway.meta import llm_report


def test_an_openai_server_that_does_not_serve_the_model_is_named_down_as_openai() -> None:
    worker = {
        "status": "degraded",
        "llm": {
            "ok": False,
            "backend": "openai",
            "generation_model": "served-8b",
            "openai": {"base_url": "http://vllm:8000/v1", "reachable": True, "models": []},
        },
    }
    assert llm_report(worker) == {"llm": "down", "llm_backend": "openai", "llm_model": "served-8b"}


def test_the_embedded_model_is_named_local_and_never_ollama() -> None:
    worker = {"llm": {"ok": True, "backend": "local", "generation_model": "qwen2.5-0.5b-instruct"}}
    report = llm_report(worker)
    assert report["llm_backend"] == "local" and report["llm"] == "ok" and "ollama" not in report


def test_ollama_keeps_its_name() -> None:
    worker = {"llm": {"ok": True, "backend": "ollama", "generation_model": "qwen3:8b"}}
    assert llm_report(worker)["ollama"] == "ok"


def test_a_worker_that_hides_its_details_leaves_the_backend_unknown() -> None:
    assert llm_report({"status": "ok"}) == {"llm": "unknown", "llm_backend": "unknown", "llm_model": None}
