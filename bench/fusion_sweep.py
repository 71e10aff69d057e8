"""Sweep the hybrid fusion parameters on a BEIR split, offline, over the legs of the cached index.

    .venv/bin/python -m bench.fusion_sweep --dataset ../shared/eval/scifact --split train

Needs the index `bench.retrieval` built (same cache). Each query's two legs are fetched once, `--depth` chunks
deep, through `Store.search` in fts and vector mode; the fusion `Store.search` does in hybrid mode (RRF at chunk
level, a document scoring as its best chunk) is then replayed for every RRF k, FTS leg weight and leg depth, and
nDCG@10 printed. It also rebuilds the FTS index of a copy of the table under other tokenizer settings and reports
FTS-only nDCG@10 for each. Use it on train, then confirm the chosen setting with `bench.retrieval` on test.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
from pathlib import Path

from bench import beir
from bench.retrieval import INDEX, ROOT, ensure_index, filename_for


def legs(services, data, depth: int):
    store = services.store
    out = {}
    for qid, query in data.queries.items():
        vec = store.search(INDEX, query, mode="vector", limit=depth)
        fts = store.search(INDEX, query, mode="fts", limit=depth)
        out[qid] = ([(h.id, h.filename) for h in vec], [(h.id, h.filename) for h in fts])
    return out


def fuse(vec, fts, k: int, w_fts: float, depth: int) -> list[str]:
    scores: dict[str, float] = {}
    fname: dict[str, str] = {}
    for rank, (cid, f) in enumerate(vec[:depth], start=1):
        scores[cid] = scores.get(cid, 0.0) + 1.0 / (k + rank)
        fname[cid] = f
    for rank, (cid, f) in enumerate(fts[:depth], start=1):
        scores[cid] = scores.get(cid, 0.0) + w_fts / (k + rank)
        fname[cid] = f
    ranked = sorted(scores, key=lambda c: -scores[c])
    return list(dict.fromkeys(fname[c] for c in ranked))


def fts_variants(services, data, store_dir: Path):
    """FTS-only nDCG@10 under other tokenizer settings, on a copy of the built table."""
    import lancedb
    from lancedb.index import FTS
    from lancedb.query import MatchQuery

    doc_of = {filename_for(d): d for d in data.corpus}
    src = services.store._require(INDEX).to_arrow().select(["id", "filename", "text"])
    scratch = store_dir / "fts-sweep"
    shutil.rmtree(scratch, ignore_errors=True)
    db = lancedb.connect(str(scratch))
    table = db.create_table("t", data=src)
    variants = {
        "stem+stop+fold (store default)": dict(stem=True, remove_stop_words=True, ascii_folding=True),
        "no stemming": dict(stem=False, remove_stop_words=True, ascii_folding=True),
        "keep stop words": dict(stem=True, remove_stop_words=False, ascii_folding=True),
        "no stem, keep stop words": dict(stem=False, remove_stop_words=False, ascii_folding=True),
    }
    results = {}
    for name, opts in variants.items():
        table.create_index("text", config=FTS(language="English", lower_case=True, **opts), replace=True)
        run = {}
        for qid, query in data.queries.items():
            rows = table.search(MatchQuery(query, "text"), query_type="fts").limit(100).to_list()
            run[qid] = list(dict.fromkeys(doc_of.get(r["filename"], r["filename"]) for r in rows))
        results[name] = beir.evaluate(run, data.qrels)["ndcg@10"]
        print(f"| FTS {name} | {results[name]:.3f} |", flush=True)
    shutil.rmtree(scratch, ignore_errors=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--split", default="train")
    parser.add_argument("--depth", type=int, default=200)
    parser.add_argument("--cache-dir", type=Path, default=ROOT / ".cache" / "bench")
    parser.add_argument("--no-fts-variants", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    data = beir.load(args.dataset, args.split)
    services, store_dir, _ = ensure_index(data, None, args.cache_dir)
    doc_of = {filename_for(d): d for d in data.corpus}
    fetched = legs(services, data, args.depth)
    print(f"{len(data.queries)} queries of {args.split}; legs {args.depth} chunks deep")
    print("| rrf_k | fts weight | leg depth | nDCG@10 | MRR@10 |")
    print("|---:|---:|---:|---:|---:|")
    best = None
    for k, w, depth in itertools.product(
        (5, 10, 20, 30, 60, 100), (0.5, 0.75, 1.0, 1.5, 2.0), (50, 100, 200)
    ):
        run = {
            qid: [doc_of.get(f, f) for f in fuse(vec, fts, k, w, min(depth, args.depth))]
            for qid, (vec, fts) in fetched.items()
        }
        m = beir.evaluate(run, data.qrels)
        print(f"| {k} | {w} | {depth} | {m['ndcg@10']:.4f} | {m['mrr@10']:.4f} |", flush=True)
        if best is None or m["ndcg@10"] > best[0]:
            best = (m["ndcg@10"], k, w, depth)
    print(f"best: nDCG@10 {best[0]:.4f} at rrf_k {best[1]}, fts weight {best[2]}, leg depth {best[3]}")
    if not args.no_fts_variants:
        fts_variants(services, data, store_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
