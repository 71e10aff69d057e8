"""The threshold chooser of bench.calibrate_abstention: which threshold a measured distribution leads to."""

from __future__ import annotations

from bench.calibrate_abstention import (
    heading_questions,
    highest_refusing_at_most,
    lowest_passing_at_most,
    passed,
    refused,
)

GRID = [round(0.1 * i, 1) for i in range(11)]


def test_refused_and_passed_split_at_the_threshold_as_judge_does():
    scores = [0.2, 0.3, 0.3, 0.5]
    # judge refuses below ABSTAIN_BELOW and accepts at or above RELEVANT_ABOVE.
    assert refused(scores, 0.3) == 0.25
    assert passed(scores, 0.3) == 0.75
    assert refused([], 0.3) == 0.0 and passed([], 0.3) == 0.0


def test_abstain_threshold_is_the_highest_refusing_at_most_the_tolerated_share():
    wanted = [0.05] + [0.45] * 49 + [0.9] * 50  # 1 in 100 far below the rest
    assert highest_refusing_at_most(wanted, 0.02, GRID) == 0.4  # 0.5 would refuse half
    assert highest_refusing_at_most(wanted, 0.0, GRID) == 0.0  # refusing none: only 0 is safe


def test_relevant_threshold_is_the_lowest_passing_at_most_the_tolerated_share():
    unwanted = [0.1] * 97 + [0.35, 0.55, 0.95]
    assert lowest_passing_at_most(unwanted, 0.02, GRID) == 0.4  # lets 0.55 and 0.95 pass: 2%
    assert lowest_passing_at_most(unwanted, 0.0, GRID) == 1.0  # 0.95 passes anything below 1.0


def test_heading_questions_strip_numbering_and_skip_empty_headings(tmp_path):
    md = tmp_path / "a.md"
    md.write_text(
        "# 5.2 Quantitative Results\n## Sheet3\n## 12\n#### Test 1:\ntext\n## quantitative results\n"
    )
    assert heading_questions([md]) == [
        "What is Quantitative Results?",
        "What is Sheet3?",
        "What is Test 1?",
    ]
