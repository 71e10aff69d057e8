"""The collections the retrieval benchmarks build from files on disk: a corpus prefix and the headings set."""

from __future__ import annotations

import json

import pytest

from bench import beir, beir_prefix, headings_collection
from tests.servers import SHARED

needs_shared = pytest.mark.skipif(
    not (SHARED / "fixtures").is_dir(), reason="needs ../shared (fixtures, eval)"
)


def write_beir(root, docs, queries, qrels):
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    for split, rows in qrels.items():
        body = "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{s}\n" for q, d, s in rows)
        (root / "qrels" / f"{split}.tsv").write_text(body)


def test_prefix_keeps_the_first_documents_and_only_queries_they_fully_answer(tmp_path):
    docs = [{"_id": f"d{i}", "title": "", "text": f"doc {i}"} for i in range(5)]
    queries = [{"_id": q, "text": q} for q in ("q1", "q2", "q3")]
    qrels = {
        "train": [("q1", "d0", 1), ("q2", "d1", 1), ("q2", "d4", 1)],  # q2 needs d4, past the prefix
        "test": [("q3", "d2", 1), ("q3", "d4", 0)],  # a judged-irrelevant d4 does not disqualify q3
    }
    write_beir(tmp_path / "src", docs, queries, qrels)
    counts = beir_prefix.build(tmp_path / "src", 3, tmp_path / "out")
    assert counts == {"test": 1, "train": 1}
    train = beir.load(tmp_path / "out", "train")
    assert list(train.corpus) == ["d0", "d1", "d2"] and list(train.queries) == ["q1"]
    assert list(beir.load(tmp_path / "out", "test").queries) == ["q3"]


def test_markdown_sections_split_at_headings_but_not_inside_code(tmp_path):
    md = tmp_path / "a.md"
    md.write_text(
        "# Title\nintro\n## First part here\nbody one\n```\n# not a heading\n```\n## Second\nbody two\n"
    )
    assert headings_collection.sections(md) == [
        ("Title", "intro"),
        ("First part here", "body one\n```\n# not a heading\n```"),
        ("Second", "body two"),
    ]


@needs_shared
def test_headings_collection_judges_each_query_by_its_own_section(tmp_path):
    docs, n_queries = headings_collection.build(tmp_path)
    data = beir.load(tmp_path, "test")
    assert len(data.corpus) == docs and len(data.queries) == n_queries > 20
    for qid, text in data.queries.items():
        (doc_id,) = data.qrels[qid]
        assert text not in data.corpus[doc_id]["text"].splitlines()[:1]  # the heading is not in its section
        assert len(data.corpus[doc_id]["text"]) >= 150
