"""Per-document overviews: a few sentences saying what each document is about, for the layer-2 triage.

Stored as one JSON line per document in `index_store/overviews/<index>.jsonl`. The overview is written by the
utility model when one is worth the wait (Ollama; or always with OVERVIEW_SUMMARIES=on) and otherwise, or when
the model fails, built without a model: the title plus the document's leading sentences.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ..names import check_table

if TYPE_CHECKING:  # pragma: no cover
    from ..services import Services
    from ..settings import Settings
    from .chunk import Chunk

log = logging.getLogger(__name__)

FALLBACK_CHARS = 400
LLM_INPUT_CHARS = 3000
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_TABLE_LINE = re.compile(r"^\s*\|.*\|\s*$")

SUMMARY_PROMPT = (
    "Summarise what the following document is about in two or three plain sentences. Name its subject, its kind "
    "(report, manual, table, letter...) and the main topics it covers. Answer with the summary only."
)


def overviews_path(settings: Settings, index: str) -> Path:
    return settings.overviews_dir / f"{check_table(index)}.jsonl"


def fallback_overview(title: str, chunks: list[Chunk], max_chars: int = FALLBACK_CHARS) -> str:
    """Title plus the leading sentences of the first chunks (tables skipped), about `max_chars` long."""
    lines = []
    for chunk in chunks[:4]:
        lines.extend(line for line in chunk.text.splitlines() if line.strip() and not _TABLE_LINE.match(line))
    body = " ".join(" ".join(lines).split())
    if body.startswith(title):
        body = body[len(title) :].lstrip(" :.-")
    lead = ""
    for sentence in _SENTENCE_END.split(body):
        if lead and len(lead) + len(sentence) + 1 > max_chars:
            break
        lead = f"{lead} {sentence}".strip()
    if len(lead) > max_chars:
        lead = lead[:max_chars].rsplit(" ", 1)[0] + "…"
    return f"{title}: {lead}" if lead else title


def wants_llm_summary(services: Services) -> bool:
    mode = services.settings.overview_summaries
    if mode == "off":
        return False
    if mode == "on":
        return True
    # auto: only when the resolved backend is a model server; resolving never loads the embedded model.
    if services.settings.llm_backend == "local":
        return False
    try:
        return services.llm.resolve().backend.backend in ("ollama", "openai")
    except Exception:  # an unreachable or misconfigured LLM must not fail an upload
        return False


def llm_overview(services: Services, title: str, chunks: list[Chunk]) -> str | None:
    """The utility model's summary of the first chunks, or None when no model answers usefully."""
    from ..llm import strip_think

    excerpt = ""
    for chunk in chunks:
        if len(excerpt) + len(chunk.text) > LLM_INPUT_CHARS:
            break
        excerpt += chunk.text + "\n\n"
    excerpt = excerpt or chunks[0].text[:LLM_INPUT_CHARS]
    try:
        resolved = services.llm.resolve()
        reply = resolved.backend.chat(
            [
                {"role": "system", "content": SUMMARY_PROMPT},
                {"role": "user", "content": f"Title: {title}\n\n{excerpt}"},
            ],
            model=resolved.utility_model,
            max_tokens=160,
            temperature=0.0,
        )
    except Exception as exc:
        log.info("overview summary failed, using the model-free overview: %r", exc)
        return None
    summary = " ".join(strip_think(reply or "").split())
    return summary or None


def build_overview(services: Services, title: str, chunks: list[Chunk]) -> tuple[str, str]:
    """(overview text, source) where source is "llm" or "fallback"."""
    if chunks and wants_llm_summary(services):
        summary = llm_overview(services, title, chunks)
        if summary:
            return summary, "llm"
    return fallback_overview(title, chunks), "fallback"


def load_overviews(settings: Settings, index: str) -> list[dict]:
    """Every document's overview in an index: [{"dataset", "filename", "document_id", "title", "overview",
    "source", "chunks", "indexed_at"}]; empty when the index has none."""
    path = overviews_path(settings, index)
    if not path.exists():
        return []
    entries = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a torn line (crash mid-write of an older version) is skipped, not fatal
        if isinstance(entry, dict):
            entries.append(entry)
    return entries


def upsert_overview(settings: Settings, index: str, entry: dict) -> None:
    upsert_overviews(settings, index, [entry])


def upsert_overviews(settings: Settings, index: str, new_entries: list[dict]) -> None:
    """Upsert many documents' overviews with one rewrite of the file (bulk indexing)."""
    if not new_entries:
        return
    keys = {(e["dataset"], e["filename"]) for e in new_entries}
    kept = [e for e in load_overviews(settings, index) if (e.get("dataset"), e.get("filename")) not in keys]
    _write(overviews_path(settings, index), kept + list(new_entries))


def remove_overview(settings: Settings, index: str, *, dataset: str, filename: str) -> None:
    path = overviews_path(settings, index)
    if not path.exists():
        return
    entries = load_overviews(settings, index)
    kept = [e for e in entries if (e.get("dataset"), e.get("filename")) != (dataset, filename)]
    if len(kept) != len(entries):
        _write(path, kept)


def drop_overviews(settings: Settings, index: str) -> None:
    overviews_path(settings, index).unlink(missing_ok=True)


def promote_overviews(settings: Settings, index: str, staged: str) -> None:
    """A rebuild's overviews (built under the name of its new table) become the index's, in one replace."""
    source = overviews_path(settings, staged)
    if source.exists():
        os.replace(source, overviews_path(settings, index))
    else:
        drop_overviews(settings, index)


def _write(path: Path, entries: list[dict]) -> None:
    """Whole-file rewrite through a temporary file: a reader sees the old list or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            for entry in entries:
                fh.write(json.dumps(entry, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
