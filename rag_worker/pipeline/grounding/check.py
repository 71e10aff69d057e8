"""Grounding: is each sentence of the answer backed by the passages the model read?

Each answer sentence (citations kept aside) is scored against every sentence of those passages:
`SIM_WEIGHT * cosine(embedder) + (1 - SIM_WEIGHT) * lexical`, where lexical is the share of the sentence's
content words found in that passage sentence and its neighbours (a quote scores ~1 on both, a paraphrase on the
similarity, a copied list of names on the overlap). The best passage sentence gives the label (`supported` at or
above GROUNDED_ABOVE, `weak` at or above UNGROUNDED_BELOW, else `unsupported`), the supporting passage and the
character span inside it. Thresholds and weight are calibrated on SciFact train (`python -m bench.grounding`,
docs/benchmarks.md "Grounding").

Citations are checked on the way: a sentence whose cited sources do not back it, while another source does, gets
its citation corrected to that source (`corrected_from` says what it cited); invented refs ([S9] with four
sources) are replaced by the supporting source the same way, before the invented-ref cleanup drops what is left.
A supported sentence that cites nothing gets the citation of its supporting source (`citation_added`; CITE_UNCITED):
a model that answers from the sources but forgets its markers (Qwen2.5-1.5B often does) still gives a cited answer.
All embeddings of one check go through `Turn.embed_texts`, at most two batched calls whose vectors the turn keeps
for provenance and the extractive answer. Only the passage sentences that can matter are embedded (`_scores`: the best
word overlap first, where a near-quote settles it, then those whose ceiling, a cosine of 1, reaches the best score
found): the labels and citations are exactly those of embedding them all, for a fraction of the forward passes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..citations import GROUP_RE
from ..turn import Turn
from .sentences import (
    PassageSentence,
    Sentence,
    citation_point,
    content_words,
    is_claim,
    passage_sentences,
    split_sentences,
)

SIM_WEIGHT = 0.5
CEILING_COSINE = 1.01  # the largest cosine of two normalised vectors, with room for float16 rounding
SETTLED_COSINE = 0.9  # an answer sentence this close to a supporting passage sentence is not searched further


@dataclass
class Thresholds:
    grounded_above: float
    ungrounded_below: float
    sim_weight: float = SIM_WEIGHT


def windows(passage: list[PassageSentence]) -> list[set[str]]:
    """Each passage sentence's words with its neighbours' (same ref): what `lexical` counts a claim against."""
    out = []
    for j, p in enumerate(passage):
        words = set(p.words)
        for k in (j - 1, j + 1):
            if 0 <= k < len(passage) and passage[k].ref == p.ref:
                words |= passage[k].words
        out.append(words)
    return out


def lexical(
    claim: set[str], passage: list[PassageSentence], around: list[set[str]] | None = None
) -> np.ndarray:
    """(len(passage),) share of `claim`'s words found in each passage sentence or its neighbours (same ref);
    `around`: `windows(passage)`, made once for several claims."""
    if not claim:
        return np.zeros(len(passage), dtype=np.float32)
    around = windows(passage) if around is None else around
    counts = np.array([len(claim & words) for words in around], dtype=np.float64)
    return (counts / len(claim)).astype(np.float32)


def _own_overlap(claim: set[str], passage: list[PassageSentence]) -> np.ndarray:
    """(len(passage),) share of `claim`'s words found in each passage sentence itself."""
    if not claim:
        return np.zeros(len(passage), dtype=np.float32)
    return np.array([len(claim & p.words) / len(claim) for p in passage], dtype=np.float32)


def label(score: float, t: Thresholds) -> str:
    if score >= t.grounded_above:
        return "supported"
    if score >= t.ungrounded_below:
        return "weak"
    return "unsupported"


def thresholds(turn: Turn) -> Thresholds:
    s = turn.settings
    return Thresholds(s.grounded_above, s.ungrounded_below, s.grounding_sim_weight)


def check(turn: Turn, reply: str, passages: dict[str, str], documents: list[dict]) -> tuple[str, dict]:
    """Score `reply` against `passages` ({ref: text the model read}); returns (reply with citations corrected,
    grounding). Grounding: {"supported_share", "supported", "checked", "sentences": [...]}."""
    t = thresholds(turn)
    sentences = [s for s in split_sentences(reply) if is_claim(s)]
    plist = [p for ref, text in passages.items() for p in passage_sentences(ref, text)]
    if not sentences:
        return reply, {"supported_share": 1.0, "supported": 0, "checked": 0, "sentences": []}
    if not plist:
        out = [_entry(s, "unsupported", 0.0, 0.0, 0.0, None, None) for s in sentences]
        return reply, _summary(out)
    refs_of = np.array([p.ref for p in plist])
    sim, scores, lex = _scores(turn, sentences, plist, refs_of, passages, t)
    known = {d["ref"] for d in documents if d.get("ref")}
    entries: list[dict] = []
    edits: list[tuple[int, int, str]] = []
    for i, s in enumerate(sentences):
        j = int(scores[i].argmax())
        best = float(scores[i, j])
        lab = label(best, t)
        entry = _entry(s, lab, best, float(sim[i, j]), float(lex[i, j]), plist[j], passages)
        if s.refs:
            cited = [r for r in s.refs if r in passages]
            cited_best = max(
                (float(scores[i][refs_of == r].max()) for r in cited if (refs_of == r).any()), default=0.0
            )
            backed = cited_best >= t.ungrounded_below
            entry["citation_ok"] = backed
            if not backed and lab == "supported" and plist[j].ref in known and s.citation_span is not None:
                entry["corrected_from"] = s.refs
                entry["refs"] = [plist[j].ref]
                edits.append((*s.citation_span, f"[{plist[j].ref}]"))
        elif lab == "supported" and plist[j].ref in known and turn.settings.cite_uncited:
            at, mark = citation_point(s), f" [{plist[j].ref}]"
            entry["refs"], entry["citation_added"] = [plist[j].ref], True
            entry["text"] = s.text[: at - s.start] + mark + s.text[at - s.start :]
            edits.append((at, at, mark))
        entries.append(entry)
    for a, b, new in sorted(edits, reverse=True):
        reply = reply[:a] + new + reply[b:]
    # Offsets moved with the edits: find each sentence again in the corrected reply.
    if edits:
        _reanchor(reply, entries)
    return reply, _summary(entries)


def _scores(
    turn: Turn,
    sentences: list[Sentence],
    plist: list[PassageSentence],
    refs_of: np.ndarray,
    passages: dict[str, str],
    t: Thresholds,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(similarity, score, lexical) of every answer sentence against every passage sentence, embedding only the
    passage sentences that can matter. Labels and citation checks are exactly those of embedding them all.

    A score is `weight * cosine + (1 - weight) * lexical`, and a cosine of normalised vectors is at most 1, so
    before any embedding each passage sentence has a ceiling, `weight + (1 - weight) * lexical`. First comes, for
    each answer sentence, the passage sentence sharing most of its words among those it cites (or among all, when
    it cites nothing). An answer sentence that is a near-quote of it (cosine SETTLED_COSINE or more, and a
    supporting score) is settled: supported, its citation holds, and that sentence is its source, though another
    could score a little higher on its neighbours' words. For the others, every passage sentence whose ceiling
    reaches the answer sentence's best score so far follows, and, while its cited passages have not reached
    `ungrounded_below` (its citation would not hold), every cited one whose ceiling reaches that. Any other could
    not be its best match nor change whether its citation holds: its similarity is left at -1 and its score at
    -inf, so its label, score, source and citation check are those of embedding them all. A quote of its cited
    passage embeds one passage sentence (a RAG turn reads five documents with their neighbours)."""
    weight, floor = t.sim_weight, t.ungrounded_below
    n, m = len(sentences), len(plist)
    claims = [content_words(s.plain) for s in sentences]
    around = windows(plist)
    lex = np.stack([lexical(c, plist, around) for c in claims])
    cites = np.zeros((n, m), dtype=bool)
    for i, s in enumerate(sentences):
        cites[i] = np.isin(refs_of, [r for r in s.refs if r in passages])
    sim = np.full((n, m), -1.0, dtype=np.float32)
    done = np.zeros(m, dtype=bool)

    def embed(cols: list[int]) -> None:
        vecs = turn.embed_texts([s.plain for s in sentences] + [plist[j].text for j in cols])
        sim[:, cols] = vecs[:n] @ vecs[n:].T
        done[cols] = True

    def scored() -> np.ndarray:
        """The scores of the passage sentences embedded so far; -inf for the others."""
        return np.where(done, weight * sim + (1.0 - weight) * lex, -np.inf)

    # The first candidate shares most of the sentence's words itself (its neighbours' words, which `lexical`
    # counts too, only break ties): a quote finds the sentence it quotes, not the one before it.
    own = np.stack([_own_overlap(c, plist) for c in claims]) + lex / 1000.0
    embed(
        sorted(
            {
                int(np.where(c, own[i], -1.0).argmax() if c.any() else own[i].argmax())
                for i, c in enumerate(cites)
            }
        )
    )
    scores = scored()
    best = scores.max(axis=1)
    cited_best = np.where(cites, scores, -np.inf).max(axis=1)
    # The margin covers float16 vectors stored at ingestion, whose norms are 1 to about 1e-3.
    ceiling = weight * CEILING_COSINE + (1.0 - weight) * lex
    wanted = (ceiling >= best[:, None]) | (cites & (cited_best < floor)[:, None] & (ceiling >= floor))
    # A near-quote of a sentence it cites (or, citing nothing, of any) is final: supported, its citation holds,
    # and its source is the sentence it quotes; another sentence could outscore it only on its neighbours' words.
    # (Judged among its own candidates: a sentence another answer sentence brought in says nothing of whether
    # this one's citation holds.)
    own_scores = np.where(np.where(cites.any(axis=1)[:, None], cites, True), scores, -np.inf)
    at_best = own_scores.argmax(axis=1)
    settled = (own_scores[np.arange(n), at_best] >= t.grounded_above) & (
        sim[np.arange(n), at_best] >= SETTLED_COSINE
    )
    wanted &= ~settled[:, None]
    rest = np.flatnonzero(~done & wanted.any(axis=0))
    if rest.size:
        embed([int(j) for j in rest])
    return sim, scored(), lex


def _entry(s: Sentence, lab: str, score: float, sim: float, lex: float, p, passages) -> dict:
    entry = {
        "text": s.text,
        "start": s.start,
        "end": s.end,
        "label": lab,
        "score": round(score, 4),
        "similarity": round(sim, 4),
        "overlap": round(lex, 4),
        "refs": s.refs,
    }
    if p is not None and lab != "unsupported":
        entry["source"] = {"ref": p.ref, "start": p.start, "end": p.end, "text": p.text}
    return entry


def _reanchor(reply: str, entries: list[dict]) -> None:
    pos = 0
    for entry in entries:
        text = entry["text"]
        if entry.get("corrected_from"):
            text = GROUP_RE.sub(lambda _m: "\0", text)
            parts = [re.escape(x) for x in text.split("\0")]
            m = re.compile(r"\[S\d+(?:\s*[,;]\s*S\d+)*\]".join(parts)).search(reply, pos)
        else:
            m = re.compile(re.escape(text)).search(reply, pos)
        if m:
            entry["text"], entry["start"], entry["end"] = m.group(0), m.start(), m.end()
            pos = m.end()


def _summary(entries: list[dict]) -> dict:
    supported = sum(e["label"] == "supported" for e in entries)
    return {
        "supported_share": round(supported / len(entries), 4) if entries else 1.0,
        "supported": supported,
        "checked": len(entries),
        "sentences": entries,
    }


def passed(grounding: dict, min_share: float) -> bool:
    return grounding["checked"] == 0 or grounding["supported_share"] >= min_share


class StreamWatch:
    """Checks each sentence as the stream completes it, so a draft going wrong can be stopped early.

    `feed` returns True once the draft is going wrong: its first checked sentence is not supported, or at least
    two sentences and half of those checked so far are not supported. Used only when a failing draft would be
    replaced anyway (policy `extract` or `refuse`).
    """

    def __init__(self, turn: Turn, passages: dict[str, str], documents: list[dict]):
        self.turn, self.passages, self.documents = turn, passages, documents
        self.text = ""
        self.checked = 0
        self.failed = 0

    def feed(self, piece: str) -> bool:
        self.text += piece
        # Every sentence but the last is complete: the last one may still grow.
        complete = split_sentences(self.text)[:-1]
        claims = [s for s in complete if is_claim(s)]
        new = claims[self.checked :]
        if not new:
            return False
        _, g = check(self.turn, " ".join(s.text for s in new), self.passages, self.documents)
        first_fails = self.checked == 0 and g["sentences"][0]["label"] != "supported"
        for e in g["sentences"]:
            self.failed += e["label"] != "supported"
            self.checked += 1
        return first_fails or (self.failed >= 2 and self.failed * 2 >= self.checked)
