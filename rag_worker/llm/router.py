"""Which backend and models a turn uses: Ollama when it serves the configured model, else the embedded one."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from ..errors import LLMUnavailable
from ..settings import Settings
from ..telemetry import instrumented
from .base import Resolved
from .local import LocalBackend
from .ollama_backend import OllamaBackend, has_model
from .openai_backend import OpenAIBackend

PROBE_TTL_S = 30.0


@dataclass
class _Probe:
    reachable: bool
    models: list[str] = field(default_factory=list)
    error: str | None = None
    at: float = 0.0


class LLMRouter:
    def __init__(self, settings: Settings, *, probe_ttl_s: float = PROBE_TTL_S):
        self.settings = settings
        self.probe_ttl_s = probe_ttl_s
        # Each backend counted and traced at this one place (rag_worker/telemetry.py), whatever calls it.
        self.ollama = instrumented(OllamaBackend(settings, think=settings.ollama_think))
        # Built now (cheap: no weights are read until the first chat or stream).
        self.local = instrumented(LocalBackend(settings))
        # Only with LLM_BACKEND=openai; `auto` keeps preferring Ollama, then the embedded model.
        self.openai = instrumented(OpenAIBackend(settings)) if settings.llm_backend == "openai" else None
        self._probe: _Probe | None = None
        self._openai_probe: _Probe | None = None
        self._probe_lock = threading.Lock()

    def resolve(self) -> Resolved:
        mode = self.settings.llm_backend
        if mode == "local":
            return self._local("LLM_BACKEND=local")
        if self.openai is not None:
            return self._resolve_openai(self.openai)
        probe = self.probe()
        host, gen = self.settings.ollama_host, self.settings.generation_model
        if mode == "ollama":
            reason = f"LLM_BACKEND=ollama; {self._ollama_state(probe)}"
            return Resolved(self.ollama, gen, self._utility(probe), reason)
        if not probe.reachable:
            return self._local(f"Ollama not reachable at {host}: {probe.error}")
        if not has_model(probe.models, gen):
            return self._local(f"model '{gen}' is not pulled on Ollama at {host} (run: ollama pull {gen})")
        return Resolved(self.ollama, gen, self._utility(probe), self._ollama_state(probe))

    def health(self) -> dict:
        if self.openai is not None:
            return self._openai_health(self.openai)
        resolved = self.resolve()
        probe = self.probe()
        if resolved.backend is self.local:
            usable = not self.local.health().get("error")
        else:
            usable = probe.reachable and has_model(probe.models, resolved.generation_model)
        return {
            # Can a turn be answered now? The worker's /health and the gateway's both read this.
            "ok": usable,
            "backend": resolved.backend.backend,
            "generation_model": resolved.generation_model,
            "utility_model": resolved.utility_model,
            "reason": resolved.reason,
            "ollama": {
                "host": self.settings.ollama_host,
                "reachable": probe.reachable,
                "models": probe.models,
                **({"error": probe.error} if probe.error else {}),
            },
            "local": self.local.health(),
        }

    def probe(self, *, fresh: bool = False) -> _Probe:
        """What Ollama serves, cached for probe_ttl_s so turns don't each pay a round trip."""
        with self._probe_lock:
            cached = self._probe
            if cached is not None and not fresh and time.monotonic() - cached.at < self.probe_ttl_s:
                return cached
            try:
                probe = _Probe(True, self.ollama.list_models())
            except LLMUnavailable as exc:
                # list_models' message already names the host; keep only the cause for the reason line.
                probe = _Probe(False, error=exc.message.split(": ", 1)[-1])
            probe.at = time.monotonic()
            self._probe = probe
            return probe

    def _local(self, reason: str) -> Resolved:
        name, choice = self.local.name, self.local.choice
        # Why this backend, then why this model (EMBEDDED_MODEL, LOCAL_MODEL, or the fallback and its cause).
        return Resolved(self.local, name, name, f"{reason}; {choice.fallback or choice.reason}")

    def _utility(self, probe: _Probe) -> str:
        """The small model for rewrites and checks; the generation model stands in when it is not pulled."""
        utility = self.settings.utility_model
        if not utility or (probe.reachable and not has_model(probe.models, utility)):
            return self.settings.generation_model
        return utility

    def _ollama_state(self, probe: _Probe) -> str:
        host, gen = self.settings.ollama_host, self.settings.generation_model
        if not probe.reachable:
            return f"Ollama not reachable at {host}: {probe.error}"
        if not has_model(probe.models, gen):
            return f"model '{gen}' is not pulled on Ollama at {host} (run: ollama pull {gen})"
        return f"Ollama at {host} serves {gen}"

    # -- LLM_BACKEND=openai ------------------------------------------------------------------------------------

    def probe_openai(self, backend: OpenAIBackend, *, fresh: bool = False) -> _Probe:
        """What the OpenAI-compatible server serves (GET /v1/models), cached like the Ollama probe."""
        with self._probe_lock:
            cached = self._openai_probe
            if cached is not None and not fresh and time.monotonic() - cached.at < self.probe_ttl_s:
                return cached
            try:
                probe = _Probe(True, backend.list_models())
            except LLMUnavailable as exc:
                probe = _Probe(False, error=exc.message.split(": ", 1)[-1])
            probe.at = time.monotonic()
            self._openai_probe = probe
            return probe

    def _resolve_openai(self, backend: OpenAIBackend) -> Resolved:
        probe = self.probe_openai(backend)
        gen, utility = self.settings.generation_model, self.settings.utility_model
        # The generation model stands in for a utility model the server does not serve.
        if not utility or (probe.reachable and utility not in probe.models):
            utility = gen
        return Resolved(backend, gen, utility, f"LLM_BACKEND=openai; {self._openai_state(backend, probe)}")

    def _openai_state(self, backend: OpenAIBackend, probe: _Probe) -> str:
        url, gen = backend.base_url, self.settings.generation_model
        if not url:
            return "OPENAI_BASE_URL is not set"
        if not probe.reachable:
            return f"OpenAI-compatible server not reachable at {url}: {probe.error}"
        if gen not in probe.models:
            served = ", ".join(probe.models[:10]) or "none"
            return f"model '{gen}' is not served at {url} (it serves: {served})"
        return f"{url} serves {gen}"

    def _openai_health(self, backend: OpenAIBackend) -> dict:
        resolved = self._resolve_openai(backend)
        probe = self.probe_openai(backend)
        return {
            "ok": probe.reachable and resolved.generation_model in probe.models,
            "backend": backend.backend,
            "generation_model": resolved.generation_model,
            "utility_model": resolved.utility_model,
            "reason": resolved.reason,
            "openai": {
                "base_url": backend.base_url or None,
                "reachable": probe.reachable,
                "models": probe.models,
                **({"error": probe.error} if probe.error else {}),
            },
        }
