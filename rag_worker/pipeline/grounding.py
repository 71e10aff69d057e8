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
All embeddings of one check go through `Turn.embed_texts`, one batched call whose vectors the turn keeps for
provenance and the extractive answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from .citations import GROUP_RE, REF_RE
from .turn import Turn

SIM_WEIGHT = 0.5
MIN_CONTENT_WORDS = 2  # "See below." or a lead line like "From README.md:" is not a claim to check
MAX_PASSAGE_SENTENCE_CHARS = 600

_ABBREVIATIONS = {"e.g", "i.e", "etc", "vs", "cf", "al", "fig", "dr", "mr", "mrs", "ms", "no", "approx", "ca"}
_CODE_RE = re.compile(r"`[^`\n]*`")
# A sentence ends at . ! or ? (with closing quotes, brackets or emphasis), then the citation groups that belong to
# it, then whitespace; or at a line break.
# A line break ends one only before a blank line, a list item, a heading, a quote or a table row (hard-wrapped
# markdown keeps its sentences whole).
_END_RE = re.compile(
    r"[.!?][\"')\]*_]*((?:\s*\[S\d+(?:\s*[,;]\s*S\d+)*\])*)(?=\s)"
    r"|\n(?=[ \t]*(?:\n|[-*+][ \t]|\d+[.)][ \t]|#{1,6}[ \t]|>|\||```|~~~))"
    r"|(?<=:)\n"
)
_LEAD_MARK_RE = re.compile(r"^\s*(?:[-*+]\s+|\d+[.)]\s+|#{1,6}\s+|>\s*)+")
_WORD_RE = re.compile(r"[a-z0-9][a-z0-9_]*")
_STOPWORD_TEXT = """a about above after again against all also am an and any are as at be because been before being below
    between both but by can could did do does doing down during each either else few for from further had has
    have having he her here hers herself him himself his how i if in into is it its itself just let me might
    more most must my myself no nor not now of off on once only or other our ours ourselves out over own per
    same she should so some such than that the their theirs them themselves then there these they this those
    through to too under until up upon us very was we were what when where which while who whom whose why will
    with within without would you your yours yourself yourselves according source sources s1 s2 s3 s4 s5 s6 s7
    s8 s9 may one use used using get via like well"""
STOPWORDS = frozenset(_STOPWORD_TEXT.split())


@dataclass
class Sentence:
    text: str  # as written in the answer, citations included
    plain: str  # without citation markers and markdown list/heading/quote marks
    refs: list[str]
    start: int  # offsets of `text` in the answer
    end: int
    citation_span: tuple[int, int] | None = None  # where its citation groups sit in the answer


@dataclass
class PassageSentence:
    ref: str
    text: str
    start: int  # offsets inside the passage text
    end: int
    words: set[str] = field(default_factory=set)


@dataclass
class Thresholds:
    grounded_above: float
    ungrounded_below: float
    sim_weight: float = SIM_WEIGHT


# -- splitting ------------------------------------------------------------------------------------------------


def _masked(text: str) -> str:
    """`text` with code spans blanked, so `tar czf a.tgz` or `index_store/.` never ends a sentence."""
    return _CODE_RE.sub(lambda m: "`" + "x" * (len(m.group(0)) - 2) + "`", text)


def _is_abbreviation(text: str, dot: int) -> bool:
    if text[dot] != ".":
        return False
    start = dot
    while start > 0 and not text[start - 1].isspace() and text[start - 1] not in "(\"'":
        start -= 1
    word = text[start:dot].lower()
    if word.isdigit() and (start == 0 or text[start - 1] == "\n"):
        return True  # "1. " opening a numbered list item
    return word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha())


def split_sentences(text: str) -> list[Sentence]:
    """The answer's sentences in order, each with the refs it cites (citations after the full stop included)."""
    masked = _masked(text)
    out: list[Sentence] = []
    start = 0
    for m in _END_RE.finditer(masked):
        if m.group(0) != "\n" and _is_abbreviation(masked, m.start()):
            continue
        end = m.end()
        _add(text, start, end, out)
        start = end
    _add(text, start, len(text), out)
    return out


def _add(text: str, start: int, end: int, out: list[Sentence]) -> None:
    raw = text[start:end]
    stripped = raw.strip()
    if not stripped:
        return
    lead = len(raw) - len(raw.lstrip())
    s, e = start + lead, start + lead + len(stripped)
    groups = list(GROUP_RE.finditer(text, s, e))
    refs = list(dict.fromkeys(r for g in groups for r in REF_RE.findall(g.group(1))))
    span = (groups[0].start(), groups[-1].end()) if groups else None
    out.append(Sentence(stripped, plain_text(stripped), refs, s, e, span))


def is_claim(s: Sentence) -> bool:
    """A sentence worth checking: enough content words, and not a lead-in ("From README.md:")."""
    return len(content_words(s.plain)) >= MIN_CONTENT_WORDS and not s.plain.endswith(":")


def plain_text(sentence: str) -> str:
    plain = GROUP_RE.sub("", sentence)
    plain = _LEAD_MARK_RE.sub("", plain)
    plain = re.sub(r"\s+([.,;:!?])", r"\1", plain)
    return re.sub(r"\s+", " ", plain).strip()


def content_words(text: str) -> set[str]:
    words = set()
    for w in _WORD_RE.findall(text.lower()):
        if w in STOPWORDS or (len(w) < 2 and not w.isdigit()):
            continue
        if len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
            w = w[:-1]
        words.add(w)
    return words


_FENCE_RE = re.compile(r"^(```|~~~).*?(^\1[^\n]*$|\Z)", re.MULTILINE | re.DOTALL)


def prose(passage: str) -> str:
    """`passage` with fenced code blocks and table rows blanked (same length, so offsets stay valid)."""
    blank = _FENCE_RE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), passage)
    return re.sub(r"(?m)^\s*\|.*$", lambda m: " " * len(m.group(0)), blank)


def passage_sentences(ref: str, passage: str, *, prose_only: bool = False) -> list[PassageSentence]:
    """The passage's sentences with offsets; `prose_only` leaves out code blocks, table rows and sentences with
    a question in them (what an extractive answer may quote)."""
    out = []
    for s in split_sentences(prose(passage) if prose_only else passage):
        text = s.plain
        if not text or len(content_words(text)) < MIN_CONTENT_WORDS:
            continue
        if prose_only and "?" in text:
            continue
        out.append(
            PassageSentence(ref, text[:MAX_PASSAGE_SENTENCE_CHARS], s.start, s.end, content_words(text))
        )
    return out


# -- scoring ----------------------------------------------------------------------------------------------------


def lexical(claim: set[str], passage: list[PassageSentence]) -> np.ndarray:
    """(len(passage),) share of `claim`'s words found in each passage sentence or its neighbours (same ref)."""
    out = np.zeros(len(passage), dtype=np.float32)
    if not claim:
        return out
    for j, p in enumerate(passage):
        words = set(p.words)
        for k in (j - 1, j + 1):
            if 0 <= k < len(passage) and passage[k].ref == p.ref:
                words |= passage[k].words
        out[j] = len(claim & words) / len(claim)
    return out


def score_matrix(sim: np.ndarray, claims: list[set[str]], passage: list[PassageSentence], weight: float):
    lex = np.stack([lexical(c, passage) for c in claims]) if claims else np.zeros((0, len(passage)))
    return weight * sim + (1.0 - weight) * lex, lex


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
    vecs = turn.embed_texts([s.plain for s in sentences] + [p.text for p in plist])
    sim = vecs[: len(sentences)] @ vecs[len(sentences) :].T
    scores, lex = score_matrix(sim, [content_words(s.plain) for s in sentences], plist, t.sim_weight)
    known = {d["ref"] for d in documents if d.get("ref")}
    refs_of = np.array([p.ref for p in plist])
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
        entries.append(entry)
    for a, b, new in sorted(edits, reverse=True):
        reply = reply[:a] + new + reply[b:]
    # Offsets moved with the edits: find each sentence again in the corrected reply.
    if edits:
        _reanchor(reply, entries)
    return reply, _summary(entries)


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
