"""Sweep the hybrid fusion on BEIR splits, offline, by replaying the store's own fusion over each query's legs.

    .venv/bin/python -m bench.fusion_sweep --dataset ../shared/eval/scifact --splits train test

Needs the index `bench.retrieval` built (same cache). Each query's two legs are fetched once, `--depth` chunks
deep (what hybrid mode fetches, `store.HYBRID_LEG_MIN`), through the store's own leg search; then
`rag_worker.store.fuse` (the function `Store.search` calls) is replayed for every fusion and parameter: RRF for
several k, and the convex combinations of theoretical-min-max ("tmm"), z-score ("zscore") and robust z-score
("robust": median and MAD) normalised scores for every vector-leg weight alpha on a 0.1 grid. Documents are
ranked from the fused top `--limit` chunks (RETRIEVAL_CANDIDATES) either by their best chunk (max: the first
appearance, what `bench.retrieval` and a `/chat` client see) or by the sum of their chunks' fused scores.
nDCG@10 is printed per split, so that the whole curve shows and not only its best point; choose on train, then
confirm with `bench.retrieval` on test.
`--prf` also measures pseudo-relevance feedback on the FTS leg (RM3-style: the `--prf-terms` terms weighing most
in the top `--prf-docs` FTS chunks, each chunk's term frequencies weighted by its share of their BM25 scores, are
added to the query and the FTS leg is run again), fused the same ways. `--fts-variants` also rebuilds the FTS index
of a copy of the table under other tokenizer settings.

Two more leads, measured and not shipped (docs/benchmarks.md): `--exact-missing` gives a chunk only the vector
leg found its exact BM25 score (the FTS query again, filtered to those chunks) instead of BM25's floor, the
mirror of what an FTS-only chunk gets; `--doc-level` fuses per document (each leg's best normalised score among
the document's chunks, then the convex combination). `--small-indexes` replays everything as if each query
searched a small index holding only its source file's documents (for `bench.headings_collection`, whose section
ids are `<file>-<n>`). `--title-context` measures everything on an index whose chunks are embedded with their
document's first line (its title, when that line is a single line of at most 300 characters) in front, where
the chunk's own text does not already hold it (its own cache folder; vectors are shared through
`vectors.sqlite`).
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

# `_rowid` too: the store's legs and fusion break exact ties by it, and the replay must rank as the stage does.
_KEEP = (
    "id", "_rowid", "document_id", "filename", "dataset", "page", "chunk_index", "metadata", "_distance", "_score",
)  # fmt: skip


def legs(services, data: beir.BeirDataset, depth: int, prf_docs: int = 0):
    """qid -> (vector rows, FTS rows, query vector), as `Store.search` fetches them in hybrid mode."""
    from rag_worker.store import has_words

    store = services.store
    tables = store.snapshots(store.open_tables([INDEX]))
    out = {}
    texts = {}
    for n, (qid, query) in enumerate(data.queries.items(), start=1):
        qvec = services.embedder.embed_query(query)
        vec_rows, fts_rows = store.legs(tables, qvec, query if has_words(query) else None, None, depth)
        out[qid] = (_slim(vec_rows), _slim(fts_rows), qvec)
        if prf_docs:
            texts[qid] = (
                query,
                [(nm, {"text": r["text"], "_score": r["_score"]}) for nm, r in fts_rows[:prf_docs]],
            )
        if n % 200 == 0:
            print(f"  legs: {n}/{len(data.queries)} queries", file=sys.stderr, flush=True)
    return (out, texts) if prf_docs else out


def small_index_legs(services, data: beir.BeirDataset, fetched: dict) -> dict:
    """`fetched` as it would be if each query searched a small index holding only its source file's documents (a
    document's source is its id up to the last "-": `bench.headings_collection` names sections `<file>-<n>`): the
    vector leg every chunk of that file by exact cosine, the FTS leg the whole collection's FTS rows of that file
    (BM25 with the collection's term statistics, which a small index would compute over itself)."""
    from rag_worker.store import PACKED

    table = services.store.table(INDEX)
    columns = [c for c in ("id", "filename", PACKED, "document_id", "dataset", "chunk_index", "metadata", "vector")
               if c in table.schema.names]  # fmt: skip
    rows = table.search().select(columns).with_row_id(True).limit(None).to_arrow().to_pylist()
    doc_of = {filename_for(d): d for d in data.corpus}

    def source(doc_id: str) -> str:
        return doc_id.rsplit("-", 1)[0]

    by_source: dict[str, list[dict]] = {}
    for row in rows:
        by_source.setdefault(source(doc_of.get(row["filename"], row["filename"])), []).append(row)
    out = {}
    for qid, (_, fts_rows, qvec) in fetched.items():
        relevant = next(iter(data.qrels.get(qid, {})), None)
        if relevant is None:
            continue
        chunks = by_source[source(relevant)]
        matrix = np.stack([np.asarray(r["vector"], dtype=np.float32) for r in chunks])
        cos = matrix @ qvec / (np.linalg.norm(matrix, axis=1) * np.linalg.norm(qvec))
        vec_rows = [
            (
                INDEX,
                {**{k: v for k, v in chunks[j].items() if k != "vector"}, "_distance": float(1.0 - cos[j])},
            )
            for j in np.argsort(-cos)
        ]
        ids = {r["id"] for r in chunks}
        out[qid] = (vec_rows, [(n, r) for n, r in fts_rows if r["id"] in ids], qvec)
    return out


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
    tables = store.snapshots(store.open_tables([INDEX]))
    out = {}
    for qid, (vec_rows, _, qvec) in fetched.items():
        query, fts_full = fetched_texts[qid]
        expanded = prf_query(query, fts_full, n_docs, n_terms)
        _, fts_rows = store.legs(tables, qvec, expanded, None, depth)
        out[qid] = (vec_rows, _slim(fts_rows), qvec)
    return out


def _slim(rows):
    from rag_worker.store import PACKED, to_hit  # a packed table's rows carry their fields in this column

    slim = []
    for name, row in rows:
        keep = {k: row[k] for k in (*_KEEP, PACKED) if k in row}
        if "id" not in keep:  # a table whose packed column holds the id: the legs read no id column
            keep["id"] = to_hit(name, row).id
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


def exact_bm25(services, data: beir.BeirDataset, fetched: dict) -> dict:
    """qid -> {chunk id: BM25 score} for the chunks only the vector leg found (0 when no query term matches)."""
    from lancedb.query import MatchQuery

    table = services.store.table(INDEX)
    out = {}
    for qid, (vec_rows, fts_rows, _) in fetched.items():
        seen = {r["id"] for _, r in fts_rows}
        missing = [r["id"] for _, r in vec_rows if r["id"] not in seen]
        out[qid] = {}
        if missing:
            ids = ",".join(f"'{i}'" for i in missing)  # hex digests: nothing to quote
            q = table.search(MatchQuery(data.queries[qid], "text"), query_type="fts")
            rows = q.where(f"id IN ({ids})", prefilter=True).select(["id", "_score"]).limit(len(missing))
            out[qid] = {r["id"]: float(r["_score"]) for r in rows.to_arrow().to_pylist()}
    return out


def convex_variant(fetched: dict, data, params: dict, bm25_of: dict | None, doc_level: bool) -> dict:
    """nDCG@10 etc. of a convex fusion with exact BM25 for vector-only chunks (`bm25_of`) and/or per document."""
    from rag_worker.store import BM25_MIN, COSINE_MIN, fuse, normaliser

    fusion, alpha = params["fusion"], params["alpha"]
    doc_of = {filename_for(d): d for d in data.corpus}
    run = {}
    for qid, (vec_rows, fts_rows, qvec) in fetched.items():
        hits = fuse(vec_rows, fts_rows, qvec, limit=10**6, **params)
        nv = normaliser(fusion, [1.0 - float(r["_distance"]) for _, r in vec_rows], COSINE_MIN)
        nf = normaliser(fusion, [float(r["_score"]) for _, r in fts_rows], BM25_MIN)
        extra = (bm25_of or {}).get(qid, {})
        parts = []
        for h in hits:
            cos = h.vector_score if h.vector_score is not None else COSINE_MIN
            bm25 = h.fts_score if h.fts_score is not None else extra.get(h.id, BM25_MIN)
            parts.append((doc_of.get(h.filename, h.filename), nv(cos), nf(bm25)))
        if doc_level:
            best: dict[str, list[float]] = {}
            for doc, v, f in parts:
                b = best.setdefault(doc, [v, f])
                b[0], b[1] = max(b[0], v), max(b[1], f)
            scores = {d: alpha * v + (1 - alpha) * f for d, (v, f) in best.items()}
        else:
            scores = {}
            for doc, v, f in parts:
                scores[doc] = max(scores.get(doc, -1e9), alpha * v + (1 - alpha) * f)
        run[qid] = sorted(scores, key=lambda d: -scores[d])[:100]
    return beir.evaluate(run, data.qrels)


def with_title_context() -> None:
    """Chunks embedded with their document's first line in front (see the module's docstring)."""
    from rag_worker.ingest.chunk import Chunker

    chunk = Chunker.chunk

    def titled(self, doc):
        chunks = chunk(self, doc)
        first = next((t.text.strip() for t in doc.texts if t.text.strip()), "")
        if first and "\n" not in first and len(first) <= 300:
            for c in chunks:
                if first not in c.embed_text:
                    c.embed_text = f"{first}\n{c.embed_text}"
        return chunks

    Chunker.chunk = titled


def configs() -> list[tuple[str, dict]]:
    out = [(f"rrf k={k}", {"fusion": "rrf", "rrf_k": k}) for k in (10, 20, 40, 60, 100)]
    for fusion in ("tmm", "zscore", "robust"):
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
    src = services.store.table(INDEX).to_arrow().select(["id", "filename", "text"])
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
    parser.add_argument("--exact-missing", action="store_true", help="exact BM25 for vector-only chunks")
    parser.add_argument("--doc-level", action="store_true", help="fuse per document")
    parser.add_argument("--title-context", action="store_true", help="chunks embedded with their title")
    parser.add_argument(
        "--small-indexes",
        action="store_true",
        help="each query searches only its source file's documents, as a per-file index would (ids <file>-<n>)",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    splits = {name: beir.load(args.dataset, name) for name in args.splits}
    if args.title_context:
        with_title_context()
        cache = args.cache_dir.with_name(args.cache_dir.name + "-title")
        cache.mkdir(parents=True, exist_ok=True)
        if not (cache / "vectors.sqlite").exists():
            (cache / "vectors.sqlite").symlink_to((args.cache_dir / "vectors.sqlite").resolve())
        args.cache_dir = cache
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
    if args.small_indexes:
        fetched = {name: small_index_legs(services, data, fetched[name]) for name, data in splits.items()}
        print("small indexes: each query searches only its source file's documents")
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
    variants = [("exact BM25 for vector-only", True, False)] if args.exact_missing else []
    variants += [("per document", False, True)] if args.doc_level else []
    if variants:
        bm25_of = (
            {name: exact_bm25(services, data, fetched[name]) for name, data in splits.items()}
            if args.exact_missing
            else None
        )
        for vname, exact, doc_level in variants:
            print(f"{vname} (documents by best chunk):")
            for label, params in configs():
                if params["fusion"] == "rrf":
                    continue
                row = {}
                for name, data in splits.items():
                    m = convex_variant(fetched[name], data, params, (bm25_of or {}).get(name) if exact else None,
                                       doc_level)  # fmt: skip
                    row[f"{name} max"] = m["ndcg@10"]
                table[f"{vname}: {label}"] = row
                print(
                    f"| {vname}: {label} | "
                    + " | ".join(f"{row[f'{s} max']:.4f}" for s in args.splits)
                    + " |"
                )
    first = f"{args.splits[0]} max"
    convex = ("tmm", "zscore", "robust")
    families = ["rrf", *convex, *((f"prf {f}" for f in ("rrf", *convex)) if args.prf else ())]
    families += [f"{v}: {f}" for v, *_ in variants for f in convex]
    for family in families:
        best = max((lb for lb in table if lb.startswith(family)), key=lambda lb: table[lb][first])
        print(f"best {family} on {first}: {best} ({table[best][first]:.4f})")
    if args.fts_variants:
        fts_variants(services, splits[args.splits[0]], store_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
