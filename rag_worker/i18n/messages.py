"""Every fixed text the chat shows, per language; English is the fallback for any other language.

A key a request overrides through `options.prompts` (abstain, ungrounded, extract_caveat) uses the override,
whatever the language. Placeholders are `str.format` fields and must be the same in every language.
"""

from __future__ import annotations

FALLBACK = "en"

CATALOGUE: dict[str, dict[str, str]] = {
    "en": {
        "abstain": (
            "I could not find anything in the indexed documents that answers this question, so I won't guess. "
            "Try rephrasing it, widening the dataset selection, or adding documents that cover it."
        ),
        "ungrounded": (
            "I found sources for this question, but the answer I drafted was not supported by them, so I won't "
            "show it. The sources are listed above; try rephrasing the question."
        ),
        "extract_caveat": (
            "The drafted answer was not supported by the sources, so here are the passages that best match the "
            "question instead."
        ),
        "no_quote": "The sources hold no sentence that answers this question.",
        "quote_from": "From {name}:",
        "turn_failed": "The answer failed because of an internal error ({kind}). Please try again.",
    },
    "fr": {
        "abstain": (
            "Je n'ai rien trouvé dans les documents indexés qui réponde à cette question, je préfère donc ne pas "
            "deviner. Reformulez-la, élargissez la sélection de jeux de données ou ajoutez des documents qui la "
            "couvrent."
        ),
        "ungrounded": (
            "J'ai trouvé des sources pour cette question, mais la réponse que j'ai rédigée n'était pas étayée par "
            "elles, je ne l'affiche donc pas. Les sources sont listées ci-dessus ; essayez de reformuler la "
            "question."
        ),
        "extract_caveat": (
            "La réponse rédigée n'était pas étayée par les sources : voici plutôt les passages qui correspondent "
            "le mieux à la question."
        ),
        "no_quote": "Les sources ne contiennent aucune phrase qui réponde à cette question.",
        "quote_from": "Extrait de {name} :",
        "turn_failed": "La réponse a échoué à cause d'une erreur interne ({kind}). Veuillez réessayer.",
    },
    "de": {
        "abstain": (
            "Ich habe in den indexierten Dokumenten nichts gefunden, was diese Frage beantwortet, deshalb rate "
            "ich nicht. Formulieren Sie sie um, erweitern Sie die Auswahl der Datensätze oder fügen Sie "
            "Dokumente hinzu, die sie abdecken."
        ),
        "ungrounded": (
            "Ich habe Quellen zu dieser Frage gefunden, aber meine entworfene Antwort wurde von ihnen nicht "
            "gestützt, deshalb zeige ich sie nicht. Die Quellen stehen oben; formulieren Sie die Frage um."
        ),
        "extract_caveat": (
            "Die entworfene Antwort wurde von den Quellen nicht gestützt, deshalb hier stattdessen die Passagen, "
            "die am besten zur Frage passen."
        ),
        "no_quote": "Die Quellen enthalten keinen Satz, der diese Frage beantwortet.",
        "quote_from": "Aus {name}:",
        "turn_failed": "Die Antwort ist wegen eines internen Fehlers ({kind}) fehlgeschlagen. Bitte erneut versuchen.",
    },
    "es": {
        "abstain": (
            "No encontré nada en los documentos indexados que responda a esta pregunta, así que no voy a "
            "adivinar. Intente reformularla, ampliar la selección de conjuntos de datos o añadir documentos que "
            "la cubran."
        ),
        "ungrounded": (
            "Encontré fuentes para esta pregunta, pero la respuesta que redacté no estaba respaldada por ellas, "
            "así que no la muestro. Las fuentes aparecen arriba; intente reformular la pregunta."
        ),
        "extract_caveat": (
            "La respuesta redactada no estaba respaldada por las fuentes, así que aquí están los pasajes que "
            "mejor responden a la pregunta."
        ),
        "no_quote": "Las fuentes no contienen ninguna frase que responda a esta pregunta.",
        "quote_from": "De {name}:",
        "turn_failed": "La respuesta falló por un error interno ({kind}). Inténtelo de nuevo.",
    },
}


def message(key: str, language: str | None, **fields: str) -> str:
    """The text `key` in `language` (English when the catalogue has not that language), formatted."""
    texts = CATALOGUE.get(language or FALLBACK, CATALOGUE[FALLBACK])
    text = texts.get(key, CATALOGUE[FALLBACK][key])
    return text.format(**fields) if fields else text
