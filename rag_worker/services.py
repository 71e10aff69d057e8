"""The long-lived parts one worker process shares between requests: models, store, LLM backends.

Nothing here holds conversation state (the worker is stateless); these are caches of models and connections.
Each part is built lazily on first use so that `create_app` stays cheap and import has no side effects.
"""

from __future__ import annotations

import threading
from functools import cached_property
from typing import TYPE_CHECKING

from .locks import Locks
from .settings import Settings

if TYPE_CHECKING:  # pragma: no cover
    from .embeddings import Embedder
    from .llm import LLMRouter
    from .locks import FileLock
    from .pipeline.admission import TurnQueue
    from .rerank import Reranker, RerankerSlot
    from .store import Store


class Services:
    def __init__(self, settings: Settings):
        self.settings = settings
        self._build_lock = threading.Lock()
        # Write locks shared with every process on this INDEX_STORE (files under INDEX_STORE/locks).
        self.locks: Locks = Locks(settings.index_store / "locks")

    def close(self) -> None:
        """Stop the helper processes these services started (ingestion's conversion child), now rather than
        whenever the garbage collector gets to them: each holds a few hundred MB."""
        from .ingest.pipeline import release_parts

        release_parts(self)

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
            )

    @cached_property
    def store(self) -> Store:
        from .store import Store

        s = self.settings
        return Store(
            s.lancedb_dir,
            self.embedder,
            ann_min_rows=s.ann_min_rows,
            ann_nprobes=s.ann_nprobes,
            ann_refine_factor=s.ann_refine_factor,
            ann_ef=s.ann_ef,
            index_cache_mb=s.lancedb_index_cache_mb,
            metadata_cache_mb=s.lancedb_metadata_cache_mb,
        )

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

    def warm_up(self) -> None:
        """Load the embedder (and open the store) ahead of the first request."""
        self.embedder.embed_query("warm up")
        self.store.indexes()

    def index_lock(self, index: str) -> FileLock:
        """One writer per index at a time (uploads, deletes, a rebuild's swap), in this process and in every
        other one on the same INDEX_STORE (gunicorn processes, replicas, the indexing CLI); readers never wait."""
        return self.locks.get(f"index-{index}")

    def rebuild_guard(self, index: str):
        """Held for a whole rebuild of `index`: a second one at the same time is a 409, wherever it runs."""
        return self.locks.try_hold(f"rebuild-{index}", f"index '{index}' is already being rebuilt")
