"""A smaller BEIR folder: the first N corpus documents, and the queries of every split whose relevant documents
all lie among them (qrels kept as they are).

    .venv/bin/python -m bench.beir_prefix ../shared/eval/scifact 1800 [--out .cache/bench/scifact-first1800]

For a machine too loaded to embed a whole corpus in time: `bench.retrieval` embeds chunks in corpus order and
caches them, so the first documents of an interrupted build are already embedded. The metrics of such a prefix
are not comparable with the full corpus's (fewer distractors, a subset of queries); differences between fusions
measured on the same prefix are.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench import beir

ROOT = Path(__file__).resolve().parent.parent


def build(src: Path, n: int, out: Path) -> dict[str, int]:
    docs = []
    for doc in beir.iter_jsonl(src / "corpus.jsonl"):
        if len(docs) >= n:
            break
        docs.append(doc)
    keep = {str(d["_id"]) for d in docs}
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    with open(out / "corpus.jsonl", "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(d) + "\n" for d in docs)
    wanted: set[str] = set()
    counts = {}
    for path in sorted((src / "qrels").glob("*.tsv")):
        qrels = beir.load_qrels(path)
        ok = {q: r for q, r in qrels.items() if all(d in keep for d, s in r.items() if s > 0)}
        with open(out / "qrels" / path.name, "w", encoding="utf-8") as fh:
            fh.write("query-id\tcorpus-id\tscore\n")
            for q, rels in ok.items():
                fh.writelines(f"{q}\t{d}\t{s}\n" for d, s in rels.items())
        wanted.update(ok)
        counts[path.stem] = len(ok)
    with open(out / "queries.jsonl", "w", encoding="utf-8") as fh:
        for q in beir.iter_jsonl(src / "queries.jsonl"):
            if str(q["_id"]) in wanted:
                fh.write(json.dumps(q) + "\n")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", type=Path)
    parser.add_argument("docs", type=int)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    out = args.out or ROOT / ".cache" / "bench" / f"{args.dataset.resolve().name}-first{args.docs}"
    counts = build(args.dataset, args.docs, out)
    print(f"{out}: {args.docs} documents; queries per split: {counts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
