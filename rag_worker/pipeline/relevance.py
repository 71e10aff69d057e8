"""Relevance check on the retrieved passages, the query improvement for one retry, abstention, and the evidence
floor below which a passage is not shown."""

from __future__ import annotations

from dataclasses import dataclass

from .cues import words
from .grounding.sentences import passage_sentences
from .turn import Turn

SHOWN = 3  # passages the model reads when it judges relevance

QUESTION_WORDS = {
    "what",
    "which",
    "who",
    "whom",
    "whose",
    "when",
    "where",
    "why",
    "how",
    "is",
    "are",
    "does",
    "do",
    "did",
    "can",
    "could",
    "should",
    "would",
    "the",
    "a",
    "an",
    "of",
    "in",
    "on",
    "to",
    "for",
    "and",
    "or",
    "about",
    "tell",
    "me",
    "please",
    "explain",
    "there",
    "any",
}


@dataclass
class Verdict:
    relevant: bool
    method: str
    evidence: float
    reason: str


def evidence(turn: Turn, query: str, hits: list) -> float:
    """The best cosine similarity between the query and the top passages: the abstention signal."""
    top = hits[: turn.options.top_k]
    if not top:
        return 0.0
    known = [h.vector_score for h in top if h.vector_score is not None]
    missing = [h for h in top if h.vector_score is None]
    if missing:  # FTS-only hits carry no similarity: measure it
        vectors = turn.space.embed_documents([h.text for h in missing])
        q = turn.embed_query(query)
        for hit, sim in zip(missing, vectors @ q, strict=True):
            hit.vector_score = float(sim)
            known.append(float(sim))
    return float(max(known)) if known else 0.0


def judge(turn: Turn, query: str, hits: list, score: float | None = None) -> Verdict:
    """Whether `hits` answer `query`: by their evidence score (`evidence`, measured here unless given), and in
    the unsure band by the model's YES/NO where it is asked."""
    if score is None and hits:
        score = evidence(turn, query, hits)
    decided = by_score(turn, hits, score or 0.0)
    if decided is not None:
        return decided
    assert score is not None
    abstain_below, relevant_above = turn.evidence_thresholds()
    mid = (relevant_above + abstain_below) / 2
    verdict = ask_model(turn, query, hits)
    if verdict is None:
        return Verdict(score >= mid, "fallback", score, f"unsure ({score:.2f}) and no model answer")
    return Verdict(
        verdict, "llm", score, "the model judged the passages " + ("relevant" if verdict else "off topic")
    )


def by_score(turn: Turn, hits: list, score: float) -> Verdict | None:
    """`judge`'s verdict when the evidence score decides it alone; None when the model is to be asked (its
    unsure band, on a backend whose model judges relevance)."""
    if not hits:
        return Verdict(False, "retrieval_score", 0.0, "nothing was found")
    abstain_below, relevant_above = turn.evidence_thresholds()
    if score >= relevant_above:
        return Verdict(True, "retrieval_score", score, f"best passage similarity {score:.2f}")
    if score < abstain_below:
        return Verdict(False, "retrieval_score", score, f"best passage similarity only {score:.2f}")
    # The unsure band: the model judges, or (not asked, or no answer) the score against the band's middle.
    mid = (relevant_above + abstain_below) / 2
    if turn.model_judges("relevance"):
        return None
    fixed = getattr(turn.llm.backend, "unsure_relevant", None)
    if isinstance(fixed, bool):  # the embedded model's measured rule for the whole band
        return Verdict(
            fixed,
            "retrieval_score",
            score,
            f"best passage similarity {score:.2f}, in the unsure band ({abstain_below:.2f}-{relevant_above:.2f}): "
            f"{'relevant' if fixed else 'off topic'} by the embedded model's rule (the model is not asked)",
        )
    side = "above" if score >= mid else "below"
    return Verdict(
        score >= mid,
        "retrieval_score",
        score,
        f"best passage similarity {score:.2f}, {side} the unsure band's middle ({mid:.2f}); the embedded "
        "model is not asked",
    )


def ask_model(turn: Turn, query: str, hits: list) -> bool | None:
    """The utility model's YES/NO on whether the first SHOWN passages answer the query (None: it can't say)."""
    passages = "\n\n".join(f"- {h.text[:400]}" for h in hits[:SHOWN])
    return turn.ask_yes_no(turn.prompt("relevance"), f"Question: {query}\n\nPassages:\n{passages}")


def improved_query(turn: Turn, query: str) -> tuple[str, str]:
    """A second attempt at the search: the model's reformulation, else the query's content words."""
    messages = [
        {"role": "system", "content": turn.prompt("retry")},
        {"role": "user", "content": f"Question: {query}"},
    ]
    reply = turn.ask_utility(messages, max_tokens=64, failing="retry query from the model failed") or ""
    lines = reply.strip().splitlines()
    candidate = lines[0].strip().strip('"') if lines else ""
    if 3 <= len(candidate) <= 400 and candidate.casefold() != query.casefold():
        return candidate, "llm"
    keywords = " ".join(w for w in words(query) if w not in QUESTION_WORDS)
    return (keywords or query), "keywords"


def rescore(turn: Turn, question: str, hits: list) -> None:
    """Measure the top hits against the user's own question (a retry searched with other words)."""
    top = hits[: turn.options.top_k]
    if not top:
        return
    vectors = turn.space.embed_documents([h.text for h in top])
    for hit, sim in zip(top, vectors @ turn.embed_query(question), strict=True):
        hit.vector_score = float(sim)


def best_of(turn: Turn, question: str, first: list, second: list) -> list:
    """Keep whichever attempt found stronger evidence for the question the user asked.

    Both are judged against the original question, never against the retry's wording: a reformulation that
    drifted off topic must not talk the worker out of abstaining.
    """
    rescore(turn, question, second)
    return second if evidence(turn, question, second) > evidence(turn, question, first) else first


def bare_sentence(hit, sentences: list[str]) -> bool:
    """Whether `hit` is the one sentence `sentences` holds, embedded as it is: no headings in its metadata
    (ingestion embeds a chunk's headings with its text, rag_worker/ingest/chunk.py)."""
    metadata = hit.metadata if isinstance(hit.metadata, dict) else {}
    return len(sentences) == 1 and sentences[0] == hit.text.strip() and not metadata.get("headings")


def above_floor(turn: Turn, query: str, hits: list, floor: float) -> list:
    """The hits worth showing: a chunk vector at or above the evidence floor, or, for a long chunk whose vector
    is diluted by its other topics, one sentence that is (the README's "Backup" paragraph shares a chunk with
    health, logs and stop). The sentence vectors stay in the turn for the grounding check and the quotes."""
    low = [h for h in hits if h.vector_score is not None and h.vector_score < floor]
    rescued: set[int] = set()
    if low:
        per_hit = [[p.text for p in passage_sentences("x", h.text)] for h in low]
        # A chunk that is one sentence, embedded from its bare text (no headings put before it), has that
        # sentence's vector already: its similarity is the score that put it below the floor, so it cannot be
        # rescued, and embedding it again was a pass for nothing (about 5 ms a turn on the benches' indexes).
        per_hit = [[] if bare_sentence(h, texts) else texts for h, texts in zip(low, per_hit, strict=True)]
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
