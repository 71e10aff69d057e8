"""Layer-2 triage: answer directly, or search the documents?"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from .turn import Turn

log = logging.getLogger("rag_worker.pipeline")


@dataclass
class Triage:
    route: str
    method: str
    reason: str
    similarity: float | None = None


def triage(turn: Turn, query: str) -> Triage:
    forced = turn.options.route
    if forced in ("rag", "direct", "sql"):
        return Triage(forced, "forced", f"options.route = {forced}")
    from .sql import sql_route

    tables = sql_route(turn, query)
    if tables:
        return Triage("sql", "cues", f"a question to compute over {tables}")
    sim = probe(turn, query)
    if sim is not None and sim >= turn.settings.triage_rag_above:
        return Triage("rag", "retrieval_score", f"closest passage similarity {sim:.2f}", sim)
    # Model-free evidence is weak: only the model may send a question past the documents. If it is not asked or
    # can't say, search anyway (a clear "not in your documents" beats an unfounded answer).
    shown = "none" if sim is None else f"{sim:.2f}"
    if not turn.model_judges("triage"):
        below = getattr(turn.llm.backend, "triage_direct_below", None)
        if isinstance(below, float) and sim is not None and sim < below:
            return Triage(
                "direct",
                "retrieval_score",
                f"closest passage similarity {shown}, below {below:.2f}: no question about the documents "
                "(the embedded model is not asked)",
                sim,
            )
        return Triage(
            "rag",
            "retrieval_score",
            f"closest passage similarity {shown}: searching (the embedded model is not asked)",
            sim,
        )
    verdict = ask_model(turn, query)
    if verdict is None:
        return Triage("rag", "fallback", "weak match and no model answer: search", sim)
    if verdict:
        return Triage("rag", "llm", "the model says the documents are needed", sim)
    return Triage("direct", "llm", "the model says no documents are needed", sim)


def probe(turn: Turn, query: str) -> float | None:
    """The similarity of the passage closest to the query (one vector search); None in an empty collection."""
    hits = turn.services.store.search(
        turn.request.indexes,
        query,
        mode="vector",
        datasets=turn.request.datasets or None,
        limit=1,
        vector=turn.embed_query(query),
    )
    return hits[0].vector_score if hits else None


def ask_model(turn: Turn, query: str) -> bool | None:
    """The utility model's YES/NO on whether the question needs the documents (None: it can't say)."""
    body = f"Document collection:\n{collection_summary(turn)}\n\nQuestion: {query}"
    return turn.ask_yes_no(turn.prompt("triage"), body)


def collection_summary(turn: Turn, limit: int = 20) -> str:
    """What the index holds, from the ingestion overviews when there are some, else the file names."""
    lines: list[str] = []
    try:
        from ..ingest.overviews import load_overviews

        for index in turn.request.indexes:
            for ov in load_overviews(turn.settings, index)[:limit]:
                lines.append(f"- {ov.get('filename', '?')}: {str(ov.get('overview', ''))[:200]}")
    except Exception as exc:  # overviews are a hint, never a requirement
        log.debug("no overviews: %s", exc)
    if not lines:
        for index in turn.request.indexes:
            try:
                docs = turn.services.store.list_documents(index)
            except Exception:
                docs = []
            lines.extend(f"- {d['filename']}" for d in docs[:limit])
    return "\n".join(lines[:limit]) or "(no description available)"
