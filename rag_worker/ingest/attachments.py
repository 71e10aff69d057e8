"""E-mail attachments indexed as their own documents, in the message's dataset, linking back to it.

An attachment `budget.xlsx` of `memo.eml` becomes the document `memo.eml.budget.xlsx` (so it sorts beside its
message, keeps its own type, and the name says where it came from); its chunks carry `attached_to: memo.eml`.
Attachments of a type the worker does not read are only named in the message's text. An attachment that fails
is reported and never fails its message. Attachments of attachments are not unpacked (one level, no recursion).
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ApiError
from ..names import check_filename
from .formats import is_supported

if TYPE_CHECKING:  # pragma: no cover
    from ..services import Services

log = logging.getLogger(__name__)

MAIL_SUFFIXES = (".eml", ".msg")


def attachment_name(message: str, attachment: str) -> str | None:
    """The document name of one attachment, or None when it has no usable name or type."""
    base = Path(attachment.replace("\\", "/")).name.strip()
    if not base or not is_supported(base) or base.lower().endswith(MAIL_SUFFIXES):
        return None
    try:
        return check_filename(f"{message}.{base}"[-255:])
    except ApiError:
        return None


def belongs_to_a_message(filename: str, messages: set[str]) -> bool:
    """True when `filename` is an attachment document of one of these message names."""
    return any(filename.startswith(f"{m}.") for m in messages if m.lower().endswith(MAIL_SUFFIXES))


def attachments_to_index(prepared) -> list[tuple[str, bytes]]:
    """A prepared message's attachments that become documents: [(document name, bytes)], first of each name."""
    out: list[tuple[str, bytes]] = []
    seen: set[str] = set()
    for raw_name, data in prepared.attachments or []:
        name = attachment_name(prepared.filename, raw_name)
        if name is None or name in seen:
            continue
        seen.add(name)
        out.append((name, data))
    return out


def prepare_attachment(services: Services, index: str, prepared, name: str, path: Path, keep_at=None):
    """Convert and chunk one attachment (its bytes at `path`) as the document `name`, linked to its message:
    a Prepared (or the IngestResult of a no-op when these bytes are already indexed under the name)."""
    from . import pipeline

    steps = pipeline.prepare_steps(services, index, prepared.dataset, path, name, keep_at=keep_at)
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            result = stop.value
            break
    if isinstance(result, pipeline.Prepared):
        result.metadata = {**result.metadata, "attached_to": prepared.filename}
        result.attachments = []  # one level: attachments of attachments are not unpacked
    return result


def ingest_attachments(services: Services, index: str, prepared) -> list[dict]:
    """Index each attachment of a written message; one {"filename", "chunks"} or {"filename", "error"} each."""
    from . import pipeline

    outcomes: list[dict] = []
    for name, data in attachments_to_index(prepared):
        keep_at = None
        if prepared.keep_at is not None:
            keep_at = pipeline.uploads_path(services, index, prepared.dataset, name)
        with tempfile.TemporaryDirectory(prefix="rag-attachment-") as tmp:
            path = Path(tmp) / "attachment"
            path.write_bytes(data)
            try:
                result = prepare_attachment(services, index, prepared, name, path, keep_at)
                if isinstance(result, pipeline.Prepared):
                    vectors = services.embedder.embed_documents([c.embed_text for c in result.chunks])
                    result = pipeline.write_prepared(services, index, result, vectors)
                outcomes.append({"filename": name, "chunks": result.chunks})
            except ApiError as err:
                outcomes.append({"filename": name, "error": err.message, "code": err.code})
            except Exception as exc:  # one attachment never fails its message
                log.exception("indexing attachment %s failed", name)
                outcomes.append(
                    {"filename": name, "error": f"{type(exc).__name__}: {exc}"[:300], "code": "internal"}
                )
    return outcomes
