"""E-mail attachments indexed as their own documents, in the message's dataset, linking back to it.

An attachment `budget.xlsx` of `memo.eml` becomes the document `memo.eml.budget.xlsx` (so it sorts beside its
message, keeps its own type, and the name says where it came from); its chunks carry `attached_to: memo.eml`.
Attachments of a type the worker does not read are only named in the message's text. An attachment that fails
is reported and never fails its message. Attachments of attachments are not unpacked (one level, no recursion).

This module holds the naming rules; preparing and writing an attachment is a document's work
(`document.prepare_attachment`, `document.ingest_attachments`).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ApiError
from ..names import check_filename
from .formats import is_supported

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
