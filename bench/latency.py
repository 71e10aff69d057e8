"""Retrieval-stage latency at 10k, 100k and 1M chunks, with and without the ANN vector index, against NumPy.

    .venv/bin/python -m bench.latency [--sizes 10000 100000 1000000] [--queries 50] [--index-types IVF_PQ]
    .venv/bin/python -m bench.latency --sizes 200000 --index-types IVF_HNSW_SQ IVF_PQ --partitions 0 256 \
        --nprobes 5 10 20 --refine 0 1 2 10 --ef 0 200      # the ANN sweep
    .venv/bin/python -m bench.latency --sizes 1000000 --reuse --ef 0 150 200 300   # again on the same table

One LanceDB table grows through the sizes (written with the Store's own schema and row checks; bulk appends
rather than per-document commits, which would take hours at 1M). Rows: the SciFact chunk vectors the retrieval
benchmark cached (`.cache/bench/vectors.sqlite`), each copy past the real corpus jittered with Gaussian noise and
re-normalised, so the vectors keep the clustered shape of real embeddings (random vectors when the cache is
empty); texts are SciFact abstracts, cycled; documents of two chunks (see `append`). Queries: SciFact test
queries, embedded by the worker's embedder.

At each size, for each query:
- numpy: exact cosine top-50 over an in-memory float32 matrix of the same vectors (argpartition), the floor;
- the store's search (`Store.search`, what `retrieve.search` calls) in vector mode and in hybrid mode, first
  with no vector index (LanceDB's exact scan), then with each ANN index type (built through `Store.build_ann`,
  timed), and its recall@10 against the exact top 10; "leg recall@100": the same search 100 deep (a hybrid
  search's vector leg, HYBRID_LEG_MIN) against the exact top 100, untimed.
p50 / p95 are per query, in milliseconds, after one warm-up query.

The sweep: every index type is built with every `--partitions` (0: LanceDB's default), and each build is then
searched with every `--nprobes` x `--refine` (refine_factor; 0: none) x `--ef` (HNSW candidates; 0: LanceDB's
default), set on the store (`Store.ann`) as ANN_NPROBES, ANN_REFINE_FACTOR and ANN_EF would; the speed-ups are p50 ratios
against NumPy's exact scan in the same run. `--reuse` (one size) keeps the table and index an earlier run with
the same arguments left, so a search-time sweep needs no rebuild (LanceDB's exact scan is then not timed).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
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
CHUNKS_PER_DOC = 2  # SciFact: 11,226 chunks of 5,183 abstracts
LAYOUT = 5  # of the rows `append` writes; a reused table must have been written with it (5: the id packed)


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


def row_id(n: int) -> str:
    return hashlib.sha256(str(n).encode()).hexdigest()[:32]


def append(store, table, texts: list[str], vectors: np.ndarray, start: int) -> None:
    """Rows shaped like an ingested folder of plain-text files in one dataset: documents of CHUNKS_PER_DOC chunks
    numbered from 0, each chunk's metadata naming its kind and its document's title. (Until 2026-12-01 every row
    had chunk_index 0 and metadata "{}": Lance stores a column that is constant across a whole file so that
    reading one row of it decodes the file's whole page, 2.5 ms per read at 1M rows against 0.6 ms for a real
    column, a cost no real index pays for those two columns. `dataset` stays constant, as in a one-dataset
    index.)"""
    from rag_worker.store import PACKED, packed_column, table_schema
    from rag_worker.store.rows import SENTENCE_COLUMNS

    now = datetime.now(UTC).isoformat(timespec="seconds")
    n = len(vectors)
    rows = range(start, start + n)
    ids = [row_id(r) for r in rows]
    docs = [r // CHUNKS_PER_DOC for r in rows]
    schema = table_schema(store.embedder.dim, store.own_marker)
    body = [texts[r % len(texts)] for r in rows]  # a document's chunks differ, as real ones do
    data = {
        "id": ids,
        "doc_key": [hashlib.sha256(f"synthetic/doc{d}.txt".encode()).hexdigest()[:40] for d in docs],
        "document_id": [hashlib.sha256(f"doc{d}".encode()).hexdigest() for d in docs],
        "filename": [f"doc{d}.txt" for d in docs],
        "dataset": ["synthetic"] * n,
        "page": [None] * n,
        "chunk_index": [r % CHUNKS_PER_DOC for r in rows],
        "text": body,
        "metadata": [json.dumps({"kind": "text", "title": t.split("\n", 1)[0][:200]}) for t in body],
        "file_bytes": [0] * n,
        "indexed_at": [now] * n,
        "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), vectors.shape[1]),
    }
    data[PACKED] = packed_column(pa.table(data))
    for name in SENTENCE_COLUMNS:  # retrieval reads none: synthetic rows carry no sentence vectors
        data[name] = [None] * n
    table.add(pa.table(data, schema=schema))


def percentiles(samples: list[float]) -> tuple[float, float]:
    s = sorted(samples)
    p95 = s[min(len(s) - 1, int(round(0.95 * (len(s) - 1))))]
    return statistics.median(s), p95


def time_store(
    store, queries: list[str], qvecs: np.ndarray, mode: str
) -> tuple[list[float], list[list[str]]]:
    # Every latency round since the first timed plain RRF (k=10), the store's old default; naming it keeps the
    # figures comparable across rounds (the robust fusion's own cost is in the fusion rounds' figures).
    fused = {"fusion": "rrf", "rrf_k": 10}
    store.search(INDEX, queries[0], mode=mode, vector=qvecs[0], limit=TOP, **fused)  # warm-up
    times, results = [], []
    for q, v in zip(queries, qvecs, strict=True):
        t0 = time.perf_counter()
        hits = store.search(INDEX, q, mode=mode, vector=v, limit=TOP, **fused)
        times.append((time.perf_counter() - t0) * 1000)
        results.append([h.id for h in hits])
    return times, results


def time_numpy(matrix: np.ndarray, qvecs: np.ndarray) -> tuple[list[float], list[list[str]]]:
    times, results = [], []
    for v in qvecs:
        t0 = time.perf_counter()
        scores = matrix @ v
        top = np.argpartition(-scores, TOP)[:TOP]
        top = top[np.argsort(-scores[top])]
        times.append((time.perf_counter() - t0) * 1000)
        results.append([row_id(int(i)) for i in top])
    return times, results


def recall10(got: list[list[str]], truth: list[list[str]]) -> float:
    return statistics.mean(len(set(g[:10]) & set(t[:10])) / 10 for g, t in zip(got, truth, strict=True))


def leg_recall(store, queries: list[str], qvecs: np.ndarray, matrix: np.ndarray) -> float:
    """Recall of the hybrid mode's vector leg (HYBRID_LEG_MIN chunks deep) against the exact top as deep."""
    from rag_worker.store import HYBRID_LEG_MIN as depth

    found = []
    for q, v in zip(queries, qvecs, strict=True):
        exact = np.argpartition(-(matrix @ v), depth)[:depth]
        hits = store.search(INDEX, q, mode="vector", vector=v, limit=depth)
        found.append(len({h.id for h in hits} & {row_id(int(i)) for i in exact}) / depth)
    return statistics.mean(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", type=int, default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--index-types", nargs="+", default=["IVF_HNSW_SQ"])
    parser.add_argument("--base", type=int, default=None, help="use only the first N cached vectors as bases")
    parser.add_argument("--partitions", nargs="+", type=int, default=[0], help="IVF partitions (0: default)")
    parser.add_argument("--nprobes", nargs="+", type=int, default=None, help="default: the store's")
    parser.add_argument("--refine", nargs="+", type=int, default=None, help="default: the store's")
    parser.add_argument(
        "--ef", nargs="+", type=int, default=None, help="HNSW ef (0: LanceDB's); default: the store's"
    )
    parser.add_argument("--dir", type=Path, default=ROOT / ".cache" / "bench" / "latency")
    parser.add_argument("--vectors", type=Path, default=ROOT / ".cache" / "bench" / "vectors.sqlite")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="one size only: keep the table (and ANN index) an earlier run with the same arguments left in --dir "
        "instead of writing and indexing it again; LanceDB's exact scan is then not timed",
    )
    args = parser.parse_args(argv)
    if args.reuse and len(args.sizes) != 1:
        parser.error("--reuse takes one --sizes value")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import shutil

    from rag_worker.services import Services
    from rag_worker.settings import Settings

    stamp_path = args.dir / "bench-latency.json"
    stamp = {
        "layout": LAYOUT,
        "size": max(args.sizes),
        "base": args.base,
        "vectors": str(args.vectors.resolve()),
    }
    stamp["vectors_bytes"] = args.vectors.stat().st_size if args.vectors.is_file() else 0
    old = json.loads(stamp_path.read_text()) if stamp_path.is_file() else {}
    reuse = args.reuse and {k: old.get(k) for k in stamp} == stamp
    if not reuse:
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
    # The table is created through the store (schema, marker, FTS index), then grown by bulk appends. The seed row
    # is drawn on --reuse too, so that the rng yields the same vectors as the run that wrote the table.
    first = synthetic(base, 0, 1, rng)
    if reuse:
        print(f"reusing the {stamp['size']}-row table in {args.dir}", file=sys.stderr, flush=True)
    else:
        store.add_chunks(INDEX, [{"document_id": "0" * 64, "filename": "seed.txt", "dataset": "synthetic",
                                  "chunk_index": 0, "text": texts[0], "vector": first[0]}])  # fmt: skip
        store.delete_document(INDEX, dataset="synthetic", filename="seed.txt")
    table = store.table(INDEX)
    chunks: list[np.ndarray] = []
    have = 0
    rows: list[dict] = []
    print(
        "| chunks | search | index build s | vector p50 / p95 ms | hybrid p50 / p95 ms | recall@10 | leg recall@100 "
        "| vector / hybrid speed-up vs numpy exact |",
        flush=True,
    )
    print("|---:|---|---:|---|---|---:|---:|---|", flush=True)
    saved_search = store.ann
    for size in sorted(args.sizes):
        t0 = time.monotonic()
        while have < size:
            n = min(100_000, size - have)
            vecs = synthetic(base, have, n, rng)
            if not reuse:
                append(store, table, texts, vecs, have)
            chunks.append(vecs)
            have += n
        if not reuse:
            # Fold the appends into the FTS index (as every store write does), and drop any ANN index of the last
            # size.
            for idx in table.list_indices():
                if idx.index_type != "FTS":
                    table.drop_index(idx.name)
            table.optimize()
            if size == stamp["size"]:
                stamp_path.write_text(json.dumps({**stamp, "ann": None}))
            print(f"  {size} rows written in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
        matrix = np.concatenate(chunks)

        np_times, truth = time_numpy(matrix, qvecs)
        report = [("numpy exact", None, np_times, None, 1.0, 1.0)]
        if not reuse:
            v_times, v_res = time_store(store, queries, qvecs, "vector")
            h_times, _ = time_store(store, queries, qvecs, "hybrid")
            report.append(("lancedb exact", None, v_times, h_times, recall10(v_res, truth), 1.0))
        np_p50 = percentiles(np_times)[0]
        for entry in report:
            _row(size, *entry, np_p50, rows)
        nprobes = args.nprobes or [store.ann.nprobes]
        refines = args.refine if args.refine is not None else [store.ann.refine_factor]
        efs = args.ef if args.ef is not None else [store.ann.ef]
        for kind in args.index_types:
            for parts in args.partitions:
                t1 = time.monotonic()
                built = None
                if not (reuse and old.get("ann") == [kind, parts] and store.has_ann(INDEX)):
                    store.build_ann(INDEX, kind, parts or None)
                    built = time.monotonic() - t1
                    if size == stamp["size"]:
                        stamp_path.write_text(json.dumps({**stamp, "ann": [kind, parts]}))
                    old = {}
                for probes, refine, ef in itertools.product(nprobes, refines, efs):
                    store.ann = dataclasses.replace(store.ann, nprobes=probes, refine_factor=refine, ef=ef)
                    v_times, v_res = time_store(store, queries, qvecs, "vector")
                    h_times, _ = time_store(store, queries, qvecs, "hybrid")
                    name = f"lancedb {kind} p={parts or 'default'} nprobes={probes} refine={refine} ef={ef}"
                    deep = leg_recall(store, queries, qvecs, matrix)
                    report.append((name, built, v_times, h_times, recall10(v_res, truth), deep))
                    _row(size, *report[-1], np_p50, rows)
                    built = None
        store.ann = saved_search
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


def _row(size, name, built, vt, ht, rec, deep, np_p50, rows) -> None:
    vp = "{:.1f} / {:.1f}".format(*percentiles(vt))
    hp = "{:.1f} / {:.1f}".format(*percentiles(ht)) if ht else "n/a"
    b = f"{built:.0f}" if built is not None else ""
    speed = f"{np_p50 / percentiles(vt)[0]:.1f}x"
    speed += f" / {np_p50 / percentiles(ht)[0]:.1f}x" if ht else ""
    print(f"| {size:,} | {name} | {b} | {vp} | {hp} | {rec:.3f} | {deep:.3f} | {speed} |", flush=True)
    rows.append(
        {"size": size, "search": name, "build_s": built, "vector_ms": percentiles(vt),
         "hybrid_ms": percentiles(ht) if ht else None, "recall@10": rec, "leg_recall@100": deep}
    )  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
