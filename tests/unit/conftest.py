"""Fixtures shared by unit tests: the packaged embedder, loaded once per session (about 4 s)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def embedder():
    from rag_worker.embeddings import Embedder
    from rag_worker.settings import packaged_embedding_model

    # One torch thread: the test machine is shared, and oversubscribed OpenMP threads crawl.
    return Embedder(packaged_embedding_model(), batch_size=4, max_length=256, torch_threads=1)
