"""Several processes writing to one LanceDB index at once (gunicorn's processes, replicas, the CLI), for real:
separate Python processes on one store folder, started together behind a barrier."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
from pathlib import Path

import numpy as np

WRITES_PER_PROCESS = 12


def _writer(root: str, who: str, barrier, results) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from rag_worker.embeddings import Embedder
    from rag_worker.settings import packaged_embedding_model
    from rag_worker.store import Store

    store = Store(Path(root), Embedder(packaged_embedding_model(), torch_threads=1))
    rng = np.random.default_rng(abs(hash(who)) % 2**32)
    barrier.wait()
    errors = []
    for i in range(WRITES_PER_PROCESS):
        name = f"{who}-{i:02d}.md"
        vector = rng.random(store.embedder.dim, dtype=np.float32)
        rows = [
            {
                "dataset": "default",
                "filename": name,
                "document_id": hashlib.sha256(name.encode()).hexdigest(),
                "chunk_index": 0,
                "text": f"document {who} {i} word{who}{i:02d}",
                "vector": vector / np.linalg.norm(vector),
            }
        ]
        try:
            store.replace_document("shared", dataset="default", filename=name, rows=rows)
        except Exception as exc:  # what the upload route would have turned into a 500
            errors.append(f"{name}: {type(exc).__name__}: {str(exc)[:160]}")
    results.put((who, errors))


def _counter(lock_dir: str, counter: str, rounds: int, barrier, results) -> None:
    from rag_worker.locks import Locks

    lock = Locks(Path(lock_dir)).get("index-x")
    barrier.wait()
    for _ in range(rounds):
        with lock:  # a read-modify-write, like the overview file's upsert
            value = int(Path(counter).read_text())
            Path(counter).write_text(str(value + 1))
    results.put("ok")


def test_two_processes_writing_one_index_both_succeed_and_every_document_is_there(tmp_path, embedder):
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(str(tmp_path / "lancedb"), w, barrier, results)) for w in "ab"]
    for p in procs:
        p.start()
    outcome = dict(results.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert outcome == {"a": [], "b": []}, outcome

    from rag_worker.store import Store

    store = Store(tmp_path / "lancedb", embedder)
    docs = store.list_documents("shared")
    assert sorted(d["filename"] for d in docs) == sorted(
        f"{w}-{i:02d}.md" for w in "ab" for i in range(WRITES_PER_PROCESS)
    )
    assert all(d["chunks"] == 1 for d in docs)
    assert [h.filename for h in store.search("shared", "worda07", mode="fts", limit=3)][:1] == ["a-07.md"]


def test_the_index_lock_excludes_writers_in_other_processes(tmp_path):
    counter = tmp_path / "counter"
    counter.write_text("0")
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(3), ctx.Queue()
    procs = [
        ctx.Process(target=_counter, args=(str(tmp_path / "locks"), str(counter), 300, barrier, results))
        for _ in range(3)
    ]
    for p in procs:
        p.start()
    assert [results.get(timeout=300) for _ in procs] == ["ok"] * 3
    for p in procs:
        p.join(timeout=30)
    assert counter.read_text() == "900"  # no update lost between processes
