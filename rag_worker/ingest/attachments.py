"""E-mail attachments indexed as their own documents, in the message's dataset, linking back to it.

An attachment `budget.xlsx` of `memo.eml` becomes the document `memo.eml.budget.xlsx` (so it sorts beside its
message, keeps its own type, and the name says where it came from); its chunks carry `attached_to: memo.eml`.
A name past 255 bytes loses the end of the attachment's own stem, never the `memo.eml.` prefix (by which the
attachment is found, and deleted with its message) nor its extension.
Attachments of a type the worker does not read are only named in the message's text. An attachment that fails
is reported and never fails its message. Attachments of attachments are not unpacked (one level, no recursion).
A message's attachments past MAX_ATTACHMENTS_PER_MESSAGE (in the message's order) are not indexed: the message
is, and each skipped one is reported with the code `too_many_attachments` (so one upload's work stays bounded).

This module holds the naming rules; preparing and writing an attachment is a document's work
(`document.prepare_attachment`, `document.ingest_attachments`).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ApiError
from ..names import check_filename
from .formats import is_supported

MAIL_SUFFIXES = (".eml", ".msg")
MAX_NAME_BYTES = 255  # a document name's limit (names.check_filename)
SKIPPED = "too_many_attachments"  # the code reported for each attachment past the limit


def attachment_name(message: str, attachment: str) -> str | None:
    """The document name of one attachment, or None when it has no usable name or type."""
    base = Path(attachment.replace("\\", "/")).name.strip()
    if not base or not is_supported(base) or base.lower().endswith(MAIL_SUFFIXES):
        return None
    try:
        return check_filename(_fit(f"{message}.", base))
    except ApiError:
        return None


def _fit(prefix: str, base: str, limit: int = MAX_NAME_BYTES) -> str:
    """`prefix + base` within `limit` UTF-8 bytes: the attachment's own stem is shortened, never the message's
    prefix (which links it to its message) nor its extension (which says its type)."""
    name = prefix + base
    if len(name.encode("utf-8")) <= limit:
        return name
    stem, suffix = Path(base).stem, Path(base).suffix
    room = limit - len((prefix + suffix).encode("utf-8"))
    if room < 1:
        return name  # too long whatever is cut: check_filename refuses it
    short = stem.encode("utf-8")[:room].decode("utf-8", "ignore").rstrip()
    return f"{prefix}{short or '_'}{suffix}"


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


def split_at(named: list[tuple[str, bytes]], limit: int) -> tuple[list, list]:
    """(the attachments to index, those past `limit`, skipped)."""
    return named[:limit], named[limit:]


def skipped_reason(limit: int) -> str:
    return (
        f"not indexed: the message has more attachments than the limit of {limit:,} per message "
        "(MAX_ATTACHMENTS_PER_MESSAGE); upload the file on its own"
    )
