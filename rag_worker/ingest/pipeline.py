"""One file, or one folder of files, into an index: convert, chunk, embed, write, overview.

The slow steps (conversion, chunking, embedding) run before the index's write lock is taken, so concurrent
uploads to one index overlap their work and only queue for the write itself. The write replaces the file's
rows in one commit (`Store.replace_document`): when anything fails before or during it, the index keeps the
rows it had. The original file is moved into place, and the overview written, under the same lock.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from docling_core.types.doc import DocItemLabel

from .. import tables
from ..errors import ApiError
from ..names import check_filename, check_name
from ..runtime import offload
from . import attachments, overviews
from .chunk import Chunk, Chunker
from .convert import Converted, IsolatedConverter
from .formats import IngestError, is_supported, kind_of
from .limits import Limits
from .ocr import ocr_options

if TYPE_CHECKING:  # pragma: no cover
    from ..services import Services

log = logging.getLogger(__name__)

DEFAULT_DATASET = "default"


@dataclass
class IngestResult:
    filename: str
    dataset: str
    document_id: str
    chunks: int
    replaced: bool
    unchanged: bool = False
    attachments: list[dict] = field(
        default_factory=list
    )  # e-mail: each attachment indexed as its own document

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Progress:
    """One step of a batch: `stage` is converting, chunking, embedding, indexed, unchanged or failed."""

    file: str
    done: int
    total: int
    stage: str
    dataset: str = DEFAULT_DATASET
    error: str | None = None
    code: str | None = None

    def to_dict(self) -> dict:
        data = {
            "file": self.file,
            "done": self.done,
            "total": self.total,
            "stage": self.stage,
            "dataset": self.dataset,
        }
        if self.error:
            data.update(error=self.error, code=self.code)
        return data


@dataclass
class BatchDone:
    documents: int
    chunks: int
    seconds: float
    unchanged: int = 0
    failed: list[dict] = field(default_factory=list)
    removed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


# -- the parts built once per Services (the converter's pipelines, the chunker on the embedder's tokenizer) ----


@dataclass
class _Parts:
    converter: IsolatedConverter
    chunker: Chunker


_parts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_parts_lock = threading.Lock()


def parts(services: Services) -> _Parts:
    with _parts_lock:
        built = _parts.get(services)
        if built is None:
            s = services.settings
            limits = Limits(
                max_unzipped_bytes=s.max_unzipped_bytes,
                max_zip_entries=s.max_zip_entries,
                max_spreadsheet_cells=s.max_spreadsheet_cells,
                office_timeout_s=s.office_timeout_s,
                office_memory_mb=s.office_memory_mb,
                max_pdf_pages=s.max_pdf_pages,
            )
            embedder = services.embedder
            # The budget leaves room for the [CLS]/[SEP] the embedder adds, so no chunk is ever truncated.
            budget = max(16, min(s.chunk_tokens, embedder.max_length - 2))
            built = _Parts(
                converter=IsolatedConverter(
                    artifacts_path=s.docling_artifacts_path,
                    limits=limits,
                    memory_mb=s.convert_max_memory_mb,
                    timeout_s=s.convert_timeout_s,
                    ocr=ocr_options(s),
                ),
                chunker=Chunker(embedder.tokenizer, budget),
            )
            built.converter.prepare()
            _parts[services] = built
        return built


# -- one file ---------------------------------------------------------------------------------------------------


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
    steps = ingest_steps(services, index, dataset, path, filename, keep_at=keep_at)
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value


@dataclass
class Prepared:
    """A converted and chunked file, waiting for its vectors and its write."""

    dataset: str
    filename: str
    path: Path
    document_id: str
    kind: str
    title: str
    chunks: list[Chunk]
    keep_at: Path | None = None
    sheets: list | None = None  # spreadsheets: the sheets to load as SQL tables (rag_worker/tables.py)
    metadata: dict = field(default_factory=dict)  # kept on every chunk (e-mail headers, attached_to)
    attachments: list = field(default_factory=list)  # e-mail attachments, indexed after the message


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
    prepared = yield from prepare_steps(services, index, dataset, path, filename, keep_at=keep_at)
    if isinstance(prepared, IngestResult):
        return prepared
    yield "embedding"
    vectors = services.embedder.embed_documents([c.embed_text for c in prepared.chunks])
    yield "writing"
    return write_prepared(services, index, prepared, vectors)


def prepare_steps(
    services: Services,
    index: str,
    dataset: str,
    path: Path,
    filename: str | None = None,
    *,
    keep_at: Path | None = None,
) -> Iterator[str]:
    """Hash, then convert and chunk (yielding those stage names); return a Prepared file, or the IngestResult of
    a no-op when these exact bytes are already indexed under this name."""
    check_name(index, "index")
    check_name(dataset, "dataset")
    filename = check_filename(filename or path.name)
    kind_of(filename)
    store = services.store
    document_id = offload(file_sha256, path)
    if store.exists(index):
        store.check_compatible(index)
        if store.has_document(index, dataset=dataset, filename=filename, document_id=document_id):
            if keep_at is not None:
                with services.index_lock(index):
                    _keep(path, keep_at)
            chunks = _chunk_count(services, index, dataset, filename)
            return IngestResult(filename, dataset, document_id, chunks, replaced=False, unchanged=True)

    part = parts(services)
    yield "converting"
    # In a child process with a memory and a time limit; this greenlet waits, the others go on.
    converted = part.converter.convert(path, filename)
    yield "chunking"
    chunks: list[Chunk] = offload(part.chunker.chunk, converted.document)
    if not chunks:
        raise IngestError("empty", "the file contains no text")
    return Prepared(
        dataset,
        filename,
        path,
        document_id,
        converted.kind,
        document_title(converted, filename),
        chunks,
        keep_at,
        sheets=offload(
            tables.sheets_or_none, path, converted.kind, part.converter.limits.max_spreadsheet_cells
        ),
        metadata=converted.metadata,
        attachments=converted.attachments,
    )


def write_prepared(services: Services, index: str, prepared: Prepared, vectors) -> IngestResult:
    """Write one prepared file's rows (replacing the name's old rows in one commit), its original and overview."""
    overview, source = overviews.build_overview(services, prepared.title, prepared.chunks)
    now = datetime.now(UTC).isoformat(timespec="seconds")
    rows = document_rows(prepared, vectors, now)
    store = services.store
    with services.index_lock(index):
        added, removed = store.replace_document(
            index, dataset=prepared.dataset, filename=prepared.filename, rows=rows
        )
        if prepared.keep_at is not None:
            _keep(prepared.path, prepared.keep_at)
        described = offload(tables.store_sheets, services.settings, index, prepared)
        if described:
            overview = f"{overview} Tables: {'; '.join(described)}"
        entry = {
            "dataset": prepared.dataset,
            "filename": prepared.filename,
            "document_id": prepared.document_id,
            "title": prepared.title,
            "overview": overview,
            "source": source,
            "chunks": added,
            "indexed_at": now,
        }
        offload(overviews.upsert_overview, services.settings, index, entry)
    result = IngestResult(
        prepared.filename, prepared.dataset, prepared.document_id, added, replaced=removed > 0
    )
    if prepared.attachments:
        result.attachments = attachments.ingest_attachments(services, index, prepared)
    return result


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


# -- removal ----------------------------------------------------------------------------------------------------


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


def uploads_path(services: Services, index: str, dataset: str, filename: str) -> Path:
    """Where an uploaded original is kept: uploads_dir/<index>/<dataset>/<filename>."""
    return (
        services.settings.uploads_dir
        / check_name(index, "index")
        / check_name(dataset, "dataset")
        / check_filename(filename)
    )


# -- a folder ---------------------------------------------------------------------------------------------------


def folder_files(folder: Path) -> tuple[list[tuple[str, Path]], list[dict]]:
    """(dataset, path) for every file to index, and problems found while listing.

    Files directly in `folder` belong to dataset "default"; each subfolder is a dataset of the same name.
    Hidden entries are skipped; deeper folders and badly named subfolders are reported, not indexed.
    """
    files: list[tuple[str, Path]] = []
    problems: list[dict] = []
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if entry.name.startswith("."):
            continue
        if entry.is_file():
            files.append((DEFAULT_DATASET, entry))
        elif entry.is_dir():
            try:
                dataset = check_name(entry.name, "dataset")
            except ApiError as err:
                problems.append(
                    {"file": entry.name, "code": err.code, "error": f"folder skipped: {err.message}"}
                )
                continue
            for sub in sorted(entry.iterdir(), key=lambda p: p.name):
                if sub.name.startswith("."):
                    continue
                if sub.is_file():
                    files.append((dataset, sub))
                else:
                    problems.append(
                        {
                            "file": f"{entry.name}/{sub.name}",
                            "code": "nested_folder",
                            "error": "folder skipped: datasets are one level deep",
                        }
                    )
    return files, problems


def index_folder(
    services: Services, index: str, folder: Path, rebuild: bool = False, *, prune: bool = False
) -> Iterator[Progress | BatchDone]:
    """Index every supported file of `folder`, yielding Progress per file and stage, then one BatchDone.

    A file that fails is reported (stage "failed", with its reason) and the batch goes on. `rebuild` drops the
    index first (the way out of an embedder mismatch). `prune` also removes documents whose file is no longer
    in the folder (used when the folder is the index's own uploads folder).
    Raises EmbedderMismatch before touching anything when the index was built with another embedding model.
    """
    check_name(index, "index")
    folder = Path(folder)
    if not folder.is_dir():
        raise IngestError("not_found", f"folder {folder} does not exist", field="folder")
    started = time.monotonic()
    if rebuild:
        drop_index(services, index)
    elif services.store.exists(index):
        services.store.check_compatible(index)

    files, problems = folder_files(folder)
    total = len(files)
    stats = {"finished": 0, "documents": 0, "chunks": 0, "unchanged": 0}
    failed = list(problems)
    seen: set[tuple[str, str]] = set()
    pending: list[tuple[str, Prepared]] = []
    # Small files are embedded together: one forward pass over many chunks is several times faster per chunk
    # than one pass per two-chunk file (bench/ingest_throughput.py).
    flush_at = max(1, services.embedder.batch_size) * 4

    def fail(label: str, dataset: str, code: str, message: str) -> Progress:
        stats["finished"] += 1
        failed.append({"file": label, "code": code, "error": message})
        return Progress(label, stats["finished"], total, "failed", dataset, message, code)

    def finish(label: str, result: IngestResult) -> Progress:
        stats["finished"] += 1
        stats["documents"] += 1
        stats["chunks"] += result.chunks
        stats["unchanged"] += int(result.unchanged)
        stage = "unchanged" if result.unchanged else "indexed"
        return Progress(label, stats["finished"], total, stage, result.dataset)

    def flush() -> Iterator[Progress]:
        batch = list(pending)
        pending.clear()
        if not batch:
            return
        for label, prep in batch:
            yield Progress(label, stats["finished"], total, "embedding", prep.dataset)
        texts = [c.embed_text for _, prep in batch for c in prep.chunks]
        try:
            vectors = services.embedder.embed_documents(texts)
        except Exception as exc:
            log.exception("embedding a batch failed")
            for label, prep in batch:
                yield fail(
                    label, prep.dataset, "internal", f"embedding failed: {type(exc).__name__}: {exc}"[:300]
                )
            return
        offset = 0
        for label, prep in batch:
            part = vectors[offset : offset + len(prep.chunks)]
            offset += len(prep.chunks)
            yield Progress(label, stats["finished"], total, "writing", prep.dataset)
            try:
                result = write_prepared(services, index, prep, part)
            except ApiError as err:
                if err.code == "embedder_mismatch":
                    raise
                yield fail(label, prep.dataset, err.code, err.message)
                continue
            except Exception as exc:
                log.exception("writing %s failed", label)
                yield fail(
                    label, prep.dataset, "internal", f"internal error: {type(exc).__name__}: {exc}"[:300]
                )
                continue
            yield finish(label, result)

    for dataset, path in files:
        label = (
            path.name if dataset == DEFAULT_DATASET and path.parent == folder else f"{dataset}/{path.name}"
        )
        seen.add((dataset, path.name))
        if not is_supported(path.name):
            yield fail(label, dataset, "unsupported_type", "unsupported file type")
            continue
        steps = prepare_steps(services, index, dataset, path, path.name)
        try:
            while True:
                try:
                    stage = next(steps)
                except StopIteration as stop:
                    outcome: Prepared | IngestResult = stop.value
                    break
                yield Progress(label, stats["finished"], total, stage, dataset)
        except ApiError as err:
            if err.code == "embedder_mismatch":
                raise
            yield fail(label, dataset, err.code, err.message)
            continue
        except Exception as exc:  # one bad file never stops the batch
            log.exception("indexing %s failed", label)
            yield fail(label, dataset, "internal", f"internal error: {type(exc).__name__}: {exc}"[:300])
            continue
        if isinstance(outcome, IngestResult):
            yield finish(label, outcome)
            continue
        pending.append((label, outcome))
        if sum(len(p.chunks) for _, p in pending) >= flush_at:
            yield from flush()
    yield from flush()

    removed = 0
    if prune and not rebuild and services.store.exists(index):
        for doc in services.store.list_documents(index):
            messages = {name for ds, name in seen if ds == doc["dataset"]}
            if (doc["dataset"], doc["filename"]) not in seen and not attachments.belongs_to_a_message(
                doc["filename"], messages
            ):
                removed += delete_document(services, index, doc["dataset"], doc["filename"])
    yield BatchDone(
        documents=stats["documents"],
        chunks=stats["chunks"],
        seconds=round(time.monotonic() - started, 3),
        unchanged=stats["unchanged"],
        failed=failed,
        removed=removed,
    )
