"""One file into an index: convert, chunk, embed, write, overview (and an e-mail's attachments after it).

The slow steps (conversion, chunking, embedding) run before the index's write lock is taken, so concurrent
uploads to one index overlap their work and only queue for the write itself. The write replaces the file's
rows in one commit (`Store.replace_document`): when anything fails before or during it, the index keeps the
rows it had. The original file is moved into place, and the overview written, under the same lock.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from docling_core.types.doc import DocItemLabel

from .. import metrics, tables
from ..errors import ApiError
from ..names import STAGED_RE, check_filename, check_name, check_table
from ..runtime import offload
from . import attachments, overviews
from .chunk import Chunk
from .convert import Converted
from .formats import IngestError, kind_of
from .records import IngestResult, Prepared, Stage, internal_error, run_steps

if TYPE_CHECKING:  # pragma: no cover
    from ..services import Services
    from .isolated import IsolatedConverter

log = logging.getLogger(__name__)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def document_title(converted: Converted, filename: str) -> str:
    for item in converted.document.texts:
        if item.label in (DocItemLabel.TITLE, DocItemLabel.SECTION_HEADER) and item.text.strip():
            return " ".join(item.text.split())[:200]
    return Path(filename).stem


def uploads_path(services: Services, index: str, dataset: str, filename: str) -> Path:
    """Where an uploaded original is kept: uploads_dir/<index>/<dataset>/<filename>."""
    return (
        services.settings.uploads_dir
        / check_name(index, "index")
        / check_name(dataset, "dataset")
        / check_filename(filename)
    )


def served_index(table: str) -> str:
    """The index a table name serves: itself, or the index a rebuild table `<index>.<hex>` is built for."""
    match = STAGED_RE.fullmatch(table)
    return match.group(1) if match else table


def ingest_file(
    services: Services,
    index: str,
    dataset: str,
    path: Path,
    filename: str | None = None,
    *,
    keep_at: Path | None = None,
) -> IngestResult:
    """Index one file under (dataset, filename); see `ingest_steps` for the stages."""
    return run_steps(ingest_steps(services, index, dataset, path, filename, keep_at=keep_at))


def ingest_steps(
    services: Services,
    index: str,
    dataset: str,
    path: Path,
    filename: str | None = None,
    *,
    keep_at: Path | None = None,
) -> Iterator[str]:
    """Yield each stage's name as it starts; return the IngestResult.

    Identical bytes already indexed under the same name: nothing is done. Otherwise the file's rows replace
    whatever the same name had. `keep_at`: move the file there once its rows are written (the upload route keeps
    originals this way, so a failed upload leaves the previous original in place too).
    Raises IngestError for a file that cannot be read, EmbedderMismatch when the index was built with another
    embedding model.
    """
    try:
        prepared = yield from prepare_steps(services, index, dataset, path, filename, keep_at=keep_at)
        if isinstance(prepared, IngestResult):
            metrics.INGEST_FILES.labels(metrics.ingest_format(filename or path.name), "unchanged").inc()
            return prepared
        yield "embedding"
        vectors = services.store.embedder_for(index).embed_documents([c.embed_text for c in prepared.chunks])
        yield "writing"
        return write_prepared(services, index, prepared, vectors)
    except ApiError as err:
        metrics.ingest_failed(filename or path.name, err.code)
        raise


def prepare_steps(
    services: Services,
    index: str,
    dataset: str,
    path: Path,
    filename: str | None = None,
    *,
    keep_at: Path | None = None,
    document_id: str | None = None,
) -> Iterator[str]:
    """Hash, then convert and chunk (yielding those stage names); return a Prepared file, or the IngestResult of
    a no-op when these exact bytes are already indexed under this name.

    `document_id`: the file's hash, when the caller (a folder run) has already compared it with what the index
    holds; the file is then prepared without asking the index again."""
    check_table(index)
    check_name(dataset, "dataset")
    filename = check_filename(filename or path.name)
    kind_of(filename)
    if document_id is None:
        document_id = offload(file_sha256, path)
        unchanged = _unchanged(services, index, dataset, path, filename, document_id, keep_at)
        if unchanged is not None:
            return unchanged

    converter, chunker = services.converter, services.chunker
    yield "converting"
    # In a child process with a memory and a time limit; this greenlet waits, the others go on.
    converted = yield from _converting(converter, path, filename)
    yield "chunking"
    chunks: list[Chunk] = offload(chunker.chunk, converted.document)
    if not chunks:
        raise IngestError("empty", "the file contains no text")
    limit = services.settings.max_chunks_per_document
    if len(chunks) > limit:
        raise IngestError(
            "too_many_chunks",
            f"the file makes {len(chunks):,} chunks, more than the limit of {limit:,} per document "
            "(MAX_CHUNKS_PER_DOCUMENT); split it into smaller files",
        )
    return Prepared(
        dataset,
        filename,
        path,
        document_id,
        converted.kind,
        document_title(converted, filename),
        chunks,
        keep_at,
        sheets=offload(tables.sheets_or_none, path, converted.kind, converter.limits.max_spreadsheet_cells),
        metadata=converted.metadata,
        attachments=converted.attachments,
    )


def _unchanged(
    services: Services,
    index: str,
    dataset: str,
    path: Path,
    filename: str,
    document_id: str,
    keep_at: Path | None,
) -> IngestResult | None:
    """The no-op result when the index already holds these bytes under this name (the original still moved to
    `keep_at`); None when the file needs indexing."""
    store = services.store
    if not store.exists(index):
        return None
    store.check_compatible(index)
    if not store.has_document(index, dataset=dataset, filename=filename, document_id=document_id):
        return None
    if keep_at is not None:
        with services.index_lock(index):
            _keep(path, keep_at)
    chunks = _chunk_count(services, index, dataset, filename)
    return IngestResult(filename, dataset, document_id, chunks, replaced=False, unchanged=True)


def _converting(converter: IsolatedConverter, path: Path, filename: str) -> Iterator[str]:
    """Convert in the child, yielding a Stage "ocr" for each scanned page it reads; return the Converted file."""
    steps = converter.convert_steps(path, filename)
    try:
        while True:
            try:
                event = next(steps)
            except StopIteration as stop:
                return stop.value
            if event.get("stage") == "ocr" and isinstance(event.get("ocr"), dict):
                yield Stage("ocr", ocr=event["ocr"])
    finally:
        steps.close()  # stopped early (the client left): the child's work ends too


def write_prepared(services: Services, index: str, prepared: Prepared, vectors) -> IngestResult:
    """Write one prepared file's rows (replacing the name's old rows in one commit), its original and overview."""
    return write_batch(services, index, [(prepared, vectors)])[0]


def write_batch(
    services: Services, index: str, items: list[tuple[Prepared, object]], *, compact: bool = True
) -> list[IngestResult]:
    """Write several prepared files [(prepared, vectors)] in one commit, replacing their names' old rows: each
    file is in the index whole or not at all, and a crash loses at most this batch. Originals are moved into
    place and the overviews written (one rewrite of the overview file) under the same write lock.
    `compact=False`: the store's housekeeping after the commit is left to the caller (`Store.optimize`)."""
    now = datetime.now(UTC).isoformat(timespec="seconds")
    documents = []
    entries = []
    for prepared, vectors in items:
        rows = document_rows(prepared, vectors, now)
        documents.append((prepared.dataset, prepared.filename, rows))
        entries.append(overview_entry(services, prepared, now))
    with services.index_lock(index):
        counts = services.store.replace_documents(index, documents, compact=compact)
        for (prepared, _), entry in zip(items, entries, strict=True):
            if prepared.keep_at is not None:
                _keep(prepared.path, prepared.keep_at)
            offload(store_tables, services, index, prepared, entry)
        offload(overviews.upsert_overviews, services.settings, index, entries)
    results = [
        IngestResult(prepared.filename, prepared.dataset, prepared.document_id, added, replaced=removed > 0)
        for (prepared, _), (added, removed) in zip(items, counts, strict=True)
    ]
    for (prepared, _), result in zip(items, results, strict=True):
        metrics.ingested(prepared.kind, result.chunks, prepared.keep_at or prepared.path)
        if prepared.attachments:
            result.attachments = ingest_attachments(services, index, prepared)
    return results


def overview_entry(services: Services, prepared: Prepared, now: str) -> dict:
    """A prepared file's line in the index's overviews (both engines write exactly this)."""
    overview, source = overviews.build_overview(services, prepared.title, prepared.chunks)
    return {
        "dataset": prepared.dataset,
        "filename": prepared.filename,
        "document_id": prepared.document_id,
        "title": prepared.title,
        "overview": overview,
        "source": source,
        "chunks": len(prepared.chunks),
        "indexed_at": now,
    }


def store_tables(services: Services, table: str, prepared, entry: dict) -> None:
    """Load a spreadsheet's sheets (`prepared.sheets`) as SQL tables and name them in its overview `entry`.

    SQL tables live under the index's own name, also while a rebuild builds its new table."""
    described = tables.store_sheets(services.settings, served_index(table), prepared)
    if described:
        entry["overview"] = f"{entry['overview']} Tables: {'; '.join(described)}"


def document_rows(prepared: Prepared, vectors, now: str) -> list[dict]:
    """The store rows of one prepared file (the local path and the Ray engine write exactly these)."""
    size = prepared.path.stat().st_size
    return [
        {
            "document_id": prepared.document_id,
            "filename": prepared.filename,
            "dataset": prepared.dataset,
            "page": c.page,
            "chunk_index": c.chunk_index,
            "text": c.text,
            "vector": vectors[i],
            "metadata": {**c.metadata, **prepared.metadata, "kind": prepared.kind, "title": prepared.title},
            "file_bytes": size,
            "indexed_at": now,
        }
        for i, c in enumerate(prepared.chunks)
    ]


def _keep(path: Path, keep_at: Path) -> None:
    if path.resolve() == keep_at.resolve():
        return
    keep_at.parent.mkdir(parents=True, exist_ok=True)
    os.replace(path, keep_at)


def _chunk_count(services: Services, index: str, dataset: str, filename: str) -> int:
    for doc in services.store.list_documents(index):
        if doc["dataset"] == dataset and doc["filename"] == filename:
            return int(doc["chunks"])
    return 0


# -- an e-mail's attachments, each a document of its own (names: attachments.py) --------------------------------


def prepare_attachment(
    services: Services, index: str, prepared: Prepared, name: str, path: Path, keep_at: Path | None = None
) -> Prepared | IngestResult:
    """Convert and chunk one attachment (its bytes at `path`) as the document `name`, linked to its message:
    a Prepared (or the IngestResult of a no-op when these bytes are already indexed under the name)."""
    result = run_steps(prepare_steps(services, index, prepared.dataset, path, name, keep_at=keep_at))
    if isinstance(result, Prepared):
        result.metadata = {**result.metadata, "attached_to": prepared.filename}
        result.attachments = []  # one level: attachments of attachments are not unpacked
    return result


def ingest_attachments(services: Services, index: str, prepared: Prepared) -> list[dict]:
    """Index each attachment of a written message; one {"filename", "chunks"} or {"filename", "error"} each."""
    outcomes: list[dict] = []
    limit = services.settings.max_attachments_per_message
    indexed, skipped = attachments.split_at(attachments.attachments_to_index(prepared), limit)
    for name, data in indexed:
        keep_at = None
        if prepared.keep_at is not None:
            keep_at = uploads_path(services, index, prepared.dataset, name)
        with tempfile.TemporaryDirectory(prefix="rag-attachment-") as tmp:
            path = Path(tmp) / "attachment"
            path.write_bytes(data)
            try:
                result = prepare_attachment(services, index, prepared, name, path, keep_at)
                if isinstance(result, Prepared):
                    embedder = services.store.embedder_for(index)
                    vectors = embedder.embed_documents([c.embed_text for c in result.chunks])
                    result = write_prepared(services, index, result, vectors)
                outcomes.append({"filename": name, "chunks": result.chunks})
            except ApiError as err:
                outcomes.append({"filename": name, "error": err.message, "code": err.code})
            except Exception as exc:  # one attachment never fails its message
                log.exception("indexing attachment %s failed", name)
                outcomes.append({"filename": name, "error": internal_error(exc, ""), "code": "internal"})
    reason = attachments.skipped_reason(limit)
    outcomes.extend({"filename": name, "error": reason, "code": attachments.SKIPPED} for name, _ in skipped)
    return outcomes
