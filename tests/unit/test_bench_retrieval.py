"""The BEIR harness: its metrics on hand-worked cases, and one real run on a 100-document SciFact slice."""

from __future__ import annotations

import math
import re

import pytest

from bench import beir
from tests.servers import SHARED, needs_shared

SCIFACT = SHARED / "eval" / "scifact"


def test_ndcg_uses_graded_gains_and_the_ideal_of_all_judged_documents():
    rels = {"a": 2, "b": 1, "c": 0}
    # Ranked b, x, a: DCG = 1/log2(2) + 2/log2(4) = 2; ideal a, b: 2/1 + 1/log2(3).
    got = beir.ndcg_at(["b", "x", "a"], rels, 10)
    assert got == pytest.approx(2 / (2 + 1 / math.log2(3)))
    assert beir.ndcg_at(["a", "b"], rels, 10) == pytest.approx(1.0)
    # A relevant document past the cut-off earns nothing; one never retrieved still counts in the ideal.
    assert beir.ndcg_at(["x"] * 10 + ["a"], rels, 10) == 0.0
    assert beir.ndcg_at(["a"], rels, 10) < 1.0


def test_recall_and_mrr_cut_offs():
    rels = {"a": 1, "b": 1, "z": 0}
    ranked = [f"x{i}" for i in range(4)] + ["a"] + [f"y{i}" for i in range(200)] + ["b"]
    assert beir.recall_at(ranked, rels, 100) == 0.5
    assert beir.recall_at(ranked, rels, 1000) == 1.0
    assert beir.mrr_at(ranked, rels, 10) == pytest.approx(1 / 5)
    assert beir.mrr_at(ranked, rels, 4) == 0.0
    assert beir.mrr_at(["z", "b"], rels, 10) == 0.5  # judged non-relevant is not relevant


def test_evaluate_averages_over_judged_queries_and_ignores_the_query_itself():
    qrels = {"q1": {"d1": 1}, "q2": {"d2": 1}}
    run = {"q1": ["q1", "d1"]}  # q2 retrieved nothing; q1's own id is dropped as BEIR does
    scores = beir.evaluate(run, qrels)
    assert scores["ndcg@10"] == pytest.approx(0.5)
    assert scores["mrr@10"] == pytest.approx(0.5)
    assert scores["recall@100"] == pytest.approx(0.5)


def test_chunks_map_to_documents_by_their_best_chunk():
    class H:
        def __init__(self, f):
            self.filename = f

    hits = [H("7.txt"), H("3.txt"), H("7.txt"), H("5.txt")]
    assert beir.docs_from_hits(hits, lambda h: h.filename[:-4]) == ["7", "3", "5"]


@needs_shared("eval/scifact")
def test_slice_keeps_only_queries_it_can_answer():
    data = beir.load(SCIFACT, "test", limit_docs=200)
    assert len(data.corpus) == 200
    assert data.queries
    for qid in data.queries:
        assert all(d in data.corpus for d, r in data.qrels[qid].items() if r > 0)


@needs_shared("eval/scifact")
@pytest.mark.timeout(1200)
def test_harness_on_a_100_document_slice(tmp_path, capsys, monkeypatch):
    """The command a user runs, end to end on a slice: real chunking, real index, the /chat retrieval stage."""
    from bench import retrieval

    monkeypatch.setenv("TORCH_THREADS", "1")  # the test machine is shared; oversubscribed threads crawl
    code = retrieval.main(
        [
            "--dataset",
            str(SCIFACT),
            "--split",
            "test",
            "--limit-docs",
            "100",
            "--cache-dir",
            str(tmp_path / "cache"),
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    rows = {
        m.group(1): [float(m.group(i)) for i in (2, 3, 4)]
        for m in re.finditer(r"^\| (\S+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|", out, re.MULTILINE)
    }
    assert {"fts", "vector", "hybrid"} <= set(rows), out
    assert "hybrid+rerank" in rows or "skipped: hybrid+rerank" in out
    for mode, (ndcg, recall, mrr) in rows.items():
        assert 0.0 <= ndcg <= 1.0 and 0.0 <= recall <= 1.0 and 0.0 <= mrr <= 1.0, mode
        # A 100-document corpus: nearly every relevant document is in the top 100.
        assert recall >= 0.5, (mode, out)
    assert rows["hybrid"][0] > 0.5, out
    assert rows["hybrid"][0] >= min(rows["fts"][0], rows["vector"][0]), out

    # A second run reuses the built index instead of embedding the slice again.
    args = ["--dataset", str(SCIFACT), "--split", "test", "--limit-docs", "100"]
    code = retrieval.main([*args, "--cache-dir", str(tmp_path / "cache"), "--modes", "hybrid"])
    assert code == 0
    captured = capsys.readouterr()
    assert "building index" not in captured.err
    assert "| hybrid |" in captured.out
