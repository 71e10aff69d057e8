"""The embedders and full-text languages an index may be created with: both services validate against these
(rag_worker/embedders.py and rag_worker/store/fts.py build them; tests/unit/test_languages.py checks they agree)."""

from __future__ import annotations

EMBEDDERS = ("default", "multilingual-e5-small")
# What an index made without a choice gets (and what a table whose marker names neither records).
DEFAULT_EMBEDDER = "default"  # MiniLM (all-MiniLM-L6-v2)
DEFAULT_INDEX_LANGUAGE = "en"
# ISO 639-1 codes: Snowball-stemmed languages, and Chinese, Japanese and Korean (n-gram tokenizer).
INDEX_LANGUAGES = (
    "ar", "da", "de", "el", "en", "es", "fi", "fr", "hu", "it", "ja", "ko", "nl", "no", "pt", "ro", "ru", "sv",
    "ta", "tr", "zh",
)  # fmt: skip

# The languages a turn's `options.language` may name (ISO 639-1): those the worker's detection chooses among
# (rag_worker/i18n.NAMES; tests/unit/test_i18n.py checks they agree). The hint is the interface's language: used
# only when the latest message is too short or too unsure to detect ("ok?", "merci", a name).
HINT_LANGUAGES = (
    "ar", "cs", "da", "de", "el", "en", "es", "fi", "fr", "hu", "it", "ja", "ko", "nl", "pl", "pt", "ro", "ru",
    "sv", "tr", "uk", "zh",
)  # fmt: skip
# A BCP-47 tag (fr, fr-CA, zh-Hant-TW) or an ISO 639-1 code; only its primary subtag is kept. The pattern names
# the known primary subtags (either case: JSON Schema's regexes have no flags), so that what the OpenAPI
# documents call valid is what the services accept.
LANGUAGE_TAG_PATTERN = (
    "^(?:"
    + "|".join("".join(f"[{ch}{ch.upper()}]" for ch in code) for code in HINT_LANGUAGES)
    + ")(-[A-Za-z0-9]{1,8})*$"
)


def language_hint(value: str) -> str:
    """The ISO 639-1 code of a BCP-47 tag (`fr-CA` -> `fr`); a ValueError naming the problem for a malformed tag
    or a language outside HINT_LANGUAGES."""
    import re

    if (
        not isinstance(value, str)
        or len(value) > 35
        or not re.fullmatch(r"[A-Za-z]{2,3}(-[A-Za-z0-9]{1,8})*", value)
    ):
        raise ValueError(f"{str(value)[:40]!r} is not a language tag (ISO 639-1 or BCP-47: fr, fr-CA)")
    code = value.split("-", 1)[0].lower()
    if code not in HINT_LANGUAGES:
        raise ValueError(f"unknown language {code!r}; known: {', '.join(HINT_LANGUAGES)}")
    return code
