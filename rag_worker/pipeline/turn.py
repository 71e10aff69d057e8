"""Per-turn context shared by the stages: the validated request, resolved options, clocks and flags."""

from __future__ import annotations

import re
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..i18n.messages import message
from ..schemas import ChatRequest
from ..telemetry import Carried, stage_span
from . import utility
from .events import Step
from .prompts import text_in

if TYPE_CHECKING:  # pragma: no cover
    from ..llm import CancelToken, Resolved
    from ..services import Services

YES_NO_RE = re.compile(r"\b(yes|no)\b", re.IGNORECASE)


@dataclass
class TurnOptions:
    """Per-request switches merged over the worker's defaults: an argument, never a global."""

    route: str
    rewrite: bool
    hyde: bool
    rerank: bool
    mode: str
    top_k: int
    provenance: str
    model: str | None
    temperature: float | None
    max_tokens: int | None
    prompts: dict[str, str]
    stop: list[str] = field(default_factory=list)
    grounding: str | None = None  # None: the backend's default (grounding.policy.policy_for)
    answer_mode: str | None = None


@dataclass
class Turn:
    services: Services
    request: ChatRequest
    options: TurnOptions
    llm: Resolved
    cancel: CancelToken
    started: float = field(default_factory=time.monotonic)
    timings: dict[str, int | str] = field(default_factory=dict)
    flags: dict[str, object] = field(default_factory=dict)
    # What the generator read, {ref: text} (set by generate.sources_message), and the grounding check's result.
    read: dict[str, str] = field(default_factory=dict)
    grounding: dict | None = None
    _vectors: dict[str, np.ndarray] = field(default_factory=dict)
    # The embedder the turn's indexes were built with (chat.prepare sets it; None: the worker's default). The
    # query, the passages and the answer's sentences are all compared in its space.
    embedder: Any = None
    # The answer's language (ISO 639-1, rag_worker/i18n.choose; None: nothing to go on, English) and why
    # (detected, hinted, guessed, fallback).
    language: str | None = None
    language_source: str = "fallback"
    # Stored vectors of the chunks this turn's search returned, {(index, chunk id): vector} (for provenance).
    chunk_vectors: dict[tuple[str, str], np.ndarray] = field(default_factory=dict)
    # The neighbouring chunks context expansion added, {(index, chunk id)}: the grounding check reads their
    # stored sentence vectors with the documents' own (grounding.stored).
    context_chunks: set[tuple[str, str]] = field(default_factory=set)
    # The chunks whose stored sentence vectors this turn has read already, and how many sentences it got from them.
    sentences_read: set[tuple[str, str]] = field(default_factory=set)
    stored_sentences: int = 0
    # How the turn ended, for the metrics (answered, abstained, stopped, failed), the route it took and the
    # tokens it streamed; and the request's context for its logs and spans (rag_worker/telemetry.py).
    outcome: str = "stopped"
    route: str | None = None
    tokens: int = 0
    carried: Carried = field(default_factory=Carried)

    @property
    def settings(self):
        return self.services.settings

    def elapsed_ms(self) -> int:
        return int((time.monotonic() - self.started) * 1000)

    def step(self, name: str, label: str, method: str | None = None, **detail) -> Step:
        return Step(name, label, self.elapsed_ms(), method, detail)

    @contextmanager
    def timed(self, key: str):
        """Time a stage into `timings[key]` (the done event's, and the stage histogram's at the turn's end),
        in a span of its own when tracing is on."""
        t0 = time.monotonic()
        try:
            with stage_span(key.removesuffix("_ms")):
                yield
        finally:
            self.timings[key] = self.timings.get(key, 0) + int((time.monotonic() - t0) * 1000)

    def prompt(self, name: str) -> str:
        """The prompt or fixed text `name`: the request's override, else the default, a fixed text in the
        user's language (`language`), the system prompt told which language to answer in."""
        if self.options.prompts and self.options.prompts.get(name):
            return self.options.prompts[name]
        return text_in(name, self.language)

    def message(self, key: str, **fields: str) -> str:
        """A fixed text of the chat in the user's language (English when the catalogue lacks it)."""
        return message(key, self.language, **fields)

    @property
    def generation_model(self) -> str:
        return self.options.model or self.llm.generation_model

    @property
    def space(self):
        """The embedder of this turn's comparisons (`embedder`, or the worker's default)."""
        return self.embedder if self.embedder is not None else self.services.embedder

    def evidence_thresholds(self) -> tuple[float, float]:
        """(abstain below, relevant above) on the best passage's cosine, in this turn's embedder's scale: the
        settings' for the default embedder, the embedder's own for another (its cosines sit higher)."""
        own = getattr(self.space, "evidence_thresholds", None)
        if own is not None and self.space is not self.services.embedder:
            return own
        return self.settings.abstain_below, self.settings.relevant_above

    def embed_query(self, text: str) -> np.ndarray:
        return self.space.embed_query(text)

    def embed_texts(self, texts: list[str]) -> np.ndarray:
        """Embeddings of `texts`, computed once per turn: the missing ones in one batched call, the rest reused
        (the grounding check, the extractive answer and provenance embed many of the same sentences). Across
        turns the embedder remembers recent texts (TEXT_CACHE_SIZE): the same passages come back."""
        missing = list(dict.fromkeys(t for t in texts if t not in self._vectors))
        if missing:
            for text, vec in zip(missing, self.space.embed_cached(missing), strict=True):
                self._vectors[text] = vec
        dim = self.space.dim
        return np.stack([self._vectors[t] for t in texts]) if texts else np.zeros((0, dim), dtype=np.float32)

    def know_vectors(self, vectors: dict[str, np.ndarray]) -> int:
        """Take vectors of texts computed earlier in this turn's space (sentence vectors stored at ingestion), so
        `embed_texts` does not embed them again; returns how many were new to the turn."""
        new = {t: v for t, v in vectors.items() if t not in self._vectors}
        self._vectors.update(new)
        return len(new)

    def utility_chat(self, messages: list[dict], max_tokens: int = 64) -> str:
        """A short call to the utility model that raises on failure (`ask_utility` falls back instead)."""
        return utility.chat(self.llm, messages, max_tokens)

    def ask_utility(self, messages: list[dict], *, max_tokens: int, failing: str) -> str | None:
        """The utility model's reply, or None (logged: "<failing>: <error>") for the caller's fallback."""
        return utility.ask(self.llm, messages, max_tokens=max_tokens, failing=failing)

    def model_judges(self, step: str) -> bool:
        """Whether the YES/NO step `step` (relevance, fetch_check, triage) asks the utility model when its
        model-free signal is unsure: always on Ollama or an OpenAI-compatible server; on the embedded model only
        in the steps its measurements chose (`Packaged.judges`, rag_worker/llm/embedded.py)."""
        backend = self.llm.backend
        if getattr(backend, "backend", None) != "local":
            return True
        judges = getattr(backend, "judges", None)
        return judges is None or step in judges

    def ask_yes_no(self, instruction: str, body: str) -> bool | None:
        """Ask the utility model a YES/NO question; None when it is unavailable or answers neither."""
        messages = [
            {"role": "system", "content": instruction},
            {"role": "user", "content": f"{body}\n\nAnswer YES or NO."},
        ]
        reply = self.ask_utility(messages, max_tokens=4, failing="utility model failed in a yes/no step")
        match = None if reply is None else YES_NO_RE.search(reply)
        return None if match is None else match.group(1).lower() == "yes"


def history_excerpt(turn: Turn, max_messages: int = 6, max_chars: int = 2000) -> str:
    """The last user/assistant exchanges as plain text, for the rewrite and check prompts."""
    lines = []
    for msg in turn.request.history[-max_messages:]:
        if msg.role == "system":
            continue
        lines.append(f"{msg.role}: {msg.content.strip()[:600]}")
    text = "\n".join(lines)
    return text[-max_chars:]
