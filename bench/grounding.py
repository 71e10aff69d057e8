"""How well the grounding check and the extractive answer work, measured on SciFact claims and gold abstracts.

    .venv/bin/python -m bench.grounding                # both: choose on all train claims, report on all test claims
    .venv/bin/python -m bench.grounding --split train  # (or --calibrate) train only: choose weight and thresholds
    .venv/bin/python -m bench.grounding --split test   # test only, with the worker's shipped thresholds

The default run is the calibration the worker ships: the weight and the thresholds are chosen on SciFact train
claims only, then the test claims are checked with exactly those (and, when they differ, with the thresholds in
rag_worker/settings.py as well); the test split never feeds a choice. `--train-limit` / `--test-limit` take the
first N claims of a split.

Each claim with a SUPPORT-labelled gold abstract gives three "answer sentences" checked against that abstract
(the passage the model read), through the real `grounding.check`:
- supporting: the claim itself (a paraphrase of the abstract's evidence sentence): should be `supported`;
- unrelated: a sentence of a random other claim's gold abstract: should be `unsupported`;
- near miss: the sentence closest to the claim (by tf-idf) in the most similar non-gold abstract of the corpus:
  same field and vocabulary, other finding; should be `unsupported` (the hard case).
Precision and recall per label: `supported` against the supporting set, `unsupported` against the unrelated (and,
separately, near-miss) set. CONTRADICT claims are reported on their own: the check measures whether the text says
something like it, not whether it agrees (no entailment model runs).

The extractive answer: the claim as the question, the passages its gold abstract(s) plus the 4 non-gold
abstracts most similar to it by tf-idf (hard distractors); how often the first quote comes from a gold abstract.

Calibration (train only, never test): the weight of similarity vs overlap is the largest grid value whose
separation of supporting from near-miss sentences (AUC) is within 0.02 of the best one; GROUNDED_ABOVE is the lowest threshold that labels at
most 5% of near-miss sentences supported; UNGROUNDED_BELOW the highest that leaves at most 5% of supporting
sentences unsupported (never above GROUNDED_ABOVE). Figures, not pass/fail.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import random
import re
import sys
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from bench import beir

ROOT = Path(__file__).resolve().parents[1]
SCIFACT = ROOT.parent / "shared" / "eval" / "scifact"
WEIGHTS = [round(0.1 * i, 1) for i in range(0, 11)]
GRID = [round(0.01 * i, 2) for i in range(0, 101)]
AUC_TIE = 0.02
_TOKEN = re.compile(r"[a-z0-9]+")


# -- tf-idf for distractors (no extra dependency) ----------------------------------------------------------------


class Tfidf:
    def __init__(self, docs: dict[str, str]):
        self.ids = list(docs)
        df: Counter = Counter()
        tfs = []
        for d in self.ids:
            tf = Counter(_TOKEN.findall(docs[d].lower()))
            tfs.append(tf)
            df.update(tf.keys())
        n = len(self.ids)
        self.idf = {w: math.log((n + 1) / (c + 1)) + 1 for w, c in df.items()}
        self.index: dict[str, list[tuple[int, float]]] = {}
        for i, tf in enumerate(tfs):
            vec = {w: (1 + math.log(c)) * self.idf[w] for w, c in tf.items()}
            norm = math.sqrt(sum(v * v for v in vec.values())) or 1.0
            for w, v in vec.items():
                self.index.setdefault(w, []).append((i, v / norm))

    def vector(self, text: str) -> dict[str, float]:
        tf = Counter(_TOKEN.findall(text.lower()))
        vec = {w: (1 + math.log(c)) * self.idf[w] for w, c in tf.items() if w in self.idf}
        norm = math.sqrt(sum(v * v for v in vec.values())) or 1.0
        return {w: v / norm for w, v in vec.items()}

    def top(self, text: str, k: int, exclude: set[str]) -> list[str]:
        scores: Counter = Counter()
        for w, qv in self.vector(text).items():
            for i, dv in self.index.get(w, ()):
                scores[i] += qv * dv
        out = []
        for i, _ in scores.most_common(k + len(exclude)):
            if self.ids[i] not in exclude:
                out.append(self.ids[i])
            if len(out) == k:
                break
        return out

    def similarity(self, a: str, b: str) -> float:
        va, vb = self.vector(a), self.vector(b)
        return sum(v * vb.get(w, 0.0) for w, v in va.items())


# -- data ---------------------------------------------------------------------------------------------------------


def load(split: str):
    data = beir.load(SCIFACT, split)
    meta = {row["_id"]: row.get("metadata") or {} for row in beir.iter_jsonl(SCIFACT / "queries.jsonl")}
    texts = {d: f"{v['title']}\n\n{v['text']}" for d, v in data.corpus.items()}
    cases = []
    for qid, rels in sorted(data.qrels.items(), key=lambda kv: beir._natural(kv[0])):
        gold = [d for d, r in rels.items() if r > 0 and d in texts]
        labels = {d: {e.get("label") for e in meta.get(qid, {}).get(d, [])} for d in gold}
        if gold:
            cases.append({"qid": qid, "claim": data.queries[qid], "gold": gold, "labels": labels})
    return cases, texts


CACHE = ROOT / ".cache" / "bench" / "grounding"


def vector_cache_path(turn) -> Path:
    """Sentence vectors of earlier runs with the same embedder and precision (a rerun with other thresholds embeds
    nothing)."""
    import hashlib

    from bench.retrieval import vectors_made_by

    key = hashlib.sha256(vectors_made_by(turn.services.embedder).encode()).hexdigest()[:12]
    return CACHE / f"vectors-{key}.npz"


def load_vectors(turn) -> None:
    path = vector_cache_path(turn)
    if path.is_file():
        with np.load(path, allow_pickle=False) as data:
            turn._vectors.update(zip(data["texts"].tolist(), data["vectors"], strict=True))


def save_vectors(turn) -> None:
    path = vector_cache_path(turn)
    path.parent.mkdir(parents=True, exist_ok=True)
    load_vectors(turn)  # keep what another run saved meanwhile
    texts = list(turn._vectors)
    np.savez(path, texts=np.array(texts), vectors=np.stack([turn._vectors[t] for t in texts]))


def make_turn(settings):
    """A turn over the worker's real services (embedder, settings), as the pipeline builds one."""
    from rag_worker.llm import CancelToken
    from rag_worker.pipeline.turn import Turn, TurnOptions
    from rag_worker.schemas import ChatRequest
    from rag_worker.services import Services

    services = Services(settings)
    opts = TurnOptions("rag", False, False, False, "hybrid", 5, "similarity", None, None, None, {})
    llm = SimpleNamespace(backend=SimpleNamespace(backend="bench"))
    return Turn(services, ChatRequest(prompt="bench"), opts, llm, CancelToken())


def examples(cases, texts, tfidf, rng):
    """(kind, answer sentence, ref->passage, claim case) for each case: supporting, unrelated, near miss."""
    from rag_worker.pipeline.grounding.sentences import passage_sentences

    out = []
    golds = [g for c in cases for g in c["gold"]]
    for c in cases:
        gold = c["gold"][0]
        passages = {"S1": texts[gold]}
        kind = (
            "supporting"
            if "SUPPORT" in c["labels"][gold]
            else ("contradicted" if "CONTRADICT" in c["labels"][gold] else None)
        )
        if kind:
            out.append((kind, c["claim"], passages, c))
        other = rng.choice([g for g in golds if g not in c["gold"]])
        sents = passage_sentences("x", texts[other])
        if sents:
            out.append(("unrelated", rng.choice(sents).text, passages, c))
        near = tfidf.top(texts[gold], 1, set(c["gold"]))
        if near:
            sents = passage_sentences("x", texts[near[0]])
            if sents:
                best = max(sents, key=lambda s: tfidf.similarity(c["claim"], s.text))
                out.append(("near miss", best.text, passages, c))
    return out


# -- the passages' vectors as the worker stores them (SENTENCE_VECTORS=ingest) ----------------------------------------


def passage_wholes(exs) -> set[str]:
    """The whole passages of the check's examples (what a pooled forward pass reads)."""
    return {text for _, _, passages, _ in exs for text in passages.values()}


def passage_texts(exs, cases, texts, tfidf, extractive_cases: int | None) -> set[str]:
    """Every passage sentence the run reads (the check's and the extractive answer's)."""
    from rag_worker.pipeline.grounding.sentences import passage_sentences

    out: set[str] = set()
    for _, _, passages, _ in exs:
        for ref, text in passages.items():
            out.update(p.text for p in passage_sentences(ref, text))
    for c in cases[:extractive_cases]:
        for d in c["gold"] + tfidf.top(c["claim"], 4, set(c["gold"])):
            out.update(p.text for p in passage_sentences("x", texts[d], prose_only=True))
    return out


def stored_turn(turn, passages: set[str]):
    """A turn like `turn` whose passage sentences' vectors went through the store (float16 and back, exactly as
    `store.rows.sentence_columns` writes and `decode_sentences` reads them); answer sentences stay as embedded."""
    import copy

    from rag_worker.store.rows import decode_sentences

    other = copy.copy(turn)
    other._vectors = dict(turn._vectors)
    for text in passages & set(turn._vectors):
        vec = np.asarray(turn._vectors[text], dtype=np.float16)
        other._vectors[text] = decode_sentences([text], vec.tobytes(), vec.shape[0])[text]
    return other


def pooled_turn(turn, texts_of_passages: set[str], window: int = 254):
    """A turn like `turn` whose passage sentences' vectors are pooled out of their passage's own forward pass
    (each passage cut at sentence ends into windows of at most `window` tokens, as chunks are; each sentence the
    mean of its tokens' last hidden states, L2-normalised) instead of embedded on their own: the signal that would
    cost ingestion nothing (issue 31, item 1). Measured, not shipped (docs/benchmarks.md)."""
    import copy

    import torch

    from rag_worker.pipeline.grounding.sentences import passage_sentences

    emb = turn.services.embedder
    other = copy.copy(turn)
    other._vectors = dict(turn._vectors)
    pooled: dict[str, np.ndarray] = {}
    done = 0
    for text in sorted(texts_of_passages):
        sents = passage_sentences("x", text)
        if not sents:
            continue
        # windows of whole sentences
        windows, cur = [], []
        for p in sents:
            n = emb.count_tokens(p.text) + 1
            if cur and sum(c[1] for c in cur) + n > window:
                windows.append(cur)
                cur = []
            cur.append((p, n))
        if cur:
            windows.append(cur)
        for win in windows:
            a, b = win[0][0].start, win[-1][0].end
            chunk = text[a:b]
            enc = emb._tok(
                [chunk],
                truncation=True,
                max_length=emb.max_length,
                return_tensors="pt",
                return_offsets_mapping=True,
            )
            offsets = enc.pop("offset_mapping")[0].tolist()
            with torch.inference_mode():
                hidden = emb._model(**enc).last_hidden_state[0]
            for p, _ in win:
                s0, e0 = p.start - a, p.end - a
                idx = [j for j, (x, y) in enumerate(offsets) if y > x and y > s0 and x < e0]
                if not idx or p.text in pooled:  # cut off by the window, or pooled in an earlier passage
                    continue
                v = torch.nn.functional.normalize(hidden[idx].mean(0), dim=0)
                pooled[p.text] = v.numpy().astype(np.float32)
        done += 1
    other._vectors.update(pooled)
    print(f"  pooled the sentences of {done} passages", file=sys.stderr, flush=True)
    return other


# -- measuring ------------------------------------------------------------------------------------------------------


def features(turn, ex):
    """(sim, lex) matrices of one answer sentence against the passage sentences."""
    from rag_worker.pipeline.grounding.check import lexical
    from rag_worker.pipeline.grounding.sentences import content_words, passage_sentences

    _, sentence, passages, _ = ex
    plist = [p for ref, text in passages.items() for p in passage_sentences(ref, text)]
    vecs = turn.embed_texts([sentence] + [p.text for p in plist])
    return vecs[1:] @ vecs[0], lexical(content_words(sentence), plist)


def auc(pos: list[float], neg: list[float]) -> float:
    allv = sorted([(v, 1) for v in pos] + [(v, 0) for v in neg])
    rank_sum, n_pos = 0.0, len(pos)
    for r, (_, is_pos) in enumerate(allv, 1):
        rank_sum += r * is_pos
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * len(neg)) if pos and neg else float("nan")


def calibrate(turn, exs, weight: float | None = None) -> dict:
    feats = [(ex[0], features(turn, ex)) for ex in exs]
    rows = []
    for w in WEIGHTS:
        best = {k: [] for k in ("supporting", "unrelated", "near miss")}
        for kind, (sim, lex) in feats:
            if kind in best and len(sim):
                best[kind].append(float((w * sim + (1 - w) * lex).max()))
        rows.append(
            (w, auc(best["supporting"], best["near miss"]), auc(best["supporting"], best["unrelated"]), best)
        )
    top = max(r[1] for r in rows)
    # Ties go to the embedder: the largest similarity weight within AUC_TIE of the best, so paraphrases count
    # (SciFact claims reuse their abstract's terms, which flatters word overlap).
    w, a_near, a_unrel, best = max((r for r in rows if r[1] >= top - AUC_TIE), key=lambda r: r[0])
    if weight is not None:  # fixed by a fuller run's table
        w, a_near, a_unrel, best = next(r for r in rows if abs(r[0] - weight) < 1e-9)
    pos, near = best["supporting"], best["near miss"]
    grounded = next(t for t in GRID if sum(v >= t for v in near) / len(near) <= 0.05)
    ungrounded = max(t for t in GRID if sum(v < t for v in pos) / len(pos) <= 0.05)
    return {
        "weight": w,
        "grounded_above": grounded,
        "ungrounded_below": min(ungrounded, grounded),
        "table": [(r[0], r[1], r[2]) for r in rows],
        "scores": best,
    }


def evaluate(turn, exs, cases, texts, tfidf, limit_extractive: int | None):
    from rag_worker.pipeline.grounding import check as grounding
    from rag_worker.pipeline.grounding import quotes as extractive

    labels: dict[str, Counter] = {}
    for kind, sentence, passages, _ in exs:
        docs = [{"ref": "S1", "id": "gold", "filename": "gold.txt", "text": passages["S1"]}]
        _, g = grounding.check(turn, f"{sentence}", passages, docs)
        lab = g["sentences"][0]["label"] if g["sentences"] else "skipped"
        labels.setdefault(kind, Counter())[lab] += 1
    first_gold = n_ex = 0
    for c in cases[:limit_extractive]:
        distractors = tfidf.top(c["claim"], 4, set(c["gold"]))
        ids = c["gold"] + distractors
        order = sorted(ids, key=lambda d: -tfidf.similarity(c["claim"], texts[d]))  # a retrieval-like order
        docs = [
            {"ref": f"S{i + 1}", "id": d, "filename": f"{d}.txt", "text": texts[d]}
            for i, d in enumerate(order)
        ]
        passages = {d["ref"]: d["text"] for d in docs}
        reply = extractive.answer(turn, c["claim"], passages, docs)
        m = re.search(r"\[(S\d+)\]", reply)
        n_ex += 1
        if m and next(d["id"] for d in docs if d["ref"] == m.group(1)) in c["gold"]:
            first_gold += 1
    return labels, first_gold, n_ex


def precision_recall(labels: dict[str, Counter], negative: str):
    pos, neg = labels.get("supporting", Counter()), labels.get(negative, Counter())
    out = {}
    for lab, truth, other in (("supported", pos, neg), ("unsupported", neg, pos)):
        tp, fp = truth[lab], other[lab]
        out[lab] = (
            tp / (tp + fp) if tp + fp else float("nan"),
            tp / sum(truth.values()) if truth else float("nan"),
        )
    return out


def prefetch(turn, exs, cases, texts, tfidf, extractive_cases: int | None) -> None:
    """Embed every sentence the run will need in a few large batches (the checks then find them in the turn)."""
    from rag_worker.pipeline.grounding.sentences import passage_sentences

    wanted: dict[str, None] = {}
    for _, sentence, passages, _ in exs:
        wanted[sentence] = None
        for ref, text in passages.items():
            wanted.update((p.text, None) for p in passage_sentences(ref, text))
    for c in cases[:extractive_cases]:
        for d in c["gold"] + tfidf.top(c["claim"], 4, set(c["gold"])):
            wanted.update((p.text, None) for p in passage_sentences("x", texts[d], prose_only=True))
    todo = [t for t in wanted if t not in turn._vectors]
    started = time.monotonic()
    for at in range(0, len(todo), 2048):
        turn.embed_texts(todo[at : at + 2048])
        save_vectors(turn)  # a run stopped half-way keeps what it embedded
        print(
            f"  embedded {min(at + 2048, len(todo))}/{len(todo)} sentences ({time.monotonic() - started:.0f} s)",
            file=sys.stderr,
            flush=True,
        )


def report_test(turn, exs, cases, texts, tfidf, extractive_cases: int | None, label: str) -> None:
    labels, first_gold, n_ex = evaluate(turn, exs, cases, texts, tfidf, extractive_cases)
    print(f"\n{label}\n")
    print("| answer sentence | n | supported | weak | unsupported |")
    print("|---|---:|---:|---:|---:|")
    for kind in ("supporting", "contradicted", "unrelated", "near miss"):
        c = labels.get(kind, Counter())
        n = sum(c.values())
        if n:
            print(
                f"| {kind} | {n} | "
                + " | ".join(f"{c[k] / n:.1%}" for k in ("supported", "weak", "unsupported"))
                + " |"
            )
    print("\n| negatives | label | precision | recall |")
    print("|---|---|---:|---:|")
    for negative in ("unrelated", "near miss"):
        for lab, (p, r) in precision_recall(labels, negative).items():
            print(f"| {negative} | {lab} | {p:.3f} | {r:.3f} |")
    print(
        f"\nExtractive answer, first quote from a gold abstract: {first_gold}/{n_ex} = "
        f"{first_gold / max(n_ex, 1):.1%} (gold + 4 tf-idf-nearest distractor abstracts)",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", choices=("both", "train", "test"), default="both")
    parser.add_argument("--calibrate", action="store_true", help="the same as --split train")
    parser.add_argument("--limit", type=int, default=None, help="at most this many claims of each split")
    parser.add_argument("--train-limit", type=int, default=None, help="at most this many train claims")
    parser.add_argument("--test-limit", type=int, default=None, help="at most this many test claims")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--weight", type=float, default=None, help="calibration: fix the similarity weight")
    parser.add_argument(
        "--passages",
        choices=("stored", "embedded", "both", "pooled"),
        default="both",
        help="passage vectors as the store keeps them (float16, what SENTENCE_VECTORS=ingest ships), as a turn "
        "embeds them (SENTENCE_VECTORS=turn), or both in the same run (the calibration is the stored one's)",
    )
    args = parser.parse_args(argv)
    split = "train" if args.calibrate else args.split
    if not (SCIFACT / "corpus.jsonl").is_file():
        print(f"SciFact not found at {SCIFACT} (the shared eval folder)", file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from rag_worker.settings import Settings

    settings = Settings()
    started = time.monotonic()
    load1 = os.getloadavg()[0]
    print(
        f"Machine: {platform.platform()}, Python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"load average {load1:.1f} at the start"
    )
    turn = make_turn(settings)
    load_vectors(turn)
    shipped = (settings.grounding_sim_weight, settings.grounded_above, settings.ungrounded_below)
    chosen = None
    tfidf = None
    if split in ("both", "train"):
        cases, texts = load("train")
        cases = cases[: args.train_limit or args.limit]
        tfidf = Tfidf(texts)
        exs = examples(cases, texts, tfidf, random.Random(args.seed))
        counts = Counter(e[0] for e in exs)
        print(f"SciFact train: {len(cases)} claims; examples {dict(counts)}", file=sys.stderr, flush=True)
        prefetch(turn, exs, cases, texts, tfidf, 0)
        if args.passages == "pooled":
            cal = calibrate(pooled_turn(turn, passage_wholes(exs)), exs, args.weight)
        elif args.passages != "embedded":
            plain = calibrate(turn, exs, args.weight) if args.passages == "both" else None
            cal = calibrate(stored_turn(turn, passage_texts(exs, cases, texts, tfidf, 0)), exs, args.weight)
            if plain is not None:
                print(
                    "\nThe same calibration with the passages embedded at the turn (SENTENCE_VECTORS=turn): "
                    f"GROUNDING_SIM_WEIGHT={plain['weight']} GROUNDED_ABOVE={plain['grounded_above']} "
                    f"UNGROUNDED_BELOW={plain['ungrounded_below']}; with stored vectors (below): "
                    f"{cal['weight']} / {cal['grounded_above']} / {cal['ungrounded_below']}"
                )
        else:
            cal = calibrate(turn, exs, args.weight)
        print(f"\nCalibration on SciFact train, {len(cases)} claims, {dict(counts)}\n")
        print("| similarity weight | AUC supporting vs near miss | AUC supporting vs unrelated |")
        print("|---:|---:|---:|")
        for w, a1, a2 in cal["table"]:
            mark = " ← chosen" if abs(w - cal["weight"]) < 1e-9 else ""
            print(f"| {w:.1f}{mark} | {a1:.3f} | {a2:.3f} |")
        for kind, vals in cal["scores"].items():
            q = np.percentile(vals, [5, 25, 50, 75, 95]) if vals else []
            print(
                f"\n{kind} (weight {cal['weight']}): p5/p25/p50/p75/p95 = "
                + " / ".join(f"{x:.3f}" for x in q)
            )
        chosen = (cal["weight"], cal["grounded_above"], cal["ungrounded_below"])
        limited = bool(args.train_limit or args.limit)  # a slice of train is a try-out, not the calibration
        print(
            f"\nChosen on train: GROUNDING_SIM_WEIGHT={chosen[0]} GROUNDED_ABOVE={chosen[1]} "
            f"UNGROUNDED_BELOW={chosen[2]}; shipped in rag_worker/settings.py: GROUNDING_SIM_WEIGHT={shipped[0]} "
            f"GROUNDED_ABOVE={shipped[1]} UNGROUNDED_BELOW={shipped[2]} "
            f"({'the same' if chosen == shipped else 'different' + ('' if limited else ': update the defaults')})  "
            f"({time.monotonic() - started:.0f} s)",
            flush=True,
        )
    if split in ("both", "test"):
        cases, texts = load("test")
        cases = cases[: args.test_limit or args.limit]
        tfidf = tfidf or Tfidf(texts)
        exs = examples(cases, texts, tfidf, random.Random(args.seed))
        counts = Counter(e[0] for e in exs)
        print(f"SciFact test: {len(cases)} claims; examples {dict(counts)}", file=sys.stderr, flush=True)
        prefetch(turn, exs, cases, texts, tfidf, None)
        runs = [(chosen, "the thresholds chosen on train")] if chosen else []
        if chosen != shipped:
            runs.append((shipped, "the thresholds shipped in rag_worker/settings.py"))
        stored = stored_turn(turn, passage_texts(exs, cases, texts, tfidf, None))
        pooled = pooled_turn(turn, passage_wholes(exs)) if args.passages == "pooled" else None
        variants = {
            "pooled": [
                (pooled, "passage sentences pooled out of their passage's forward pass"),
                (turn, "passages embedded at the turn"),
            ],
            "stored": [(stored, "passage vectors stored at ingestion (float16)")],
            "embedded": [(turn, "passages embedded at the turn")],
            "both": [
                (stored, "passage vectors stored at ingestion (float16)"),
                (turn, "passages embedded at the turn"),
            ],
        }[args.passages]
        runs = [(r, v) for r in runs for v in variants]
        for ((w, above, below), what), (which, how) in runs:
            settings.grounding_sim_weight, settings.grounded_above, settings.ungrounded_below = (
                w,
                above,
                below,
            )
            report_test(
                which,
                exs,
                cases,
                texts,
                tfidf,
                None,
                f"SciFact test, {len(cases)} claims, {how}, with {what}: GROUNDING_SIM_WEIGHT={w} "
                f"GROUNDED_ABOVE={above} UNGROUNDED_BELOW={below}",
            )
    print(
        f"\nTotal {time.monotonic() - started:.0f} s; load average {load1:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
