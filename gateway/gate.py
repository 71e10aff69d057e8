"""Layer 1 of routing: a deterministic gate in front of retrieval. It never calls a model.

`force_rag` → RAG; a chat with no linked index → direct; a message that is only smalltalk (at most six words)
or a question about the assistant itself → direct; anything else → RAG (layer 2 in the worker may still answer
directly). Cheap to be wrong toward RAG: the worker's triage catches it; wrong toward direct would hide evidence,
so the direct patterns only match the whole message.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Literal

Route = Literal["rag", "direct"]

MAX_SMALLTALK_WORDS = 6

# Smalltalk phrases (after normalising case, punctuation and held-down letters). A message is smalltalk when it
# is nothing but these, e.g. "ok thanks bye"; one other word ("ok so what is...") makes it a question.
_PHRASE = r"""(?:
    (?:hi|hello|hey|heya|hiya|howdy|yo|greetings|good\ (?:morning|afternoon|evening|day))
        (?:\ (?:there|again|everyone|all|friend|assistant|bot))?
  | (?:thanks|thank\ you|thank\ u|thx|ty|cheers|many\ thanks)(?:\ (?:again|a\ lot|so\ much|very\ much))?
  | ok|okay|k|kk|okey|alright|all\ right|cool|great|nice|perfect|awesome|got\ it|i\ see|understood|sure|fine
  | yes|yeah|yep|no|nope|nah|good|very\ good|sounds\ good|makes\ sense|wow|lol|haha|oh|ah|hmm
  | bye|goodbye|good\ bye|bye\ bye|see\ you|see\ ya|see\ you\ later|later|cya|farewell|take\ care
  | have\ a\ (?:nice|good|great)\ (?:day|one|night|evening|weekend)|good\ night
  | how\ are\ you(?:\ doing)?|how\ is\ it\ going|hows\ it\ going|whats\ up|sup|how\ do\ you\ do
)"""
_SMALLTALK = re.compile(rf"^{_PHRASE}(?:\ {_PHRASE})*$", re.VERBOSE)

# A question about the assistant itself, as the whole message.
_ABOUT_ASSISTANT = re.compile(
    r"""^(?:(?:hi|hello|hey)\ )?(?:
        who\ (?:are|r)\ (?:you|u)
      | what\ (?:are|r)\ (?:you|u)
      | what\ is\ your\ name | whats\ your\ name | what\ should\ i\ call\ you
      | what\ can\ (?:you|u)\ do | what\ do\ you\ do | what\ are\ you\ able\ to\ do | what\ are\ your\ capabilities
      | how\ can\ you\ help(?:\ me)? | what\ can\ you\ help\ (?:me\ )?with | can\ you\ help\ me
      | are\ you\ (?:a\ )?(?:bot|robot|ai|human|an\ ai|a\ human|real)
      | introduce\ yourself | tell\ me\ about\ yourself
      | who\ (?:made|built|created)\ you | which\ model\ are\ you | what\ model\ are\ you
    )$""",
    re.VERBOSE,
)

_STRIP = re.compile(r"[^\w\s]+")
_SPACES = re.compile(r"\s+")
_REPEATS = re.compile(r"(\w)\1{2,}")  # a letter held down: "hellooo" -> "hello", "thxxx" -> "thx"


def normalise(message: str) -> str:
    """Lowercase words without punctuation or emoji: 'Thanks!!' and 'thanks' read the same."""
    text = unicodedata.normalize("NFKC", message).lower().replace("’", "'").replace("'", "")
    text = _STRIP.sub(" ", text)
    text = _REPEATS.sub(r"\1", text)
    return _SPACES.sub(" ", text).strip()


def should_use_rag(message: str, *, force_rag: bool, has_indexes: bool) -> tuple[Route, str]:
    """The layer-1 decision for one user message: (route, reason). Pure, deterministic, no model call."""
    if force_rag:
        return "rag", "force_rag"
    if not has_indexes:
        return "direct", "no_index"
    text = normalise(message)
    if not text:
        return "direct", "smalltalk"
    if len(text.split(" ")) <= MAX_SMALLTALK_WORDS:
        if _SMALLTALK.fullmatch(text):
            return "direct", "smalltalk"
        if _ABOUT_ASSISTANT.fullmatch(text):
            return "direct", "about_assistant"
    return "rag", "default"
