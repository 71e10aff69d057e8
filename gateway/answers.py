"""One turn's answer on the gateway's side: stored whole on its assistant message, served as it was stored.

The worker's `done` is read once into `contract.answer.Answer` (gateway/worker_answer.py). A finished turn keeps
it whole in `Message.answer`, exactly as the worker sent it (fields it left out stay out), so a reloaded chat, the
JSON turn and a turn rejoined from another replica all give back the same answer, question, history and flags
included. The message's older fields (`documents`, `citations`, `rewritten`, `timings`, `details`) are derived
from it here for the clients that read them.

Nothing here imports the database models at run time: db.py's migration builds answers for old rows with
`from_columns`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from contract.answer import Answer, Citation, Document, Grounding

if TYPE_CHECKING:
    from .db import Message

log = logging.getLogger("gateway.answers")


def stored_json(answer: Answer) -> dict:
    """The answer as it is stored and served: what the worker sent, typed, without defaults added."""
    return answer.model_dump(mode="json", exclude_unset=True)


def stored_values(data: dict, answer: Answer, steps: list[dict]) -> dict[str, Any]:
    """`store`'s columns as values for one UPDATE of the assistant message (`data`: `stored_json(answer)`)."""
    return {
        "answer": data,
        "content": answer.reply,
        "documents": data["documents"],
        "route": answer.route,
        "steps": steps,
        "status": "complete",
        "error": None,
        "details": {},
    }


def carries_documents(answer: dict) -> bool:
    """A direct turn (small talk) fetched nothing: the documents in hand stay for the next follow-up."""
    return (
        answer["route"] != "direct" or bool(answer.get("fetched_new_documents")) or bool(answer["documents"])
    )


def done_event(msg: Message) -> dict | None:
    """The `done` of a turn read back from the database: the stored answer itself."""
    return msg.answer


def message_fields(msg: Message) -> dict[str, Any]:
    """The answer part of a message's JSON: `answer`, and the older fields derived from it. A message without an
    answer (running, interrupted, failed) carries what it had so far."""
    answer = msg.answer
    if answer is None:
        return {
            "answer": None,
            "documents": msg.documents,
            "citations": [],
            "rewritten": None,
            "timings": {},
            "details": msg.details,
        }
    return {
        "answer": answer,
        "documents": answer["documents"],
        "citations": answer.get("citations", []),
        "rewritten": answer.get("rewritten"),
        "timings": answer.get("timings", {}),
        "details": {
            "model": answer.get("model"),
            "abstained": answer.get("abstained", False),
            "fetched_new_documents": answer.get("fetched_new_documents", False),
            "grounding": answer.get("grounding"),
        },
    }


def _valid(model: type[BaseModel], items: Any) -> list[dict]:
    """The items that fit the model, as they were (an old row's odd item is left out, not the whole answer)."""
    kept = []
    for item in items if isinstance(items, list) else []:
        try:
            model.model_validate(item)
        except ValidationError:
            continue
        kept.append(item)
    return kept


def from_columns(row: dict[str, Any], question: str, history: list[dict]) -> dict | None:
    """The answer of a message stored before answers were kept whole (schema version 4), rebuilt from its
    columns: the question is the user message before it, the history the chat's finished turns up to it. The
    worker's flags and llm_backend were not kept then and stay out. None if it cannot be made to fit."""
    details = row.get("details") if isinstance(row.get("details"), dict) else {}
    grounding = details.get("grounding")
    timings = row.get("timings") if isinstance(row.get("timings"), dict) else {}
    data: dict[str, Any] = {
        "reply": row.get("content") or "",
        "question": question,
        "rewritten": row.get("rewritten") if isinstance(row.get("rewritten"), str) else None,
        "history": history,
        "documents": _valid(Document, row.get("documents")),
        "fetched_new_documents": bool(details.get("fetched_new_documents")),
        "route": row.get("route") if row.get("route") in ("rag", "direct", "sql") else "rag",
        "citations": _valid(Citation, row.get("citations")),
        "abstained": bool(details.get("abstained")),
        "model": details.get("model") if isinstance(details.get("model"), str) else "",
        "timings": {k: v for k, v in timings.items() if isinstance(v, int) and not isinstance(v, bool)},
        "grounding": grounding if _valid(Grounding, [grounding]) else None,
    }
    try:
        return stored_json(Answer.model_validate(data))
    except ValidationError as exc:
        log.warning("message %s: its answer could not be rebuilt (%s)", row.get("id"), exc.errors()[0]["msg"])
        return None
