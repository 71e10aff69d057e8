"""What both services accept as text at their door: Unicode scalar values only, and file names free of the
bidirectional controls that make a name display as something else.

- A JSON string may carry a lone surrogate (`"\\udfff"`): valid JSON, but no text; it cannot be encoded as
  UTF-8, so it would fail later (in the database, the model call) as a 500. `lone_surrogate_at` finds it first.
- `invoice\\u202efdp.txt` shows as `invoicetxt.pdf`: the right-to-left override (and the other embedding,
  isolate and mark characters) spoofs an extension, so `bidi_control_in` refuses them in file names.
"""

from __future__ import annotations

import re
from typing import Any

# U+202A..U+202E (embeddings, overrides), U+2066..U+2069 (isolates), U+200E/U+200F (LRM/RLM), U+061C (ALM).
BIDI_CONTROLS = re.compile("[\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def bidi_control_in(name: str) -> str | None:
    """The first bidirectional control character of `name` as `U+202E`, or None."""
    m = BIDI_CONTROLS.search(name)
    return f"U+{ord(m.group()):04X}" if m else None


def has_lone_surrogate(text: str) -> bool:
    return _SURROGATE.search(text) is not None


def lone_surrogate_at(value: Any) -> str | None:
    """Where in a parsed JSON value (keys included) a string holds a lone surrogate (`options.prompts.system`,
    `index_ids[2]`; `body` for the value itself), or None when every string is text. Iterative: a body nested
    as deep as the parser allows is walked without recursion."""
    todo: list[tuple[str, Any]] = [("", value)]
    while todo:
        path, item = todo.pop()
        if isinstance(item, str):
            if has_lone_surrogate(item):
                return path or "body"
        elif isinstance(item, dict):
            for key, inner in item.items():
                here = f"{path}.{_shown(key)}" if path else _shown(key)
                if has_lone_surrogate(str(key)):
                    return here
                todo.append((here, inner))
        elif isinstance(item, list):
            todo.extend((f"{path}[{i}]", inner) for i, inner in enumerate(item))
    return None


def _shown(key: object) -> str:
    """A key as an error message can name it: surrogates replaced, at most 80 characters."""
    return _SURROGATE.sub("?", str(key))[:80]


def surrogate_refusal(where: str) -> str:
    return f"{where} is not valid text: it holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape)"


def text_problem_in_filename(name: str) -> str | None:
    """Why `name` cannot be a file's display name as text (a bidirectional control, a lone surrogate), or None;
    both services' file-name checks ask this."""
    if has_lone_surrogate(name):
        return "the file name is not valid text (it holds a lone UTF-16 surrogate)"
    control = bidi_control_in(name)
    if control:
        return (
            f"the file name contains the bidirectional control {control}, which makes a name display as another "
            "(a spoofed extension): rename the file without it"
        )
    return None
