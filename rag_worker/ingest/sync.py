"""`python -m rag_worker sync FOLDER --index NAME`: a folder kept in step with an index (contract/sync.py).

The worker's side of the sync: `StoreTarget` adds and removes documents in this process's store (an added file
is indexed as `/add_document` indexes it, a removed one as `DELETE /documents` removes it), and each source's
records are kept beside the index's uploads: `UPLOADS_DIR/<index>/.sync/<source>.json` (a hidden folder, which
`index --prune` passes over; dropping the index with its uploads drops them too). A second sync of the same
folder into the same index while one runs is refused (an flock on the records).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import logging
import os
import sys
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from contract.sync import FileEvent, FolderSource, JsonState, Summary, SyncError, root_problem, sync

from ..errors import ApiError, EmbedderMismatch
from ..names import check_filename, check_name
from ..services import Services as _Services
from .formats import is_supported
from .records import internal_error

if TYPE_CHECKING:  # pragma: no cover
    from ..services import Services

log = logging.getLogger(__name__)


class StoreTarget:
    """An index of this process's store as a sync target."""

    def __init__(self, services: Services, index: str):
        self.services = services
        self.index = check_name(index, "index")
        self.checked = False  # the index's embedder against this worker's (EmbedderMismatch)

    def documents(self) -> dict[tuple[str, str], str]:
        store = self.services.store
        if not store.exists(self.index):
            return {}
        return {(d["dataset"], d["filename"]): d["document_id"] for d in store.list_documents(self.index)}

    def check(self, dataset: str, filename: str) -> tuple[str, str]:
        try:
            return check_name(dataset, "dataset"), check_filename(filename)
        except ApiError as err:
            raise SyncError(err.code, err.message) from err

    def supported(self, filename: str) -> bool:
        return is_supported(filename)

    def add(self, dataset: str, filename: str, path: Path) -> None:
        # Docling and transformers: only a run that indexes pays their import.
        from .document import ingest_file

        if not self.checked:  # before the first write (not before the run: that loads the embedder)
            if self.services.store.exists(self.index):
                self.services.store.check_compatible(self.index)
            self.checked = True
        try:
            ingest_file(self.services, self.index, dataset, path, filename)
        except EmbedderMismatch:
            raise  # the whole index, not this file: the run ends
        except ApiError as err:
            # A 4xx (no text in it, it does not convert, too large) fails again on the same bytes.
            lasting = 400 <= err.status < 500 and err.status not in (408, 409, 429)
            raise SyncError(err.code, err.message, lasting=lasting) from err
        except OSError as err:
            raise SyncError("unreadable", f"cannot read the file: {err.strerror or err}") from err
        except Exception as exc:  # one bad file never stops the run
            log.exception("syncing %s/%s failed", dataset, filename)
            raise SyncError("internal", internal_error(exc)) from exc

    def remove(self, dataset: str, filename: str) -> None:
        from .removal import delete_document

        try:
            delete_document(self.services, self.index, dataset, filename)
        except ApiError as err:
            raise SyncError(err.code, err.message) from err


class _DeferredEmbedder:
    """The default embedder, loaded on first use: a sync that finds nothing changed never embeds, and loading it
    (torch, transformers, the model) was most of a cron run's time (bench/sync.py)."""

    def __init__(self, services: _Services):
        self._services = services

    def __getattr__(self, name: str):
        return getattr(self._services.embedder, name)


class SyncServices(_Services):
    """The worker's services for the sync CLI: a store whose default embedder is loaded when a file is indexed."""

    @cached_property
    def store(self):
        from ..embedders import DEFAULT, check_name
        from ..store import Store

        deferred = _DeferredEmbedder(self)

        def embedders(name: str | None):
            return deferred if check_name(name) == DEFAULT else self.embedder_named(name)

        return Store.from_settings(self.settings, deferred, embedders=embedders)


def state_path(services: Services, index: str, source_key: str) -> Path:
    digest = hashlib.sha256(source_key.encode("utf-8")).hexdigest()[:24]
    return services.settings.uploads_dir / check_name(index, "index") / ".sync" / f"{digest}.json"


@contextmanager
def exclusive(path: Path):
    """Hold an flock on `<records>.lock`; SyncError `busy` when another run holds it."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(str(path) + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as err:
            raise SyncError("busy", "another sync of this folder into this index is running") from err
        yield
    finally:
        os.close(fd)


def sync_folder(services: Services, index: str, folder: Path):
    """Sync `folder` into `index`: contract.sync's events (FileEvent..., Summary). Raises SyncError (the folder
        is outside SYNC_ROOTS, or busy), EmbedderMismatch (the index was built with another embedder: at the first
    file to index, so a run that finds nothing to do never loads the embedder)."""
    index = check_name(index, "index")
    roots = services.settings.sync_roots
    if roots:
        problem = root_problem(Path(folder).absolute(), roots)
        if problem:
            raise SyncError("outside_roots", problem)
    if not Path(folder).is_dir():
        raise SyncError("not_found", f"folder {folder} does not exist")
    source = FolderSource(Path(folder).absolute())
    path = state_path(services, index, source.key)
    with exclusive(path):
        for event in sync(source, StoreTarget(services, index), JsonState(path, source.key)):
            changed = isinstance(event, Summary) and (event.added or event.changed or event.removed)
            if changed and services.store.exists(index):  # the FTS index and fragments, once per run
                with services.index_lock(index):
                    services.store.optimize(index)
            yield event


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rag_worker sync",
        description="Keep an index in step with a folder: add new files, re-index changed ones, remove the "
        "documents of deleted ones (only documents this folder's syncs wrote). Files at the folder's top go to "
        "dataset 'default', each subfolder is a dataset. Unchanged files (same size and mtime) are not read.",
    )
    parser.add_argument("folder", type=Path)
    parser.add_argument("--index", default="default", help="index (table) name, default 'default'")
    parser.add_argument("--quiet", action="store_true", help="only the summary and the failures")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from .cli import ingest_settings

    try:
        check_name(args.index, "index")
    except ApiError as err:
        print(f"error: {err.message}", file=sys.stderr)
        return 2
    services = SyncServices(ingest_settings())
    summary: Summary | None = None
    try:
        for event in sync_folder(services, args.index, args.folder):
            if isinstance(event, Summary):
                summary = event
            elif isinstance(event, FileEvent):
                _show(event, args.quiet)
    except SyncError as err:
        print(f"error: {err.message}", file=sys.stderr)
        return 2
    except ApiError as err:
        print(f"error: {err.message}", file=sys.stderr)
        return 2
    assert summary is not None
    if not summary.listed:
        for problem in summary.failed:
            print(f"error: {problem['error']}", file=sys.stderr)
        return 2
    print(f"index '{args.index}': {summary.line()}")
    return 1 if summary.failed else 0


def _show(event: FileEvent, quiet: bool) -> None:
    if event.stage == "failed":
        again = " (unchanged since it failed: not converted again)" if event.tried is False else ""
        print(f"failed: {event.file}: {event.error}{again}", file=sys.stderr)
    elif not quiet:
        print(f"{event.stage}: {event.file}")
