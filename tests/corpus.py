"""A small corpus with three datasets, indexed into a real LanceDB store, for the worker's contract tests.

Paragraphs become chunks in order, so neighbour expansion has neighbours to find. Some SciFact abstracts
(from ../shared/eval/scifact) make the `science` dataset, as the issue asks for "an index of the SciFact
fixtures".
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path

from tests.servers import SHARED

DOCS: dict[tuple[str, str], str] = {
    ("animals", "ducks.md"): (
        "Ducks eat aquatic plants, small fish, insects and worms.\n\n"
        "A male duck is called a drake and a female duck is called a hen.\n\n"
        "Ducks have waterproof feathers thanks to an oil gland near the base of the tail.\n\n"
        "Mallard ducklings leave the nest within a day of hatching and follow their mother to water."
    ),
    ("animals", "owls.txt"): (
        "Owls hunt at night and can turn their heads about 270 degrees.\n\n"
        "The barn owl swallows its prey whole and later coughs up pellets of bones and fur."
    ),
    ("places", "eiffel.md"): (
        "The Eiffel Tower is 330 metres tall and stands on the Champ de Mars in Paris.\n\n"
        "It was completed in 1889 as the entrance arch of the World's Fair.\n\n"
        "Gustave Eiffel's company designed and built the wrought-iron lattice tower."
    ),
    ("places", "great_wall.md"): (
        "The Great Wall of China stretches for more than 21,000 kilometres across northern China.\n\n"
        "Most of the existing wall was rebuilt during the Ming dynasty."
    ),
}

SCIFACT_IDS = ("4983", "5836", "7912", "18670", "19238")


def scifact_docs(ids: tuple[str, ...] = SCIFACT_IDS) -> dict[tuple[str, str], str]:
    wanted, found = set(ids), {}
    if not (SHARED / "eval" / "scifact").is_dir():
        return (
            found  # a bare clone: the corpus is the hand-written documents alone (no test asks about these)
        )
    with open(SHARED / "eval" / "scifact" / "corpus.jsonl", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            if row["_id"] in wanted:
                found[("science", f"scifact-{row['_id']}.txt")] = f"{row['title']}\n\n{row['text']}"
            if len(found) == len(wanted):
                break
    return found


def corpus_docs() -> dict[tuple[str, str], str]:
    return {**DOCS, **scifact_docs()}


def build_corpus_index(index_store: Path, index: str) -> int:
    from rag_worker.services import Services
    from rag_worker.settings import Settings

    services = Services(Settings(INDEX_STORE=str(index_store)))
    now = datetime.now(UTC).isoformat()
    rows = []
    for (dataset, filename), text in corpus_docs().items():
        document_id = hashlib.sha256(text.encode()).hexdigest()
        for i, para in enumerate(p.strip() for p in text.split("\n\n") if p.strip()):
            rows.append(
                {
                    "id": hashlib.sha256(f"{dataset}/{filename}/{document_id}/{i}".encode()).hexdigest()[:32],
                    "document_id": document_id,
                    "filename": filename,
                    "dataset": dataset,
                    "page": None,
                    "chunk_index": i,
                    "text": para,
                    "metadata": {},
                    "file_bytes": len(text.encode()),
                    "indexed_at": now,
                }
            )
    return services.store.add_chunks(index, rows)


def corpus_copy(tmp_path_factory, name: str) -> Path:
    """A new folder (under pytest's tmp) whose index_store holds the corpus in the index `corpus`.

    The corpus is embedded once per test run and copied: under pytest-xdist the worker processes share one
    build (a file lock makes the others wait for the first) rather than each loading the embedder for it.
    Each copy is the caller's own, so a test may add to it or drop from it.
    """
    root = tmp_path_factory.mktemp(name)
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the run's, across its workers
    built = shared / "corpus-built"
    with open(shared / "corpus-built.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (built / "index_store").is_dir():
            building = shared / "corpus-building"
            shutil.rmtree(building, ignore_errors=True)
            build_corpus_index(building / "index_store", "corpus")
            building.rename(built)  # whole or not at all, should a build fail half-way
    shutil.copytree(built / "index_store", root / "index_store")
    return root


class OtherEmbedder:
    """Another embedding model's identity (8 dims): enough to build a table the worker must refuse to use."""

    model_id = "example/other-embedder"
    model_path = "/models/other-embedder"
    dim = 8

    def embed_documents(self, texts):
        import numpy as np

        return np.ones((len(texts), 8), dtype=np.float32) / np.sqrt(8)


def build_foreign_index(lancedb_dir: Path, index: str) -> None:
    """A one-row table written with OtherEmbedder, so its marker names a model the worker doesn't run."""
    from rag_worker.store import Store

    store = Store(lancedb_dir, OtherEmbedder())
    if not store.exists(index):
        store.add_chunks(
            index,
            [
                {
                    "document_id": "a" * 64,
                    "filename": "old.txt",
                    "dataset": "default",
                    "page": None,
                    "chunk_index": 0,
                    "text": "old text",
                }
            ],
        )
