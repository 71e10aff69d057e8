"""Generation: the messages the model sees, and the token stream."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..i18n.messages import FALLBACK
from ..llm.base import ModelMissing
from .prompts import text_in
from .turn import Turn

DOC_CHARS = 2400  # per document, so one long context can't crowd out the others


def sources_message(turn: Turn, documents: list[dict]) -> str:
    lines = [turn.prompt("sources")]
    bodies = local_bodies(turn, documents) if is_local(turn) else None
    turn.read = {}
    for i, d in enumerate(documents):
        where = d["filename"] or d["id"]
        if d.get("page") is not None:
            where += f", page {d['page']}"
        body = (d.get("context") or d["text"]).strip()[:DOC_CHARS] if bodies is None else bodies[i]
        if body is None:
            continue
        turn.read[d["ref"]] = body
        lines.append(f"\n[{d['ref']}] {where}\n{body}")
    return "\n".join(lines)


def warm_messages(language: str = FALLBACK) -> list[dict]:
    """The start every answer in `language` shares (the instructions, then the sources' heading), as the embedded
    model is warmed with it at load: llama.cpp keeps that state and reuses it, so a question's first token waits
    only for its own sources and words (at 40-80 prompt tokens/s on 2 cores, the instructions are 1.5 s)."""
    head = f"{text_in('system', language)}\n\n{text_in('sources', language)}"
    return [{"role": "system", "content": head}, {"role": "user", "content": "?"}]


def is_local(turn: Turn) -> bool:
    return getattr(turn.llm.backend, "backend", None) == "local"


# Tokens kept free in the embedded model's context for the instructions, the chat template and the sources' labels.
INSTRUCTIONS_TOKENS = 256


def local_max_tokens(turn: Turn) -> int:
    return turn.options.max_tokens or turn.settings.local_max_tokens


def local_bodies(turn: Turn, documents: list[dict]) -> list[str | None]:
    """What the embedded model reads of each document: the best passages whole (with their neighbours when they
    fit, else the passage alone), the rest left out (None); only the first is cut when even it alone is too long.
    The budget is LOCAL_CONTEXT_TOKENS (or the model's default), never more than its context leaves after the
    instructions, the question and the answer; everything is counted by the model's own tokenizer. A small
    model reading five cut passages took 22 s to its first token."""
    backend = turn.llm.backend
    count = backend.count_tokens  # llama.cpp's tokenizer, the one the model reads with
    room = backend.n_ctx - local_max_tokens(turn) - count(turn.request.prompt) - INSTRUCTIONS_TOKENS
    budget = max(0, min(turn.settings.local_context_tokens or backend.context_tokens, room))
    out: list[str | None] = []
    for d in documents:
        fitted = None
        for text in (d.get("context"), d["text"]):
            if text and count(text) + 8 <= budget:
                fitted = text.strip()
                break
        if fitted is None and not any(out):
            fitted = _cut(d["text"].strip(), budget, backend)
        if fitted is not None:
            budget -= count(fitted) + 8
        out.append(fitted)
    return out


def _cut(text: str, budget: int, backend) -> str:
    """The longest run of `text`'s leading paragraphs within budget tokens, or failing that its first tokens."""
    kept = ""
    for para in text.split("\n\n"):
        candidate = f"{kept}\n\n{para}" if kept else para
        if backend.count_tokens(candidate) > budget:
            break
        kept = candidate
    return kept or backend.cut(text, budget)


def llm_messages(turn: Turn, system: str, sources: str | None) -> list[dict]:
    """One leading system message (instructions, then the sources), recent history, then the question.

    Small models follow a single leading system message far better than instructions split around the
    question (SmolLM2 answered the Eiffel question only this way). With fresh sources, the history's own source
    messages are left out: their [S1]... would collide with the new numbering.
    """
    head = f"{system}\n\n{sources}" if sources else system
    if is_local(turn):  # the embedded model's context, in its own tokens (4 more per message: the template)
        backend = turn.llm.backend
        cost_of = backend.count_tokens
        budget = backend.n_ctx - local_max_tokens(turn) - cost_of(head) - cost_of(turn.request.prompt) - 32
    else:
        cost_of = len
        budget = turn.settings.context_chars - len(head) - len(turn.request.prompt)
    kept: list[dict] = []
    for msg in reversed(turn.request.history):
        if sources and msg.role == "system":
            continue
        cost = cost_of(msg.content) + (4 if is_local(turn) else 0)
        if cost > budget:
            break
        budget -= cost
        kept.append({"role": msg.role, "content": msg.content})
    return [
        {"role": "system", "content": head},
        *reversed(kept),
        {"role": "user", "content": turn.request.prompt},
    ]


def stream_answer(turn: Turn, messages: list[dict]) -> Iterator[str]:
    """Tokens from the generation model; closing this iterator stops the model. A model the request chose that
    the server lacks is the request's 404 (`model_not_found`), the configured one the worker's 503."""
    try:
        yield from _generated(turn, messages)
    except ModelMissing as exc:
        if turn.options.model and exc.model == turn.options.model:
            raise exc.chosen() from exc
        raise


def _generated(turn: Turn, messages: list[dict]) -> Iterator[str]:
    stream = turn.llm.backend.stream(
        messages,
        model=turn.generation_model,
        temperature=turn.options.temperature,
        max_tokens=local_max_tokens(turn) if is_local(turn) else turn.options.max_tokens,
        cancel=turn.cancel,
    )
    with contextlib.closing(stream):  # leaving early (a stop sequence, a client gone) stops the model
        if not turn.options.stop:
            yield from stream
            return
        stops = StopFilter(turn.options.stop)
        for piece in stream:
            text, hit = stops.feed(piece)
            if text:
                yield text
            if hit:
                return
        if rest := stops.flush():
            yield rest


class StopFilter:
    """Cut a token stream before the first stop sequence, which may be split across pieces."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.keep = max((len(s) for s in self.stops), default=1) - 1
        self.buffer = ""

    def feed(self, piece: str) -> tuple[str, bool]:
        """The text safe to show now, and whether a stop sequence was reached."""
        self.buffer += piece
        cuts = [at for s in self.stops if (at := self.buffer.find(s)) >= 0]
        if cuts:
            text, self.buffer = self.buffer[: min(cuts)], ""
            return text, True
        ready = len(self.buffer) - self.keep
        if ready <= 0:
            return "", False
        text, self.buffer = self.buffer[:ready], self.buffer[ready:]
        return text, False

    def flush(self) -> str:
        text, self.buffer = self.buffer, ""
        return text


def words_of(text: str) -> Iterator[str]:
    """Split a canned reply into word-sized tokens so it streams like a model's answer."""
    start = 0
    for i, ch in enumerate(text):
        if ch == " " and i > start:
            yield text[start : i + 1]
            start = i + 1
    if start < len(text):
        yield text[start:]
