"""The embedded model as the judge of the three YES/NO steps, beside each step's model-free rule (issue 29).

    .venv/bin/python -m bench.embedded judges [--split train|test] [--models smollm2,qwen2.5-1.5b] [--n 60]

Each step is asked exactly as a turn asks it (the worker's prompts and bodies, `Turn.ask_yes_no`, the real
`LocalBackend`, one call at a time), on every item, with the model-free signal the step computes:

- relevance (`relevance.ask_model`, signal: `relevance.evidence`): questions "Is it true that <claim>?" searched
  with `retrieve.search` in a LanceDB index of a SciFact slice (the split's first gold documents and as many
  others, built with the worker's converter and chunker, overviews as ingestion writes them without a model):
  claims whose gold document is in the index, claims whose gold document is not (on topic, answer elsewhere),
  and the questions of bench/data/unanswerable_<split>.txt. YES when a gold document is among the passages the
  model is shown, NO otherwise.
- fetch_check (`fetch_check.ask_model`, signal: `fetch_check.similarity`): a conversation about a claim with its
  gold abstract in hand, then another claim about the same abstract or a follow-up of
  bench/data/follow_ups_<split>.txt (NO: no new search needed), or a claim about another abstract (YES). Half
  the claims open with "And is it also true that" (a follow-up cue), so the cue does not give the label away.
- triage (`triage.ask_model`, signal: `triage.probe`): the indexed claims (YES: the documents are needed) and
  the messages of bench/data/no_documents_<split>.txt (NO); the layer-1 gate's verdict on each is recorded too.

The steps are interleaved, so the model's prompt cache never holds the previous call's prefix (as in a chat,
where the steps of a turn and the answer take turns). Per-item results: .cache/bench/embedded/
judges-<split>-<model>.jsonl (a rerun resumes). Prints figures; never pass/fail.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from itertools import zip_longest
from pathlib import Path
from types import SimpleNamespace

from bench import beir
from bench.embedded import OUT, ROOT, SCIFACT

STEPS = ("relevance", "fetch_check", "triage")
SLICE_DOCS = 400  # the index: up to half gold documents of the split's first claims, the rest distractors
CUTS = {  # model-free alternatives shown in the report: one similarity cut across the step's unsure band
    "relevance": (0.35, 0.37, 0.395, 0.42, 0.44),
    "fetch_check": (0.20, 0.30, 0.40, 0.50, 0.55),
    "triage": (0.15, 0.20, 0.25, 0.30, 0.40),
}


# -- data --------------------------------------------------------------------------------------------------------


def lines(name: str) -> list[str]:
    text = (ROOT / "bench" / "data" / name).read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def lower_first(text: str) -> str:
    """The text with its first letter lowercased, unless it opens an acronym ("ALDH1", "CONTEXT")."""
    return text if text[1:2].isupper() else text[:1].lower() + text[1:]


def as_question(claim: str, follow_up: bool = False) -> str:
    body = lower_first(claim.strip().rstrip("."))
    return f"And is it also true that {body}?" if follow_up else f"Is it true that {body}?"


def gold(data: beir.BeirDataset, qid: str) -> list[str]:
    return [d for d, r in data.qrels[qid].items() if r > 0 and d in data.corpus]


def relevance_items(split: str, n: int, full: beir.BeirDataset, sliced: beir.BeirDataset) -> list[dict]:
    indexed = [
        {"id": f"rel-in-{q}", "kind": "indexed", "question": as_question(t), "gold": gold(full, q)}
        for q, t in list(sliced.queries.items())[:n]
    ]
    elsewhere = [
        {"id": f"rel-out-{q}", "kind": "elsewhere", "question": as_question(t), "gold": gold(full, q)}
        for q, t in full.queries.items()
        if q not in sliced.queries and gold(full, q) and not set(gold(full, q)) & set(sliced.corpus)
    ][:n]
    none = [
        {"id": f"rel-none-{i}", "kind": "unanswerable", "question": q, "gold": []}
        for i, q in enumerate(lines(f"unanswerable_{split}.txt")[:n])
    ]
    return interleave(indexed, elsewhere, none)


def fetch_items(split: str, n: int, full: beir.BeirDataset) -> list[dict]:
    """2n conversations: n/2 same abstract, n/2 generic follow-ups (NO), n another abstract (YES)."""
    first = {q: gold(full, q)[0] for q in full.queries if gold(full, q)}
    by_doc: dict[str, list[str]] = {}
    for q, d in first.items():
        by_doc.setdefault(d, []).append(q)
    pairs = [(qs[0], qs[1]) for qs in by_doc.values() if len(qs) > 1][: n // 2]
    generic = lines(f"follow_ups_{split}.txt")
    qids = list(first)
    out = []
    for i, (a, b) in enumerate(pairs):
        out.append(conversation(f"fetch-same-{a}-{b}", "same_abstract", a, full.queries[b], i % 2 == 1, full))
    for i, a in enumerate(qids[: n // 2]):
        out.append(conversation(f"fetch-generic-{a}", "generic", a, generic[i % len(generic)], None, full))
    others = qids[len(qids) // 2 :]  # claims far from the first ones in the split's order
    for i, (a, c) in enumerate(zip(qids[:n], others, strict=False)):
        if first[a] != first[c]:
            out.append(
                conversation(f"fetch-other-{a}-{c}", "other_abstract", a, full.queries[c], i % 2, full)
            )
    return out


def conversation(
    item_id: str, kind: str, qid: str, follow: str, cue: bool | int | None, full: beir.BeirDataset
) -> dict:
    doc_id = gold(full, qid)[0]
    doc = full.corpus[doc_id]
    opening = doc["text"].split(". ")[0].rstrip(".") + "."
    return {
        "id": item_id,
        "kind": kind,
        "question": follow if cue is None else as_question(follow, follow_up=bool(cue)),
        "label": kind == "other_abstract",
        "history": [
            {"role": "user", "content": as_question(full.queries[qid])},
            {"role": "assistant", "content": f"The source says: {opening} [S1]"},
        ],
        "docs": [{"id": doc_id, "filename": f"{doc_id}.txt", "text": doc["text"], "ref": "S1"}],
    }


def triage_items(split: str, n: int, sliced: beir.BeirDataset) -> list[dict]:
    needed = [
        {"id": f"tri-doc-{q}", "kind": "documents", "question": as_question(t), "label": True}
        for q, t in list(sliced.queries.items())[:n]
    ]
    chat = [
        {"id": f"tri-none-{i}", "kind": "no_documents", "question": q, "label": False}
        for i, q in enumerate(lines(f"no_documents_{split}.txt")[:n])
    ]
    return interleave(needed, chat)


def interleave(*lists: list[dict]) -> list[dict]:
    return [it for group in zip_longest(*lists) for it in group if it is not None]


# -- the index ---------------------------------------------------------------------------------------------------


def judge_index(split: str):
    """Services over the split's slice index (built once, with overviews), the full split and the slice."""
    from bench import retrieval
    from rag_worker.ingest.overviews import fallback_overview, overviews_path, upsert_overviews

    full = beir.load(SCIFACT, split)
    sliced = beir.slice_corpus(full, SLICE_DOCS)
    services, _, built = retrieval.ensure_index(sliced, SLICE_DOCS, OUT / f"judges-{split}")
    if built or not overviews_path(services.settings, retrieval.INDEX).exists():
        entries = []
        for doc_id, doc in sliced.corpus.items():
            chunk = SimpleNamespace(text=f"{doc['title']}\n\n{doc['text']}")
            entries.append(
                {
                    "dataset": retrieval.DATASET,
                    "filename": retrieval.filename_for(doc_id),
                    "document_id": doc_id,
                    "title": doc["title"],
                    "overview": fallback_overview(doc["title"], [chunk]),
                    "source": "fallback",
                }
            )
        upsert_overviews(services.settings, retrieval.INDEX, entries)
    return services, full, sliced


# -- one item ----------------------------------------------------------------------------------------------------


class Recorded:
    """The backend, keeping each call's reply and seconds (what the model said, not only the parsed YES/NO)."""

    def __init__(self, backend):
        self._backend = backend
        self.reply: str | None = None
        self.seconds = 0.0

    def __getattr__(self, name: str):
        return getattr(self._backend, name)

    def chat(self, messages: list[dict], **kwargs) -> str:
        started = time.monotonic()
        try:
            self.reply = self._backend.chat(messages, **kwargs)
            return self.reply
        finally:
            self.seconds = time.monotonic() - started


def make_turn(services, backend, item: dict):
    from bench.retrieval import INDEX
    from rag_worker.llm import CancelToken
    from rag_worker.pipeline.turn import Turn, TurnOptions
    from rag_worker.schemas import ChatRequest

    opts = TurnOptions("auto", True, False, False, "hybrid", 5, "similarity", None, None, None, {})
    request = ChatRequest(
        prompt=item["question"], index=INDEX, history=item.get("history", []), docs=item.get("docs", [])
    )
    llm = SimpleNamespace(backend=backend, generation_model=backend.name, utility_model=backend.name)
    return Turn(services, request, opts, llm, CancelToken())


def run_item(step: str, item: dict, services, backend: Recorded) -> dict:
    from gateway.gate import should_use_rag
    from rag_worker.pipeline import fetch_check, relevance, retrieve, triage

    turn = make_turn(services, backend, item)
    rec = {k: item[k] for k in ("id", "kind", "question")}
    rec["step"] = step
    backend.reply, backend.seconds = None, 0.0
    if step == "relevance":
        hits = retrieve.search(turn, item["question"])
        rec["similarity"] = relevance.evidence(turn, item["question"], hits)
        shown = {Path(h.filename).stem for h in hits[: relevance.SHOWN]}
        rec["label"] = bool(shown & set(item["gold"]))
        rec["answer"] = relevance.ask_model(turn, item["question"], hits)
    elif step == "fetch_check":
        rec["similarity"], rec["follow_up"] = fetch_check.similarity(turn)
        rec["label"] = item["label"]
        rec["answer"] = fetch_check.ask_model(turn)
    else:
        rec["similarity"] = triage.probe(turn, item["question"])
        rec["label"] = item["label"]
        rec["gate"] = should_use_rag(item["question"], force_rag=False, has_indexes=True)[0]
        rec["answer"] = triage.ask_model(turn, item["question"])
    rec.update(reply=backend.reply, seconds=backend.seconds, model=backend.name)
    return rec


def run(split: str, n: int, models: list[str]) -> None:
    from rag_worker.llm import LocalBackend
    from rag_worker.settings import Settings

    started = time.monotonic()
    services, full, sliced = judge_index(split)
    print(
        f"index: {len(sliced.corpus)} SciFact {split} abstracts ready in {time.monotonic() - started:.0f} s",
        flush=True,
    )
    per_step = {
        "relevance": relevance_items(split, n, full, sliced),
        "fetch_check": fetch_items(split, n, full),
        "triage": triage_items(split, n, sliced),
    }
    tagged = {s: [(s, it) for it in items] for s, items in per_step.items()}
    items = interleave(*(tagged[s] for s in STEPS))  # type: ignore[arg-type]
    OUT.mkdir(parents=True, exist_ok=True)
    for key in models:
        settings = Settings(EMBEDDED_MODEL=key, LLM_BACKEND="local", LOCAL_PARALLEL=1)
        backend = Recorded(LocalBackend(settings))
        path = OUT / f"judges-{split}-{key}.jsonl"
        done = {json.loads(line)["id"] for line in path.open()} if path.exists() else set()
        todo = [(s, it) for s, it in items if it["id"] not in done]
        print(f"{key}: {len(todo)} of {len(items)} items to run -> {path}", flush=True)
        if not todo:
            continue
        backend.ensure_loaded()  # the load is not a judge call
        t0 = time.monotonic()
        with path.open("a") as out:
            for i, (step, item) in enumerate(todo, 1):
                out.write(json.dumps(run_item(step, item, services, backend)) + "\n")
                out.flush()
                if i % 20 == 0:
                    print(f"  {i}/{len(todo)} in {time.monotonic() - t0:.0f} s", flush=True)


# -- report -------------------------------------------------------------------------------------------------------


def asked(rec: dict, settings) -> bool:
    """Whether the step asks the model on this item (its model-free signal is unsure): mirrors the step's code."""
    from rag_worker.pipeline.fetch_check import FETCH_BELOW, FOLLOW_UP_REUSE_ABOVE, REUSE_ABOVE

    s = rec["similarity"]
    if rec["step"] == "relevance":
        return settings.abstain_below <= s < settings.relevant_above
    if rec["step"] == "fetch_check":
        reuse = s >= REUSE_ABOVE or (rec["follow_up"] and s >= FOLLOW_UP_REUSE_ABOVE)
        return not reuse and s >= FETCH_BELOW
    return s is None or s < settings.triage_rag_above


def by_rule(rec: dict, settings, cut: float | None = None) -> bool:
    """The step's verdict without the model (YES: relevant / search again / documents needed). Within the unsure
    band: the step's rule (relevance: the band's middle, fetch check: search again, triage: search), or, with
    `cut`, YES at or above (relevance), below (fetch check) or at or above (triage) that similarity."""
    from rag_worker.pipeline.fetch_check import FOLLOW_UP_REUSE_ABOVE, REUSE_ABOVE

    s = rec["similarity"]
    step = rec["step"]
    if step == "relevance":
        low, high = settings.abstain_below, settings.relevant_above
        if not asked(rec, settings):
            return s >= high
        return s >= (cut if cut is not None else (low + high) / 2)
    if step == "fetch_check":
        if not asked(rec, settings):
            return not (s >= REUSE_ABOVE or (rec["follow_up"] and s >= FOLLOW_UP_REUSE_ABOVE))
        return True if cut is None else s < cut
    if not asked(rec, settings):
        return True
    return True if cut is None else (s is not None and s >= cut)


def with_model(rec: dict, settings) -> bool:
    """The step's verdict as it runs when it asks the model: the rule outside the band, the model within it (its
    fallback when the model says neither)."""
    if asked(rec, settings) and rec["answer"] is not None:
        return rec["answer"]
    return by_rule(rec, settings)


def tally(pairs: list[tuple[bool, bool | None]]) -> dict:
    """Accuracy (an answer of neither YES nor NO counts as wrong), neither, precision and recall per class."""
    n = len(pairs)
    out: dict = {"n": n, "acc": sum(a == lab for lab, a in pairs) / n if n else None}
    out["neither"] = sum(a is None for _, a in pairs) / n if n else None
    for cls in (True, False):
        said = [lab for lab, a in pairs if a is cls]
        real = [a for lab, a in pairs if lab is cls]
        out[f"p_{cls}"] = sum(lab is cls for lab in said) / len(said) if said else None
        out[f"r_{cls}"] = sum(a is cls for a in real) / len(real) if real else None
    return out


def pct(x: float | None) -> str:
    return "   -" if x is None else f"{100 * x:4.0f}"


HEAD = " acc neith.    YES P/R    NO P/R"
CLASS_NAMES = {
    "relevance": ("relevant", "off topic"),
    "fetch_check": ("search again", "docs in hand"),
    "triage": ("documents", "no documents"),
}


def figures(t: dict) -> str:
    """Accuracy, neither, and precision/recall of YES and of NO, in percent."""
    yes, no = f"{pct(t['p_True'])}/{pct(t['r_True'])}", f"{pct(t['p_False'])}/{pct(t['r_False'])}"
    return f"{pct(t['acc'])} {pct(t['neither'])}     {yes} {no}"


def row(label: str, recs: list[dict], verdict, band: list[dict], seconds: str = "") -> str:
    every = tally([(r["label"], verdict(r)) for r in recs])
    asked_ = tally([(r["label"], verdict(r)) for r in band])
    return f"  {label:34} | {figures(every)} | {figures(asked_)} | {seconds}"


def report(split: str) -> None:
    from rag_worker.settings import Settings

    settings = Settings()
    runs = {p.stem.removeprefix(f"judges-{split}-"): p for p in sorted(OUT.glob(f"judges-{split}-*.jsonl"))}
    if not runs:
        return
    recs_of = {m: [json.loads(line) for line in p.open()] for m, p in runs.items()}
    for step in STEPS:
        # The items every model answered, so the rows compare the same items.
        ids = set.intersection(*({r["id"] for r in rs if r["step"] == step} for rs in recs_of.values()))
        if not ids:
            continue
        base = sorted((r for r in next(iter(recs_of.values())) if r["id"] in ids), key=lambda r: r["id"])
        band = [r for r in base if asked(r, settings)]
        yes, no = CLASS_NAMES[step]
        kinds = statistics_of(base, band)
        print(
            f"\n{step} ({split}): {len(base)} items, {sum(r['label'] for r in base)} YES ({yes}) / "
            f"{sum(not r['label'] for r in base)} NO ({no}); where the step asks the model: {len(band)} "
            f"({sum(r['label'] for r in band)} YES / {sum(not r['label'] for r in band)} NO){kinds}"
        )
        print(f"  {'verdict':34} | {'all items':34} | {'where the step asks the model':34} | model s/call")
        print(f"  {'':34} | {HEAD:34} | {HEAD:34} | all (asked)")
        for model, recs in recs_of.items():
            mine = {r["id"]: r for r in recs if r["id"] in ids}
            secs = [r["seconds"] for r in mine.values()]
            secs_band = [mine[r["id"]]["seconds"] for r in band]
            timing = f"{statistics.mean(secs):.1f} ({statistics.mean(secs_band):.1f})" if secs_band else ""
            answer = lambda r, m=mine: m[r["id"]]["answer"]  # noqa: E731
            step_with = lambda r, m=mine: with_model(m[r["id"]], settings)  # noqa: E731
            print(row(f"{model} asked on every item", base, answer, band, timing))
            print(row(f"step asking {model}", base, step_with, band))
        print(row("step by its rule alone", base, lambda r: by_rule(r, settings), band))
        for cut in CUTS[step]:
            print(row(f"  rule, band cut at {cut:.3f}", base, lambda r, c=cut: by_rule(r, settings, c), band))
        if step == "triage":
            gated = [r for r in base if r["gate"] == "direct"]
            print(
                f"  the gateway's layer-1 gate sends {len(gated)} of {sum(not r['label'] for r in base)} "
                f"no-document messages direct before triage ({sum(r['label'] for r in gated)} document questions)"
            )


def statistics_of(base: list[dict], band: list[dict]) -> str:
    kinds = sorted({r["kind"] for r in base})
    parts = [f"{k} {sum(r['kind'] == k for r in band)}/{sum(r['kind'] == k for r in base)}" for k in kinds]
    return "; asked/all per kind: " + ", ".join(parts)


if __name__ == "__main__":  # pragma: no cover
    print("run it as: python -m bench.embedded judges", file=sys.stderr)
