"""Helpers for the ingestion tests: uploads over HTTP, SSE parsing, searching the worker's store from outside."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import httpx

from tests.servers import worker_process

# Small bounds so that the hostile-input tests stay small and fast.
WORKER_ENV = {
    "LLM_BACKEND": "local",
    "OVERVIEW_SUMMARIES": "off",
    "MAX_UPLOAD_BYTES": str(3 * 1024 * 1024),
    "MAX_UNZIPPED_BYTES": str(16 * 1024 * 1024),
    "MAX_SPREADSHEET_CELLS": "5000",
}


def start_worker(tmp: Path, **env: str):
    return worker_process(tmp, env={**WORKER_ENV, **env}).start(timeout=180)


def upload(
    client: httpx.Client, name: str, data: bytes, *, index: str = "default", dataset: str | None = None
) -> httpx.Response:
    form = {"index": index}
    if dataset is not None:
        form["dataset"] = dataset
    return client.post("/add_document", data=form, files={"file": (name, data)})


def sse_events(response: httpx.Response) -> list[tuple[str, dict]]:
    """[(event, data)] of a complete SSE body; keepalive comments are skipped."""
    events = []
    for block in response.text.split("\n\n"):
        name, data = None, None
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: ") :])
        if name:
            events.append((name, data))
    return events


def documents(client: httpx.Client, index: str = "default") -> dict[tuple[str, str], dict]:
    resp = client.get("/get_documents", params={"index": index})
    assert resp.status_code == 200, resp.text
    return {(d["dataset"], d["filename"]): d for d in resp.json()}


@functools.cache
def reader_embedder():
    """The packaged embedder, loaded once per test process: a reader opened per poll or per test would load the
    model (two tokenizers and the weights, a CPU-second or more) every time."""
    from rag_worker.embeddings import Embedder
    from rag_worker.settings import packaged_embedding_model

    return Embedder(packaged_embedding_model(), torch_threads=1)


def open_store(lancedb_dir: Path):
    """The worker's LanceDB store at `lancedb_dir`, opened from the test process with the shared embedder."""
    from rag_worker.store import Store

    return Store(Path(lancedb_dir), reader_embedder())


class StoreReader:
    """The worker's LanceDB store opened from the test process (a second reader, as the CLI would be)."""

    def __init__(self, tmp: Path):
        self.store = open_store(tmp / "index_store" / "lancedb")

    def search(self, query: str, index: str = "default", mode: str = "fts", limit: int = 5):
        return self.store.search(index, query, mode=mode, limit=limit)

    def files_for(self, query: str, index: str = "default", mode: str = "fts", limit: int = 5) -> list[str]:
        return [h.filename for h in self.search(query, index, mode, limit)]
