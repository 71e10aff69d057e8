"""A folder of files into an index: the one loop both engines share, the local engine, and the end of a run.

`index_files` lists the folder, checks each file's name and type, and passes over files whose bytes are already
indexed under their name; an engine does the rest: the local one (`LocalEngine`, here) converts and chunks each
file in this process and embeds and writes them in batches, the Ray one (`ray_engine.RayEngine`) hands them to
actors across a cluster and commits what they wrote.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ..errors import ApiError, EmbedderMismatch
from ..names import check_filename, check_name
from ..runtime import offload
from . import attachments
from .document import file_sha256, prepare_steps, write_batch, write_prepared
from .formats import IngestError, is_supported
from .memory import release_free_memory
from .rebuild import rebuild_and_swap
from .records import (
    DEFAULT_DATASET,
    BatchDone,
    FileJob,
    IndexInto,
    IngestResult,
    Prepared,
    Progress,
    Run,
    internal_error,
    stage_detail,
)
from .removal import delete_document

if TYPE_CHECKING:  # pragma: no cover
    from ..services import Services

log = logging.getLogger(__name__)

# A folder run compacts its table (FTS index update, fragments) after this many rows, and at its end.
COMPACT_ROWS = 20_000


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
    folder = Path(folder)

    def index_into(target: str) -> Generator[Progress, None, Run]:
        return index_files(services, target, folder, LocalEngine(services, target))

    yield from run_folder(services, index, folder, rebuild, prune, index_into)


def run_folder(
    services: Services, index: str, folder: Path, rebuild: bool, prune: bool, index_into: IndexInto
) -> Iterator[Progress | BatchDone]:
    """A folder run with an engine's indexing step: into a new table swapped in when complete (`rebuild`), or
    into the index's own table."""
    check_name(index, "index")
    folder = Path(folder)
    if not folder.is_dir():
        raise IngestError("not_found", f"folder {folder} does not exist", field="folder")
    started = time.monotonic()
    if rebuild:
        with services.rebuild_guard(index):
            yield from rebuild_and_swap(services, index, folder, prune, started, index_into)
        return
    yield from index_and_prune(services, index, prune, started, index_into)


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


class Engine(Protocol):
    """What differs between the engines of `index_files`: how the files that need indexing are converted,
    embedded and written."""

    def take(self, run: Run, job: FileJob) -> Iterator[Progress]:
        """One more file to index, in the folder's order; may index what it holds so far."""
        ...

    def drain(self, run: Run) -> Iterator[Progress]:
        """Index whatever `take` left pending; called once, after the last file."""
        ...


def file_label(folder: Path, dataset: str, path: Path) -> str:
    """How progress names a file: its name at the folder's top level, else `dataset/name`."""
    return path.name if dataset == DEFAULT_DATASET and path.parent == folder else f"{dataset}/{path.name}"


def index_files(
    services: Services, target: str, folder: Path, engine: Engine
) -> Generator[Progress, None, Run]:
    """Index the folder's files into the table `target` (an index, or a rebuild's new table) with `engine`,
    yielding Progress; returns the run's counters.

    What the table holds is read once, here: a run started again skips every file whose bytes are already
    indexed under its name. A file that fails is reported and the run goes on."""
    files, problems = folder_files(folder)
    store = services.store
    indexed = (
        {(d["dataset"], d["filename"]): d for d in store.list_documents(target)}
        if store.exists(target)
        else {}
    )
    run = Run(len(files), problems, indexed)
    for dataset, path in files:
        label = file_label(folder, dataset, path)
        try:
            name = check_filename(path.name)
        except ApiError as err:
            yield run.fail(label, dataset, err.code, err.message)
            continue
        run.seen.add((dataset, name))
        if not is_supported(name):
            yield run.fail(label, dataset, "unsupported_type", "unsupported file type")
            continue
        try:
            document_id = offload(file_sha256, path)
        except Exception as exc:  # one bad file never stops the batch
            log.exception("indexing %s failed", label)
            yield run.fail(label, dataset, "internal", internal_error(exc))
            continue
        have = indexed.get((dataset, name))
        if have is not None and have["document_id"] == document_id:
            result = IngestResult(
                name, dataset, document_id, int(have["chunks"]), replaced=False, unchanged=True
            )
            yield run.finish(label, result)
            continue
        yield from engine.take(run, FileJob(label, dataset, path, name, document_id))
    yield from engine.drain(run)
    return run


class LocalEngine:
    """`index_files` in this process: each file converted and chunked as it comes, then embedded and committed
    in batches (`write_batch`), so a crash loses at most the batch in flight."""

    def __init__(self, services: Services, target: str):
        self.services = services
        self.target = target
        self.pending: list[tuple[str, Prepared]] = []
        # Small files are embedded together: one forward pass over many chunks is several times faster per
        # chunk than one pass per two-chunk file, and the pool is sorted by length before it is cut into batches,
        # so a pool of 512 chunks pads ~10% fewer tokens than one of 128 on SciFact (bench/ingest_throughput.py).
        self.flush_at = max(1, services.embedder.batch_size, services.settings.ingest_batch_chunks)
        # Rows committed since the table was last compacted (`Store.optimize`), which happens every COMPACT_ROWS
        # and once at the end instead of after every batch: each compaction left ~2 MB resident (Lance), which
        # made memory grow with the run (bench/ingest_memory.py). A run that stops before its end leaves the FTS
        # index behind by at most COMPACT_ROWS rows, which searches still find (exhaustively) and the next write
        # folds in.
        self.uncompacted = 0

    def take(self, run: Run, job: FileJob) -> Iterator[Progress]:
        services = self.services
        steps = prepare_steps(
            services, self.target, job.dataset, job.path, job.name, document_id=job.document_id
        )
        try:
            while True:
                try:
                    stage = next(steps)
                except StopIteration as stop:
                    prepared: Prepared = stop.value
                    break
                ocr = stage_detail(stage).get("ocr")
                yield Progress(job.label, run.finished, run.total, str(stage), job.dataset, ocr=ocr)
        except EmbedderMismatch:
            raise
        except ApiError as err:
            yield run.fail(job.label, job.dataset, err.code, err.message)
            return
        except Exception as exc:  # one bad file never stops the batch
            log.exception("indexing %s failed", job.label)
            yield run.fail(job.label, job.dataset, "internal", internal_error(exc))
            return
        self.pending.append((job.label, prepared))
        if sum(len(p.chunks) for _, p in self.pending) >= self.flush_at:
            yield from self.flush(run)

    def drain(self, run: Run) -> Iterator[Progress]:
        yield from self.flush(run)
        self.compact()

    def compact(self) -> None:
        if self.uncompacted:
            with self.services.index_lock(self.target):
                self.services.store.optimize(self.target)
            self.uncompacted = 0

    def flush(self, run: Run) -> Iterator[Progress]:
        """Embed the pending files together and write them in one commit (one by one when that fails)."""
        batch = list(self.pending)
        self.pending.clear()
        if not batch:
            return
        for label, prep in batch:
            yield Progress(label, run.finished, run.total, "embedding", prep.dataset)
        texts = [c.embed_text for _, prep in batch for c in prep.chunks]
        try:
            vectors = self.services.store.embedder_for(self.target).embed_documents(texts)
        except Exception as exc:
            log.exception("embedding a batch failed")
            for label, prep in batch:
                yield run.fail(label, prep.dataset, "internal", internal_error(exc, "embedding failed"))
            return
        items = []
        offset = 0
        for label, prep in batch:
            items.append((prep, vectors[offset : offset + len(prep.chunks)]))
            offset += len(prep.chunks)
            yield Progress(label, run.finished, run.total, "writing", prep.dataset)
        results = self._write_together(items)
        if results is not None:
            self.uncompacted += len(texts)
            if self.uncompacted >= COMPACT_ROWS:
                self.compact()
        release_free_memory()  # resident memory stays flat over long runs (rag_worker/ingest/memory.py)
        if results is not None:
            for (label, _), result in zip(batch, results, strict=True):
                yield run.finish(label, result)
            return
        yield from self._write_one_by_one(run, [label for label, _ in batch], items)

    def _write_together(self, items: list[tuple[Prepared, object]]) -> list[IngestResult] | None:
        """The whole batch in one commit; None when that failed (but not for an embedder mismatch)."""
        try:
            return write_batch(self.services, self.target, items, compact=False)
        except EmbedderMismatch:
            raise
        except ApiError:
            return None
        except Exception:
            log.exception("writing a batch of %d files failed; writing them one by one", len(items))
            return None

    def _write_one_by_one(
        self, run: Run, labels: list[str], items: list[tuple[Prepared, object]]
    ) -> Iterator[Progress]:
        """Write a batch that failed as a whole file by file, to find the file that fails."""
        for label, (prep, vectors) in zip(labels, items, strict=True):
            try:
                result = write_prepared(self.services, self.target, prep, vectors)
            except EmbedderMismatch:
                raise
            except ApiError as err:
                yield run.fail(label, prep.dataset, err.code, err.message)
                continue
            except Exception as exc:
                log.exception("writing %s failed", label)
                yield run.fail(label, prep.dataset, "internal", internal_error(exc))
                continue
            yield run.finish(label, result)


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
    yield run.done(started, removed=removed)
