"""What every LLM backend offers the pipeline: chat, stream (cancellable), health."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ..errors import LLMUnavailable, NotFound

DEFAULT_MAX_TOKENS = 256


class LLMFailed(LLMUnavailable):
    """The model was reached but failed: broke off while generating, timed out, or answered with an error (503
    `llm_failed`; `LLMUnavailable` itself, `llm_unavailable`, is a backend or model that is not there)."""

    code = "llm_failed"


class ModelMissing(LLMUnavailable):
    """The LLM server has no model of this name (503 `llm_unavailable`: the configured model is not pulled or
    served, an operator's matter). `chosen()` is the same for a model the request named."""

    def __init__(self, message: str, model: str):
        super().__init__(message)
        self.model = model

    def chosen(self) -> ModelNotFound:
        return ModelNotFound(f"options.model names a model the LLM server lacks: {self.message}")


class ModelNotFound(NotFound):
    """A model the request chose (`options.model`) that the LLM server does not have: 404 `model_not_found`,
    the client's mistake rather than the worker's outage."""

    code = "model_not_found"

    def __init__(self, message: str):
        super().__init__(message, field="options.model")


class CancelToken:
    """Set by the HTTP layer when the client goes away; backends stop generating at the next piece.

    A plain flag (no threading.Event): under gevent's monkey-patching an Event would be a greenlet primitive,
    and the local backend reads this flag from a native thread.
    """

    def __init__(self) -> None:
        self.cancelled = False
        self._callbacks: list[Callable[[], None]] = []

    def cancel(self) -> None:
        if self.cancelled:
            return
        self.cancelled = True
        for callback in self._callbacks:
            callback()

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """Run callback when cancelled (immediately if it already is)."""
        self._callbacks.append(callback)
        if self.cancelled:
            callback()


@runtime_checkable
class LLMBackend(Protocol):
    backend: str  # "ollama" | "openai" | "local"

    def chat(
        self,
        messages: list[dict],
        *,
        model: str,
        temperature: float | None = None,
        max_tokens: int | None = None,
    ) -> str: ...

    def stream(
        self,
        messages: list[dict],
        *,
        model: str,
        temperature: float | None = None,
        max_tokens: int | None = None,
        cancel: CancelToken | None = None,
    ) -> Iterator[str]: ...

    def health(self) -> dict: ...


@dataclass
class Resolved:
    """The backend and model names one turn uses (decided once per turn by LLMRouter.resolve)."""

    backend: LLMBackend
    generation_model: str
    utility_model: str
    reason: str


def strip_think(text: str) -> str:
    """Drop qwen3-style <think>...</think> blocks (an unclosed one runs to the end: the answer never came)."""
    if "<think>" not in text:
        return text
    f = ThinkFilter()
    return f.feed(text) + f.flush()


class ThinkFilter:
    """Streaming version of strip_think: feed pieces, get the visible text; tags may be split across pieces."""

    OPEN, CLOSE = "<think>", "</think>"

    def __init__(self) -> None:
        self._buffer = ""
        self._thinking = False
        self._after_block = False  # swallow the blank lines a model writes after </think>

    def feed(self, piece: str) -> str:
        self._buffer += piece
        out: list[str] = []
        while self._buffer:
            tag = self.CLOSE if self._thinking else self.OPEN
            at = self._buffer.find(tag)
            if at >= 0:
                if not self._thinking:
                    out.append(self._visible(self._buffer[:at]))
                self._buffer = self._buffer[at + len(tag) :]
                self._thinking = not self._thinking
                self._after_block = not self._thinking
                continue
            # Keep back a tail that could be the start of the tag; release the rest.
            keep = _partial_suffix(self._buffer, tag)
            ready, self._buffer = (
                self._buffer[: len(self._buffer) - keep],
                self._buffer[len(self._buffer) - keep :],
            )
            if not self._thinking:
                out.append(self._visible(ready))
            break
        return "".join(out)

    def flush(self) -> str:
        rest, self._buffer = self._buffer, ""
        return "" if self._thinking else self._visible(rest)

    def _visible(self, text: str) -> str:
        if self._after_block:
            text = text.lstrip()
            if text:
                self._after_block = False
        return text


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
