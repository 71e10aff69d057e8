"""One file, or one folder of files, into an index: convert, chunk, embed, write, overview.

The slow steps (conversion, chunking, embedding) run before the index's write lock is taken, so concurrent
uploads to one index overlap their work and only queue for the write itself. The write replaces the file's
rows in one commit (`Store.replace_document`): when anything fails before or during it, the index keeps the
rows it had. The original file is moved into place, and the overview written, under the same lock.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from docling_core.types.doc import DocItemLabel

from .. import tables
from ..errors import ApiError
from ..names import STAGED_RE, check_filename, check_name, check_table
from ..runtime import offload
from . import attachments, overviews
from .chunk import Chunk, Chunker
from .convert import Converted, IsolatedConverter
from .formats import IngestError, is_supported, kind_of
from .limits import Limits
from .memory import release_free_memory
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
    ocr: dict | None = None  # stage "ocr": {"page", "done", "total"}, the scanned page just read

    def to_dict(self) -> dict:
        data = {
            "file": self.file,
            "done": self.done,
            "total": self.total,
            "stage": str(self.stage),
            "dataset": self.dataset,
        }
        if self.error:
            data.update(error=self.error, code=self.code)
        if self.ocr:
            data["ocr"] = self.ocr
        return data


class Stage(str):
    """A stage name as `ingest_steps` yields it, with details of a step inside it in `detail`: the stage "ocr"
    comes once per scanned page read, with `detail["ocr"] = {"page", "done", "total"}`."""

    detail: dict

    def __new__(cls, name: str, **detail) -> Stage:
        stage = super().__new__(cls, name)
        stage.detail = detail
        return stage


def stage_detail(stage: str) -> dict:
    return dict(getattr(stage, "detail", None) or {})


@dataclass
class BatchDone:
    documents: int
    chunks: int
    seconds: float
    unchanged: int = 0
    failed: list[dict] = field(default_factory=list)
    removed: int = 0
    kept: int = 0  # a rebuild's documents carried over from the old table (file not in the folder, or failed)

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


def release_parts(services: Services) -> None:
    """Stop the conversion child `parts` started for these services (it also ends once they are collected)."""
    with _parts_lock:
        built = _parts.pop(services, None)
    if built is not None:
        built.converter.close()


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
    known: dict[tuple[str, str], tuple[str, int]] | None = None,
) -> Iterator[str]:
    """Hash, then convert and chunk (yielding those stage names); return a Prepared file, or the IngestResult of
    a no-op when these exact bytes are already indexed under this name."""
    check_table(index)
    check_name(dataset, "dataset")
    filename = check_filename(filename or path.name)
    kind_of(filename)
    store = services.store
    document_id = offload(file_sha256, path)
    if (
        known is not None
    ):  # a folder run: what the index held when it started, {(dataset, name): (id, chunks)}
        have = known.get((dataset, filename))
        if have is not None and have[0] == document_id:
            return IngestResult(filename, dataset, document_id, have[1], replaced=False, unchanged=True)
    elif store.exists(index):
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
    converted = yield from _converting(part.converter, path, filename)
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
        overview, source = overviews.build_overview(services, prepared.title, prepared.chunks)
        rows = document_rows(prepared, vectors, now)
        documents.append((prepared.dataset, prepared.filename, rows))
        entries.append(
            {
                "dataset": prepared.dataset,
                "filename": prepared.filename,
                "document_id": prepared.document_id,
                "title": prepared.title,
                "overview": overview,
                "source": source,
                "chunks": len(rows),
                "indexed_at": now,
            }
        )
    store = services.store
    with services.index_lock(index):
        counts = store.replace_documents(index, documents, compact=compact)
        for (prepared, _), entry in zip(items, entries, strict=True):
            if prepared.keep_at is not None:
                _keep(prepared.path, prepared.keep_at)
            # SQL tables live under the index's own name, also while a rebuild builds its new table.
            described = offload(tables.store_sheets, services.settings, _served(index), prepared)
            if described:
                entry["overview"] = f"{entry['overview']} Tables: {'; '.join(described)}"
        offload(overviews.upsert_overviews, services.settings, index, entries)
    results = [
        IngestResult(prepared.filename, prepared.dataset, prepared.document_id, added, replaced=removed > 0)
        for (prepared, _), (added, removed) in zip(items, counts, strict=True)
    ]
    for (prepared, _), result in zip(items, results, strict=True):
        if prepared.attachments:
            result.attachments = attachments.ingest_attachments(services, index, prepared)
    return results


def _served(index: str) -> str:
    """The index a table name serves: itself, or the index a rebuild table `<index>.<hex>` is built for."""
    match = STAGED_RE.fullmatch(index)
    return match.group(1) if match else index


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

    Files directly in `folder` belong to dataset "default"; each subfolder is a dataset of the same name. The
    file rule is the upload's: a name `/add_document` accepts is indexed here too, dot-files included
    (`.notes.md`); a hidden file of a type no upload would accept (`.DS_Store`, `.gitignore`) is passed over
    quietly, other unsupported files are reported. Hidden folders, deeper folders and badly named subfolders
    are skipped (the last two reported).
    """
    files: list[tuple[str, Path]] = []
    problems: list[dict] = []

    def wanted(entry: Path) -> bool:
        return not entry.name.startswith(".") or is_supported(entry.name)

    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if entry.is_file():
            if wanted(entry):
                files.append((DEFAULT_DATASET, entry))
        elif entry.is_dir() and not entry.name.startswith("."):
            try:
                dataset = check_name(entry.name, "dataset")
            except ApiError as err:
                problems.append(
                    {"file": entry.name, "code": err.code, "error": f"folder skipped: {err.message}"}
                )
                continue
            for sub in sorted(entry.iterdir(), key=lambda p: p.name):
                if sub.is_file():
                    if wanted(sub):
                        files.append((dataset, sub))
                elif not sub.name.startswith("."):
                    problems.append(
                        {
                            "file": f"{entry.name}/{sub.name}",
                            "code": "nested_folder",
                            "error": "folder skipped: datasets are one level deep",
                        }
                    )
    return files, problems


def _source_in(folder: Path, dataset: str, filename: str) -> Path | None:
    """The file a (dataset, filename) document is read from in `folder`, if it is there."""
    for candidate in (folder / dataset / filename, folder / filename if dataset == DEFAULT_DATASET else None):
        if candidate is not None and candidate.is_file():
            return candidate
    return None


def _names_in(folder: Path, dataset: str) -> set[str]:
    """The file names a dataset has in `folder` (an e-mail there keeps its attachment documents)."""
    dirs = [folder / dataset, *([folder] if dataset == DEFAULT_DATASET else [])]
    return {p.name for d in dirs if d.is_dir() for p in d.iterdir() if p.is_file()}


class _Run:
    """Counters of one indexing run, shared by its steps."""

    def __init__(self, total: int, problems: list[dict]):
        self.total = total
        self.finished = 0
        self.documents = 0
        self.chunks = 0
        self.unchanged = 0
        self.failed = list(problems)
        self.seen: set[tuple[str, str]] = set()  # (dataset, name) of every file found, indexed or not

    def fail(self, label: str, dataset: str, code: str, message: str) -> Progress:
        self.finished += 1
        self.failed.append({"file": label, "code": code, "error": message})
        return Progress(label, self.finished, self.total, "failed", dataset, message, code)

    def finish(self, label: str, result: IngestResult) -> Progress:
        self.finished += 1
        self.documents += 1
        self.chunks += result.chunks
        self.unchanged += int(result.unchanged)
        stage = "unchanged" if result.unchanged else "indexed"
        return Progress(label, self.finished, self.total, stage, result.dataset)


def _index_files(
    services: Services, target: str, folder: Path, files: list[tuple[str, Path]], run: _Run
) -> Iterator[Progress]:
    """Convert, chunk, embed and write each file into the table `target`, yielding Progress.

    Files are embedded and committed in batches (`write_batch`): a crash loses at most the batch in flight, and
    a run started again skips every file whose bytes are already indexed under its name (read once, here)."""
    known = (
        {
            (d["dataset"], d["filename"]): (d["document_id"], int(d["chunks"]))
            for d in services.store.list_documents(target)
        }
        if services.store.exists(target)
        else {}
    )
    pending: list[tuple[str, Prepared]] = []
    # Small files are embedded together: one forward pass over many chunks is several times faster per chunk
    # than one pass per two-chunk file, and the pool is sorted by length before it is cut into batches, so a pool
    # of 512 chunks pads ~10% fewer tokens than one of 128 on SciFact (bench/ingest_throughput.py).
    flush_at = max(1, services.embedder.batch_size, services.settings.ingest_batch_chunks)
    # Rows committed since the table was last compacted (`Store.optimize`), which happens every COMPACT_ROWS and
    # once at the end instead of after every batch: each compaction left ~2 MB resident (Lance), which made
    # memory grow with the run (bench/ingest_memory.py). A run that stops before its end leaves the FTS index
    # behind by at most COMPACT_ROWS rows, which searches still find (exhaustively) and the next write folds in.
    uncompacted = 0

    def compact() -> None:
        nonlocal uncompacted
        if uncompacted:
            with services.index_lock(target):
                services.store.optimize(target)
            uncompacted = 0

    def flush() -> Iterator[Progress]:
        batch = list(pending)
        pending.clear()
        if not batch:
            return
        for label, prep in batch:
            yield Progress(label, run.finished, run.total, "embedding", prep.dataset)
        texts = [c.embed_text for _, prep in batch for c in prep.chunks]
        try:
            vectors = services.embedder.embed_documents(texts)
        except Exception as exc:
            log.exception("embedding a batch failed")
            for label, prep in batch:
                yield run.fail(
                    label, prep.dataset, "internal", f"embedding failed: {type(exc).__name__}: {exc}"[:300]
                )
            return
        items = []
        offset = 0
        for label, prep in batch:
            items.append((prep, vectors[offset : offset + len(prep.chunks)]))
            offset += len(prep.chunks)
            yield Progress(label, run.finished, run.total, "writing", prep.dataset)
        nonlocal uncompacted
        try:
            results = write_batch(services, target, items, compact=False)  # the whole batch in one commit
        except ApiError as err:
            if err.code == "embedder_mismatch":
                raise
            results = None
        except Exception:
            log.exception("writing a batch of %d files failed; writing them one by one", len(batch))
            results = None
        if results is not None:
            uncompacted += len(texts)
            if uncompacted >= COMPACT_ROWS:
                compact()
        release_free_memory()  # resident memory stays flat over long runs (rag_worker/ingest/memory.py)
        if results is not None:
            for (label, _), result in zip(batch, results, strict=True):
                yield run.finish(label, result)
            return
        for (label, prep), (_, part) in zip(batch, items, strict=True):  # find the file that fails
            try:
                result = write_prepared(services, target, prep, part)
            except ApiError as err:
                if err.code == "embedder_mismatch":
                    raise
                yield run.fail(label, prep.dataset, err.code, err.message)
                continue
            except Exception as exc:
                log.exception("writing %s failed", label)
                yield run.fail(
                    label, prep.dataset, "internal", f"internal error: {type(exc).__name__}: {exc}"[:300]
                )
                continue
            yield run.finish(label, result)

    for dataset, path in files:
        label = (
            path.name if dataset == DEFAULT_DATASET and path.parent == folder else f"{dataset}/{path.name}"
        )
        try:
            name = check_filename(path.name)
        except ApiError as err:
            yield run.fail(label, dataset, err.code, err.message)
            continue
        run.seen.add((dataset, name))
        if not is_supported(name):
            yield run.fail(label, dataset, "unsupported_type", "unsupported file type")
            continue
        steps = prepare_steps(services, target, dataset, path, name, known=known)
        try:
            while True:
                try:
                    stage = next(steps)
                except StopIteration as stop:
                    outcome: Prepared | IngestResult = stop.value
                    break
                yield Progress(
                    label, run.finished, run.total, str(stage), dataset, ocr=stage_detail(stage).get("ocr")
                )
        except ApiError as err:
            if err.code == "embedder_mismatch":
                raise
            yield run.fail(label, dataset, err.code, err.message)
            continue
        except Exception as exc:  # one bad file never stops the batch
            log.exception("indexing %s failed", label)
            yield run.fail(label, dataset, "internal", f"internal error: {type(exc).__name__}: {exc}"[:300])
            continue
        if isinstance(outcome, IngestResult):
            yield run.finish(label, outcome)
            continue
        pending.append((label, outcome))
        if sum(len(p.chunks) for _, p in pending) >= flush_at:
            yield from flush()
    yield from flush()
    compact()


def index_folder(
    services: Services, index: str, folder: Path, rebuild: bool = False, *, prune: bool = False
) -> Iterator[Progress | BatchDone]:
    """Index every supported file of `folder`, yielding Progress per file and stage, then one BatchDone.

    A file that fails is reported (stage "failed", with its reason) and the batch goes on. `rebuild` indexes
    everything again into a new table and swaps it in when complete (see `rebuild_and_swap`); the way out of an
    embedder mismatch. `prune` removes documents whose file is not in the folder (used when the folder is the
    index's own uploads folder); without it such documents are kept, a rebuild included.
    Raises EmbedderMismatch before touching anything when the index was built with another embedding model and
    no rebuild is asked; Conflict (409 `busy`) when the index is already being rebuilt.
    """
    check_name(index, "index")
    folder = Path(folder)
    if not folder.is_dir():
        raise IngestError("not_found", f"folder {folder} does not exist", field="folder")
    started = time.monotonic()

    def index_into(target: str) -> Generator[Progress, None, _Run]:
        files, problems = folder_files(folder)
        run = _Run(len(files), problems)
        yield from _index_files(services, target, folder, files, run)
        return run

    if rebuild:
        with services.rebuild_guard(index):
            yield from rebuild_and_swap(services, index, folder, prune, started, index_into)
        return
    yield from index_and_prune(services, index, prune, started, index_into)


# An engine's indexing step: index the folder into the named table, yielding Progress; returns the run's counters.
IndexInto = Callable[[str], Generator[Progress, None, _Run]]


def index_and_prune(
    services: Services, index: str, prune: bool, started: float, index_into: IndexInto
) -> Iterator[Progress | BatchDone]:
    """Index into the index's own table, then (with `prune`) delete the documents whose file was not seen."""
    store = services.store
    if store.exists(index):
        store.check_compatible(index)
    run = yield from index_into(index)

    removed = 0
    if prune and store.exists(index):
        for doc in store.list_documents(index):
            messages = {name for ds, name in run.seen if ds == doc["dataset"]}
            if (doc["dataset"], doc["filename"]) not in run.seen and not attachments.belongs_to_a_message(
                doc["filename"], messages
            ):
                removed += delete_document(services, index, doc["dataset"], doc["filename"])
    yield BatchDone(
        documents=run.documents,
        chunks=run.chunks,
        seconds=round(time.monotonic() - started, 3),
        unchanged=run.unchanged,
        failed=run.failed,
        removed=removed,
    )


def rebuild_and_swap(
    services: Services, index: str, folder: Path, prune: bool, started: float, index_into: IndexInto
) -> Iterator[Progress | BatchDone]:
    """Index the folder into a new table while searches keep using the current one, carry over what the folder
    cannot rebuild, and swap the new table in only when it is complete. Both engines rebuild through this, each
    with its own indexing step.

    Kept from the current table: documents whose file is not in the folder (unless `prune`), files that failed
    this time, and whatever uploads and deletes changed while the rebuild ran (settled under the index's write
    lock, just before the swap). A crash or an error before the swap (a node lost, the driver stopped) leaves
    the current table and its overviews as they were; the table being built is dropped then, or by the next
    rebuild when the process died.
    """
    store = services.store
    for stale in store.staged_tables(index):  # a rebuild that crashed (only one runs at a time: the guard)
        store.discard(stale)
        overviews.drop_overviews(services.settings, stale)
    staged = store.new_staged(index)
    swapped = False
    try:
        run = yield from index_into(staged)
        # Most of the carrying over (maybe re-embedding) happens without the lock; what uploads and deletes
        # changed meanwhile is settled under it, then the swap.
        kept, removed = _settle(services, index, staged, folder, prune)
        with services.index_lock(index):
            more_kept, more_removed = _settle(services, index, staged, folder, prune)
            store.promote(index, staged)
            overviews.promote_overviews(services.settings, index, staged)
            swapped = True
    finally:
        if not swapped:
            try:
                store.discard(staged)
                overviews.drop_overviews(services.settings, staged)
            except Exception:  # the next rebuild drops it
                log.exception("dropping the unfinished rebuild table %s failed", staged)
    yield BatchDone(
        documents=run.documents,
        chunks=run.chunks,
        seconds=round(time.monotonic() - started, 3),
        unchanged=run.unchanged,
        failed=run.failed,
        removed=removed + more_removed,
        kept=len(kept | more_kept),
    )


def _settle(
    services: Services, index: str, staged: str, folder: Path, prune: bool
) -> tuple[set[tuple[str, str]], int]:
    """Make the rebuilt table hold what it must before the swap; returns (documents carried over, chunks of
    documents left out because `prune` was asked)."""
    store = services.store
    current = (
        {(d["dataset"], d["filename"]): d for d in store.list_documents(index)} if store.exists(index) else {}
    )
    built = {(d["dataset"], d["filename"]): d for d in store.list_documents(staged)}
    carry: list[tuple[str, str]] = []
    pruned = 0
    for key, doc in current.items():
        source = _source_in(folder, *key)
        if key not in built:
            if (
                prune
                and source is None
                and not attachments.belongs_to_a_message(key[1], _names_in(folder, key[0]))
            ):
                pruned += int(doc["chunks"])
            else:  # not in the folder, or its file failed this time: the current rows stay
                carry.append(key)
        elif (
            built[key]["document_id"] != doc["document_id"]
            and source is not None
            and file_sha256(source) == doc["document_id"]
        ):
            carry.append(key)  # an upload replaced the file while the rebuild ran: the folder has its bytes
    for key in built.keys() - current.keys():
        if _source_in(folder, *key) is None:  # deleted while the rebuild ran (a delete removes the original)
            store.delete_document(staged, dataset=key[0], filename=key[1])
            overviews.remove_overview(services.settings, staged, dataset=key[0], filename=key[1])
    if carry:
        _carry_over(services, index, staged, carry)
    return set(carry), pruned


def _carry_over(services: Services, index: str, staged: str, keys: list[tuple[str, str]]) -> None:
    """Copy documents' rows (and overviews) from the current table into the rebuilt one; their vectors are
    computed again when the current table was made with another embedder."""
    store = services.store
    marker = store.marker(index)
    same_embedder = (
        marker.get("embedding_model") in (None, store.own_marker["embedding_model"])
        and marker.get("dim", marker.get("table_dim")) == store.own_marker["dim"]
    )
    for start in range(0, len(keys), CARRY_BATCH):
        part = keys[start : start + CARRY_BATCH]
        rows = store.scan_documents(index, part)
        if not same_embedder:
            rows = _embedded_again(services, rows)
        store.write_rows(staged, rows, part)
    wanted = set(keys)
    entries = [
        e
        for e in overviews.load_overviews(services.settings, index)
        if (e.get("dataset"), e.get("filename")) in wanted
    ]
    if entries:
        overviews.upsert_overviews(services.settings, staged, entries)


CARRY_BATCH = 200
# A folder run compacts its table (FTS index update, fragments) after this many rows, and at its end.
COMPACT_ROWS = 20_000


def _embedded_again(services: Services, rows):
    """The rows with vectors from this worker's embedder: headings + text, as ingestion embeds a chunk."""
    texts = []
    for text, meta in zip(rows.column("text").to_pylist(), rows.column("metadata").to_pylist(), strict=True):
        try:
            headings = json.loads(meta or "{}").get("headings") or []
        except (ValueError, AttributeError):
            headings = []
        texts.append("\n".join([*(str(h) for h in headings if h), text]))
    vectors = np.asarray(services.embedder.embed_documents(texts), dtype=np.float32) if texts else None
    dim = services.embedder.dim
    flat = pa.array(vectors.reshape(-1) if vectors is not None else np.zeros(0, dtype=np.float32))
    column = pa.FixedSizeListArray.from_arrays(flat, dim)
    return rows.drop_columns(["vector"]).append_column(
        pa.field("vector", pa.list_(pa.float32(), dim)), column
    )
