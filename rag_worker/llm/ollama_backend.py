"""Generation through an Ollama server (the production backend), using the official `ollama` client."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import ollama

from ..errors import LLMUnavailable
from ..settings import Settings
from .base import CancelToken, LLMFailed, ModelMissing, ThinkFilter, strip_think

PROBE_TIMEOUT_S = 2.0


def full_name(name: str) -> str:
    """Ollama's canonical `model:tag` form: a name without a tag means `:latest`."""
    name = name.strip().lower()
    last = name.rsplit("/", 1)[-1]
    return name if ":" in last else f"{name}:latest"


def has_model(pulled: list[str], name: str) -> bool:
    want = full_name(name)
    return any(full_name(p) == want for p in pulled)


class OllamaBackend:
    backend = "ollama"

    def __init__(self, settings: Settings, *, think: bool | None = None):
        self.host = settings.ollama_host
        self.client = ollama.Client(host=self.host, timeout=settings.llm_timeout_s)
        # A short-timeout client for probes, so a blackholed host costs 2 s and not llm_timeout_s.
        self.probe_client = ollama.Client(host=self.host, timeout=PROBE_TIMEOUT_S)
        # None: send nothing and let the model's default apply; <think> blocks in content are stripped anyway.
        self.think = think

    def list_models(self) -> list[str]:
        """Names of the pulled models; raises LLMUnavailable when the server does not answer."""
        try:
            listing = self.probe_client.list()
        except (ConnectionError, httpx.HTTPError, ollama.ResponseError) as exc:
            raise LLMUnavailable(f"Ollama not reachable at {self.host}: {_describe(exc)}") from exc
        return [m.model for m in listing.models if m.model]

    def chat(
        self,
        messages: list[dict],
        *,
        model: str,
        temperature: float | None = None,
        max_tokens: int | None = None,
    ) -> str:
        try:
            response = self.client.chat(
                model=model,
                messages=messages,
                stream=False,
                options=_options(temperature, max_tokens),
                **self._extra(),
            )
        except Exception as exc:
            raise self._error(exc, model, started=False) from exc
        return strip_think(response.message.content or "")

    def stream(
        self,
        messages: list[dict],
        *,
        model: str,
        temperature: float | None = None,
        max_tokens: int | None = None,
        cancel: CancelToken | None = None,
    ) -> Iterator[str]:
        """Yield pieces of the reply as Ollama produces them.

        Closing this generator (or cancelling) closes the ollama client's generator, which closes the HTTP
        response: Ollama sees the connection drop and stops generating.
        """
        chunks = None
        think = ThinkFilter()
        started = False
        try:
            chunks = self.client.chat(
                model=model,
                messages=messages,
                stream=True,
                options=_options(temperature, max_tokens),
                **self._extra(),
            )
            finished = False
            for chunk in chunks:
                started = True
                if cancel is not None and cancel.cancelled:
                    return
                text = think.feed(chunk.message.content or "")
                if text:
                    yield text
                if chunk.done:
                    finished = True
                    break
            if not finished:
                raise LLMFailed(
                    f"Ollama at {self.host} ended the reply from {model} before it was done",
                )
            rest = think.flush()
            if rest:
                yield rest
        except LLMUnavailable:
            raise
        except Exception as exc:
            raise self._error(exc, model, started=started) from exc
        finally:
            if chunks is not None:
                chunks.close()

    def health(self) -> dict:
        try:
            return {"host": self.host, "reachable": True, "models": self.list_models()}
        except LLMUnavailable as exc:
            return {"host": self.host, "reachable": False, "models": [], "error": exc.message}

    def _extra(self) -> dict[str, Any]:
        return {} if self.think is None else {"think": self.think}

    def _error(self, exc: Exception, model: str, *, started: bool) -> LLMUnavailable:
        """Translate a client failure into the 503 the worker answers with (a 404 for a model Ollama lacks)."""
        if isinstance(exc, ollama.ResponseError) and exc.status_code == 404:
            return ModelMissing(
                f"model '{model[:200]}' is not pulled on Ollama at {self.host} (run: ollama pull {model[:200]})",
                model,
            )
        if started:
            return LLMFailed(
                f"Ollama at {self.host} failed while generating with {model}: {_describe(exc)}",
            )
        if isinstance(exc, ConnectionError | httpx.ConnectError | httpx.ConnectTimeout):
            return LLMUnavailable(f"Ollama not reachable at {self.host}: {_describe(exc)}")
        if isinstance(exc, httpx.TimeoutException):
            return LLMFailed(f"Ollama at {self.host} did not answer within the timeout (LLM_TIMEOUT_S)")
        return LLMFailed(f"Ollama at {self.host} failed with {model}: {_describe(exc)}")


def _options(temperature: float | None, max_tokens: int | None) -> dict[str, Any] | None:
    options: dict[str, Any] = {}
    if temperature is not None:
        options["temperature"] = temperature
    if max_tokens is not None:
        options["num_predict"] = max_tokens
    return options or None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ollama.ResponseError):
        return exc.error
    return str(exc) or type(exc).__name__
