"""The full-text index's tokenizer per index language (`language` when the index is created; its marker records it).

Verified on lancedb 0.40 (tests/unit/test_store_languages.py):
- `FTS(language=..., stem=True)` stems with that language's Snowball stemmer and drops its stop words, at index
  and at query time (`MatchQuery` tokenizes with the index's own settings): with French, "cheval" finds
  "chevaux" and "pomme" finds "pommes"; with the English stemmer neither does;
- Chinese, Japanese and Korean are written without spaces between words (Korean puts particles on the word:
  "김치찌개를"), so the simple tokenizer makes a whole run one token and a query word never matches it. The
  `ngram` tokenizer with 2-grams indexes every pair of characters (the usual CJK bigram indexing), so a query's
  words match wherever they appear; stemming and stop words do not apply there.
"""

from __future__ import annotations

from ..errors import BadRequest
from .rows import FTS_CONFIG

# ISO 639-1 code -> the language name LanceDB's stemmer takes.
STEMMED = {
    "ar": "Arabic",
    "da": "Danish",
    "de": "German",
    "el": "Greek",
    "en": "English",
    "es": "Spanish",
    "fi": "Finnish",
    "fr": "French",
    "hu": "Hungarian",
    "it": "Italian",
    "nl": "Dutch",
    "no": "Norwegian",
    "pt": "Portuguese",
    "ro": "Romanian",
    "ru": "Russian",
    "sv": "Swedish",
    "ta": "Tamil",
    "tr": "Turkish",
}
CJK = ("ja", "ko", "zh")
LANGUAGES = tuple(sorted([*STEMMED, *CJK]))
DEFAULT_LANGUAGE = "en"
NGRAM_CONFIG = {
    "base_tokenizer": "ngram",
    "ngram_min_length": 2,
    "ngram_max_length": 2,
    "prefix_only": False,
    "stem": False,
    "remove_stop_words": False,
    "lower_case": True,
    "ascii_folding": False,
    "max_token_length": None,
}


def check_language(language) -> str:
    """An index language code (None and "" mean English, the default); a 400 listing the valid ones otherwise."""
    if language is None or language == "":
        return DEFAULT_LANGUAGE
    code = language.strip().lower() if isinstance(language, str) else None
    if code not in LANGUAGES:
        raise BadRequest(
            f"unknown language {language!r}: use one of {', '.join(LANGUAGES)}",
            code="bad_language",
            field="language",
        )
    return code


def fts_config(language: str | None) -> dict:
    """The `lancedb.index.FTS` arguments for an index in `language` (a table without one is English)."""
    code = check_language(language)
    if code in CJK:
        return dict(NGRAM_CONFIG)
    return {**FTS_CONFIG, "language": STEMMED[code]}
