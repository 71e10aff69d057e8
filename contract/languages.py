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
