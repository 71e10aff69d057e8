"""The default Docker deployment works: worker and gateway started with exactly the environment that
deploy/docker-compose.yml (over the images' ENV) gives them, with no .env file, answer a turn.

Docker is not needed: the compose file and Dockerfiles are parsed, `${NAME:-default}` takes its default (the
shell sets nothing), and only what a container network provides is mapped to loopback: service names and
`host.docker.internal` to 127.0.0.1 ports, the listen address 0.0.0.0 to 127.0.0.1, and the volumes to folders.
The fake Ollama plays the host's Ollama.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import sys
from pathlib import Path

import httpx
import pytest

from tests.ollama_server import FakeOllama
from tests.servers import ServerProcess, free_port
from tests.unit.test_compose import COMPOSE, DEPLOY, env_of, load

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")


def interpolate(value: object, shell: dict[str, str]) -> str:
    """Compose's `${NAME}`, `${NAME:-default}` with the given shell environment."""
    return _VAR.sub(lambda m: shell.get(m.group(1)) or (m.group(2) or ""), str(value))


def image_env(dockerfile: Path) -> dict[str, str]:
    """The `ENV` of a Dockerfile (KEY=value pairs, line continuations joined)."""
    env: dict[str, str] = {}
    for line in dockerfile.read_text().replace("\\\n", " ").splitlines():
        if line.startswith("ENV "):
            for pair in shlex.split(line[4:]):
                key, _, value = pair.partition("=")
                env[key] = value
    return env


def image_cmd(dockerfile: Path) -> list[str]:
    import json

    (line,) = [ln for ln in dockerfile.read_text().splitlines() if ln.startswith("CMD ")]
    return json.loads(line[4:])


def container_env(service: str, dockerfile: str) -> dict[str, str]:
    compose = load(COMPOSE)["services"][service]
    env = image_env(DEPLOY / dockerfile)
    env.update({k: interpolate(v, {}) for k, v in env_of(compose).items()})
    return env


def to_loopback(env: dict[str, str], tmp: Path, names: dict[str, str]) -> dict[str, str]:
    out = {}
    for key, value in env.items():
        for name, address in names.items():
            value = value.replace(name, address)
        if value.startswith(("/data/", "/opt/")):
            value = str(tmp / value.strip("/").replace("/", "_"))
        out[key] = value
    # What any container has besides its ENV; nothing else of this test process leaks in.
    out.update(PATH=os.environ.get("PATH", "/usr/bin:/bin"), HOME=str(tmp / "home"), LANG="C.UTF-8")
    return out


@pytest.fixture(scope="module")
def compose_stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compose")
    worker_env = container_env("worker", "Dockerfile.worker")
    gateway_env = container_env("gateway", "Dockerfile.gateway")
    # The defaults this test is about: no key set anywhere.
    assert worker_env["WORKER_API_KEY"] == "" and gateway_env["WORKER_API_KEY"] == ""
    assert worker_env["WORKER_HOST"] == "0.0.0.0"

    with contextlib.ExitStack() as stack:
        ollama = stack.enter_context(FakeOllama(models=["qwen3:8b", "qwen3:0.6b"]))
        worker_port, gateway_port = free_port(), free_port()
        names = {
            "http://host.docker.internal:11434": ollama.url,
            "http://worker:8001": f"http://127.0.0.1:{worker_port}",
            "0.0.0.0": "127.0.0.1",
        }
        wenv = to_loopback(worker_env, tmp, names)
        wenv["WORKER_PORT"] = str(worker_port)
        # The packaged embedded model is baked into the image at /opt/rag-models; here it lives where tests keep it.
        if os.environ.get("MODEL_CACHE_DIR"):
            wenv["MODEL_CACHE_DIR"] = os.environ["MODEL_CACHE_DIR"]
        genv = to_loopback(gateway_env, tmp, names)
        (tmp / "home").mkdir()
        worker_cmd = image_cmd(DEPLOY / "Dockerfile.worker")
        gateway_cmd = [a.replace("0.0.0.0", "127.0.0.1") for a in image_cmd(DEPLOY / "Dockerfile.gateway")]
        gateway_cmd[gateway_cmd.index("--port") + 1] = str(gateway_port)
        assert worker_cmd[0] == gateway_cmd[0] == "python"
        worker = ServerProcess(
            [sys.executable, *worker_cmd[1:]], worker_port, wenv, tmp / "worker.log", inherit_env=False
        )
        gateway = ServerProcess(
            [sys.executable, *gateway_cmd[1:]], gateway_port, genv, tmp / "gateway.log", inherit_env=False
        )
        worker.start(timeout=180)  # not enter_context(): __enter__ would start a second process
        stack.callback(worker.stop)
        gateway.start(timeout=120)
        stack.callback(gateway.stop)
        yield worker, gateway, worker_env


def test_the_worker_in_its_container_may_listen_without_a_key(compose_stack):
    """In the container it listens on 0.0.0.0 with no key: compose must say the network is private."""
    from rag_worker.security import open_bind_refusal
    from rag_worker.settings import Settings

    _worker, _gateway, env = compose_stack
    settings = Settings(**{k: v for k, v in env.items() if k in ("WORKER_API_KEY", "WORKER_ALLOW_OPEN")})
    assert settings.worker_api_key is None
    bind = f"{env['WORKER_HOST']}:{env['WORKER_PORT']}"
    assert open_bind_refusal([bind], has_key=False, allow_open=settings.allow_open) is None


def test_a_turn_runs_through_the_gateway_with_the_compose_environment(compose_stack):
    worker, gateway, _env = compose_stack
    with httpx.Client(base_url=gateway.url, timeout=300) as api:
        health = api.get("/health").json()
        assert health["worker"] == "ok" and health["status"] == "ok", health
        token = api.post("/api/auth/register", json={"username": "admin", "password": "a long passphrase"})
        assert token.status_code == 201, token.text
        user = {"Authorization": f"Bearer {token.json()['token']}"}
        index = api.post("/api/indexes", json={"name": "Harbour"}, headers=user)
        assert index.status_code == 201, index.text
        upload = api.post(
            f"/api/indexes/{index.json()['id']}/documents?wait=1",
            headers=user,
            files={
                "file": ("harbour.md", b"# Harbour\n\nThe harbour office opens at seven.", "text/markdown")
            },
        )
        assert upload.status_code == 201, upload.text
        chat = api.post("/api/chats", json={"index_ids": [index.json()["id"]]}, headers=user).json()
        with api.stream(
            "POST",
            f"/api/chats/{chat['id']}/messages/stream",
            json={"message": "When does the harbour office open?"},
            headers=user,
        ) as resp:
            assert resp.status_code == 200, resp.read()
            text = "".join(resp.iter_text())
        assert "event: done" in text and "event: error" not in text, text[-2000:]
        assert "harbour.md" in text
    # The worker's API answers its own clients without a key too (the compose default).
    assert httpx.get(worker.url + "/get_documents", params={"index": "nope"}).status_code == 404
