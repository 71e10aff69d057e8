"""A small out-of-domain BEIR collection built from Markdown already on disk: a section's heading is the query,
the section (its body, heading removed) the one relevant document.

    .venv/bin/python -m bench.headings_collection [--out .cache/bench/headings-beir]

Sources: `shared/fixtures/docling/groundtruth_md/*.md` (Docling's expected conversions of its test documents:
papers, manuals, reports) and `shared/fixtures/ollama-api-spec/docs/**/*.md*` (API documentation). Every
Markdown heading opens a section that runs to the next heading. A heading becomes a query only when it is a
descriptive phrase (3 words or more), unique in the whole collection (so the judgement is unambiguous), and its
section holds at least 150 characters of text; every section, query or not, is in the corpus (the distractors).
The corpus title is the file's name, never the heading. This is a known-item task with short topical queries,
unlike SciFact's claims against abstracts: it is a check that a fusion setting chosen on SciFact does not lose
elsewhere, not a benchmark of its own (its qrels are one document per query, made here, not by annotators).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT.parent / "shared" / "fixtures"
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")


def sections(path: Path) -> list[tuple[str, str]]:
    """(heading, body) for every heading of a Markdown file (code fences are not headings)."""
    out: list[tuple[str, list[str]]] = []
    fenced = False
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        m = None if fenced else HEADING.match(line)
        if m:
            out.append((m.group(2).strip(), []))
        elif out:
            out[-1][1].append(line)
    return [(h, "\n".join(body).strip()) for h, body in out]


def build(out: Path) -> tuple[int, int]:
    files = sorted((FIXTURES / "docling" / "groundtruth_md").glob("*.md"))
    files += sorted(
        p for p in (FIXTURES / "ollama-api-spec" / "docs").rglob("*") if p.suffix in (".md", ".mdx")
    )
    corpus: list[dict] = []
    for path in files:
        for n, (heading, body) in enumerate(sections(path)):
            if body:
                corpus.append(
                    {"_id": f"{path.stem}-{n}", "title": path.stem, "text": body, "heading": heading}
                )
    counts = Counter(d["heading"].lower() for d in corpus)
    queries, qrels = [], []
    for doc in corpus:
        words = re.findall(r"\w+", doc["heading"])
        if len(words) >= 3 and counts[doc["heading"].lower()] == 1 and len(doc["text"]) >= 150:
            qid = f"q{len(queries) + 1}"
            queries.append({"_id": qid, "text": doc["heading"]})
            qrels.append((qid, doc["_id"]))
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    with open(out / "corpus.jsonl", "w", encoding="utf-8") as fh:
        for doc in corpus:
            fh.write(json.dumps({k: doc[k] for k in ("_id", "title", "text")}) + "\n")
    with open(out / "queries.jsonl", "w", encoding="utf-8") as fh:
        for q in queries:
            fh.write(json.dumps(q) + "\n")
    with open(out / "qrels" / "test.tsv", "w", encoding="utf-8") as fh:
        fh.write("query-id\tcorpus-id\tscore\n")
        for qid, did in qrels:
            fh.write(f"{qid}\t{did}\t1\n")
    return len(corpus), len(queries)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / ".cache" / "bench" / "headings-beir")
    args = parser.parse_args(argv)
    docs, queries = build(args.out)
    print(f"{args.out}: {docs} documents, {queries} queries")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
