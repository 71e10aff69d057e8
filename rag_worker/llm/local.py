"""The embedded generator: a GGUF model run in-process by llama.cpp (the `xllamacpp` package) when no Ollama is
reachable or LLM_BACKEND=local.

Which file: rag_worker/llm/embedded.py (EMBEDDED_MODEL=qwen2.5-1.5b, assembled once from its part packages and
hash-checked; smollm2, the fallback when those are not installed; or LOCAL_MODEL, any GGUF file).

How it runs, and why:
- llama.cpp releases the GIL while it computes, but a call into it still blocks its calling thread, so under
  gunicorn's gevent worker every call runs in a native thread (gevent's pool), never on the loop. Generated
  pieces come back through the package's streaming callback (called in that native thread) into a deque the
  consuming greenlet polls with a cooperative sleep: nothing in the callback touches the gevent hub.
- Stop: the callback returns True once the consumer closed the stream or the turn's CancelToken is set, and
  llama.cpp cancels the task at that token.
- LOCAL_PARALLEL turns generate at once, batched in one llama.cpp context (LOCAL_N_CTX tokens each); more wait in
  arrival order in front of it (`_Gate`): a turn cancelled while it waits costs nothing, and one that comes in
  never interrupts the others with a long prompt (prompts are processed in batches of N_BATCH tokens between
  the other turns' tokens).
- The tokenizer (prompt budgets, context fitting) is llama.cpp's own: the package serves it only through
  llama.cpp's HTTP routes, so the server listens on a Unix socket in a private temporary folder (0700) and
  answers only requests that carry a random per-process key; the generation itself never goes through HTTP.
- OMP_WAIT_POLICY=passive is set before xllamacpp is imported (libgomp reads it when it loads): with OpenMP's
  default busy-waiting, two generating threads on a busy 2-core box fell from 40 to about 3 tokens/s.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import itertools
import json
import logging
import os
import secrets
import shutil
import socket
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..embeddings import native_lock
from ..errors import LLMUnavailable
from ..runtime import cooperative_sleep, gevent_active, offload
from ..settings import Settings
from .base import DEFAULT_MAX_TOKENS, CancelToken, LLMFailed, ThinkFilter
from .embedded import JUDGE_STEPS, choose, ready_file

os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # before any import of xllamacpp (see above)

log = logging.getLogger(__name__)

POLL_S = 0.02
# Prompt tokens llama.cpp evaluates in one step: a turn that comes in delays the other turns' next token by one
# step (about 1 s for 128 tokens of the 1.5B model on 2 cores), not by its whole prompt.
N_BATCH = 128
ENGINE = "llama.cpp (xllamacpp)"


def cpu_count() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _run_native(fn: Callable[[], None]) -> None:
    """Start fn in a real OS thread (gevent's pool when monkey-patched: threading.Thread would be a greenlet)."""
    if gevent_active():
        import gevent

        gevent.get_hub().threadpool.spawn(fn)
    else:
        threading.Thread(target=fn, name="local-llm-generate", daemon=True).start()


class _Gate:
    """At most `slots` generations at once, the rest admitted in arrival order.

    Its lock is a real OS lock held for a few instructions: a slot is released from the generating native
    thread, and waiting happens in the consumer (a greenlet under gevent), which polls cooperatively.
    """

    def __init__(self, slots: int):
        self.slots = slots
        self._lock = native_lock()
        self._busy = 0
        self._waiting: deque[int] = deque()
        self._seq = itertools.count()

    def join(self) -> int:
        with self._lock:
            ticket = next(self._seq)
            self._waiting.append(ticket)
            return ticket

    def enter(self, ticket: int) -> bool:
        with self._lock:
            if self._waiting and self._waiting[0] == ticket and self._busy < self.slots:
                self._waiting.popleft()
                self._busy += 1
                return True
            return False

    def leave(self, ticket: int) -> None:
        with self._lock, contextlib.suppress(ValueError):
            self._waiting.remove(ticket)

    def release(self) -> None:
        with self._lock:
            self._busy -= 1

    def stats(self) -> dict:
        with self._lock:
            return {"slots": self.slots, "busy": self._busy, "waiting": len(self._waiting)}


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


class LocalBackend:
    backend = "local"

    def __init__(self, settings: Settings):
        self.settings = settings
        self.choice = choose(settings)  # cheap: which file, and why; nothing is read or assembled yet
        self.name = self.choice.name
        self.slots = settings.local_parallel
        self._lock = threading.Lock()  # greenlet-aware under gevent: a second turn waits for the first's load
        self._server: Any = None
        self._socket: str | None = None
        self._key = secrets.token_hex(32)
        self._n_ctx = settings.local_n_ctx
        self._load_error: str | None = None
        self._gate = _Gate(self.slots)

    # -- loading -------------------------------------------------------------------------------------------

    @property
    def model_path(self) -> Path:
        return self.choice.path

    @property
    def loaded(self) -> bool:
        return self._server is not None

    @property
    def n_ctx(self) -> int:
        """Tokens one turn may use, prompt and answer together."""
        return self._n_ctx

    @property
    def context_tokens(self) -> int:
        """The passages' budget that suits this model (what LOCAL_CONTEXT_TOKENS=0 means)."""
        model = self.choice.model
        return model.context_tokens if model else 700

    @property
    def grounding_policy(self) -> str:
        """The grounding policy that suits this model (what an empty GROUNDING_POLICY means on it)."""
        model = self.choice.model
        return model.grounding_policy if model else "extract"

    @property
    def judges(self) -> frozenset[str]:
        """The YES/NO steps this model is asked in (LOCAL_MODEL's own file, never measured: all of them)."""
        model = self.choice.model
        return model.judges if model else JUDGE_STEPS

    @property
    def unsure_relevant(self) -> bool | None:
        """The relevance check's verdict in its unsure band when this model is not asked (None: the band's
        middle decides)."""
        model = self.choice.model
        return model.unsure_relevant if model else None

    @property
    def triage_direct_below(self) -> float | None:
        """Triage answers directly below this similarity when this model is not asked (None: it searches)."""
        model = self.choice.model
        return model.triage_direct_below if model else None

    @property
    def repeat_penalty(self) -> float:
        model = self.choice.model
        return model.repeat_penalty if model else 1.05

    def file_ready(self) -> bool:
        """Whether a load now needs no one-time assembly (the 1.1 GB copy put together from its parts)."""
        model = self.choice.model
        return model is None or len(model.packages) == 1 or self.choice.path.is_file()

    def preload(self, warm: list[dict] | None = None) -> bool:
        """Load the model now (a worker process's start, before it serves: llama.cpp holds the GIL while it
        loads, which would otherwise freeze the process's streams at its first embedded turn), then run `warm`
        once for one token so llama.cpp keeps the state of its start (the instructions every answer begins
        with). A model still to be assembled is left to its first turn (the assembly runs off the loop). Returns
        whether the model is loaded; a file that cannot be loaded raises LLMUnavailable, as a turn would."""
        if self.loaded:
            return True
        if not self.file_ready():
            return False
        self.ensure_loaded()
        if warm:
            started = time.monotonic()
            self.chat(warm, model=self.name, max_tokens=1)
            log.info("warmed %s with its instructions in %.1f s", self.name, time.monotonic() - started)
        return True

    def ensure_loaded(self) -> None:
        if self._server is not None:
            return
        with self._lock:
            if self._server is not None:
                return
            try:
                server = offload(self._load)
                # Asked from this greenlet, not the loading thread: its socket is gevent's when patched.
                props = self._request("GET", "/props", None, server_ready=True) or {}
                n_ctx = (props.get("default_generation_settings") or {}).get("n_ctx")
                if isinstance(n_ctx, int) and n_ctx > 0:
                    self._n_ctx = n_ctx
                self._server = server
                self._load_error = None
            except LLMUnavailable as exc:
                self._load_error = exc.message
                raise
            except Exception as exc:  # a broken file or an engine failure: say what failed, as a 503
                self._load_error = f"{type(exc).__name__}: {exc}"
                raise LLMUnavailable(
                    f"the local model {self.name} could not be loaded from {self.model_path}: {self._load_error}"
                ) from exc

    def _load(self) -> Any:
        path = ready_file(self.choice, self.settings.model_cache_dir)
        import xllamacpp

        folder = tempfile.mkdtemp(prefix="rag-llm-")  # 0700: only this user reaches the socket
        atexit.register(shutil.rmtree, folder, True)
        self._socket = os.path.join(folder, "llm.sock")
        threads = self.settings.local_threads or cpu_count()
        p = xllamacpp.CommonParams()
        p.model.path = str(path)
        p.n_parallel = self.slots
        p.kv_unified = False  # each turn its own LOCAL_N_CTX tokens
        p.n_ctx = self.settings.local_n_ctx * self.slots
        p.n_batch = N_BATCH
        p.n_ubatch = N_BATCH
        p.cpuparams.n_threads = threads
        p.cpuparams_batch.n_threads = threads
        p.cache_ram_mib = self.settings.local_prompt_cache_mib
        p.hostnames = [self._socket]
        p.api_keys = [self._key]
        p.verbosity = 0
        # The load holds the GIL (the package's constructor waits for llama.cpp without releasing it): skip the
        # warm-up decode to keep that one-time stall short; the first turn pays for it instead, off the GIL.
        p.warmup = False
        started = time.monotonic()
        try:
            server = xllamacpp.Server(p)
        except RuntimeError as exc:
            raise LLMUnavailable(
                f"llama.cpp could not load {path} (is it a GGUF file of a supported model?): {exc}"
            ) from exc
        log.info("loaded local model %s (%s) in %.1f s", self.name, ENGINE, time.monotonic() - started)
        return server

    # -- llama.cpp's own tokenizer ---------------------------------------------------------------------------

    def _request(self, method: str, route: str, body: dict | None, *, server_ready: bool = False) -> Any:
        if not server_ready:
            self.ensure_loaded()
        assert self._socket is not None
        conn = _UnixConnection(self._socket, timeout=30)
        try:
            payload = None if body is None else json.dumps(body)
            headers = {"Authorization": f"Bearer {self._key}", "Content-Type": "application/json"}
            conn.request(method, route, body=payload, headers=headers)
            res = conn.getresponse()
            data = res.read()
        except OSError as exc:
            raise LLMFailed(f"the local model's tokenizer is not reachable: {exc}") from exc
        finally:
            conn.close()
        if res.status != 200:
            raise LLMFailed(f"the local model's {route} failed ({res.status}): {data[:300]!r}")
        return json.loads(data)

    def tokenize(self, text: str) -> list[int]:
        return self._request("POST", "/tokenize", {"content": text, "add_special": False})["tokens"]

    def detokenize(self, tokens: list[int]) -> str:
        return self._request("POST", "/detokenize", {"tokens": tokens})["content"]

    def count_tokens(self, text: str) -> int:
        return len(self.tokenize(text)) if text else 0

    def cut(self, text: str, budget: int) -> str:
        """text's first `budget` tokens (whole text when it fits)."""
        tokens = self.tokenize(text)
        return text if len(tokens) <= budget else self.detokenize(tokens[: max(0, budget)])

    def prompt_tokens(self, messages: list[dict]) -> int:
        """What the messages cost in the model's context, chat template and special tokens included."""
        prompt = self._request("POST", "/apply-template", {"messages": messages})["prompt"]
        return len(self._request("POST", "/tokenize", {"content": prompt, "parse_special": True})["tokens"])

    def fit(self, messages: list[dict], max_tokens: int) -> tuple[list[dict], int]:
        """Messages and answer length that fit the context: the answer gets at most half of it; then the oldest
        history goes, then the first message's tail (instructions and the best sources come first), then the
        question's head. A degraded answer beats a failed turn (llama.cpp refuses an overlong prompt)."""
        new = max(1, min(max_tokens, self.n_ctx // 2))
        room = self.n_ctx - new
        msgs = [dict(m) for m in messages]
        n = self.prompt_tokens(msgs)
        if n <= room:
            return msgs, new
        before = n
        while len(msgs) > 2 and n > room:
            del msgs[1]
            n = self.prompt_tokens(msgs)
        for i in (0, len(msgs) - 1) if len(msgs) > 1 else (0,):
            if n <= room:
                break
            tokens = self.tokenize(msgs[i]["content"])
            keep = max(0, len(tokens) - (n - room) - 8)
            text = self.detokenize(tokens[:keep]) if i == 0 else self.detokenize(tokens[len(tokens) - keep :])
            msgs[i]["content"] = text
            n = self.prompt_tokens(msgs)
        log.warning(
            "prompt of %d tokens cut to %d for the local model's context of %d", before, n, self.n_ctx
        )
        return msgs, new

    # -- generation ----------------------------------------------------------------------------------------

    def chat(
        self,
        messages: list[dict],
        *,
        model: str,
        temperature: float | None = None,
        max_tokens: int | None = None,
    ) -> str:
        return "".join(self.stream(messages, model=model, temperature=temperature, max_tokens=max_tokens))

    def stream(
        self,
        messages: list[dict],
        *,
        model: str,
        temperature: float | None = None,
        max_tokens: int | None = None,
        cancel: CancelToken | None = None,
    ) -> Iterator[str]:
        """Yield pieces of the reply; closing the iterator or cancelling stops generation within a token.

        `model` is accepted for the common interface; the local backend serves only its one model.
        """
        self.ensure_loaded()
        chat = [{"role": m["role"], "content": m["content"]} for m in messages]
        chat, new_tokens = self.fit(chat, max_tokens or DEFAULT_MAX_TOKENS)  # I/O to llama.cpp's HTTP threads
        pieces: deque[str] = deque()
        state: dict[str, Any] = {"done": False, "error": None, "stop": False}
        ticket = self._gate.join()
        entered = False
        try:
            while not self._gate.enter(ticket):
                if cancel is not None and cancel.cancelled:
                    return
                cooperative_sleep(POLL_S)
            entered = True
            _run_native(self._job(chat, temperature, new_tokens, pieces, state, cancel))
            think = ThinkFilter()
            while True:
                while pieces:
                    if cancel is not None and cancel.cancelled:
                        return  # what the generating thread queued after the cancel is not the caller's any more
                    text = think.feed(pieces.popleft())
                    if text:
                        yield text
                if state["done"]:
                    if pieces:
                        continue
                    break
                if cancel is not None and cancel.cancelled:
                    return
                cooperative_sleep(POLL_S)
            if state["error"] is not None:
                raise LLMFailed(f"the local model failed while generating: {state['error']}")
            rest = think.flush()
            if rest:
                yield rest
        finally:
            state["stop"] = True  # read by the callback in the generating thread, at the next token
            if not entered:
                self._gate.leave(ticket)

    def _job(
        self,
        messages: list[dict],
        temperature: float | None,
        new_tokens: int,
        pieces: deque[str],
        state: dict,
        cancel: CancelToken | None,
    ) -> Callable[[], None]:
        request: dict[str, Any] = {
            "messages": messages,
            "stream": True,
            "max_tokens": new_tokens,
            "temperature": 0.0,  # greedy unless the request asks for sampling
            "repeat_penalty": self.repeat_penalty,
            "cache_prompt": True,  # the instructions' prefix is reused across turns
        }
        if temperature is not None and temperature > 0:
            request.update(temperature=float(temperature), top_p=0.95)

        def on_chunk(chunk: Any) -> bool:
            if not isinstance(chunk, dict) or "error" in chunk or "choices" not in chunk:
                err = chunk.get("error", chunk) if isinstance(chunk, dict) else chunk
                state["error"] = (err.get("message") if isinstance(err, dict) else None) or str(err)[:500]
                return True
            for choice in chunk["choices"]:
                text = (choice.get("delta") or {}).get("content")
                if text:
                    pieces.append(text)
            return bool(state["stop"] or (cancel is not None and cancel.cancelled))

        server = self._server

        def job() -> None:
            try:
                server.handle_chat_completions(request, on_chunk)
            except Exception as exc:  # reported to the consumer, which raises it as llm_failed
                state["error"] = f"{type(exc).__name__}: {exc}"
            finally:
                self._gate.release()
                state["done"] = True

        return job

    def health(self) -> dict:
        info: dict[str, Any] = {
            "model": self.name,
            "path": str(self.model_path),
            "loaded": self.loaded,
            "engine": ENGINE,
            "n_ctx": self.n_ctx,
            "parallel": self.slots,
            **self.choice.info(),
        }
        model = self.choice.model
        if model is not None and len(model.packages) > 1:
            info["assembled"] = self.model_path.is_file()
        if self.loaded:
            info["generating"] = self._gate.stats()
        if self._load_error:
            info["error"] = self._load_error
        return info
