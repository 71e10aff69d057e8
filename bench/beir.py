"""BEIR-format datasets and the standard BEIR metrics (nDCG@k, Recall@k, MRR@k), with no extra dependency.

A BEIR folder holds `corpus.jsonl` ({"_id", "title", "text"}), `queries.jsonl` ({"_id", "text"}) and
`qrels/<split>.tsv` (header `query-id corpus-id score`). The metrics follow what BEIR computes with
pytrec_eval (trec_eval semantics):
- nDCG@k: gain is the graded relevance itself (not 2^rel - 1), discount 1/log2(rank + 1); the ideal DCG is built
  from every judged document of the query, retrieved or not. Documents judged 0 count as non-relevant.
- Recall@k: relevant documents (score > 0) in the top k over all relevant documents of the query.
- MRR@k: 1 / rank of the first relevant document within the top k, else 0.
Each is averaged over the queries that have at least one relevant document in the split. As BEIR does by
default, a retrieved document whose id equals the query's id is ignored (some datasets index their queries).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class BeirDataset:
    root: Path
    corpus: dict[str, dict] = field(default_factory=dict)  # _id -> {"title", "text"}
    queries: dict[str, str] = field(default_factory=dict)  # _id -> text
    qrels: dict[str, dict[str, int]] = field(default_factory=dict)  # query id -> {doc id: relevance}


def iter_jsonl(path: Path) -> Iterator[dict]:
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def load_qrels(path: Path) -> dict[str, dict[str, int]]:
    qrels: dict[str, dict[str, int]] = {}
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh, delimiter="\t")
        for n, row in enumerate(reader):
            if not row or (n == 0 and not row[-1].strip().lstrip("-").isdigit()):
                continue  # blank line or the header
            qid, did, score = row[0].strip(), row[1].strip(), int(row[2])
            qrels.setdefault(qid, {})[did] = score
    return qrels


def load(root: Path | str, split: str, limit_docs: int | None = None) -> BeirDataset:
    """Load a BEIR folder; `limit_docs` keeps a slice (see `slice_corpus`) and the queries it can answer."""
    root = Path(root)
    qrels_path = root / "qrels" / f"{split}.tsv"
    if not qrels_path.is_file():
        available = sorted(p.stem for p in (root / "qrels").glob("*.tsv"))
        raise SystemExit(
            f"no qrels for split {split!r} in {root} (available: {', '.join(available) or 'none'})"
        )
    qrels = {q: rels for q, rels in load_qrels(qrels_path).items() if any(r > 0 for r in rels.values())}
    corpus = {
        str(d["_id"]): {"title": d.get("title") or "", "text": d.get("text") or ""}
        for d in iter_jsonl(root / "corpus.jsonl")
    }
    all_queries = {str(q["_id"]): q.get("text") or "" for q in iter_jsonl(root / "queries.jsonl")}
    queries = {qid: all_queries[qid] for qid in sorted(qrels, key=_natural) if qid in all_queries}
    data = BeirDataset(root, corpus, queries, {q: qrels[q] for q in queries})
    return slice_corpus(data, limit_docs) if limit_docs else data


def slice_corpus(data: BeirDataset, limit_docs: int) -> BeirDataset:
    """A small corpus that still measures something: the relevant documents of the first queries (up to half
    the slice), then other documents in corpus order as distractors. Only queries whose relevant documents are
    all in the slice are kept, so the metrics mean the same as on the full corpus."""
    keep: dict[str, None] = {}
    queries: dict[str, str] = {}
    for qid, text in data.queries.items():
        rel = [d for d, r in data.qrels[qid].items() if r > 0 and d in data.corpus]
        new = [d for d in rel if d not in keep]
        if not rel or len(keep) + len(new) > limit_docs // 2:
            continue
        keep.update(dict.fromkeys(new))
        queries[qid] = text
    for did in data.corpus:
        if len(keep) >= limit_docs:
            break
        keep.setdefault(did, None)
    corpus = {d: data.corpus[d] for d in data.corpus if d in keep}
    return BeirDataset(data.root, corpus, queries, {q: data.qrels[q] for q in queries})


def _natural(qid: str) -> tuple:
    return (0, int(qid), "") if qid.isdigit() else (1, 0, qid)


# -- metrics ----------------------------------------------------------------------------------------------------


def ndcg_at(ranked: list[str], rels: dict[str, int], k: int) -> float:
    dcg = sum(rels.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:k]) if rels.get(d, 0) > 0)
    ideal = sorted((r for r in rels.values() if r > 0), reverse=True)[:k]
    idcg = sum(r / math.log2(i + 2) for i, r in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def recall_at(ranked: list[str], rels: dict[str, int], k: int) -> float:
    relevant = {d for d, r in rels.items() if r > 0}
    if not relevant:
        return 0.0
    return len(relevant.intersection(ranked[:k])) / len(relevant)


def mrr_at(ranked: list[str], rels: dict[str, int], k: int) -> float:
    for i, d in enumerate(ranked[:k]):
        if rels.get(d, 0) > 0:
            return 1.0 / (i + 1)
    return 0.0


def evaluate(
    run: dict[str, list[str]], qrels: dict[str, dict[str, int]], *, ignore_identical_ids: bool = True
) -> dict[str, float]:
    """Mean nDCG@10, Recall@100 and MRR@10 over the queries of `qrels` (a query missing from `run` scores 0)."""
    totals = {"ndcg@10": 0.0, "recall@100": 0.0, "mrr@10": 0.0}
    for qid, rels in qrels.items():
        ranked = [d for d in run.get(qid, []) if not (ignore_identical_ids and d == qid)]
        totals["ndcg@10"] += ndcg_at(ranked, rels, 10)
        totals["recall@100"] += recall_at(ranked, rels, 100)
        totals["mrr@10"] += mrr_at(ranked, rels, 10)
    n = max(1, len(qrels))
    return {name: value / n for name, value in totals.items()}


def docs_from_hits(hits, doc_id_of) -> list[str]:
    """Chunk hits (best first) -> document ids ranked by their best chunk (max score per document)."""
    ranked: dict[str, None] = {}
    for hit in hits:
        ranked.setdefault(doc_id_of(hit), None)
    return list(ranked)
