"""`--engine ray`: index a folder across a Ray cluster, into the same LanceDB table the local path writes.

The local path (`pipeline.index_folder`) converts, chunks and embeds in one process. Here those steps run as a
Ray Data `map_batches` over actors spread across the cluster's nodes; each actor builds the same parts the
local path builds (Docling converter with the same limits, the chunker on the embedder's tokenizer, the
embedder), prepares its files with the same function (`pipeline.prepare_steps`: file rules, limits, errors),
builds the same rows (`pipeline.document_rows`) and writes them as a Lance fragment straight into the index's
table folder. The driver only sees small per-file results: it reports progress as they stream in and commits
the written fragments with one Lance `Append` per group of files (`RAY_COMMIT_FILES`), so a crash loses at most
the group in flight and never leaves half a document: a document's rows are in one fragment, and a fragment
is visible only once its commit lands. A document whose bytes changed keeps its old rows until its new ones
are committed; they are deleted right after, in one delete per group. A re-run skips documents whose bytes are
already indexed under their name, as the local path does. `--rebuild` builds into a new table and swaps it in
when complete, through the local path's own code (`pipeline.rebuild_and_swap`): a rebuild that fails leaves the index as it was.

Like the local path, a spreadsheet's sheets become SQL tables of the index (rag_worker/tables.py: the actor reads
them, the driver writes them with the commit, in the folder's file order, under the index's write lock), and an
e-mail's attachments become documents of their own linked back to the message (prepared, embedded and written
by the actor that read the message, in the same fragment; like the local path, they are not counted as files
of the run).

Requirements: every node runs the same virtualenv (torch, Docling and the packaged models load from local
files there; `requirements/ray.txt` adds Ray and Lance's Python package), and sees the index store and the
folder at the same path (one machine, a shared file system, or LanceDB on object storage for the table).
The project's `rag_worker` package travels to the nodes with the job (`py_modules`), so nodes need no
checkout of this repository.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import tempfile
import time
from collections.abc import Generator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from .. import tables
from ..errors import ApiError
from ..names import check_name
from . import attachments, overviews
from .formats import IngestError, is_supported
from .memory import release_free_memory
from .pipeline import (
    DEFAULT_DATASET,
    BatchDone,
    IngestResult,
    Prepared,
    Progress,
    _Run,
    _served,
    document_rows,
    file_sha256,
    folder_files,
    index_and_prune,
    prepare_steps,
    rebuild_and_swap,
)

if TYPE_CHECKING:  # pragma: no cover
    from ..services import Services
    from ..settings import Settings

log = logging.getLogger(__name__)

# Files handed to one actor call; each call writes at most one fragment.
FILES_PER_BATCH = 16
# Files whose fragments are committed together (and whose overviews are written together).
COMMIT_FILES = 1000
# Variables a node needs to load models offline and find the same caches as the driver.
_FORWARDED_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "MODEL_CACHE_DIR", "OMP_NUM_THREADS")


def available() -> bool:
    try:
        import lance  # noqa: F401
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


class _Preparer:
    """A Ray actor: converts, chunks and embeds a batch of files and writes their rows as one Lance fragment."""

    def __init__(self, settings: Settings, index: str, table_uri: str):
        from ..services import Services

        self.services = Services(settings)
        self.index = index
        self.table_uri = table_uri
        self.node = _node_id()

    def __call__(self, batch: dict) -> dict:
        import lance

        out: dict[str, list] = {
            k: []
            for k in (
                "label",
                "dataset",
                "filename",
                "document_id",
                "chunks",
                "stage",
                "error",
                "code",
                "overview",
                "fragment",
                "sheets",
                "node",
            )
        }
        with tempfile.TemporaryDirectory(prefix="rag-ray-") as scratch:  # attachments' bytes, until written
            self._prepare_batch(batch, out, Path(scratch), lance)
        out["node"] = [self.node] * len(out["label"])
        release_free_memory()  # as the local engine does after each batch
        return out

    def _prepare_batch(self, batch: dict, out: dict, scratch: Path, lance) -> None:
        # (label, prepared, is an e-mail attachment): attachments follow their message
        prepared: list[tuple[str, Prepared, bool]] = []
        for label, dataset, path in zip(batch["label"], batch["dataset"], batch["path"], strict=True):
            try:
                outcome = _run(prepare_steps(self.services, self.index, dataset, Path(path), Path(path).name))
            except ApiError as err:
                _result(
                    out, label, dataset, Path(path).name, stage="failed", error=err.message, code=err.code
                )
                continue
            except Exception as exc:  # one bad file never stops the batch (as on the local path)
                log.exception("indexing %s failed", label)
                message = f"internal error: {type(exc).__name__}: {exc}"[:300]
                _result(out, label, dataset, Path(path).name, stage="failed", error=message, code="internal")
                continue
            if isinstance(outcome, IngestResult):  # indexed meanwhile by someone else: nothing to write
                _result(
                    out, label, dataset, outcome.filename, outcome.document_id, outcome.chunks, "unchanged"
                )
                continue
            prepared.append((label, outcome, False))
            prepared.extend((label, extra, True) for extra in self._attachments(outcome, scratch))

        if prepared:
            texts = [c.embed_text for _, prep, _ in prepared for c in prep.chunks]
            vectors = self.services.embedder.embed_documents(texts)
            now = datetime.now(UTC).isoformat(timespec="seconds")
            rows: list[dict] = []
            offset = 0
            entries: list[str] = []
            for _, prep, _ in prepared:
                part = vectors[offset : offset + len(prep.chunks)]
                offset += len(prep.chunks)
                rows.extend(document_rows(prep, part, now))
                overview, source = overviews.build_overview(self.services, prep.title, prep.chunks)
                entry = {
                    "dataset": prep.dataset,
                    "filename": prep.filename,
                    "document_id": prep.document_id,
                    "title": prep.title,
                    "overview": overview,
                    "source": source,
                    "chunks": len(prep.chunks),
                    "indexed_at": now,
                }
                entries.append(json.dumps(entry, ensure_ascii=False))
            # The same validation and Arrow layout as the local path's write (Store._prepare).
            data = self.services.store.prepare_rows(self.index, rows)
            fragment = lance.fragment.LanceFragment.create(self.table_uri, data)
            fragment_json = json.dumps(fragment.to_json())
            for n, ((label, prep, attached), entry) in enumerate(zip(prepared, entries, strict=True)):
                _result(
                    out,
                    label,
                    prep.dataset,
                    prep.filename,
                    prep.document_id,
                    len(prep.chunks),
                    "attachment" if attached else "indexed",
                    overview=entry,
                    fragment=fragment_json if n == 0 else "",
                    sheets=pickle.dumps(prep.sheets) if prep.sheets is not None else b"",
                )

    def _attachments(self, message: Prepared, scratch: Path) -> list[Prepared]:
        """The message's attachments prepared as their own documents (as `attachments.ingest_attachments` does
        on the local path); one that fails is logged and never fails its message."""
        out = []
        for name, data in attachments.attachments_to_index(message):
            path = scratch / f"attachment-{len(list(scratch.iterdir()))}"
            path.write_bytes(data)
            try:
                extra = attachments.prepare_attachment(self.services, self.index, message, name, path)
            except Exception as exc:  # ApiError included: reported in the log, as the local path's CLI does
                log.warning("attachment %s of %s not indexed: %s", name, message.filename, exc)
                continue
            if isinstance(extra, Prepared):
                out.append(extra)
        return out


def _run(steps: Iterator[str]):
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value


def _result(
    out: dict,
    label: str,
    dataset: str,
    filename: str,
    document_id: str = "",
    chunks: int = 0,
    stage: str = "failed",
    *,
    error: str = "",
    code: str = "",
    overview: str = "",
    fragment: str = "",
    sheets: bytes = b"",
) -> None:
    values = {
        "label": label,
        "dataset": dataset,
        "filename": filename,
        "document_id": document_id,
        "chunks": chunks,
        "stage": stage,
        "error": error,
        "code": code,
        "overview": overview,
        "fragment": fragment,
        "sheets": sheets,
    }
    for key, value in values.items():
        out[key].append(value)


def _node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def _node_settings(settings: Settings, cpus: int) -> Settings:
    """The driver's settings with absolute paths (nodes run elsewhere) and torch threads per actor."""
    return settings.model_copy(
        update={
            "index_store": Path(settings.index_store).resolve(),
            "uploads_dir": Path(settings.uploads_dir).resolve(),
            "torch_threads": cpus,
        }
    )


def connect(address: str | None = None):
    """Join the cluster at `address` (or RAY_ADDRESS); without either, start a local one for this run."""
    import ray

    import rag_worker

    if ray.is_initialized():
        return ray
    env = {k: os.environ[k] for k in _FORWARDED_ENV if k in os.environ}
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    runtime_env = {"py_modules": [str(Path(rag_worker.__file__).parent)], "env_vars": env}
    address = address or os.environ.get("RAY_ADDRESS") or None
    # Our own progress events report the run; Ray Data's progress bars and execution logs would repeat them.
    for name in ("ray", "ray.data"):
        logging.getLogger(name).setLevel(logging.WARNING)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    ray.init(
        address=address,
        runtime_env=runtime_env,
        logging_level=logging.WARNING,
        log_to_driver=False,
        include_dashboard=False if address is None else None,
        configure_logging=False,
    )
    return ray


def index_folder_ray(
    services: Services,
    index: str,
    folder: Path,
    rebuild: bool = False,
    *,
    prune: bool = False,
    address: str | None = None,
    cpus_per_worker: int = 1,
    files_per_batch: int = FILES_PER_BATCH,
    commit_files: int = COMMIT_FILES,
    nodes_seen: set[str] | None = None,
) -> Iterator[Progress | BatchDone]:
    """`pipeline.index_folder` on a Ray cluster: the same files, rules, events and resulting rows.

    Progress is aggregated: one event per file when its result arrives (indexed, unchanged or failed), plus a
    `writing` event per commit. `nodes_seen` (optional) collects the ids of the nodes whose actors wrote rows.
    """
    check_name(index, "index")
    folder = Path(folder)
    if not folder.is_dir():
        raise IngestError("not_found", f"folder {folder} does not exist", field="folder")
    started = time.monotonic()
    options = {
        "address": address,
        "cpus_per_worker": cpus_per_worker,
        "files_per_batch": files_per_batch,
        "commit_files": commit_files,
        "nodes_seen": nodes_seen,
    }

    def index_into(target: str) -> Generator[Progress, None, _Run]:
        return _index_files(services, target, folder, **options)

    if rebuild:
        with services.rebuild_guard(index):
            yield from rebuild_and_swap(services, index, folder, prune, started, index_into)
        return
    yield from index_and_prune(services, index, prune, started, index_into)


def _index_files(
    services: Services,
    target: str,
    folder: Path,
    *,
    address: str | None,
    cpus_per_worker: int,
    files_per_batch: int,
    commit_files: int,
    nodes_seen: set[str] | None,
) -> Iterator[Progress]:
    """Index the folder's files into the table `target` (an index, or a rebuild's new table) across the
    cluster, yielding Progress; returns the run's counters."""
    import lance

    store = services.store
    files, problems = folder_files(folder)
    total = len(files)
    run = _Run(total, problems)

    indexed: dict[tuple[str, str], dict] = {}
    if store.exists(target):
        indexed = {(d["dataset"], d["filename"]): d for d in store.list_documents(target)}

    todo: list[dict] = []
    order: dict[str, int] = {}  # label -> place in the folder's file order (tables are written in it)
    for dataset, path in files:
        label = (
            path.name if dataset == DEFAULT_DATASET and path.parent == folder else f"{dataset}/{path.name}"
        )
        run.seen.add((dataset, path.name))
        if not is_supported(path.name):
            yield run.fail(label, dataset, "unsupported_type", "unsupported file type")
            continue
        known = indexed.get((dataset, path.name))
        if known is not None and known["document_id"] == file_sha256(path):
            yield run.finish(
                label,
                IngestResult(
                    path.name, dataset, known["document_id"], int(known["chunks"]), False, unchanged=True
                ),
            )
            continue
        order[label] = len(order)
        todo.append({"label": label, "dataset": dataset, "path": str(path.resolve())})

    if not todo:
        return run
    # The table exists before any fragment is written into its folder (with the FTS index and marker).
    store.ensure_table(target)
    table_uri = store.table_uri(target)
    ray = connect(address)
    cpus = max(1, int(cpus_per_worker))
    actors = max(1, int(ray.cluster_resources().get("CPU", 1) // cpus))
    actors = min(actors, max(1, -(-len(todo) // files_per_batch)))
    node_settings = _node_settings(services.settings, cpus)
    dataset_plan = ray.data.from_items(todo, override_num_blocks=max(1, -(-len(todo) // files_per_batch)))
    results = dataset_plan.map_batches(
        _Preparer,
        fn_constructor_args=(node_settings, target, table_uri),
        batch_size=files_per_batch,
        batch_format="numpy",
        concurrency=actors,
        num_cpus=cpus,
    )

    pending_fragments: list[str] = []
    pending_entries: list[dict] = []
    pending_replaced: list[tuple[str, str, str]] = []
    # (file order, is an attachment, dataset, filename, sheets, its overview entry): spreadsheets' SQL tables
    pending_sheets: list[tuple[int, bool, str, str, list, dict]] = []

    def commit() -> Iterator[Progress]:
        if not pending_fragments:
            return
        yield Progress(f"{len(pending_entries)} files", run.finished, total, "writing", DEFAULT_DATASET)
        fragments = [lance.fragment.FragmentMetadata.from_json(f) for f in pending_fragments]
        with services.index_lock(target):
            store.commit_fragments(target, fragments)
            store.remove_superseded(target, pending_replaced)
            for *_, ds, name, sheets, entry in sorted(pending_sheets, key=lambda p: p[:2]):
                # SQL tables live under the index's own name, also while a rebuild builds its new table.
                described = tables.store_sheets(
                    services.settings,
                    _served(target),
                    SimpleNamespace(dataset=ds, filename=name, sheets=sheets),
                )
                if described:
                    entry["overview"] = f"{entry['overview']} Tables: {'; '.join(described)}"
            overviews.upsert_overviews(services.settings, target, pending_entries)
        pending_fragments.clear()
        pending_entries.clear()
        pending_replaced.clear()
        pending_sheets.clear()

    since_commit = 0
    for row in results.iter_rows():
        label, dataset, stage = str(row["label"]), str(row["dataset"]), str(row["stage"])
        if row["fragment"]:
            pending_fragments.append(str(row["fragment"]))
        if nodes_seen is not None and stage == "indexed":
            nodes_seen.add(str(row["node"]))
        if stage in ("indexed", "attachment"):
            entry = json.loads(str(row["overview"]))
            pending_entries.append(entry)
            filename, document_id = str(row["filename"]), str(row["document_id"])
            if (dataset, filename) in indexed:
                pending_replaced.append((dataset, filename, document_id))
            if row["sheets"]:
                place = (order.get(label, len(order)), stage == "attachment")
                sheets = pickle.loads(bytes(row["sheets"]))  # written by our own actor
                pending_sheets.append((*place, dataset, filename, sheets, entry))
        if stage == "attachment":  # a document of its own, not a file of the run (as on the local path)
            continue
        if stage == "failed":
            yield run.fail(label, dataset, str(row["code"]), str(row["error"]))
            continue
        result = IngestResult(
            str(row["filename"]), dataset, str(row["document_id"]), int(row["chunks"]), False
        )
        if stage == "unchanged":
            result.unchanged = True
        else:
            since_commit += 1
        yield run.finish(label, result)
        if since_commit >= commit_files:
            yield from commit()
            since_commit = 0
    yield from commit()
    return run


__all__ = ["available", "connect", "index_folder_ray"]
