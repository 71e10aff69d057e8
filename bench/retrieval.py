"""Retrieval quality on a BEIR-format dataset, through the worker's own ingestion chunking and retrieval stage.

    .venv/bin/python -m bench.retrieval --dataset ../shared/eval/scifact --split test
    .venv/bin/python -m bench.retrieval --dataset ../shared/eval/scifact OTHER_BEIR_FOLDER --split test
    .venv/bin/python -m bench.retrieval --dataset ../shared/eval/scifact --split train --limit-docs 200 \
        --modes fts vector hybrid
    .venv/bin/python -m bench.retrieval --dataset ../shared/eval/scifact --embedder multilingual-e5-small

Several `--dataset` folders are measured in one run and printed as one table (collection x mode), so that a
change that wins on one collection and loses on another shows at once. A folder without the split falls back
to `test` (a collection whose qrels hold only a test split).

Each corpus document becomes a file `<_id>.txt` holding "title\\n\\nbody". The file is converted and chunked by
the ingestion pipeline's own converter and chunker (`Services.converter` and `Services.chunker`, the ones
`ingest_file` uses), and the rows written are the ones `ingest_file` writes; only the embedding is batched across documents and
the writes grouped into large commits, because one commit per abstract would take hours here. The built index is
cached under `.cache/bench/retrieval/`, keyed by dataset, slice, embedder and chunking settings, and chunk vectors
are cached by text, so a rebuild after a change to the FTS config or the chunk budget embeds only new texts.

Every query then goes through `rag_worker.pipeline.retrieve.search` (the stage `/chat` runs, with a Turn built by
`chat.prepare` with rewrite and HyDE off since BEIR queries are standalone), for each mode:
- fts, vector;
- rrf: the baseline, plain reciprocal rank fusion (k = 60, both legs 100 deep), whatever FUSION says;
- hybrid: the shipped fusion (FUSION, FUSION_ALPHA, RRF_K from the environment);
- hybrid+rerank, when RERANKER_MODEL is set (the `/chat` rerank stage over the same candidates).
HyDE needs a generating LLM and is not measured here. Retrieved chunks map back to documents by file name, a
document scoring as its best chunk. nDCG@10 and MRR@10 come from the stage as `/chat` calls it (RETRIEVAL_CANDIDATES
chunks); Recall@100 needs a deeper list, so it comes from a second call with `--depth` chunks. Settings come from
the environment as for the worker (RRF_K, CHUNK_TOKENS, ...), so a variant is one environment variable away.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sqlite3
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from bench import beir

ROOT = Path(__file__).resolve().parent.parent
INDEX = "beir"
DATASET = "beir"
ALL_MODES = ("fts", "vector", "rrf", "hybrid", "hybrid+rerank")
BASELINE = {"fusion": "rrf", "rrf_k": 60}  # the "rrf" mode: what fusion must beat
WRITE_BATCH = 4096
_SAFE_ID = re.compile(r"^[A-Za-z0-9_.-]{1,120}$")


def filename_for(doc_id: str) -> str:
    """`<_id>.txt`, or a digest when the id holds characters a file name may not."""
    if _SAFE_ID.fullmatch(doc_id) and not doc_id.startswith("."):
        return f"{doc_id}.txt"
    return f"id-{hashlib.sha256(doc_id.encode()).hexdigest()[:32]}.txt"


# -- the embedding cache -----------------------------------------------------------------------------------------


def vectors_made_by(embedder) -> str:
    """What a cached vector was made by: the model, and its precision unless float32 (whose cache keys predate
    EMBEDDING_PRECISION and stay valid)."""
    precision = getattr(embedder, "precision", "float32")
    return embedder.model_id if precision == "float32" else f"{embedder.model_id}@{precision}"


class VectorCache:
    """Chunk vectors by (model, max_length, text), so rebuilding an index re-embeds only texts never seen."""

    def __init__(self, path: Path, embedder):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path)
        self._db.execute("CREATE TABLE IF NOT EXISTS vec (key TEXT PRIMARY KEY, v BLOB NOT NULL)")
        self._embedder = embedder
        self._prefix = f"{vectors_made_by(embedder)}\x00{embedder.max_length}\x00"

    def _key(self, text: str) -> str:
        return hashlib.sha256((self._prefix + text).encode()).hexdigest()

    def embed(self, texts: list[str], *, label: str = "embedding") -> np.ndarray:
        dim = self._embedder.dim
        out = np.zeros((len(texts), dim), dtype=np.float32)
        keys = [self._key(t) for t in texts]
        missing: list[int] = []
        for start in range(0, len(keys), 500):
            part = keys[start : start + 500]
            found = dict(
                self._db.execute(
                    f"SELECT key, v FROM vec WHERE key IN ({','.join('?' * len(part))})", part
                ).fetchall()
            )
            for i, key in enumerate(part, start=start):
                if key in found:
                    out[i] = np.frombuffer(found[key], dtype=np.float32)
                else:
                    missing.append(i)
        # Longest texts first would front-load the slow part; the embedder sorts within each slice anyway.
        t0 = time.monotonic()
        step = 512
        for n in range(0, len(missing), step):
            idx = missing[n : n + step]
            vecs = self._embedder.embed_documents([texts[i] for i in idx])
            out[idx] = vecs
            self._db.executemany(
                "INSERT OR REPLACE INTO vec (key, v) VALUES (?, ?)",
                [(keys[i], vecs[j].astype(np.float32).tobytes()) for j, i in enumerate(idx)],
            )
            self._db.commit()
            done = min(n + step, len(missing))
            rate = done / max(time.monotonic() - t0, 1e-6)
            print(
                f"  {label}: {done}/{len(missing)} new chunks ({rate:.1f}/s, "
                f"{(len(missing) - done) / max(rate, 1e-6) / 60:.1f} min left)",
                file=sys.stderr,
                flush=True,
            )
        return out


# -- building the index ------------------------------------------------------------------------------------------


def bench_settings(store_dir: Path):
    from rag_worker.settings import Settings

    return Settings(INDEX_STORE=str(store_dir), OVERVIEW_SUMMARIES="off")


def index_key(data: beir.BeirDataset, limit_docs: int | None, settings, embedder) -> str:
    """What the built index depends on: the corpus, the slice, the embedder, the chunking and the FTS config."""
    from rag_worker import store

    corpus = data.root / "corpus.jsonl"
    stat = corpus.stat()
    parts = {
        "corpus": str(corpus.resolve()),
        "size": stat.st_size,
        "mtime": int(stat.st_mtime),
        "limit_docs": limit_docs or 0,
        "model": embedder.model_id,
        "max_length": embedder.max_length,
        "chunk_tokens": settings.chunk_tokens,
        "fts": getattr(store, "FTS_CONFIG", None),
        "format": 2,
    }
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]
    name = re.sub(r"[^A-Za-z0-9_-]", "_", data.root.resolve().name)
    return f"{name}-{limit_docs or 'all'}-{digest}"


def build_rows(services, data: beir.BeirDataset, cache: VectorCache) -> list[dict]:
    """Rows as `ingest_file` writes them, for every corpus document (conversion and chunking are the pipeline's)."""
    from rag_worker.ingest.document import document_title, file_sha256

    converter, chunker = services.converter, services.chunker
    chunks_of: list[tuple[str, str, str, object, list]] = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="beir-") as tmp:
        for n, (doc_id, doc) in enumerate(data.corpus.items(), start=1):
            filename = filename_for(doc_id)
            path = Path(tmp) / filename
            body = "\n\n".join(p for p in (doc["title"].strip(), doc["text"].strip()) if p)
            path.write_text(body or doc_id, encoding="utf-8")
            converted = converter.convert(path, filename)
            chunks = chunker.chunk(converted.document)
            chunks_of.append(
                (filename, file_sha256(path), document_title(converted, filename), converted.kind, chunks)
            )
            path.unlink()
            if n % 1000 == 0:
                print(f"  chunked {n}/{len(data.corpus)} documents", file=sys.stderr, flush=True)
    n_chunks = sum(len(c[4]) for c in chunks_of)
    print(
        f"  {len(chunks_of)} documents -> {n_chunks} chunks in {time.monotonic() - t0:.0f} s",
        file=sys.stderr,
        flush=True,
    )
    texts = [c.embed_text for *_, chunks in chunks_of for c in chunks]
    vectors = cache.embed(texts)
    now = datetime.now(UTC).isoformat(timespec="seconds")
    rows: list[dict] = []
    for filename, document_id, title, kind, chunks in chunks_of:
        for c in chunks:
            rows.append(
                {
                    "document_id": document_id,
                    "filename": filename,
                    "dataset": DATASET,
                    "page": c.page,
                    "chunk_index": c.chunk_index,
                    "text": c.text,
                    "vector": vectors[len(rows)],
                    "metadata": {**c.metadata, "kind": kind, "title": title},
                    "file_bytes": 0,
                    "indexed_at": now,
                }
            )
    return rows


def ensure_index(
    data: beir.BeirDataset,
    limit_docs: int | None,
    cache_dir: Path,
    rebuild: bool = False,
    embedder_name: str = "default",
):
    """Services over a built index of `data` (cached) made with the embedder `embedder_name` (rag_worker/
    embedders.py); returns (services, store_dir, built_now)."""
    from rag_worker.services import Services

    probe = Services(bench_settings(cache_dir / "probe"))
    embedder = probe.embedder_named(embedder_name)
    key = index_key(data, limit_docs, probe.settings, embedder)
    store_dir = cache_dir / "retrieval" / key
    settings = bench_settings(store_dir)
    services = Services(settings)
    services.__dict__["embedder"] = probe.embedder  # one model load per run (the chunker's tokenizer is its)
    services._embedders = probe._embedders
    done_marker = store_dir / "complete.json"
    if done_marker.is_file() and not rebuild and services.store.exists(INDEX):
        return services, store_dir, False
    print(f"building index {key} ({len(data.corpus)} documents)", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    services.store.drop(INDEX)
    done_marker.unlink(missing_ok=True)
    services.store.create_index(INDEX, embedder=embedder_name)
    rows = build_rows(services, data, VectorCache(cache_dir / "vectors.sqlite", embedder))
    for start in range(0, len(rows), WRITE_BATCH):
        services.store.add_chunks(INDEX, rows[start : start + WRITE_BATCH])
    store_dir.mkdir(parents=True, exist_ok=True)
    done_marker.write_text(
        json.dumps({"documents": len(data.corpus), "chunks": len(rows), "seconds": time.monotonic() - t0})
    )
    seconds = time.monotonic() - t0
    print(
        f"  built in {seconds:.0f} s ({len(data.corpus) / seconds:.1f} documents/s, {len(rows) / seconds:.1f} "
        f"chunks/s, embedding included unless its vectors were cached)",
        file=sys.stderr,
        flush=True,
    )
    return services, store_dir, True


# -- running the queries -----------------------------------------------------------------------------------------


@dataclass
class ModeResult:
    mode: str
    metrics: dict[str, float]
    ms_per_query: float


def make_turn(services, mode: str):
    from rag_worker.pipeline.chat import prepare
    from rag_worker.schemas import ChatRequest, Options

    leg = "hybrid" if mode.startswith("hybrid") or mode == "rrf" else mode
    request = ChatRequest(
        prompt="benchmark",
        index=INDEX,
        options=Options(route="rag", rewrite=False, hyde=False, rerank=mode.endswith("+rerank"), mode=leg),
    )
    return prepare(services, request)


def run_mode(services, data: beir.BeirDataset, mode: str, depth: int) -> ModeResult:
    """nDCG@10 and MRR@10 at the stage's own candidate count; Recall@100 from `depth` candidates."""
    from rag_worker.pipeline import retrieve

    doc_of = {filename_for(d): d for d in data.corpus}
    turn = make_turn(services, mode)
    candidates = services.settings.candidates
    top_run: dict[str, list[str]] = {}
    deep_run: dict[str, list[str]] = {}
    spent = 0.0
    for qid, query in data.queries.items():
        t0 = time.perf_counter()
        hits = _stage(retrieve, turn, query, mode, candidates)
        spent += time.perf_counter() - t0
        top_run[qid] = beir.docs_from_hits(hits, lambda h: doc_of.get(h.filename, h.filename))
        if depth > candidates:
            hits = _stage(retrieve, turn, query, mode, depth)
            deep_run[qid] = beir.docs_from_hits(hits, lambda h: doc_of.get(h.filename, h.filename))
        else:
            deep_run[qid] = top_run[qid]
    top = beir.evaluate(top_run, data.qrels)
    deep_metrics = beir.evaluate(deep_run, data.qrels)
    metrics = {"ndcg@10": top["ndcg@10"], "recall@100": deep_metrics["recall@100"], "mrr@10": top["mrr@10"]}
    return ModeResult(mode, metrics, 1000.0 * spent / max(1, len(data.queries)))


def _stage(retrieve, turn, query: str, mode: str, candidates: int):
    # The stage reads RETRIEVAL_CANDIDATES (and the fusion) from the settings: set for this call (the deep one
    # for Recall@100; plain RRF for the baseline mode).
    settings = turn.services.settings
    override = {"candidates": candidates, **(BASELINE if mode == "rrf" else {})}
    saved = {name: getattr(settings, name) for name in override}
    for name, value in override.items():
        setattr(settings, name, value)
    try:
        hits = retrieve.search(turn, query)
        if mode.endswith("+rerank"):
            hits = retrieve.rerank(turn, query, hits)
        return hits
    finally:
        for name, value in saved.items():
            setattr(settings, name, value)


def format_table(results: list[ModeResult], collections: list[str] | None = None) -> str:
    """One row per (collection, mode); with one collection the collection column is left out."""
    many = collections is not None and len(set(collections)) > 1
    head = "| collection | mode |" if many else "| mode |"
    lines = [
        f"{head} nDCG@10 | Recall@100 | MRR@10 | ms/query |",
        ("|---|---|" if many else "|---|") + "---:|---:|---:|---:|",
    ]
    for n, r in enumerate(results):
        m = r.metrics
        first = f"| {collections[n]} | {r.mode} |" if many else f"| {r.mode} |"
        lines.append(
            f"{first} {m['ndcg@10']:.3f} | {m['recall@100']:.3f} | {m['mrr@10']:.3f} | {r.ms_per_query:.0f} |"
        )
    return "\n".join(lines)


def load_split(root: Path, split: str, limit_docs: int | None) -> beir.BeirDataset:
    if not (root / "qrels" / f"{split}.tsv").is_file() and (root / "qrels" / "test.tsv").is_file():
        print(f"{root}: no {split} split, using test", file=sys.stderr)
        split = "test"
    return beir.load(root, split, limit_docs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, nargs="+", required=True, help="BEIR-format folders")
    parser.add_argument("--split", default="test")
    parser.add_argument("--limit-docs", type=int, default=None, help="index a slice of this many documents")
    parser.add_argument("--modes", nargs="+", default=list(ALL_MODES), choices=ALL_MODES)
    parser.add_argument("--depth", type=int, default=300, help="chunks fetched for Recall@100 (default 300)")
    parser.add_argument("--cache-dir", type=Path, default=ROOT / ".cache" / "bench")
    parser.add_argument("--rebuild", action="store_true", help="rebuild the cached index")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument(
        "--embedder",
        default="default",
        choices=("default", "multilingual-e5-small"),
        help="the index's embedder, as `embedder` on index creation (default: EMBEDDING_MODEL, MiniLM)",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    results: list[ModeResult] = []
    collections: list[str] = []
    report = []
    skipped: list[str] = []
    for root in dict.fromkeys(args.dataset):
        data = load_split(root, args.split, args.limit_docs)
        if not data.queries:
            raise SystemExit(f"{root}: no query of this split has a relevant document in the corpus (slice)")
        services, store_dir, _ = ensure_index(
            data, args.limit_docs, args.cache_dir, args.rebuild, embedder_name=args.embedder
        )
        embedder = services.store.embedder_for(INDEX)
        modes = list(dict.fromkeys(args.modes))
        if "hybrid+rerank" in modes and services.reranker is None:
            modes.remove("hybrid+rerank")
            note = "hybrid+rerank (RERANKER_MODEL is not set)"
            if note not in skipped:
                skipped.append(note)
        s = services.settings
        chunks = services.store.count(INDEX)
        name = data.root.resolve().name
        print(
            f"{name} ({data.root}): {len(data.queries)} queries, {len(data.corpus)} documents, {chunks} chunks; "
            f"embedder {embedder.model_id} (max_length {embedder.max_length}, "
            f"{getattr(embedder, 'precision', 'float32')}), "
            f"CHUNK_TOKENS {s.chunk_tokens}, hybrid = FUSION {s.fusion} (FUSION_ALPHA {s.fusion_alpha}, "
            f"RRF_K {s.rrf_k}), rrf = plain RRF k=60, RETRIEVAL_CANDIDATES {s.candidates}, depth {args.depth}"
        )
        # Query vectors first (the embedder caches them): ms/query then measures the search itself in every
        # mode, rather than charging the first mode for embedding every query.
        for query in data.queries.values():
            embedder.embed_query(query)
        mine = []
        for mode in modes:
            mine.append(run_mode(services, data, mode, args.depth))
            print(f"  {name} {mode} done", file=sys.stderr, flush=True)
        results.extend(mine)
        collections.extend([name] * len(mine))
        report.append(
            {
                "dataset": str(data.root),
                "queries": len(data.queries),
                "documents": len(data.corpus),
                "chunks": chunks,
                "settings": {
                    "chunk_tokens": s.chunk_tokens,
                    "fusion": s.fusion,
                    "fusion_alpha": s.fusion_alpha,
                    "rrf_k": s.rrf_k,
                    "candidates": s.candidates,
                },
                "results": [r.__dict__ for r in mine],
            }
        )
    print(format_table(results, collections))
    for note in skipped:
        print(f"skipped: {note}")
    print("not measured: HyDE (needs a generating LLM); query rewrite (BEIR queries are standalone)")
    if args.json:
        args.json.write_text(json.dumps({"split": args.split, "collections": report}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
