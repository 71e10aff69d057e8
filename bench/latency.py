"""Retrieval-stage latency at 10k, 100k and 1M chunks, with and without the ANN vector index, against NumPy.

    .venv/bin/python -m bench.latency [--sizes 10000 100000 1000000] [--queries 50] [--index-types IVF_PQ]
    .venv/bin/python -m bench.latency --sizes 200000 --index-types IVF_HNSW_SQ IVF_PQ --partitions 0 256 \
        --nprobes 5 10 20 --refine 0 2 5 10      # the ANN sweep

One LanceDB table grows through the sizes (written with the Store's own schema and row checks; bulk appends
rather than per-document commits, which would take hours at 1M). Rows: the SciFact chunk vectors the retrieval
benchmark cached (`.cache/bench/vectors.sqlite`), each copy past the real corpus jittered with Gaussian noise and
re-normalised, so the vectors keep the clustered shape of real embeddings (random vectors when the cache is
empty); texts are SciFact abstracts, cycled. Queries: SciFact test queries, embedded by the worker's embedder.

At each size, for each query:
- numpy: exact cosine top-50 over an in-memory float32 matrix of the same vectors (argpartition), the floor;
- the store's search (`Store.search`, what `retrieve.search` calls) in vector mode and in hybrid mode, first
  with no vector index (LanceDB's exact scan), then with each ANN index type (built through `Store.build_ann`,
  timed), and its recall@10 against the exact top 10.
p50 / p95 are per query, in milliseconds, after one warm-up query.

The sweep: every index type is built with every `--partitions` (0: LanceDB's default), and each build is then
searched with every `--nprobes` x `--refine` (refine_factor; 0: none), set on the store as ANN_NPROBES and
ANN_REFINE_FACTOR would; the speed-ups are p50 ratios against NumPy's exact scan in the same run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sqlite3
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench import beir

ROOT = Path(__file__).resolve().parent.parent
SCIFACT = ROOT.parent / "shared" / "eval" / "scifact"
INDEX = "latency"
TOP = 30  # RETRIEVAL_CANDIDATES default: what /chat asks the stage for


def base_vectors(cache: Path, dim: int) -> np.ndarray:
    if cache.is_file():
        db = sqlite3.connect(cache)
        blobs = [row[0] for row in db.execute("SELECT v FROM vec")]
        vecs = [np.frombuffer(b, dtype=np.float32) for b in blobs]
        vecs = [v for v in vecs if v.shape == (dim,)]
        if len(vecs) >= 1000:
            return np.stack(vecs)
    print("no cached SciFact vectors: using random ones", file=sys.stderr)
    rng = np.random.default_rng(0)
    v = rng.standard_normal((10_000, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def synthetic(base: np.ndarray, start: int, count: int, rng: np.random.Generator) -> np.ndarray:
    idx = np.arange(start, start + count) % len(base)
    vecs = base[idx].copy()
    jitter = np.arange(start, start + count) >= len(base)  # the real corpus first, then noisy copies
    if jitter.any():
        vecs[jitter] += rng.standard_normal((int(jitter.sum()), base.shape[1])).astype(np.float32) * 0.03
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    return vecs


def append(store, table, texts: list[str], vectors: np.ndarray, start: int) -> None:
    from rag_worker.store import table_schema

    now = datetime.now(UTC).isoformat(timespec="seconds")
    n = len(vectors)
    ids = [hashlib.sha256(str(start + i).encode()).hexdigest()[:32] for i in range(n)]
    schema = table_schema(store.embedder.dim, store.own_marker)
    data = {
        "id": ids,
        "doc_key": ids,
        "document_id": [hashlib.sha256(i.encode()).hexdigest() for i in ids],
        "filename": [f"doc{start + i}.txt" for i in range(n)],
        "dataset": ["synthetic"] * n,
        "page": [None] * n,
        "chunk_index": [0] * n,
        "text": [texts[(start + i) % len(texts)] for i in range(n)],
        "metadata": ["{}"] * n,
        "file_bytes": [0] * n,
        "indexed_at": [now] * n,
        "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), vectors.shape[1]),
    }
    table.add(pa.table(data, schema=schema))


def percentiles(samples: list[float]) -> tuple[float, float]:
    s = sorted(samples)
    p95 = s[min(len(s) - 1, int(round(0.95 * (len(s) - 1))))]
    return statistics.median(s), p95


def time_store(
    store, queries: list[str], qvecs: np.ndarray, mode: str
) -> tuple[list[float], list[list[str]]]:
    store.search(INDEX, queries[0], mode=mode, vector=qvecs[0], limit=TOP)  # warm-up
    times, results = [], []
    for q, v in zip(queries, qvecs, strict=True):
        t0 = time.perf_counter()
        hits = store.search(INDEX, q, mode=mode, vector=v, limit=TOP)
        times.append((time.perf_counter() - t0) * 1000)
        results.append([h.filename for h in hits])
    return times, results


def time_numpy(matrix: np.ndarray, qvecs: np.ndarray) -> tuple[list[float], list[list[str]]]:
    times, results = [], []
    for v in qvecs:
        t0 = time.perf_counter()
        scores = matrix @ v
        top = np.argpartition(-scores, TOP)[:TOP]
        top = top[np.argsort(-scores[top])]
        times.append((time.perf_counter() - t0) * 1000)
        results.append([f"doc{i}.txt" for i in top])
    return times, results


def recall10(got: list[list[str]], truth: list[list[str]]) -> float:
    return statistics.mean(len(set(g[:10]) & set(t[:10])) / 10 for g, t in zip(got, truth, strict=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", type=int, default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--index-types", nargs="+", default=["IVF_HNSW_SQ"])
    parser.add_argument("--base", type=int, default=None, help="use only the first N cached vectors as bases")
    parser.add_argument("--partitions", nargs="+", type=int, default=[0], help="IVF partitions (0: default)")
    parser.add_argument("--nprobes", nargs="+", type=int, default=None, help="default: the store's")
    parser.add_argument("--refine", nargs="+", type=int, default=None, help="default: the store's")
    parser.add_argument("--dir", type=Path, default=ROOT / ".cache" / "bench" / "latency")
    parser.add_argument("--vectors", type=Path, default=ROOT / ".cache" / "bench" / "vectors.sqlite")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import shutil

    from rag_worker.services import Services
    from rag_worker.settings import Settings

    shutil.rmtree(args.dir, ignore_errors=True)
    services = Services(Settings(INDEX_STORE=str(args.dir), ANN_MIN_ROWS="0"))
    store, embedder = services.store, services.embedder
    data = beir.load(SCIFACT, "test")
    # Cut to about the median chunk of the real SciFact index (182 tokens, ~800 characters).
    texts = [f"{d['title']}\n{d['text']}"[:800] for d in data.corpus.values()]
    queries = list(data.queries.values())[: args.queries]
    qvecs = np.stack([embedder.embed_query(q) for q in queries])
    base = base_vectors(args.vectors, embedder.dim)[: args.base]
    print(f"{len(base)} base vectors, {len(queries)} queries", file=sys.stderr, flush=True)

    rng = np.random.default_rng(1)
    # The table is created through the store (schema, marker, FTS index), then grown by bulk appends.
    first = synthetic(base, 0, 1, rng)
    store.add_chunks(INDEX, [{"document_id": "0" * 64, "filename": "seed.txt", "dataset": "synthetic",
                              "chunk_index": 0, "text": texts[0], "vector": first[0]}])  # fmt: skip
    store.delete_document(INDEX, dataset="synthetic", filename="seed.txt")
    table = store._require(INDEX)
    chunks: list[np.ndarray] = []
    have = 0
    rows: list[dict] = []
    print(
        "| chunks | search | index build s | vector p50 / p95 ms | hybrid p50 / p95 ms | recall@10 "
        "| vector / hybrid speed-up vs numpy exact |",
        flush=True,
    )
    print("|---:|---|---:|---|---|---:|---|", flush=True)
    saved_search = (store.ann_nprobes, store.ann_refine_factor)
    for size in sorted(args.sizes):
        t0 = time.monotonic()
        while have < size:
            n = min(100_000, size - have)
            vecs = synthetic(base, have, n, rng)
            append(store, table, texts, vecs, have)
            chunks.append(vecs)
            have += n
        # Fold the appends into the FTS index (as every store write does), and drop any ANN index of the last size.
        for idx in table.list_indices():
            if idx.index_type != "FTS":
                table.drop_index(idx.name)
        table.optimize()
        print(f"  {size} rows written in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
        matrix = np.concatenate(chunks)

        np_times, truth = time_numpy(matrix, qvecs)
        report = [("numpy exact", None, np_times, None, 1.0)]
        v_times, v_res = time_store(store, queries, qvecs, "vector")
        h_times, _ = time_store(store, queries, qvecs, "hybrid")
        report.append(("lancedb exact", None, v_times, h_times, recall10(v_res, truth)))
        np_p50 = percentiles(np_times)[0]
        for entry in report:
            _row(size, *entry, np_p50, rows)
        nprobes = args.nprobes or [store.ann_nprobes]
        refines = args.refine if args.refine is not None else [store.ann_refine_factor]
        for kind in args.index_types:
            for parts in args.partitions:
                t1 = time.monotonic()
                store.build_ann(INDEX, kind, parts or None)
                built = time.monotonic() - t1
                for probes in nprobes:
                    for refine in refines:
                        store.ann_nprobes, store.ann_refine_factor = probes, refine
                        v_times, v_res = time_store(store, queries, qvecs, "vector")
                        h_times, _ = time_store(store, queries, qvecs, "hybrid")
                        name = f"lancedb {kind} p={parts or 'default'} nprobes={probes} refine={refine}"
                        report.append((name, built, v_times, h_times, recall10(v_res, truth)))
                        _row(size, *report[-1], np_p50, rows)
                        built = None
        store.ann_nprobes, store.ann_refine_factor = saved_search
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


def _row(size, name, built, vt, ht, rec, np_p50, rows) -> None:
    vp = "{:.1f} / {:.1f}".format(*percentiles(vt))
    hp = "{:.1f} / {:.1f}".format(*percentiles(ht)) if ht else "n/a"
    b = f"{built:.0f}" if built is not None else ""
    speed = f"{np_p50 / percentiles(vt)[0]:.1f}x"
    speed += f" / {np_p50 / percentiles(ht)[0]:.1f}x" if ht else ""
    print(f"| {size:,} | {name} | {b} | {vp} | {hp} | {rec:.3f} | {speed} |", flush=True)
    rows.append(
        {"size": size, "search": name, "build_s": built, "vector_ms": percentiles(vt),
         "hybrid_ms": percentiles(ht) if ht else None, "recall@10": rec}
    )  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
