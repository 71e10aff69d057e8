"""`--engine ray`: index a folder across a Ray cluster, into the same LanceDB table the local path writes.

The local path (`folder.index_folder`) converts, chunks and embeds in one process. Here those steps run as a
Ray Data `map_batches` over actors spread across the cluster's nodes; each actor builds the same parts the
local path builds (Docling converter with the same limits, the chunker on the embedder's tokenizer, the
embedder), prepares its files with the same function (`document.prepare_steps`: file rules, limits, errors),
builds the same rows (`document.document_rows`) and writes them as a Lance fragment straight into the index's
table folder. The driver only sees small per-file results: it reports progress as they stream in and commits
the written fragments with one Lance `Append` per group of files (`RAY_COMMIT_FILES`), so a crash loses at most
the group in flight and never leaves half a document: a document's rows are in one fragment, and a fragment
is visible only once its commit lands. A document whose bytes changed keeps its old rows until its new ones
are committed; they are deleted right after, in one delete per group. A re-run skips documents whose bytes are
already indexed under their name, as the local path does. `--rebuild` builds into a new table and swaps it in
when complete, through the local path's own code (`rebuild.rebuild_and_swap`): a rebuild that fails leaves the index as it was.
The folder is walked by the loop both engines share (`folder.index_files`: names, types, unchanged files); this
engine (`RayEngine`) supplies how the files left are converted, embedded and written.

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
from collections.abc import Generator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from ..errors import ApiError
from . import attachments, overviews
from .document import document_rows, overview_entry, prepare_attachment, prepare_steps, store_tables
from .folder import index_files, run_folder
from .memory import release_free_memory
from .records import (
    DEFAULT_DATASET,
    BatchDone,
    FileJob,
    IngestResult,
    Prepared,
    Progress,
    Run,
    internal_error,
    run_steps,
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
        prepared = self._prepare_files(batch, out, scratch)
        if prepared:
            self._write_fragment(prepared, out, lance)

    def _prepare_files(self, batch: dict, out: dict, scratch: Path) -> list[tuple[str, Prepared, bool]]:
        """Convert and chunk the batch's files (failures and no-ops go straight to `out`); [(label, prepared, is
        an e-mail attachment)], attachments after their message."""
        prepared: list[tuple[str, Prepared, bool]] = []
        for label, dataset, name in zip(batch["label"], batch["dataset"], batch["path"], strict=True):
            path = Path(name)
            try:
                outcome = run_steps(prepare_steps(self.services, self.index, dataset, path, path.name))
            except ApiError as err:
                _result(out, label, dataset, path.name, stage="failed", error=err.message, code=err.code)
                continue
            except Exception as exc:  # one bad file never stops the batch (as on the local path)
                log.exception("indexing %s failed", label)
                message = internal_error(exc)
                _result(out, label, dataset, path.name, stage="failed", error=message, code="internal")
                continue
            if isinstance(outcome, IngestResult):  # indexed meanwhile by someone else: nothing to write
                _result(
                    out, label, dataset, outcome.filename, outcome.document_id, outcome.chunks, "unchanged"
                )
                continue
            prepared.append((label, outcome, False))
            prepared.extend((label, extra, True) for extra in self._attachments(outcome, scratch))
        return prepared

    def _write_fragment(self, prepared: list[tuple[str, Prepared, bool]], out: dict, lance) -> None:
        """Embed the prepared files together and write their rows as one Lance fragment (committed by the
        driver); one result in `out` per file, the fragment on the first."""
        texts = [c.embed_text for _, prep, _ in prepared for c in prep.chunks]
        vectors = self.services.store.embedder_for(self.index).embed_documents(texts)
        now = datetime.now(UTC).isoformat(timespec="seconds")
        rows: list[dict] = []
        offset = 0
        entries: list[str] = []
        for _, prep, _ in prepared:
            part = vectors[offset : offset + len(prep.chunks)]
            offset += len(prep.chunks)
            rows.extend(document_rows(prep, part, now))
            entries.append(json.dumps(overview_entry(self.services, prep, now), ensure_ascii=False))
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
        """The message's attachments prepared as their own documents (as `document.ingest_attachments` does
        on the local path); one that fails is logged and never fails its message."""
        out = []
        limit = self.services.settings.max_attachments_per_message
        indexed, skipped = attachments.split_at(attachments.attachments_to_index(message), limit)
        if skipped:
            log.warning(
                "%s: %d attachment(s) %s", message.filename, len(skipped), attachments.skipped_reason(limit)
            )
        for name, data in indexed:
            path = scratch / f"attachment-{len(list(scratch.iterdir()))}"
            path.write_bytes(data)
            try:
                extra = prepare_attachment(self.services, self.index, message, name, path)
            except Exception as exc:  # ApiError included: reported in the log, as the local path's CLI does
                log.warning("attachment %s of %s not indexed: %s", name, message.filename, exc)
                continue
            if isinstance(extra, Prepared):
                out.append(extra)
        return out


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
    """`folder.index_folder` on a Ray cluster: the same files, rules, events and resulting rows.

    Progress is aggregated: one event per file when its result arrives (indexed, unchanged or failed), plus a
    `writing` event per commit. `nodes_seen` (optional) collects the ids of the nodes whose actors wrote rows.
    """
    folder = Path(folder)
    options = {
        "address": address,
        "cpus_per_worker": cpus_per_worker,
        "files_per_batch": files_per_batch,
        "commit_files": commit_files,
        "nodes_seen": nodes_seen,
    }

    def index_into(target: str) -> Generator[Progress, None, Run]:
        return index_files(services, target, folder, RayEngine(services, target, **options))

    yield from run_folder(services, index, folder, rebuild, prune, index_into)


class RayEngine:
    """`folder.index_files` across the cluster: the files to index are handed to actors (`_Preparer`) once the
    folder is walked; the fragments they write are committed every `commit_files` files."""

    def __init__(
        self,
        services: Services,
        target: str,
        *,
        address: str | None,
        cpus_per_worker: int,
        files_per_batch: int,
        commit_files: int,
        nodes_seen: set[str] | None,
    ):
        self.services = services
        self.target = target
        self.address = address
        self.cpus = max(1, int(cpus_per_worker))
        self.files_per_batch = files_per_batch
        self.commit_files = commit_files
        self.nodes_seen = nodes_seen
        self.todo: list[dict] = []
        self.order: dict[
            str, int
        ] = {}  # label -> place in the folder's file order (tables are written in it)

    def take(self, run: Run, job: FileJob) -> Iterator[Progress]:
        self.order[job.label] = len(self.order)
        self.todo.append({"label": job.label, "dataset": job.dataset, "path": str(job.path.resolve())})
        yield from ()

    def drain(self, run: Run) -> Iterator[Progress]:
        if not self.todo:
            return
        pending = _Pending(self.services, self.target)
        since_commit = 0
        for row in self._results():
            label, dataset, stage = str(row["label"]), str(row["dataset"]), str(row["stage"])
            if self.nodes_seen is not None and stage == "indexed":
                self.nodes_seen.add(str(row["node"]))
            replaces = (dataset, str(row["filename"])) in run.indexed
            pending.add(row, self.order.get(label, len(self.order)), replaces)
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
            if since_commit >= self.commit_files:
                yield from pending.commit(run)
                since_commit = 0
        yield from pending.commit(run)

    def _results(self) -> Iterator[dict]:
        """Start the actors on the files to index; their per-file result rows, as they stream in."""
        store = self.services.store
        # The table exists before any fragment is written into its folder (with the FTS index and marker).
        store.ensure_table(self.target)
        table_uri = store.table_uri(self.target)
        ray = connect(self.address)
        blocks = max(1, -(-len(self.todo) // self.files_per_batch))
        actors = max(1, int(ray.cluster_resources().get("CPU", 1) // self.cpus))
        actors = min(actors, blocks)
        node_settings = _node_settings(self.services.settings, self.cpus)
        plan = ray.data.from_items(self.todo, override_num_blocks=blocks)
        results = plan.map_batches(
            _Preparer,
            fn_constructor_args=(node_settings, self.target, table_uri),
            batch_size=self.files_per_batch,
            batch_format="numpy",
            concurrency=actors,
            num_cpus=self.cpus,
        )
        return results.iter_rows()


class _Pending:
    """What the actors wrote since the last commit: fragments, overview entries, the documents their new rows
    replace, spreadsheets' sheets (SQL tables)."""

    def __init__(self, services: Services, target: str):
        self.services = services
        self.target = target
        self.fragments: list[str] = []
        self.entries: list[dict] = []
        self.replaced: list[tuple[str, str, str]] = []
        # (file order, is an attachment, dataset, filename, sheets, its overview entry)
        self.sheets: list[tuple[int, bool, str, str, list, dict]] = []

    def add(self, row: dict, place: int, replaces: bool) -> None:
        """One result row; `place`: its file's place in the folder's order; `replaces`: its name was indexed."""
        stage = str(row["stage"])
        if row["fragment"]:
            self.fragments.append(str(row["fragment"]))
        if stage not in ("indexed", "attachment"):
            return
        entry = json.loads(str(row["overview"]))
        self.entries.append(entry)
        dataset, filename, document_id = str(row["dataset"]), str(row["filename"]), str(row["document_id"])
        if replaces:
            self.replaced.append((dataset, filename, document_id))
        if row["sheets"]:
            sheets = pickle.loads(bytes(row["sheets"]))  # written by our own actor
            self.sheets.append((place, stage == "attachment", dataset, filename, sheets, entry))

    def commit(self, run: Run) -> Iterator[Progress]:
        """Commit the pending fragments in one Lance `Append`, remove the rows they replace, write the SQL tables
        (in the folder's file order) and the overviews, under the index's write lock."""
        import lance

        if not self.fragments:
            return
        yield Progress(f"{len(self.entries)} files", run.finished, run.total, "writing", DEFAULT_DATASET)
        fragments = [lance.fragment.FragmentMetadata.from_json(f) for f in self.fragments]
        services, target, store = self.services, self.target, self.services.store
        with services.index_lock(target):
            store.commit_fragments(target, fragments)
            store.remove_superseded(target, self.replaced)
            for *_, ds, name, sheets, entry in sorted(self.sheets, key=lambda p: p[:2]):
                store_tables(
                    services, target, SimpleNamespace(dataset=ds, filename=name, sheets=sheets), entry
                )
            overviews.upsert_overviews(services.settings, target, self.entries)
        self.fragments.clear()
        self.entries.clear()
        self.replaced.clear()
        self.sheets.clear()


__all__ = ["available", "connect", "index_folder_ray"]
