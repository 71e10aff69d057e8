"""Generation through an OpenAI-compatible server (vLLM, llama.cpp's server, LM Studio, ...) with the `openai` SDK.

LLM_BACKEND=openai: OPENAI_BASE_URL is the server's `/v1` address, OPENAI_API_KEY its key (local servers usually
take any), GENERATION_MODEL / UTILITY_MODEL the model ids it serves (`GET /v1/models`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai

from ..errors import LLMUnavailable
from ..settings import Settings
from .base import CancelToken, LLMFailed, ModelMissing, ThinkFilter, strip_think

PROBE_TIMEOUT_S = 2.0
NO_KEY = "no-key"  # the SDK insists on a key; servers without one ignore it


class OpenAIBackend:
    backend = "openai"

    def __init__(self, settings: Settings):
        self.base_url = settings.openai_base_url.rstrip("/")
        key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else ""
        # No retries: a turn fails fast with a clear 503 rather than hammering a struggling server.
        self.client = openai.OpenAI(
            base_url=self.base_url or "http://openai-base-url-unset.invalid/v1",
            api_key=key or NO_KEY,
            timeout=settings.llm_timeout_s,
            max_retries=0,
        )
        # A short-timeout client for probes, so a blackholed host costs 2 s and not LLM_TIMEOUT_S.
        self.probe_client = self.client.with_options(timeout=PROBE_TIMEOUT_S)

    def _require_url(self) -> None:
        if not self.base_url:
            raise LLMUnavailable(
                "LLM_BACKEND=openai needs OPENAI_BASE_URL: the /v1 address of an OpenAI-compatible server"
            )

    def list_models(self) -> list[str]:
        """Ids of the models the server serves; raises LLMUnavailable when it does not answer."""
        self._require_url()
        try:
            return [m.id for m in self.probe_client.models.list()]
        except openai.OpenAIError as exc:
            raise LLMUnavailable(
                f"OpenAI-compatible server not reachable at {self.base_url}: {_describe(exc)}"
            ) from exc

    def chat(
        self,
        messages: list[dict],
        *,
        model: str,
        temperature: float | None = None,
        max_tokens: int | None = None,
    ) -> str:
        self._require_url()
        try:
            response = self.client.chat.completions.create(
                model=model, messages=messages, stream=False, **_params(temperature, max_tokens)
            )
        except openai.OpenAIError as exc:
            raise self._error(exc, model, started=False) from exc
        if not response.choices:
            return ""
        return strip_think(response.choices[0].message.content or "")

    def stream(
        self,
        messages: list[dict],
        *,
        model: str,
        temperature: float | None = None,
        max_tokens: int | None = None,
        cancel: CancelToken | None = None,
    ) -> Iterator[str]:
        """Yield pieces of the reply as the server produces them.

        Closing this generator (or cancelling) closes the SDK's stream, which closes the HTTP response: the server
        sees the connection drop and stops generating.
        """
        self._require_url()
        stream = None
        think = ThinkFilter()
        started = finished = False
        try:
            stream = self.client.chat.completions.create(
                model=model, messages=messages, stream=True, **_params(temperature, max_tokens)
            )
            for chunk in stream:
                started = True
                if cancel is not None and cancel.cancelled:
                    return
                if not chunk.choices:  # a usage-only chunk
                    continue
                choice = chunk.choices[0]
                text = think.feed(choice.delta.content or "")
                if text:
                    yield text
                finished = finished or choice.finish_reason is not None
            if not finished:
                raise LLMFailed(
                    f"the server at {self.base_url} ended the reply from {model} before it was done",
                )
            rest = think.flush()
            if rest:
                yield rest
        except openai.OpenAIError as exc:
            raise self._error(exc, model, started=started) from exc
        finally:
            if stream is not None:
                stream.close()

    def health(self) -> dict:
        return {"base_url": self.base_url or None}

    def _error(self, exc: BaseException, model: str, *, started: bool) -> LLMUnavailable:
        where = self.base_url
        if isinstance(exc, openai.APITimeoutError):
            return LLMFailed(f"the server at {where} did not answer within the timeout (LLM_TIMEOUT_S)")
        if isinstance(exc, openai.APIConnectionError):
            if started:
                return LLMFailed(f"the server at {where} dropped the reply from {model}")
            return LLMUnavailable(f"OpenAI-compatible server not reachable at {where}: {_describe(exc)}")
        if isinstance(exc, openai.AuthenticationError):
            return LLMUnavailable(f"the server at {where} refused OPENAI_API_KEY: {_describe(exc)}")
        if isinstance(exc, openai.NotFoundError):
            return ModelMissing(
                f"model '{model[:200]}' is not served at {where} (GET {where}/models lists them)", model
            )
        return LLMFailed(f"the server at {where} failed with {model}: {_describe(exc)}")


def _params(temperature: float | None, max_tokens: int | None) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if temperature is not None:
        params["temperature"] = temperature
    if max_tokens is not None:
        params["max_tokens"] = max_tokens
    return params


def _describe(exc: BaseException) -> str:
    if isinstance(exc, openai.APIStatusError):
        body = exc.body if isinstance(exc.body, dict) else {}
        message = body.get("message") or (body.get("error") or {}).get("message") if body else None
        return f"HTTP {exc.status_code}: {message or exc.message}"
    return str(exc) or type(exc).__name__
