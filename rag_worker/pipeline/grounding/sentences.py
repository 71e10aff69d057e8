"""The sentences of an answer and of a passage, and their content words: what the grounding check scores and
the extractive answer quotes.

An answer sentence ends at . ! or ? (with the citation groups after it) or at a line break that starts a new block
(a list item, a heading, a quote, a table row); code spans never end one, nor do abbreviations ("e.g.") or a
numbered item's "1.". Passage sentences keep their offsets in the passage, so a supporting span can be shown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

from ..citations import GROUP_RE, REF_RE

MIN_CONTENT_WORDS = 2  # "See below." or a lead line like "From README.md:" is not a claim to check
MAX_PASSAGE_SENTENCE_CHARS = 600

_ABBREVIATIONS = {"e.g", "i.e", "etc", "vs", "cf", "al", "fig", "dr", "mr", "mrs", "ms", "no", "approx", "ca"}
_CODE_RE = re.compile(r"`[^`\n]*`")
# A sentence ends at . ! or ? (with closing quotes, brackets or emphasis), then the citation groups that belong to
# it, then whitespace; or at a line break.
# A line break ends one only before a blank line, a list item, a heading, a quote or a table row (hard-wrapped
# markdown keeps its sentences whole).
# A sentence's closing punctuation, with the quotes, brackets or emphasis after it.
_CLOSE = r"[.!?][\"')\]*_]*"
_END_RE = re.compile(
    _CLOSE + r"((?:\s*\[S\d+(?:\s*[,;]\s*S\d+)*\])*)(?=\s)"
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
    words: frozenset[str] | set[str] = field(default_factory=frozenset)


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


_CLOSING_RE = re.compile(_CLOSE + "$")


def citation_point(s: Sentence) -> int:
    """Where a citation for `s` belongs in the answer: before its closing punctuation ("... folders [S1]."),
    else at its end (a list item without a full stop)."""
    m = _CLOSING_RE.search(s.text)
    return s.start + (m.start() if m else len(s.text))


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
    a question in them (what an extractive answer may quote). Their `words` are shared between calls: read
    them, never change them."""
    return [PassageSentence(ref, *cut) for cut in _cut(passage, prose_only)]


@lru_cache(maxsize=1024)  # a passage is a chunk with its neighbours: some 20 MB at most
def _cut(passage: str, prose_only: bool) -> tuple[tuple[str, int, int, frozenset[str]], ...]:
    """(text, start, end, content words) of each sentence: the same passages come back turn after turn (the
    hits of popular questions, their neighbours, the passages a follow-up carries), and splitting them again was
    a few milliseconds of a turn's CPU."""
    out = []
    for s in split_sentences(prose(passage) if prose_only else passage):
        text = s.plain
        if not text:
            continue
        words = frozenset(content_words(text))
        if len(words) < MIN_CONTENT_WORDS:
            continue
        if prose_only and "?" in text:
            continue
        out.append((text[:MAX_PASSAGE_SENTENCE_CHARS], s.start, s.end, words))
    return tuple(out)
