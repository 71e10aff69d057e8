"""The user's language: detected from the latest message, told to the model, and used for every fixed text the
chat shows (abstention, the quote fallback's texts, the refusal of an unsupported draft).

`messages.CATALOGUE` holds each text in English, French, German and Spanish (tests/unit/test_i18n.py fails on a
key missing in one); any other language falls back to English. Detection is lingua (lingua-language-detector,
Apache-2.0, offline, its models inside the package), restricted to the languages below: chosen over langdetect
by accuracy on short questions (49/50 against 47/50, docs/benchmarks.md, "Language detection").
"""

from __future__ import annotations

import re
import threading

from .messages import CATALOGUE, FALLBACK, message

__all__ = ["CATALOGUE", "FALLBACK", "NAMES", "choose", "detect", "message"]

# The languages detection chooses among (ISO 639-1), with their English names for the system prompt: those of
# the full-text index (contract.languages) and a few more a user may write in.
NAMES = {
    "ar": "Arabic",
    "cs": "Czech",
    "da": "Danish",
    "de": "German",
    "el": "Greek",
    "en": "English",
    "es": "Spanish",
    "fi": "Finnish",
    "fr": "French",
    "hu": "Hungarian",
    "it": "Italian",
    "ja": "Japanese",
    "ko": "Korean",
    "nl": "Dutch",
    "pl": "Polish",
    "pt": "Portuguese",
    "ro": "Romanian",
    "ru": "Russian",
    "sv": "Swedish",
    "tr": "Turkish",
    "uk": "Ukrainian",
    "zh": "Chinese",
}
MIN_LETTERS = 3  # "ok?" says nothing about a language
# A detection is sure when lingua's confidence in its first language is at least MIN_CONFIDENCE and RATIO times
# that of the second: "Wie hoch ist der Eiffelturm?" (de 0.34, sv 0.11) is; "merci" (it 0.17, es 0.16), "Danke"
# (de 0.30, nl 0.29) and "Jean Dupont" (fr 0.19) are not, and the interface's language (a hint) decides them.
MIN_CONFIDENCE = 0.25
RATIO = 1.3
_LETTER = re.compile(r"[^\W\d_]", re.UNICODE)
_lock = threading.Lock()
_detectors: dict[tuple[str, ...], object] = {}


def _build(among: tuple[str, ...]):
    with _lock:
        detector = _detectors.get(among)
        if detector is None:
            from lingua import IsoCode639_1, LanguageDetectorBuilder

            codes = [getattr(IsoCode639_1, code.upper()) for code in among]
            # Only these languages' models (a few hundred MB for all of NAMES, not the GB of lingua's 75).
            detector = _detectors[among] = LanguageDetectorBuilder.from_iso_codes_639_1(*codes).build()
    return detector


def detect(text: str | None, among: tuple[str, ...] | None = None) -> str | None:
    """The ISO 639-1 code of `text`'s language, one of `among` (default: NAMES); None when it is too short to
    tell, or when `among` holds fewer than two languages (nothing to choose)."""
    if not isinstance(text, str) or len(_LETTER.findall(text)) < MIN_LETTERS:
        return None
    among = tuple(sorted(set(among) & set(NAMES))) if among is not None else tuple(NAMES)
    if len(among) < 2:
        return among[0] if among else None
    found = _build(among).detect_language_of(text[:2000])
    return found.iso_code_639_1.name.lower() if found is not None else None


def choose(text: str | None, hint: str | None = None) -> tuple[str | None, str]:
    """The language a turn answers in, and why: `detected` (the latest message's, surely), `hinted` (the message
    too short or unsure to tell, the hint given: the interface's language), `guessed` (unsure, no hint: lingua's
    best guess, as `detect` gives it) or `fallback` (nothing to go on: None, so English)."""
    best, sure = None, False
    if isinstance(text, str) and len(_LETTER.findall(text)) >= MIN_LETTERS:
        values = _build(tuple(NAMES)).compute_language_confidence_values(text[:2000])
        if values and values[0].value > 0:
            best = values[0].language.iso_code_639_1.name.lower()
            second = values[1].value if len(values) > 1 else 0.0
            sure = values[0].value >= MIN_CONFIDENCE and values[0].value >= RATIO * second
    if best is not None and sure:
        return best, "detected"
    if hint:
        return hint, "hinted"
    if best is not None:
        return best, "guessed"
    return None, "fallback"


def language_name(code: str | None) -> str | None:
    return NAMES.get(code or "")
