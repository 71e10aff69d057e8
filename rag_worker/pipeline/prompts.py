"""Default prompts. Each can be replaced per request through `options.prompts[<name>]`."""

from __future__ import annotations

from ..i18n import language_name
from ..i18n.messages import CATALOGUE, FALLBACK, message

DEFAULTS: dict[str, str] = {
    "system": (
        "You are a careful assistant that answers questions from the user's documents. "
        "Use only the numbered sources you are given. After each statement, cite the source it comes from as "
        "[S1], [S2], ... If the sources do not contain the answer, say so plainly instead of guessing. "
        "Answer in the language of the question, concisely, in markdown."
    ),
    "direct": (
        "You are a helpful, concise assistant in a document chat application. Answer in markdown. "
        "If the user asks about facts you are unsure of, say so."
    ),
    "sources": "Sources for the user's latest question (cite them as [S1], [S2], ...):",
    "rewrite": (
        "Rewrite the user's latest question as one standalone search query that can be understood without the "
        "conversation. Resolve pronouns and references using the conversation. Reply with the rewritten "
        "question only."
    ),
    "fetch_check": (
        "The user asked a follow-up question. Can it be answered from the sources already retrieved (listed "
        "below by their first words), or does it need a new search? Answer YES if a new search is needed, NO if "
        "the sources already retrieved are enough. Answer YES or NO."
    ),
    "triage": (
        "Decide whether answering the question needs facts from the user's document collection described "
        "below, or whether it is general conversation or a task that needs no documents (greetings, writing, "
        "arithmetic, translation). Answer YES if the documents are needed, NO otherwise. Answer YES or NO."
    ),
    "relevance": ("Do the passages below contain information that answers the question? Answer YES or NO."),
    "retry": (
        "A search for the question below found nothing relevant. Write a better search query for the same "
        "information: other words, synonyms, the key technical terms. Reply with the query only."
    ),
    "hyde": (
        "Write a short passage (3 sentences) that would answer the question, as it might appear in a "
        "reference document. Reply with the passage only."
    ),
    "title": "Write a title of at most six words for a chat that starts with this question. Reply with the title only.",
    "sql": (
        "You write one DuckDB SQL SELECT statement that answers the user's question from the tables below. "
        "Use only these tables and columns. Reply with the SQL only: no explanation, no code fence. "
        "If the tables cannot answer the question, reply NONE."
    ),
    # Texts the chat shows as they are: their English here, each language's in rag_worker/i18n/messages.py.
    "abstain": CATALOGUE[FALLBACK]["abstain"],
    "ungrounded": CATALOGUE[FALLBACK]["ungrounded"],
    "extract_caveat": CATALOGUE[FALLBACK]["extract_caveat"],
}
# Added to the system prompt when the latest message's language is detected (rag_worker/i18n).
ANSWER_IN = "Answer in {language}, the language of the user's latest message."


def prompt(name: str, overrides: dict[str, str] | None) -> str:
    if overrides and overrides.get(name):
        return overrides[name]
    return DEFAULTS[name]


def text_in(name: str, language: str | None) -> str:
    """The default prompt or fixed text `name` for a turn in `language`: a fixed text in that language, the
    system prompt told which language to answer in."""
    if name in CATALOGUE[FALLBACK]:
        return message(name, language)
    text = DEFAULTS[name]
    if name == "system" and language_name(language):
        text = f"{text} {ANSWER_IN.format(language=language_name(language))}"
    return text
