"""HTTP probes of the services' /health, and the one line that says which LLM answers."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from launcher.processes import Child


@dataclass
class Probe:
    status: int | None  # HTTP status, None when nothing answered
    body: dict = field(default_factory=dict)
    error: str | None = None


def get_json(url: str, timeout: float = 5.0, headers: dict[str, str] | None = None) -> Probe:
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers or {}), timeout=timeout
        ) as resp:
            return Probe(resp.status, _json_or_empty(resp.read()))
    except urllib.error.HTTPError as exc:
        return Probe(exc.code, _json_or_empty(exc.read()), f"HTTP {exc.code}")
    except (urllib.error.URLError, OSError) as exc:
        return Probe(None, {}, str(getattr(exc, "reason", exc)))


def _json_or_empty(raw: bytes) -> dict:
    try:
        data = json.loads(raw.decode("utf-8"))
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def describe_llm(llm: dict) -> str:
    """One line from the worker's /health `llm` part: the Ollama model, or the embedded model and why."""
    if not llm:
        return "unknown (the worker's /health has no llm part)"
    backend = str(llm.get("backend") or "?")
    model = llm.get("generation_model") or llm.get("model") or "?"
    reason = llm.get("reason") or ""
    if backend == "openai":
        server = llm.get("openai") or {}
        text = f"OpenAI-compatible server, model {model} at {server.get('base_url') or '?'}"
        return text if llm.get("ok") else f"{text} -- {reason}"
    if backend == "ollama":
        ollama = llm.get("ollama") or {}
        text = f"Ollama, model {model}" + (f" at {ollama['host']}" if ollama.get("host") else "")
        # The reason of a working Ollama only repeats the line; a failing one says what to fix.
        return text if ollama.get("reachable", True) and "not pulled" not in reason else f"{text} -- {reason}"
    return f"embedded model {model} ({reason})" if reason else f"embedded model {model}"


def worker_auth(settings) -> dict[str, str]:
    """The worker's /health shows its details only to callers with the key (when one is set)."""
    key = settings.worker_api_key
    return {"Authorization": f"Bearer {key.get_secret_value()}"} if key is not None else {}


def wait_healthy(child: Child, timeout: float, headers: dict[str, str] | None = None) -> Probe:
    """Wait until the child's /health answers with JSON (200 ok, or 503 degraded: it is up and says why)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert child.proc is not None
        if child.proc.poll() is not None:
            raise StartupError(f"{child.name} exited with code {child.proc.returncode} while starting", child)
        probe = get_json(child.url + "/health", timeout=5, headers=headers)
        if probe.status is not None and probe.body:
            return probe
        time.sleep(0.3)
    raise StartupError(f"{child.name} did not answer {child.url}/health within {timeout:.0f} s", child)


class StartupError(RuntimeError):
    def __init__(self, message: str, child: Child | None = None):
        super().__init__(message)
        self.child = child


class Shutdown(Exception):
    """Raised in the supervisor by SIGTERM (Ctrl-C raises KeyboardInterrupt)."""
