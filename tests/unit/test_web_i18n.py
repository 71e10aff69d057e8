"""The web's message catalogues (web/js/i18n/*.js): every label the code looks up with t("…") is in the English
catalogue, every English key has a French text, no catalogue holds a key the code no longer uses, and each
text keeps its {placeholders}. Keys are the English texts themselves (see web/js/i18n.js)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

WEB = Path(__file__).resolve().parents[2] / "web"
CATALOGUES = WEB / "js" / "i18n"
# t("…") with a literal first argument; a t( call on anything else (a variable) is refused below, so every key
# the web can show is one this scan sees.
LOOKUP = re.compile(r"(?<![\w.$])t\(\s*(\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|`[^`]*`|[^)\s,]+)")
PLACEHOLDER = re.compile(r"\{(\w+)\}")


def catalogue(locale: str) -> dict:
    """A catalogue module is `export default {…};` whose object is strict JSON (so this test can read it)."""
    text = (CATALOGUES / f"{locale}.js").read_text(encoding="utf-8")
    body = text[text.index("{", text.index("export default")) : text.rindex("}") + 1]
    return json.loads(body)


def sources() -> list[Path]:
    return sorted(p for p in (WEB / "js").rglob("*.js") if CATALOGUES not in p.parents)


def used_keys() -> dict[str, str]:
    """{key: where} for every t("…") in the web's code (index.html has no labels of its own besides these)."""
    keys: dict[str, str] = {}
    for path in sources():
        text = path.read_text(encoding="utf-8")
        for match in LOOKUP.finditer(text):
            arg = match.group(1)
            line = text.count("\n", 0, match.start()) + 1
            where = f"{path.relative_to(WEB)}:{line}"
            if path.name == "i18n.js" and arg in ("key", "key,"):
                continue  # t() itself
            assert arg[0] in "\"'", (
                f"{where}: t() is called on {arg!r}, not a literal key the catalogues can be checked for"
            )
            if arg[0] == "'":
                arg = '"' + arg[1:-1].replace('"', '\\"') + '"'
            keys.setdefault(json.loads(arg), where)
    return keys


def texts(value) -> list[str]:
    return list(value.values()) if isinstance(value, dict) else [value]


def test_every_key_the_code_uses_is_in_the_english_catalogue():
    en = catalogue("en")
    missing = {k: w for k, w in used_keys().items() if k not in en}
    assert not missing, f"keys used in the code but in no catalogue: {missing}"


def test_the_catalogues_hold_no_key_the_code_does_not_use():
    used = used_keys()
    for locale in ("en", "fr"):
        stale = sorted(set(catalogue(locale)) - set(used))
        assert not stale, f"{locale}.js holds keys nothing uses: {stale}"


@pytest.mark.parametrize("locale", ["fr"])
def test_every_english_key_has_a_translation(locale):
    en, other = catalogue("en"), catalogue(locale)
    missing = sorted(set(en) - set(other))
    assert not missing, f"{locale}.js lacks: {missing}"
    empty = sorted(k for k, v in other.items() if not all(s.strip() for s in texts(v)))
    assert not empty, f"{locale}.js has empty texts for: {empty}"


@pytest.mark.parametrize("locale", ["en", "fr"])
def test_translations_keep_the_placeholders(locale):
    for key, value in catalogue(locale).items():
        wanted = set(PLACEHOLDER.findall(key))
        for text in texts(value):
            assert set(PLACEHOLDER.findall(text)) == wanted, f"{locale}.js: {key!r} → {text!r}"
        if isinstance(value, dict):
            assert "other" in value, f"{locale}.js: the plural forms of {key!r} lack 'other'"


def test_the_scan_sees_every_lookup():
    """Guards the scan itself: a file with labels imports t, and the keys found are many (not a broken regex)."""
    keys = used_keys()
    assert len(keys) > 300
    assert "New chat" in keys and "Sign in" in keys


def test_the_create_form_offers_what_the_gateway_accepts():
    """web/js/languages.js lists the embedders and full-text languages of contract/languages.py, no more."""
    from contract.languages import DEFAULT_EMBEDDER, DEFAULT_INDEX_LANGUAGE, EMBEDDERS, INDEX_LANGUAGES

    text = (WEB / "js" / "languages.js").read_text(encoding="utf-8")

    def listed(name: str) -> list[str]:
        body = re.search(rf"export const {name} = \[(.*?)\];", text, re.S)
        assert body, name
        return re.findall(r'"([^"]+)"', body.group(1))

    assert listed("EMBEDDERS") == list(EMBEDDERS)
    assert listed("INDEX_LANGUAGES") == list(INDEX_LANGUAGES)
    assert f'DEFAULT_EMBEDDER = "{DEFAULT_EMBEDDER}"' in text
    assert f'DEFAULT_INDEX_LANGUAGE = "{DEFAULT_INDEX_LANGUAGE}"' in text


def test_the_error_codes_the_web_translates_are_ones_the_services_send():
    """web/js/api.js's KNOWN_ERRORS: a code the gateway (or the worker, whose refusals it passes on) never sends
    would be a translation no user can see, and a renamed code would silently fall back to the English text."""
    api = (WEB / "js" / "api.js").read_text(encoding="utf-8")
    block = api[api.index("const KNOWN_ERRORS = {") : api.index("\n};", api.index("const KNOWN_ERRORS = {"))]
    codes = re.findall(r"^  (\w+): ", block, re.M)
    assert len(codes) >= 10, block
    root = WEB.parent
    sent = "\n".join(
        p.read_text(encoding="utf-8") for d in ("gateway", "rag_worker") for p in (root / d).rglob("*.py")
    )
    for code in codes:
        assert re.search(rf"""code(?:: str)?\s*=\s*["']{code}["']""", sent), f"no service sends code {code!r}"
