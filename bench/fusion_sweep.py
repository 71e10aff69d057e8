"""Sweep the hybrid fusion on BEIR splits, offline, by replaying the store's own fusion over each query's legs.

    .venv/bin/python -m bench.fusion_sweep --dataset ../shared/eval/scifact --splits train test

Needs the index `bench.retrieval` built (same cache). Each query's two legs are fetched once, `--depth` chunks
deep (what hybrid mode fetches, `store.HYBRID_LEG_MIN`), through the store's own leg search; then
`rag_worker.store.fuse` (the function `Store.search` calls) is replayed for every fusion and parameter: RRF for
several k, and the convex combinations of theoretical-min-max ("tmm") and z-score normalised scores for every
vector-leg weight alpha on a 0.1 grid. Documents are ranked from the fused top `--limit` chunks
(RETRIEVAL_CANDIDATES) either by their best chunk (max: the first appearance, what `bench.retrieval` and a
`/chat` client see) or by the sum of their chunks' fused scores. nDCG@10 is printed per split, so that the whole
curve shows and not only its best point; choose on train, then confirm with `bench.retrieval` on test.
`--prf` also measures pseudo-relevance feedback on the FTS leg (RM3-style: the `--prf-terms` terms weighing most
in the top `--prf-docs` FTS chunks, each chunk's term frequencies weighted by its share of their BM25 scores, are
added to the query and the FTS leg is run again), fused the same ways. `--fts-variants` also rebuilds the FTS index
of a copy of the table under other tokenizer settings.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from bench import beir
from bench.retrieval import INDEX, ROOT, ensure_index, filename_for

_KEEP = ("id", "document_id", "filename", "dataset", "page", "chunk_index", "metadata", "_distance", "_score")


def legs(services, data: beir.BeirDataset, depth: int, prf_docs: int = 0):
    """qid -> (vector rows, FTS rows, query vector), as `Store.search` fetches them in hybrid mode."""
    from rag_worker.store import _has_words

    store = services.store
    tables = [(INDEX, store._require(INDEX))]
    out = {}
    texts = {}
    for n, (qid, query) in enumerate(data.queries.items(), start=1):
        qvec = services.embedder.embed_query(query)
        vec_rows, fts_rows = store._run_legs(tables, qvec, query if _has_words(query) else None, None, depth)
        out[qid] = (_slim(vec_rows), _slim(fts_rows), qvec)
        if prf_docs:
            texts[qid] = (
                query,
                [(nm, {"text": r["text"], "_score": r["_score"]}) for nm, r in fts_rows[:prf_docs]],
            )
        if n % 200 == 0:
            print(f"  legs: {n}/{len(data.queries)} queries", file=sys.stderr, flush=True)
    return (out, texts) if prf_docs else out


# English function words (the FTS tokenizer drops its own list; expansion terms must not be these either).
_STOP_WORDS = """a about above after again against all also am an and any are as at be because been before being below
    between both but by can could did do does doing down during each few for from further had has have having he
    her here hers him his how i if in into is it its itself just may me might more most must my no nor not now of
    off on once only or other our ours out over own same she should so some such than that the their theirs them
    then there these they this those through to too under until up very was we were what when where which while
    who whom why will with would you your yours within without however therefore thus using used use via among
    whether either neither both per et al"""
STOP = set(_STOP_WORDS.split())
_TERM = re.compile(r"[a-z][a-z-]{2,}")


def prf_query(query: str, fts_rows, n_docs: int, n_terms: int) -> str:
    """The query plus the terms weighing most in the top FTS chunks (RM3's relevance model, unsmoothed)."""
    top = fts_rows[:n_docs]
    if not top:
        return query
    total = sum(max(float(r["_score"]), 0.0) for _, r in top) or 1.0
    own = set(_TERM.findall(query.lower()))
    weight: Counter = Counter()
    for _, r in top:
        terms = [t for t in _TERM.findall(r.get("text", "").lower()) if t not in STOP]
        if not terms:
            continue
        share = max(float(r["_score"]), 0.0) / total
        for term, tf in Counter(terms).items():
            if term not in own:
                weight[term] += share * tf / len(terms)
    return " ".join([query, *(t for t, _ in weight.most_common(n_terms))])


def prf_legs(services, fetched_texts: dict, fetched: dict, depth: int, n_docs: int, n_terms: int) -> dict:
    """The same legs with the FTS leg re-run on the expanded query."""
    store = services.store
    tables = [(INDEX, store._require(INDEX))]
    out = {}
    for qid, (vec_rows, _, qvec) in fetched.items():
        query, fts_full = fetched_texts[qid]
        expanded = prf_query(query, fts_full, n_docs, n_terms)
        _, fts_rows = store._run_legs(tables, qvec, expanded, None, depth)
        out[qid] = (vec_rows, _slim(fts_rows), qvec)
    return out


def _slim(rows):
    slim = []
    for name, row in rows:
        keep = {k: row[k] for k in _KEEP if k in row}
        keep["text"] = ""
        if row.get("vector") is not None:
            keep["vector"] = np.asarray(row["vector"], dtype=np.float32)
        slim.append((name, keep))
    return slim


def ranked_docs(hits, doc_of: dict, agg: str) -> list[str]:
    if agg == "max":
        return beir.docs_from_hits(hits, lambda h: doc_of.get(h.filename, h.filename))
    total: dict[str, float] = {}
    for h in hits:
        d = doc_of.get(h.filename, h.filename)
        total[d] = total.get(d, 0.0) + h.score
    return sorted(total, key=lambda d: -total[d])


def configs() -> list[tuple[str, dict]]:
    out = [(f"rrf k={k}", {"fusion": "rrf", "rrf_k": k}) for k in (10, 20, 40, 60, 100)]
    for fusion in ("tmm", "zscore"):
        for a in range(1, 10):
            out.append((f"{fusion} alpha={a / 10:.1f}", {"fusion": fusion, "alpha": a / 10}))
    return out


def evaluate(fetched: dict, data: beir.BeirDataset, limit: int, agg: str, params: dict) -> dict:
    from rag_worker.store import fuse

    doc_of = {filename_for(d): d for d in data.corpus}
    run = {}
    for qid, (vec_rows, fts_rows, qvec) in fetched.items():
        hits = fuse(vec_rows, fts_rows, qvec, limit=limit, **params)
        run[qid] = ranked_docs(hits, doc_of, agg)
    return beir.evaluate(run, data.qrels)


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
    from rag_worker.store import HYBRID_LEG_MIN

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--splits", nargs="+", default=["train"], help="the first one chooses (train)")
    parser.add_argument("--depth", type=int, default=HYBRID_LEG_MIN, help="chunks per leg")
    parser.add_argument("--limit", type=int, default=30, help="fused chunks kept (RETRIEVAL_CANDIDATES)")
    parser.add_argument("--cache-dir", type=Path, default=ROOT / ".cache" / "bench")
    parser.add_argument("--fts-variants", action="store_true")
    parser.add_argument("--prf", action="store_true", help="also measure RM3-style feedback on the FTS leg")
    parser.add_argument("--prf-docs", type=int, default=10)
    parser.add_argument("--prf-terms", type=int, default=10)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    splits = {name: beir.load(args.dataset, name) for name in args.splits}
    services, store_dir, _ = ensure_index(splits[args.splits[0]], None, args.cache_dir)
    if args.prf:
        fetched, prf_fetched = {}, {}
        for name, data in splits.items():
            fetched[name], texts = legs(services, data, args.depth, args.prf_docs)
            prf_fetched[name] = prf_legs(
                services, texts, fetched[name], args.depth, args.prf_docs, args.prf_terms
            )
    else:
        fetched = {name: legs(services, data, args.depth) for name, data in splits.items()}
    sizes = ", ".join(f"{name} {len(d.queries)} queries" for name, d in splits.items())
    print(f"{args.dataset}: {sizes}; legs {args.depth} chunks deep, top {args.limit} chunks fused")
    cols = [f"{s} {agg}" for agg in ("max", "sum") for s in args.splits]
    print("| fusion | " + " | ".join(f"nDCG@10 {c}" for c in cols) + " |")
    print("|---|" + "---:|" * len(cols))
    table: dict[str, dict[str, float]] = {}
    for label, params in configs():
        row = {}
        for agg in ("max", "sum"):
            for name, data in splits.items():
                row[f"{name} {agg}"] = evaluate(fetched[name], data, args.limit, agg, params)["ndcg@10"]
        table[label] = row
        print(f"| {label} | " + " | ".join(f"{row[c]:.4f}" for c in cols) + " |", flush=True)
    if args.prf:
        print(f"With RM3-style feedback on the FTS leg ({args.prf_docs} chunks, {args.prf_terms} terms):")
        for label, params in [("fts alone", {"fusion": "tmm", "alpha": 0.0})] + configs():
            row = {}
            for agg in ("max", "sum"):
                for name, data in splits.items():
                    m = evaluate(prf_fetched[name], data, args.limit, agg, params)
                    row[f"{name} {agg}"] = m["ndcg@10"]
            table[f"prf {label}"] = row
            print(f"| prf {label} | " + " | ".join(f"{row[c]:.4f}" for c in cols) + " |", flush=True)
    first = f"{args.splits[0]} max"
    for family in ("rrf", "tmm", "zscore", *(("prf rrf", "prf tmm", "prf zscore") if args.prf else ())):
        best = max((lb for lb in table if lb.startswith(family)), key=lambda lb: table[lb][first])
        print(f"best {family} on {first}: {best} ({table[best][first]:.4f})")
    if args.fts_variants:
        fts_variants(services, splits[args.splits[0]], store_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
