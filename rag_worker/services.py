"""The long-lived parts one worker process shares between requests: models, store, LLM backends.

Nothing here holds conversation state (the worker is stateless); these are caches of models and connections.
Each part is built lazily on first use so that `create_app` stays cheap and import has no side effects.
"""

from __future__ import annotations

import logging
import threading
from functools import cached_property
from typing import TYPE_CHECKING

from .locks import Locks
from .runtime import limit_blas_threads
from .settings import Settings

if TYPE_CHECKING:  # pragma: no cover
    from .embeddings import Embedder
    from .ingest.chunk import Chunker
    from .ingest.isolated import IsolatedConverter
    from .llm import LLMRouter
    from .locks import FileLock
    from .pipeline.admission import TurnQueue
    from .rerank import Reranker, RerankerSlot
    from .store import Store

log = logging.getLogger("rag_worker")


class Services:
    def __init__(self, settings: Settings):
        self.settings = settings
        limit_blas_threads(settings.blas_threads)
        self._build_lock = threading.Lock()
        self._ingest_lock = threading.Lock()  # ingestion's converter and chunker, each built once
        self._converter: IsolatedConverter | None = None
        self._chunker: Chunker | None = None
        self._embedders: dict[str, Embedder] = {}  # the other embedders indexes name, loaded on first use
        # Write locks shared with every process on this INDEX_STORE (files under INDEX_STORE/locks).
        self.locks: Locks = Locks(settings.index_store / "locks")

    def close(self) -> None:
        """Stop the helper processes these services started (ingestion's conversion child), now rather than
        whenever the garbage collector gets to them: each holds a few hundred MB."""
        with self._ingest_lock:
            converter, self._converter = self._converter, None
        if converter is not None:
            converter.close()

    @cached_property
    def embedder(self) -> Embedder:
        from .embeddings import Embedder

        with self._build_lock:
            return Embedder(
                self.settings.resolved_embedding_model(),
                batch_size=self.settings.embedding_batch_size,
                max_length=self.settings.embedding_max_length,
                torch_threads=self.settings.torch_threads,
                query_batching=self.settings.query_batching,
                text_cache_size=self.settings.text_cache_size,
                precision=self.settings.embedding_precision,
            )

    def embedder_named(self, name: str | None) -> Embedder:
        """The embedder an index's marker names (rag_worker/embedders.py), each loaded once, on first use."""
        from . import embedders

        name = embedders.check_name(name)
        if name == embedders.DEFAULT:
            return self.embedder
        built = self._embedders.get(name)
        if built is None:
            default = self.embedder  # outside the lock: building the default one takes it too
            with self._build_lock:
                built = self._embedders.get(name)
                if built is None:
                    built = self._embedders[name] = embedders.build(name, self.settings, default)
        return built

    @property
    def converter(self) -> IsolatedConverter:
        """Ingestion's converter: Docling in a child process with the settings' limits, started on first use
        (its pipelines are then built once and reused)."""
        with self._ingest_lock:
            if self._converter is None:
                from .ingest.isolated import IsolatedConverter
                from .ingest.limits import Limits
                from .ingest.ocr import ocr_options

                s = self.settings
                limits = Limits(
                    max_unzipped_bytes=s.max_unzipped_bytes,
                    max_zip_entries=s.max_zip_entries,
                    max_spreadsheet_cells=s.max_spreadsheet_cells,
                    office_timeout_s=s.office_timeout_s,
                    office_memory_mb=s.office_memory_mb,
                    max_pdf_pages=s.max_pdf_pages,
                    max_image_pixels=s.max_image_pixels,
                )
                converter = IsolatedConverter(
                    artifacts_path=s.docling_artifacts_path,
                    limits=limits,
                    memory_mb=s.convert_max_memory_mb,
                    timeout_s=s.convert_timeout_s,
                    ocr=ocr_options(s),
                )
                converter.prepare()
                self._converter = converter
            return self._converter

    @property
    def chunker(self) -> Chunker:
        """Ingestion's chunker, on the embedder's tokenizer."""
        with self._ingest_lock:
            if self._chunker is None:
                from .ingest.chunk import Chunker

                embedder = self.embedder
                # The budget leaves room for the [CLS]/[SEP] the embedder adds, so no chunk is ever truncated.
                budget = max(16, min(self.settings.chunk_tokens, embedder.max_length - 2))
                self._chunker = Chunker(embedder.tokenizer, budget)
            return self._chunker

    @cached_property
    def store(self) -> Store:
        from .store import Store

        return Store.from_settings(self.settings, self.embedder, embedders=self.embedder_named)

    @cached_property
    def llm(self) -> LLMRouter:
        from .llm import LLMRouter

        return LLMRouter(self.settings)

    @cached_property
    def reranking(self) -> RerankerSlot:
        from .rerank import RerankerSlot

        return RerankerSlot(self.settings.reranker_model, torch_threads=self.settings.torch_threads)

    @property
    def reranker(self) -> Reranker | None:
        """The cross-encoder; None when none is configured or it cannot be loaded (`reranking.error` says why)."""
        return self.reranking.get()

    @cached_property
    def turn_queue(self) -> TurnQueue:
        from .pipeline.admission import TurnQueue, default_slots

        s = self.settings
        with self._build_lock:
            return TurnQueue(s.rag_concurrency or default_slots(), s.max_queued_turns)

    def embedder_health(self) -> dict:
        """The embedder's state without forcing a load from a health probe."""
        if "embedder" not in self.__dict__:
            return {"ok": True, "loaded": False, "model": self.settings.resolved_embedding_model()}
        emb = self.embedder
        return {"ok": True, "loaded": True, "model": emb.model_id, "dim": emb.dim}

    def preload_llm(self) -> None:
        """Load the embedded model before this process serves, when it is the model that would answer now
        (LOCAL_PRELOAD; rag_worker/llm/local.py says why). A model that fails to load is logged and reported by
        /health, as at a turn; the process starts anyway (Ollama may come back)."""
        if not self.settings.local_preload:
            return
        router = self.llm
        if router.openai is not None or router.resolve().backend is not router.local:
            return
        from .errors import LLMUnavailable
        from .pipeline.generate import warm_messages

        try:
            router.local.preload(warm_messages())
        except LLMUnavailable as exc:
            log.warning("the embedded model was not loaded at start: %s", exc.message)

    def warm_up(self) -> None:
        """Load the embedder (and open the store) ahead of the first request."""
        self.embedder.embed_query("warm up")
        from .i18n import detect

        detect("Warm up the language detector")  # loads its models (seconds) before the first turn needs them
        self.store.indexes()

    def index_lock(self, index: str) -> FileLock:
        """One writer per index at a time (uploads, deletes, a rebuild's swap), in this process and in every
        other one on the same INDEX_STORE (gunicorn processes, replicas, the indexing CLI); readers never wait."""
        return self.locks.get(f"index-{index}")

    def rebuild_guard(self, index: str):
        """Held for a whole rebuild of `index`: a second one at the same time is a 409, wherever it runs."""
        return self.locks.try_hold(f"rebuild-{index}", f"index '{index}' is already being rebuilt")
