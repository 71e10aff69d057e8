"""Incremental sync of a source (a server folder, an S3-compatible bucket and prefix) into an index.

Shared by both services: the worker's CLI (`python -m rag_worker sync FOLDER --index X`) syncs into its own
store, the gateway's sync jobs into a worker over HTTP. Each gives `sync` a `Target` (what the index holds, and
how to add and remove one document) and a `StateStore` (what earlier runs of this source recorded); the
listing, the comparison and the bookkeeping are here, once.

A run:

1. lists the source (`FolderSource`: `os.scandir`, `stat`; `S3Source`: `list_objects_v2`). The layout is the
   `index` command's: files at the top go to dataset "default", each subfolder (key prefix) is a dataset;
   deeper folders, badly named datasets, symlinks leading out of the folder and unsupported files are
   per-file problems;
2. passes over a file without reading it when its size and stamp (mtime in nanoseconds; S3: ETag and
   LastModified) are the ones recorded and the index still holds the recorded hash under its name;
3. otherwise reads it, hashes it (sha256, the index's document id) and adds it (not in the index), re-indexes
   it (the index holds another version this source wrote) or leaves it as unchanged (same bytes);
4. removes the documents of files no longer listed, but only documents this source wrote and that still hold
   the bytes it wrote: a document uploaded by hand is never removed, nor replaced (a source file whose name an
   uploaded document already has is a per-file `name_taken` error).

A file that cannot be read, converted or fetched is a per-file error and the run goes on. When the listing
itself fails (the folder is gone, the bucket refuses the credentials) nothing is added or removed.

A file the index refused for a reason that lasts (a type it cannot read, a file that does not convert, one too
large: a SyncError with `lasting`) is remembered with its size, stamp and hash: later runs report it as failed
with the same error without reading or sending it again, until it changes (another size or stamp and other
bytes). A failure that may pass (the worker unreachable, the file unreadable) is tried again at every run.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Protocol

DEFAULT_DATASET = "default"
# State is written after this many changes (and at the end of a run), so a killed run keeps most of its
# bookkeeping without rewriting the whole record after every file.
SAVE_EVERY = 50


class SyncError(Exception):
    """One file could not be synced: `code` (machine-readable) and a message saying why."""

    def __init__(self, code: str, message: str, *, lasting: bool = False):
        super().__init__(message)
        self.code = code
        self.message = message
        # True when sending the same bytes again would fail the same way (the type is unsupported, the file
        # does not convert): the run remembers the failure and does not try the file again until it changes.
        self.lasting = lasting


@dataclass(frozen=True)
class Entry:
    """A file as the source lists it: its path relative to the source (posix), size and change stamp."""

    path: str
    size: int
    stamp: str


@dataclass(frozen=True)
class Problem:
    """Something the listing could not use (a file or a folder), with the reason."""

    path: str
    code: str
    error: str


class Source(Protocol):
    key: str  # what identifies the source in the index's bookkeeping

    def entries(self) -> Iterator[Entry | Problem]:
        """Every file (and problem), in a stable order. Raises SyncError when the source cannot be listed."""
        ...

    def local(self, entry: Entry):
        """A context manager giving a local path holding the file's bytes (raises SyncError)."""
        ...


class Target(Protocol):
    def documents(self) -> dict[tuple[str, str], str]:
        """(dataset, filename) -> document id (sha256 of the bytes) of every document of the index."""
        ...

    def check(self, dataset: str, filename: str) -> tuple[str, str]:
        """The (dataset, filename) the index keeps a file under (a name normalised); raises SyncError when the
        dataset or file name cannot be indexed."""
        ...

    def supported(self, filename: str) -> bool: ...

    def add(self, dataset: str, filename: str, path: Path) -> None:
        """Index the file under (dataset, filename), replacing what the name held; raises SyncError."""
        ...

    def remove(self, dataset: str, filename: str) -> None: ...


class StateStore(Protocol):
    def load(self) -> dict[str, dict]: ...

    def save(self, state: dict[str, dict]) -> None: ...


@dataclass
class FileEvent:
    """One file's outcome: `stage` is added, changed, removed, unchanged or failed."""

    file: str
    stage: str
    done: int
    total: int
    dataset: str = DEFAULT_DATASET
    code: str | None = None
    error: str | None = None
    # False for a file that failed in an earlier run and has not changed since: not read nor sent again.
    tried: bool | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class Summary:
    added: int = 0
    changed: int = 0
    removed: int = 0
    unchanged: int = 0
    failed: list[dict] = field(default_factory=list)
    failed_unchanged: int = 0  # of `failed`: files that failed before, unchanged since, not tried again
    hashed: int = 0  # files read and hashed this run (the others were passed over on size and stamp)
    seconds: float = 0.0
    listed: bool = True  # False when the source could not be listed (nothing was added or removed)

    def to_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        return (
            f"added {self.added}, changed {self.changed}, removed {self.removed}, "
            f"unchanged {self.unchanged}, failed {len(self.failed)}"
            + (f" ({self.failed_unchanged} unchanged since they failed)" if self.failed_unchanged else "")
            + f" in {self.seconds:.1f} s"
        )


def place(path: str) -> tuple[str, str] | None:
    """(dataset, filename) of a source path: `name` and `default/name` are dataset "default"'s; `ds/name` is
    dataset ds's; None for a deeper path."""
    parts = PurePosixPath(path).parts
    if len(parts) == 1:
        return DEFAULT_DATASET, parts[0]
    if len(parts) == 2:
        return parts[0], parts[1]
    return None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sync(
    source: Source,
    target: Target,
    state_store: StateStore,
    *,
    should_stop: Callable[[], bool] | None = None,
) -> Iterator[FileEvent | Summary]:
    """Sync `source` into `target`: a FileEvent per file that is not unchanged-by-stamp (those come as one
    count), then one Summary. `should_stop` is asked between files; when true the run ends there (what it did
    is recorded)."""
    started = time.monotonic()
    summary = Summary()
    state = state_store.load()
    try:
        listing = list(source.entries())
    except SyncError as err:
        summary.listed = False
        summary.failed.append({"file": "", "code": err.code, "error": err.message})
        summary.seconds = round(time.monotonic() - started, 3)
        yield summary
        return
    docs = target.documents()
    total = len(listing)
    done = 0
    dirty = 0
    seen: dict[tuple[str, str], str] = {}  # key -> the path that gave it (two paths can name one document)
    listed_paths: set[str] = set()
    new_state: dict[str, dict] = {}
    blocked: list[str] = []  # paths the listing could not read: what earlier runs wrote under them stays

    def fail(path: str, dataset: str, code: str, error: str, tried: bool | None = None) -> FileEvent:
        summary.failed.append({"file": path, "code": code, "error": error})
        if tried is False:
            summary.failed[-1]["tried"] = False
            summary.failed_unchanged += 1
        return FileEvent(path, "failed", done, total, dataset, code, error, tried)

    def still_failing(path: str, dataset: str, record: dict, failure: dict) -> FileEvent:
        new_state[path] = record
        return fail(
            path, dataset, str(failure.get("code") or "failed"), str(failure.get("error") or ""), False
        )

    try:
        for item in listing:
            if should_stop is not None and should_stop():
                break
            done += 1
            if isinstance(item, Problem):
                blocked.append(item.path)
                yield fail(item.path, DEFAULT_DATASET, item.code, item.error)
                continue
            listed_paths.add(item.path)
            where = place(item.path)
            if where is None:
                yield fail(item.path, DEFAULT_DATASET, "nested_folder", "datasets are one level deep")
                continue
            try:
                dataset, filename = target.check(*where)
            except SyncError as err:
                yield fail(item.path, where[0], err.code, err.message)
                continue
            if not target.supported(filename):
                if not filename.startswith("."):
                    yield fail(item.path, dataset, "unsupported_type", "unsupported file type")
                continue
            key = (dataset, filename)
            if key in seen:
                yield fail(item.path, dataset, "duplicate", f"{seen[key]} already names this document")
                continue
            seen[key] = item.path
            record = state.get(item.path)
            have = docs.get(key)
            if (
                record is not None
                and record.get("size") == item.size
                and record.get("stamp") == item.stamp
                and have is not None
                and have == record.get("sha256")
            ):
                summary.unchanged += 1  # nothing read: size and stamp are the ones recorded
                new_state[item.path] = record
                continue
            failure = (record or {}).get("failure")
            if failure and failure.get("size") == item.size and failure.get("stamp") == item.stamp:
                yield still_failing(item.path, dataset, record, failure)  # nothing read nor sent
                continue
            ours = record is not None and have is not None and have == record.get("sha256")
            digest = None
            try:
                with source.local(item) as local:
                    digest = sha256_of(local)
                    summary.hashed += 1
                    if failure and failure.get("sha256") == digest and have != digest:
                        # Touched, not changed: the bytes that failed. Not sent again.
                        record = {**record, "failure": {**failure, "size": item.size, "stamp": item.stamp}}
                        dirty += 1
                        yield still_failing(item.path, dataset, record, record["failure"])
                        continue
                    if have == digest:
                        # Same bytes under that name: this file (an earlier run's, or a run cut short before
                        # its bookkeeping was saved).
                        summary.unchanged += 1
                        new_state[item.path] = _record(item, digest, key)
                        dirty += 1
                        yield FileEvent(item.path, "unchanged", done, total, dataset)
                        continue
                    if have is not None and not ours:
                        yield fail(
                            item.path,
                            dataset,
                            "name_taken",
                            f"the index holds a document '{filename}' in dataset '{dataset}' that this source "
                            "did not write (uploaded by hand?); it is left as it is",
                        )
                        continue
                    target.add(dataset, filename, local)
            except SyncError as err:
                if ours:
                    new_state[item.path] = record  # still the document this source wrote
                if err.lasting:
                    base = record if ours else {"size": -1, "stamp": "", "sha256": "", "dataset": dataset}
                    base = {**base, "filename": base.get("filename") or filename}
                    new_state[item.path] = {
                        **base,
                        "failure": {
                            "size": item.size,
                            "stamp": item.stamp,
                            "sha256": digest or "",
                            "code": err.code,
                            "error": err.message,
                        },
                    }
                    dirty += 1
                yield fail(item.path, dataset, err.code, err.message)
                continue
            except OSError as err:
                if ours:
                    new_state[item.path] = record
                yield fail(item.path, dataset, "unreadable", f"cannot read the file: {err.strerror or err}")
                continue
            new_state[item.path] = _record(item, digest, key)
            dirty += 1
            docs[key] = digest
            if have is None:
                summary.added += 1
                yield FileEvent(item.path, "added", done, total, dataset)
            else:
                summary.changed += 1
                yield FileEvent(item.path, "changed", done, total, dataset)
            if dirty >= SAVE_EVERY:
                state_store.save({**state, **new_state})
                dirty = 0
        else:
            # The listing was walked to its end: what it no longer has is removed, if this source wrote it.
            for path, record in state.items():
                if path in listed_paths:
                    continue
                key = (record.get("dataset"), record.get("filename"))
                if key in seen:
                    continue  # another path of this listing names that document now
                if any(path == b or path.startswith(b + "/") for b in blocked):
                    new_state[path] = record
                    continue
                if docs.get(key) == record.get("sha256"):
                    try:
                        target.remove(*key)
                    except SyncError as err:
                        new_state[path] = record  # try again next run
                        yield fail(path, key[0], err.code, err.message)
                        continue
                    summary.removed += 1
                    yield FileEvent(path, "removed", done, total, key[0])
                # else: the document is gone, or was replaced by an upload: forget the record, keep the document
            state = {}
        # Cut short (should_stop): records of files not reached yet stay as they were.
        state_store.save({**state, **new_state})
    except BaseException:
        state_store.save({**state, **new_state})
        raise
    summary.seconds = round(time.monotonic() - started, 3)
    yield summary


def _record(entry: Entry, digest: str, key: tuple[str, str]) -> dict:
    return {
        "size": entry.size,
        "stamp": entry.stamp,
        "sha256": digest,
        "dataset": key[0],
        "filename": key[1],
    }


def run_to_end(events: Iterator[FileEvent | Summary], on_event: Callable[[FileEvent], None] | None = None):
    """Drive `sync` to its Summary, passing each FileEvent to `on_event`."""
    for event in events:
        if isinstance(event, Summary):
            return event
        if on_event is not None:
            on_event(event)
    raise RuntimeError("sync ended without a summary")


# ---------------------------------------------------------------------------------------------- roots


def parse_roots(value: str | list | tuple | None) -> tuple[Path, ...]:
    """SYNC_ROOTS: absolute folders separated by `:` (or a list); each is resolved (symlinks followed)."""
    if value is None or value == "":
        return ()
    items = value.split(os.pathsep) if isinstance(value, str) else list(value)
    roots = []
    for item in items:
        text = str(item).strip()
        if not text:
            continue
        path = Path(text)
        if not path.is_absolute():
            raise ValueError(f"SYNC_ROOTS: {text!r} is not an absolute path")
        roots.append(Path(os.path.realpath(path)))
    return tuple(roots)


def root_problem(folder: str | Path, roots: tuple[Path, ...]) -> str | None:
    """Why `folder` may not be synced under `roots` (None when it may): it must be an absolute path that,
    symlinks followed, lies inside one of them."""
    text = str(folder)
    if "\x00" in text:
        return "the folder path holds a NUL character"
    path = Path(text)
    if not path.is_absolute():
        return "the folder must be an absolute path"
    if not roots:
        return "no folder may be synced: the operator has set no SYNC_ROOTS"
    real = Path(os.path.realpath(path))
    if not any(real == root or root in real.parents for root in roots):
        return "the folder is outside the allowed roots (SYNC_ROOTS)"
    return None


# ---------------------------------------------------------------------------------------------- folder


class FolderSource:
    """A server folder, listed with os.scandir; a file's stamp is its mtime in nanoseconds."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.real = Path(os.path.realpath(self.folder))
        self.key = f"folder:{self.real}"

    def entries(self) -> Iterator[Entry | Problem]:
        try:
            top = sorted(os.scandir(self.real), key=lambda e: e.name)
        except OSError as err:
            raise SyncError(
                "source_unreachable", f"cannot list {self.folder}: {err.strerror or err}"
            ) from err
        for entry in top:
            yield from self._entry(entry, entry.name, depth=0)

    def _entry(self, entry: os.DirEntry, rel: str, depth: int) -> Iterator[Entry | Problem]:
        try:
            if entry.is_symlink():
                real = Path(os.path.realpath(entry.path))
                if not (real == self.real or self.real in real.parents):
                    yield Problem(rel, "symlink_escapes", "a symlink to outside the synced folder: skipped")
                    return
            st = entry.stat()  # follows a symlink that stays inside
        except OSError as err:
            yield Problem(rel, "unreadable", f"cannot stat: {err.strerror or err}")
            return
        if stat.S_ISREG(st.st_mode):
            yield Entry(rel, st.st_size, str(st.st_mtime_ns))
            return
        if not stat.S_ISDIR(st.st_mode) or entry.name.startswith("."):
            return  # sockets, devices, hidden folders
        if depth >= 1:
            yield Problem(rel, "nested_folder", "folder skipped: datasets are one level deep")
            return
        try:
            inner = sorted(os.scandir(entry.path), key=lambda e: e.name)
        except OSError as err:
            yield Problem(rel, "unreadable", f"cannot list the folder: {err.strerror or err}")
            return
        for sub in inner:
            yield from self._entry(sub, f"{rel}/{sub.name}", depth + 1)

    @contextmanager
    def local(self, entry: Entry):
        path = self.real / entry.path
        real = Path(os.path.realpath(path))
        if self.real not in real.parents:  # swapped for a symlink since the listing
            raise SyncError("symlink_escapes", "a symlink to outside the synced folder: skipped")
        yield real


# ---------------------------------------------------------------------------------------------- S3


class S3Source:
    """An S3-compatible bucket and prefix, read with boto3; a file's stamp is its ETag and LastModified."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        max_bytes: int | None = None,
    ):
        self.bucket = bucket
        self.prefix = prefix.lstrip("/")
        if self.prefix and not self.prefix.endswith("/"):
            self.prefix += "/"
        self.endpoint_url = endpoint_url
        self.max_bytes = max_bytes
        self.key = f"s3:{endpoint_url or 'aws'}/{bucket}/{self.prefix}"
        import boto3
        from botocore.config import Config

        self.client = boto3.client(
            "s3",
            endpoint_url=endpoint_url or None,
            region_name=region or "us-east-1",
            aws_access_key_id=access_key or None,
            aws_secret_access_key=secret_key or None,
            config=Config(
                retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=10, read_timeout=60
            ),
        )

    def entries(self) -> Iterator[Entry | Problem]:
        from botocore.exceptions import BotoCoreError, ClientError

        items: list[Entry] = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.prefix
            )
            for page in pages:
                for obj in page.get("Contents", []):
                    key = obj["Key"]
                    rel = key[len(self.prefix) :]
                    if not rel or rel.endswith("/"):
                        continue  # the prefix itself, folder markers
                    parts = PurePosixPath(rel).parts
                    if any(p in ("", ".", "..") for p in rel.split("/")) or any(
                        p.startswith(".") for p in parts[:-1]
                    ):
                        continue  # hidden "folders", and keys no file system would give
                    stamp = f"{obj.get('ETag', '')}|{obj['LastModified'].isoformat()}"
                    items.append(Entry(rel, int(obj.get("Size", 0)), stamp))
        except ClientError as err:
            code = err.response.get("Error", {}).get("Code", "error")
            raise SyncError(
                "source_unreachable", f"the bucket refused the listing: {code}: {_client_message(err)}"
            ) from err
        except BotoCoreError as err:
            raise SyncError("source_unreachable", f"cannot reach the bucket: {err}") from err
        yield from sorted(items, key=lambda e: e.path)

    @contextmanager
    def local(self, entry: Entry):
        from botocore.exceptions import BotoCoreError, ClientError

        if self.max_bytes is not None and entry.size > self.max_bytes:
            raise SyncError(
                "too_large", f"the object is {entry.size} bytes, over the limit of {self.max_bytes}"
            )
        folder = tempfile.mkdtemp(prefix="rag-sync-")
        try:
            path = Path(folder) / PurePosixPath(entry.path).name
            try:
                self.client.download_file(self.bucket, self.prefix + entry.path, str(path))
            except ClientError as err:
                code = err.response.get("Error", {}).get("Code", "error")
                raise SyncError("fetch_failed", f"the bucket refused the object: {code}") from err
            except BotoCoreError as err:
                raise SyncError("fetch_failed", f"cannot fetch the object: {err}") from err
            yield path
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def _client_message(err) -> str:
    return str(err.response.get("Error", {}).get("Message", ""))[:200]


# ---------------------------------------------------------------------------------------------- state


class JsonState:
    """A source's records in a JSON file, written atomically (a temporary file renamed over it), 0600."""

    def __init__(self, path: Path, source_key: str):
        self.path = Path(path)
        self.source_key = source_key

    def load(self) -> dict[str, dict]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        if data.get("source") != self.source_key:
            return {}
        return dict(data.get("files") or {})

    def save(self, state: dict[str, dict]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".sync-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"source": self.source_key, "files": state}, fh, separators=(",", ":"))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


class MemoryState:
    """Records kept by the caller (the gateway keeps them in its database)."""

    def __init__(self, state: dict[str, dict] | None = None, on_save: Callable[[dict], None] | None = None):
        self.state = dict(state or {})
        self.on_save = on_save

    def load(self) -> dict[str, dict]:
        return dict(self.state)

    def save(self, state: dict[str, dict]) -> None:
        self.state = dict(state)
        if self.on_save is not None:
            self.on_save(self.state)
