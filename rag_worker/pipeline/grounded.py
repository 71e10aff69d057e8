"""The grounding policy of a turn: which answer mode and policy apply, and what happens when a draft fails.

- `flag`: keep the answer; its unsupported sentences are marked in `done.grounding` (the web marks them).
- `extract`: replace the answer with the extractive one (quotes of the sources, with a caveat saying why).
- `refuse`: abstain and say why.
Defaults: `extract` for the embedded model, `flag` for Ollama. ANSWER_MODE=extractive (or options.answer_mode)
skips generation on the embedded model and quotes at once.
"""

from __future__ import annotations

from . import extractive, grounding
from .generate import is_local
from .turn import Turn


def policy(turn: Turn) -> str:
    return (
        turn.options.grounding or turn.settings.grounding_policy or ("extract" if is_local(turn) else "flag")
    )


def extractive_only(turn: Turn) -> bool:
    """Answer with quotes and no generation: asked per request, or ANSWER_MODE=extractive on the embedded model."""
    if turn.options.answer_mode:
        return turn.options.answer_mode == "extractive"
    return is_local(turn) and turn.settings.answer_mode == "extractive"


def passages(turn: Turn, documents: list[dict]) -> dict[str, str]:
    """{ref: text} the generator read (all documents' full context when it read none, as for quotes)."""
    if turn.read:
        return dict(turn.read)
    return {d["ref"]: (d.get("context") or d["text"]) for d in documents if d.get("ref")}


def all_passages(documents: list[dict]) -> dict[str, str]:
    return {d["ref"]: (d.get("context") or d["text"]) for d in documents if d.get("ref")}


def watch(turn: Turn, documents: list[dict]) -> grounding.StreamWatch | None:
    """A sentence-by-sentence check of the stream, when a failing draft would be replaced anyway."""
    if policy(turn) == "flag" or not documents:
        return None
    return grounding.StreamWatch(turn, passages(turn, documents), documents)


def quote(turn: Turn, question: str, documents: list[dict], caveat: str = "") -> str:
    return extractive.answer(turn, question, all_passages(documents), documents, caveat)


def apply(turn: Turn, question: str, reply: str, documents: list[dict], mode: str) -> tuple[str, dict, bool]:
    """Check `reply` (mode "generated" or "extractive"); act on a failure. Returns (reply, grounding, refused)."""
    act = policy(turn)
    reply, g = grounding.check(turn, reply, passages(turn, documents), documents)
    g.update(policy=act, answer_mode=mode, action="none")
    corrected = [s for s in g["sentences"] if s.get("corrected_from")]
    if corrected:
        known = {d.get("ref") for d in documents}
        turn.flags["corrected_citations"] = len(corrected)
        # Invented refs the check replaced never reach citations.validate: say here that the model made them up.
        invented = [r for s in corrected for r in s["corrected_from"] if r not in known]
        if invented:
            turn.flags["invented_refs_corrected"] = list(dict.fromkeys(invented))
    if mode == "extractive" or grounding.passed(g, turn.settings.grounding_min_share):
        return reply, g, False
    draft = {k: g[k] for k in ("supported_share", "supported", "checked")}
    if act == "flag":
        g["action"] = "flagged"
        return reply, g, False
    if act == "refuse":
        g.update(action="refused", draft=draft)
        return turn.prompt("ungrounded"), g, True
    # The caveat is the system speaking, not a claim from the sources: only the quotes are checked.
    quoted, g2 = grounding.check(turn, quote(turn, question, documents), all_passages(documents), documents)
    caveat = turn.prompt("extract_caveat").strip()
    if caveat:
        quoted = f"{caveat}\n\n{quoted}"
        for e in g2["sentences"]:
            e["start"] += len(caveat) + 2
            e["end"] += len(caveat) + 2
    g2.update(policy=act, answer_mode="extractive", action="extracted", draft=draft)
    return quoted, g2, False


def summary(g: dict) -> str:
    done = f"{g['supported']} of {g['checked']} sentences supported by the sources"
    return {
        "flagged": f"{done}: unsupported ones are marked",
        "extracted": "The draft was not supported by the sources: quoting them instead",
        "refused": f"Only {done}: not showing the draft",
    }.get(g.get("action"), done)


def above_floor(turn: Turn, query: str, hits: list, floor: float) -> list:
    """The hits worth showing: a chunk vector at or above the evidence floor, or, for a long chunk whose vector
    is diluted by its other topics, one sentence that is (the README's "Backup" paragraph shares a chunk with
    health, logs and stop). The sentence vectors stay in the turn for the grounding check and the quotes."""
    low = [h for h in hits if h.vector_score is not None and h.vector_score < floor]
    rescued: set[int] = set()
    if low:
        per_hit = [[p.text for p in grounding.passage_sentences("x", h.text)] for h in low]
        flat = [t for texts in per_hit for t in texts]
        if flat:
            sims = turn.embed_texts(flat) @ turn.embed_query(query)
            at = 0
            for h, texts in zip(low, per_hit, strict=True):
                if texts and float(sims[at : at + len(texts)].max()) >= floor:
                    rescued.add(id(h))
                at += len(texts)
    if rescued:
        turn.flags["rescued_passages"] = len(rescued)
    return [h for h in hits if h.vector_score is None or h.vector_score >= floor or id(h) in rescued]
