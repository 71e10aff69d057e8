"""The message catalogue and language detection (rag_worker/i18n)."""

from __future__ import annotations

import string

import pytest

from rag_worker.i18n import NAMES, choose, detect, message
from rag_worker.i18n.messages import CATALOGUE, FALLBACK
from rag_worker.pipeline.prompts import DEFAULTS

REQUIRED = ("en", "fr", "de", "es")


def fields(text: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(text) if name}


@pytest.mark.parametrize("language", REQUIRED)
def test_every_language_has_every_key_with_the_same_placeholders(language):
    english = CATALOGUE[FALLBACK]
    texts = CATALOGUE[language]
    assert set(texts) == set(english), f"{language} lacks {set(english) - set(texts)}"
    for key, text in english.items():
        assert text.strip() and fields(texts[key]) == fields(text), (language, key)
        if language != FALLBACK:
            assert texts[key] != text, f"{language}.{key} is not translated"


def test_another_language_falls_back_to_english_and_defaults_show_the_english():
    assert message("abstain", "it") == CATALOGUE["en"]["abstain"] == DEFAULTS["abstain"]
    assert message("quote_from", "fr", name="a.md") == "Extrait de a.md :"


def test_short_questions_are_detected():
    assert detect("Combien de jours de congé ai-je ?") == "fr"
    assert detect("Wie viele Urlaubstage habe ich?") == "de"
    assert detect("¿Cuántos días de vacaciones tengo?") == "es"
    assert detect("How many vacation days do I get?") == "en"
    assert detect("휴가는 며칠입니까?") == "ko"
    assert detect("ok?") is None and detect("") is None and detect(None) is None


def test_the_hint_languages_are_those_detection_chooses_among():
    from contract.languages import HINT_LANGUAGES, language_hint

    assert set(HINT_LANGUAGES) == set(NAMES)
    assert language_hint("fr-CA") == "fr" and language_hint("DE") == "de"
    for bad in ("xx", "fr_FR", "", "f"):
        with pytest.raises(ValueError):
            language_hint(bad)


def test_the_hint_decides_only_what_detection_is_unsure_of():
    assert choose("merci ?", "fr") == ("fr", "hinted")
    assert choose("ok?", "fr") == ("fr", "hinted")
    assert choose("Wie hoch ist der Eiffelturm in Paris?", "fr") == ("de", "detected")
    assert choose("Combien de jours de congé ai-je ?", "en") == ("fr", "detected")
    assert choose("ok?") == (None, "fallback")
