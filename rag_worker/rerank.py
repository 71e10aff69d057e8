"""Cross-encoder reranking: score (query, passage) pairs with a sequence-classification model.

No cross-encoder ships in a package reachable offline (docs/design/MODELS.md), so this runs only when
RERANKER_MODEL names a local directory or a model already in the local HF cache; otherwise the worker relies on
hybrid fusion alone. A RERANKER_MODEL that cannot be loaded is skipped with a warning (`RerankerSlot`): turns
answer in the fusion's order and say so, and /health reports the worker degraded with the reason.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from .embeddings import local_files_only, max_input_tokens, model_identity, native_lock
from .errors import RerankerUnavailable
from .runtime import offload

log = logging.getLogger("rag_worker")


def check_labels(model: str, num_labels: int) -> None:
    if num_labels not in (1, 2):
        raise RerankerUnavailable(
            f"reranker model {model!r} has {num_labels} labels; a cross-encoder has 1 "
            "(a relevance logit) or 2 (not relevant, relevant)"
        )


class Reranker:
    def __init__(self, model: str, *, torch_threads: int = 0, max_length: int = 512, batch_size: int = 16):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if torch_threads > 0:
            torch.set_num_threads(torch_threads)
        self.model_path = str(model)
        local_only = local_files_only(self.model_path)
        try:
            self._tok = AutoTokenizer.from_pretrained(self.model_path, local_files_only=local_only)
            self._model = AutoModelForSequenceClassification.from_pretrained(
                self.model_path, local_files_only=local_only
            )
        except (OSError, ValueError) as exc:
            raise RerankerUnavailable(
                f"reranker model {self.model_path!r} could not be loaded from local files: {exc}"
            ) from exc
        self.num_labels = int(self._model.config.num_labels)
        check_labels(self.model_path, self.num_labels)
        self._model.eval()
        self._torch = torch
        self.model_id = model_identity(self.model_path)
        self.max_length = max_input_tokens(self._model.config, self._tok, max_length)
        self.batch_size = max(1, batch_size)
        self._tok_lock = native_lock()  # a fast tokenizer is not safe to call from two threads at once

    def describe(self) -> dict:
        return {"model": self.model_id, "path": self.model_path, "max_length": self.max_length}

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        """A 0..1 relevance score per text, in the order given (higher = more relevant)."""
        texts = list(texts)
        scores = [0.0] * len(texts)
        # Similar lengths per batch: less padding. One offload per batch keeps the gevent loop responsive.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            for i, s in zip(idx, offload(self._forward, query, [texts[i] for i in idx]), strict=True):
                scores[i] = s
        return scores

    def _forward(self, query: str, texts: list[str]) -> list[float]:
        torch = self._torch
        with self._tok_lock:
            # longest_first: a long question is cut as well, where only_second would fail on it.
            enc = self._tok(
                [query] * len(texts),
                texts,
                padding=True,
                truncation="longest_first",
                max_length=self.max_length,
                return_tensors="pt",
            )
        with torch.inference_mode():
            logits = self._model(**enc).logits.float()
        if self.num_labels == 1:
            probs = torch.sigmoid(logits[:, 0])
        else:
            probs = torch.softmax(logits, dim=-1)[:, 1]
        return [float(p) for p in probs.cpu()]


class RerankerSlot:
    """RERANKER_MODEL, loaded on first use. A model that cannot be loaded is skipped with a warning rather than
    failing every turn: `get()` is then None and `error` says why."""

    def __init__(self, model: str, *, torch_threads: int = 0):
        self.model = model
        self.torch_threads = torch_threads
        self.error: str | None = None
        self._reranker: Reranker | None = None
        self._tried = False
        self._probed = False
        self._lock = threading.Lock()

    def get(self) -> Reranker | None:
        if not self.model:
            return None
        with self._lock:
            if not self._tried:
                try:
                    self._reranker = Reranker(self.model, torch_threads=self.torch_threads)
                except Exception as exc:  # whatever breaks the model, the turns go on without it
                    self._broken(exc)
                self._tried = True
        return self._reranker

    def health(self) -> dict:
        """`ok` false with the reason when the model is known to be broken; never loads the model."""
        if not self._tried and not self._probed:
            self._probed = True  # once: the configuration does not change while the worker runs
            self._probe()
        if self.error:
            return {"ok": False, "model": self.model, "error": self.error}
        return {"ok": True, "model": self.model, "loaded": self._reranker is not None}

    def _probe(self) -> None:
        """Read the model's configuration (a small file) where the load would read only local files anyway, so
        a path with no model or a classifier that is no cross-encoder shows before the first turn."""
        if not local_files_only(self.model):
            return  # it may still be downloaded on first use: known once loaded
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(self.model, local_files_only=True)
            check_labels(self.model, int(config.num_labels))
        except RerankerUnavailable as exc:
            self._broken(exc)
        except Exception as exc:
            self._broken(RerankerUnavailable(f"reranker model {self.model!r} could not be loaded: {exc}"))

    def _broken(self, exc: Exception) -> None:
        message = exc.message if isinstance(exc, RerankerUnavailable) else f"{type(exc).__name__}: {exc}"
        if self.error is None:
            log.warning("reranking skipped: %s", message)
        self.error = message[:500]
