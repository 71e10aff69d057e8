"""bench.latency end to end on a small table: the ANN sweep prints its rows, and --reuse keeps table and index."""

from __future__ import annotations

import pytest

from bench import latency
from tests.servers import SHARED

needs_scifact = pytest.mark.skipif(
    not (SHARED / "eval" / "scifact").is_dir(), reason="needs ../shared/eval/scifact (texts and queries)"
)


def rows_of(out: str) -> list[list[str]]:
    return [
        [c.strip() for c in line.strip("|").split("|")]
        for line in out.splitlines()
        if line.startswith("| 2,")
    ]


@needs_scifact
def test_a_sweep_then_a_reuse_of_the_same_table(tmp_path, capsys):
    args = [
        "--sizes",
        "2000",
        "--queries",
        "3",
        "--dir",
        str(tmp_path / "lat"),
        "--vectors",
        str(tmp_path / "none"),
    ]
    assert latency.main([*args, "--refine", "1", "--ef", "0", "400"]) == 0
    first = rows_of(capsys.readouterr().out)
    assert [r[1] for r in first] == [
        "numpy exact",
        "lancedb exact",
        "lancedb IVF_HNSW_SQ p=default nprobes=10 refine=1 ef=0",
        "lancedb IVF_HNSW_SQ p=default nprobes=10 refine=1 ef=400",
    ]
    assert first[2][2] != ""  # the index was built (and timed) in this run
    for row in first:
        assert 0.0 <= float(row[5]) <= 1.0 and 0.0 <= float(row[6]) <= 1.0  # recall@10, leg recall@100
    assert float(first[1][5]) == 1.0  # LanceDB's exact scan finds NumPy's exact top 10

    assert latency.main([*args, "--reuse"]) == 0
    captured = capsys.readouterr()
    again = rows_of(captured.out)
    assert "reusing the 2000-row table" in captured.err
    # Neither written nor indexed again: no exact-scan row, no build time, the store's defaults searched.
    assert [r[1] for r in again] == [
        "numpy exact",
        "lancedb IVF_HNSW_SQ p=default nprobes=10 refine=1 ef=400",
    ]
    assert again[1][2] == ""
    assert float(again[1][5]) >= 0.9  # the kept index still finds the exact neighbours
