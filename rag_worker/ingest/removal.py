"""Taking documents out of an index: one file (with its e-mail attachments), or the whole index."""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING

from .. import tables
from ..names import check_filename, check_name
from ..runtime import offload
from . import attachments, overviews
from .document import uploads_path

if TYPE_CHECKING:  # pragma: no cover
    from ..services import Services


def delete_document(services: Services, index: str, dataset: str, filename: str) -> int:
    """Remove a file's rows, its overview and its stored original; the count of chunks removed."""
    check_name(dataset, "dataset")
    filename = check_filename(filename)
    with services.index_lock(index):
        count = services.store.delete_document(index, dataset=dataset, filename=filename)
        offload(overviews.remove_overview, services.settings, index, dataset=dataset, filename=filename)
        offload(tables.remove_tables, services.settings, index, dataset, filename)
        original = uploads_path(services, index, dataset, filename)
        original.unlink(missing_ok=True)
    # A message's attachment documents go with it.
    if filename.lower().endswith(attachments.MAIL_SUFFIXES) and services.store.exists(index):
        for doc in services.store.list_documents(index):
            if doc["dataset"] == dataset and attachments.belongs_to_a_message(doc["filename"], {filename}):
                count += delete_document(services, index, dataset, doc["filename"])
    return count


def drop_index(services: Services, index: str, *, remove_uploads: bool = False) -> bool:
    """Drop the table and its overviews (and, when asked, the uploaded originals). True when a table existed."""
    check_name(index, "index")
    with services.index_lock(index):
        existed = services.store.drop(index)
        overviews.drop_overviews(services.settings, index)
        tables.drop_tables(services.settings, index)
        folder = services.settings.uploads_dir / index
        if remove_uploads and folder.is_dir():
            shutil.rmtree(folder)
    return existed
