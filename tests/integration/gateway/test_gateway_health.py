"""The gateway's /health (and `run_system.py --health`) names the LLM backend the worker really uses.

With LLM_BACKEND=openai the model is served by an OpenAI-compatible server, not Ollama: a health report that
says "ollama: ok" (or probes an Ollama the deployment does not have) sends the operator to the wrong place.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys

import httpx
import pytest

from tests.openai_server import FakeOpenAI
from tests.servers import ROOT, free_port, gateway_process, worker_process


@pytest.fixture(scope="module")
def openai_stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("openai-stack")
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(FakeOpenAI(models=["served-8b", "served-small"], api_key="model-key"))
        worker_env = {
            "LLM_BACKEND": "openai",
            "OPENAI_BASE_URL": server.base_url,
            "OPENAI_API_KEY": "model-key",
            "GENERATION_MODEL": "served-8b",
            "UTILITY_MODEL": "served-small",
            "TORCH_THREADS": "1",
        }
        worker = stack.enter_context(worker_process(tmp, env=worker_env))
        # An OLLAMA_HOST left in the environment (nothing listens there) must not make the gateway report on
        # an Ollama that this deployment does not use.
        dead_ollama = f"http://127.0.0.1:{free_port()}"
        gateway = stack.enter_context(
            gateway_process(tmp, worker_url=worker.url, env={"OLLAMA_HOST": dead_ollama})
        )
        yield server, worker, gateway, worker_env


def test_gateway_health_names_the_openai_backend(openai_stack):
    _server, _worker, gateway, _env = openai_stack
    r = httpx.get(gateway.url + "/health", timeout=30)
    body = r.json()
    assert r.status_code == 200, body
    assert body["status"] == "ok" and body["llm"] == "ok", body
    assert body["llm_backend"] == "openai" and body["llm_model"] == "served-8b", body
    assert "ollama" not in body, f"the LLM is not Ollama here: {body}"


def test_run_system_health_shows_the_openai_backend_in_the_gateway_row(openai_stack, tmp_path):
    server, worker, gateway, env = openai_stack
    args = [sys.executable, "run_system.py", "--health", "--logs-dir", str(tmp_path / "logs")]
    args += ["--worker-port", str(worker.port), "--gateway-port", str(gateway.port)]
    cli_env = {**env, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    result = subprocess.run(
        args, cwd=ROOT, env={**_base_env(), **cli_env}, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines()[1:4] if line.strip()}
    assert rows["openai"].split()[1] == "ok", result.stdout
    assert "llm_backend: openai" in rows["gateway"] and "ollama" not in rows["gateway"], result.stdout


def _base_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k not in ("OLLAMA_HOST", "LLM_BACKEND")}
