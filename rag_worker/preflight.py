"""Start-up preflight: is Ollama reachable from here, are the configured models pulled, and what to do if not.

Called once when the worker starts (and by run_system.py before it starts anything). It only reports: with
LLM_BACKEND=auto the worker still answers on the embedded model when Ollama is missing, so nothing here stops
the start. Plain urllib keeps it free of the LLM client's own retries and timeouts.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from .settings import Settings

log = logging.getLogger("rag_worker.preflight")


@dataclass
class OllamaStatus:
    host: str
    reachable: bool
    error: str | None = None
    version: str | None = None
    available: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        return self.reachable and not self.missing


def same_model(wanted: str, pulled: str) -> bool:
    """Ollama names without a tag mean ':latest' (`qwen3` is `qwen3:latest`)."""

    def norm(name: str) -> str:
        return name if ":" in name else f"{name}:latest"

    return norm(wanted) == norm(pulled)


def probe_ollama(host: str, models: list[str], timeout: float = 3.0) -> OllamaStatus:
    """Ask Ollama for its pulled models (`GET /api/tags`) and compare them with the ones configured."""
    host = host.rstrip("/")
    if "://" not in host:  # Ollama's own CLI accepts a bare host:port in OLLAMA_HOST
        host = f"http://{host}"
    try:
        with urllib.request.urlopen(f"{host}/api/tags", timeout=timeout) as resp:
            tags = json.loads(resp.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        return OllamaStatus(host, False, f"HTTP {exc.code} from {host}/api/tags")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return OllamaStatus(host, False, str(reason) or type(exc).__name__)
    available = [m.get("name") or m.get("model") or "" for m in tags.get("models", [])]
    wanted = list(dict.fromkeys(m for m in models if m))
    missing = [m for m in wanted if not any(same_model(m, a) for a in available)]
    version = None
    try:
        with urllib.request.urlopen(f"{host}/api/version", timeout=timeout) as resp:
            version = json.loads(resp.read().decode("utf-8")).get("version")
    except (urllib.error.URLError, OSError, ValueError):
        pass
    return OllamaStatus(host, True, None, version, available, missing)


@dataclass
class OpenAIStatus:
    base_url: str
    reachable: bool
    error: str | None = None
    available: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        return self.reachable and not self.missing


def probe_openai(base_url: str, api_key: str, models: list[str], timeout: float = 3.0) -> OpenAIStatus:
    """Ask an OpenAI-compatible server for its models (`GET /v1/models`) and compare with the ones configured."""
    base_url = base_url.rstrip("/")
    if not base_url:
        return OpenAIStatus("", False, "OPENAI_BASE_URL is not set")
    request = urllib.request.Request(
        f"{base_url}/models", headers={"Authorization": f"Bearer {api_key or 'no-key'}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            listing = json.loads(resp.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        return OpenAIStatus(base_url, False, f"HTTP {exc.code} from {base_url}/models")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return OpenAIStatus(base_url, False, str(getattr(exc, "reason", exc)) or type(exc).__name__)
    available = [str(m.get("id")) for m in listing.get("data") or [] if isinstance(m, dict)]
    missing = [m for m in dict.fromkeys(models) if m and m not in available]
    return OpenAIStatus(base_url, True, None, available, missing)


def openai_status(settings: Settings) -> OpenAIStatus:
    key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else ""
    return probe_openai(settings.openai_base_url, key, configured_models(settings))


def in_container() -> bool:
    return Path("/.dockerenv").exists() or os.environ.get("container") is not None  # noqa: SIM112 (podman sets lower-case)


def advice(status: OllamaStatus, backend: str, *, container: bool | None = None) -> list[str]:
    """What a person should do about `status`, in the order they should try it. Empty when all is well."""
    container = in_container() if container is None else container
    if status.reachable:
        return [f"pull the missing model: ollama pull {m}" for m in status.missing]
    tips = []
    if container:
        tips += [
            f"Ollama is not reachable from inside the container at {status.host}.",
            "On the host, make Ollama listen beyond loopback: OLLAMA_HOST=0.0.0.0 ollama serve "
            "(systemd: `systemctl edit ollama` and add Environment=OLLAMA_HOST=0.0.0.0, then restart it).",
            "Keep `extra_hosts: host.docker.internal:host-gateway` on the worker so the name resolves on Linux.",
            "Or run Ollama in a container: DOCKER_OLLAMA_HOST=http://ollama:11434 docker compose --profile ollama up -d",
        ]
    else:
        tips += [
            f"Ollama is not reachable at {status.host}: install it from https://ollama.com and run `ollama serve`,",
            "or point OLLAMA_HOST at the machine that runs it.",
        ]
    if backend == "auto":
        tips.append(
            "LLM_BACKEND=auto: the worker answers with the embedded local model until Ollama is reachable."
        )
    elif backend == "ollama":
        tips.append(
            "LLM_BACKEND=ollama: chat turns fail until Ollama is reachable (set LLM_BACKEND=auto to fall back)."
        )
    return tips


def configured_models(settings: Settings) -> list[str]:
    return list(dict.fromkeys(m for m in (settings.generation_model, settings.utility_model) if m))


def run_preflight(settings: Settings, logger: logging.Logger | None = None) -> OllamaStatus | None:
    """Log what the worker will use for generation and why. Returns the Ollama probe (None when not used)."""
    logger = logger or log
    if settings.llm_backend == "local":
        logger.info("LLM_BACKEND=local: generation uses the embedded model; Ollama is not consulted")
        return None
    if settings.llm_backend == "openai":
        st = openai_status(settings)
        if st.ready:
            logger.info(
                "OpenAI-compatible server at %s serves %s",
                st.base_url,
                ", ".join(configured_models(settings)),
            )
        elif st.reachable:
            logger.warning(
                "the server at %s does not serve %s (it serves: %s)",
                st.base_url,
                ", ".join(st.missing),
                ", ".join(st.available),
            )
        else:
            logger.warning(
                "LLM_BACKEND=openai: server not reachable at %s (%s); turns fail until it is",
                st.base_url or "?",
                st.error,
            )
        return None
    status = probe_ollama(settings.ollama_host, configured_models(settings))
    if status.ready:
        logger.info(
            "Ollama %s reachable at %s; models ready: %s",
            status.version or "",
            status.host,
            ", ".join(configured_models(settings)),
        )
        return status
    if status.reachable:
        logger.warning(
            "Ollama reachable at %s but models are not pulled: %s", status.host, ", ".join(status.missing)
        )
    else:
        logger.warning("Ollama not reachable at %s (%s)", status.host, status.error)
    for tip in advice(status, settings.llm_backend):
        logger.warning("  %s", tip)
    return status
