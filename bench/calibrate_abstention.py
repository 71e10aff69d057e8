"""Calibrate the abstention thresholds (ABSTAIN_BELOW, RELEVANT_ABOVE, TRIAGE_RAG_ABOVE) on measured evidence.

    .venv/bin/python -m bench.calibrate_abstention

The evidence is what `/chat` computes: `relevance.evidence`, the best cosine similarity between the question and
the top_k (5) passages of the real retrieval stage (`retrieve.search`, hybrid, as `bench.retrieval` runs it),
FTS-only hits measured on the spot. It is taken twice: on the first search, and after the model-free retry
(the question's content words, judged against the question as `relevance.best_of` does), because `/chat`
decides on the better of the two. Triage's signal is the top-1 vector probe it runs before retrieval.

- Answerable: the SciFact test queries against the SciFact index (the one `bench.retrieval` built and cached under
  `.cache/bench/retrieval/`); the thresholds are chosen on the queries whose relevant document is in the top 5,
  since refusing a query whose answer was never retrieved is not the threshold's fault.
- Unanswerable: the same queries against an off-domain index (the docling and py-pdf fixtures, indexed by
  `rag_worker.ingest.folder.index_folder` into `.cache/bench/calibration/`), and questions made from the
  fixtures' ground-truth headings ("What is <heading>?") against the SciFact index. No answer is in the index.

Chosen: ABSTAIN_BELOW = the highest threshold refusing at most 2% of answerable-with-retrieved-answer queries;
RELEVANT_ABOVE = the lowest threshold letting at most 2% of unanswerable queries through without the LLM;
TRIAGE_RAG_ABOVE = the highest threshold whose probe still sends at least 98% of answerable queries to
retrieval without asking the LLM. Figures, not pass/fail.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench import beir
from bench.retrieval import INDEX, ROOT, bench_settings, ensure_index, filename_for

SHARED = ROOT.parent / "shared"
OFF_INDEX = "offdomain"
GRID = [round(0.01 * i, 2) for i in range(0, 101)]
SHOWN = [round(0.05 * i, 2) for i in range(0, 17)]
PERCENTILES = (1, 2, 5, 10, 25, 50, 75, 90, 95, 98, 99)


# -- the pure part: rates and the choice of thresholds -----------------------------------------------------------


def refused(scores: list[float], threshold: float) -> float:
    """Share of scores strictly below the threshold (what `judge` refuses or triage sends to the LLM)."""
    return sum(s < threshold for s in scores) / len(scores) if scores else 0.0


def passed(scores: list[float], threshold: float) -> float:
    """Share of scores at or above the threshold (what `judge` accepts without the LLM)."""
    return 1.0 - refused(scores, threshold) if scores else 0.0


def highest_refusing_at_most(scores: list[float], share: float, grid: list[float] = GRID) -> float:
    """The highest grid threshold that refuses at most `share` of these (wanted) scores."""
    ok = [t for t in grid if refused(scores, t) <= share + 1e-12]
    return max(ok) if ok else min(grid)


def lowest_passing_at_most(scores: list[float], share: float, grid: list[float] = GRID) -> float:
    """The lowest grid threshold that lets at most `share` of these (unwanted) scores through."""
    ok = [t for t in grid if passed(scores, t) <= share + 1e-12]
    return min(ok) if ok else max(grid)


def heading_questions(markdown_files: list[Path]) -> list[str]:
    """ "What is <heading>?" for every distinct, wordy markdown heading (numbering and markup stripped)."""
    seen: dict[str, str] = {}
    for path in markdown_files:
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            m = re.match(r"^#{1,6}\s+(.*)$", line.strip())
            if not m:
                continue
            text = re.sub(r"[*_`#\[\]]", "", m.group(1))
            text = re.sub(r"^[\d.\s]+", "", text).strip(" :.-")
            if len(re.findall(r"[^\W\d_]{2,}", text)) == 0 or len(text) < 4:
                continue
            seen.setdefault(text.casefold(), text)
    return [f"What is {t}?" for t in seen.values()]


# -- measuring ---------------------------------------------------------------------------------------------------


@dataclass
class Measured:
    query: str
    first: float  # evidence of the first search
    final: float  # the better of the first search and the model-free retry, judged on the question
    probe: float  # triage's top-1 vector similarity
    retrieved: bool | None = None  # a relevant document in the top k (answerable set only)


def keyword_retry(query: str) -> str:
    """`relevance.improved_query`'s model-free branch (the LLM's reformulation is not reproducible here)."""
    from rag_worker.pipeline.cues import words
    from rag_worker.pipeline.relevance import QUESTION_WORDS

    return " ".join(w for w in words(query) if w not in QUESTION_WORDS) or query


def measure(turn, query: str) -> tuple[Measured, list]:
    from rag_worker.pipeline import relevance, retrieve

    hits = retrieve.search(turn, query)
    first = relevance.evidence(turn, query, hits)
    retry = keyword_retry(query)
    final = first
    if retry.casefold() != query.casefold():
        second = retrieve.search(turn, retry)
        final = relevance.evidence(turn, query, relevance.best_of(turn, query, hits, second))
    # Triage's probe, as `triage.triage` runs it.
    probe = turn.services.store.search(
        turn.request.indexes, query, mode="vector", limit=1, vector=turn.embed_query(query)
    )
    sim = probe[0].vector_score if probe else 0.0
    return Measured(query, first, max(first, final), float(sim or 0.0)), hits


def turn_on(services, index: str):
    """A Turn as `bench.retrieval.make_turn` builds it (hybrid, no rewrite, HyDE or rerank), on `index`."""
    from rag_worker.pipeline.chat import prepare
    from rag_worker.schemas import ChatRequest, Options

    options = Options(route="rag", rewrite=False, hyde=False, rerank=False, mode="hybrid")
    return prepare(services, ChatRequest(prompt="calibration", index=index, options=options))


def ensure_offdomain(services, folders: list[Path]) -> dict:
    """Index the fixture folders into the throwaway store (unchanged files are skipped on a rerun)."""
    from rag_worker.ingest.folder import index_folder
    from rag_worker.ingest.records import BatchDone

    failed: list[str] = []
    for folder in folders:
        for event in index_folder(services, OFF_INDEX, folder):
            if isinstance(event, BatchDone):
                failed += [f"{f.get('file')} ({f.get('code')})" for f in event.failed]
    return {
        "documents": len(services.store.list_documents(OFF_INDEX)),
        "chunks": services.store.count(OFF_INDEX),
        "failed": failed,
    }


def percentiles(scores: list[float]) -> str:
    values = np.percentile(np.asarray(scores), PERCENTILES) if scores else [float("nan")] * len(PERCENTILES)
    return " | ".join(f"{v:.3f}" for v in values)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, default=SHARED / "eval" / "scifact")
    parser.add_argument("--split", default="test")
    parser.add_argument("--cache-dir", type=Path, default=ROOT / ".cache" / "bench")
    parser.add_argument("--share", type=float, default=0.02, help="tolerated error share (default 0.02)")
    parser.add_argument("--json", type=Path, default=None, help="also write every measured score here")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from rag_worker.services import Services

    t0 = time.monotonic()
    data = beir.load(args.dataset, args.split)
    services, _, built = ensure_index(data, None, args.cache_dir)
    if built:
        print("note: the SciFact index was not cached and had to be built", file=sys.stderr)
    off = Services(bench_settings(args.cache_dir / "calibration" / "store"))
    off.__dict__["embedder"] = services.embedder
    fixtures = [SHARED / "fixtures" / "docling" / "sources", SHARED / "fixtures" / "py-pdf-sample-files"]
    indexed = ensure_offdomain(off, fixtures)
    print(f"off-domain index: {indexed}", file=sys.stderr, flush=True)

    sci_turn = turn_on(services, INDEX)
    top_k = sci_turn.options.top_k
    off_turn = turn_on(off, OFF_INDEX)

    doc_of = {filename_for(d): d for d in data.corpus}
    answerable: list[Measured] = []
    for qid, query in data.queries.items():
        m, hits = measure(sci_turn, query)
        relevant = {d for d, r in data.qrels[qid].items() if r > 0}
        m.retrieved = any(doc_of.get(h.filename) in relevant for h in hits[:top_k])
        answerable.append(m)
    print(f"  answerable: {len(answerable)} queries", file=sys.stderr, flush=True)
    off_queries = [measure(off_turn, q)[0] for q in data.queries.values()]
    headings = heading_questions(sorted((SHARED / "fixtures" / "docling" / "groundtruth_md").glob("*.md")))
    off_headings = [measure(sci_turn, q)[0] for q in headings]
    print(f"  unanswerable: {len(off_queries)} + {len(off_headings)} queries", file=sys.stderr, flush=True)

    good = [m for m in answerable if m.retrieved]
    bad = off_queries + off_headings
    sets = {
        "answerable, answer in top 5": good,
        "answerable, answer not retrieved": [m for m in answerable if not m.retrieved],
        "unanswerable: SciFact queries vs off-domain index": off_queries,
        "unanswerable: fixture headings vs SciFact index": off_headings,
        "unanswerable: both": bad,
    }
    share = args.share
    abstain = highest_refusing_at_most([m.final for m in good], share)
    relevant = lowest_passing_at_most([m.final for m in bad], share)
    triage_at = highest_refusing_at_most([m.probe for m in answerable], share)
    s = services.settings

    print(
        f"SciFact {args.split}: {len(answerable)} queries ({len(good)} with a relevant document in the top "
        f"{top_k}), {services.store.count(INDEX)} chunks; off-domain index {indexed['chunks']} chunks from "
        f"{indexed['documents']} documents; {len(headings)} heading questions. Embedder "
        f"{services.embedder.model_id}, hybrid, RRF_K {s.rrf_k}, RETRIEVAL_CANDIDATES {s.candidates}."
    )
    print("\nEvidence percentiles (the better of the first search and the model-free retry):\n")
    print("| set | n | " + " | ".join(f"p{p}" for p in PERCENTILES) + " |")
    print("|---|---:|" + "---:|" * len(PERCENTILES))
    for name, ms in sets.items():
        print(f"| {name} | {len(ms)} | {percentiles([m.final for m in ms])} |")
    print("\nTriage probe (top-1 vector similarity) percentiles:\n")
    print("| set | n | " + " | ".join(f"p{p}" for p in PERCENTILES) + " |")
    print("|---|---:|" + "---:|" * len(PERCENTILES))
    for name, ms in [("answerable (all)", answerable), *list(sets.items())[2:]]:
        print(f"| {name} | {len(ms)} | {percentiles([m.probe for m in ms])} |")

    print(
        "\nPer threshold: answerable-with-answer refused (evidence below it), unanswerable passed without the "
        "LLM (at or above it); first search / after the retry. Triage: answerable sent to the LLM (probe below "
        "it), unanswerable sent to retrieval.\n"
    )
    print(
        "| threshold | answerable refused | unanswerable passed | triage: answerable to LLM "
        "| triage: unanswerable to rag |"
    )
    print("|---:|---:|---:|---:|---:|")
    rows = sorted(
        set(SHOWN) | {abstain, relevant, triage_at, s.abstain_below, s.relevant_above, s.triage_rag_above}
    )
    for t in rows:
        marks = []
        if t == abstain:
            marks.append("ABSTAIN_BELOW")
        if t == relevant:
            marks.append("RELEVANT_ABOVE")
        if t == triage_at:
            marks.append("TRIAGE_RAG_ABOVE")
        label = f"{t:.2f}" + (f" ← {', '.join(marks)}" if marks else "")
        print(
            f"| {label} "
            f"| {refused([m.first for m in good], t):.1%} / {refused([m.final for m in good], t):.1%} "
            f"| {passed([m.first for m in bad], t):.1%} / {passed([m.final for m in bad], t):.1%} "
            f"| {refused([m.probe for m in answerable], t):.1%} | {passed([m.probe for m in bad], t):.1%} |"
        )
    print(
        f"\nchosen (tolerated share {share:.0%}): ABSTAIN_BELOW {abstain:.2f} (was {s.abstain_below}), "
        f"RELEVANT_ABOVE {relevant:.2f} (was {s.relevant_above}), TRIAGE_RAG_ABOVE {triage_at:.2f} "
        f"(was {s.triage_rag_above})"
    )
    if relevant < abstain:
        print("note: the sets separate: no threshold band is left for the LLM to decide")
    print(f"machine: {machine()}; {time.monotonic() - t0:.0f} s")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "chosen": {
                        "abstain_below": abstain,
                        "relevant_above": relevant,
                        "triage_rag_above": triage_at,
                    },
                    "sets": {name: [m.__dict__ for m in ms] for name, ms in sets.items()},
                    "headings": headings,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
