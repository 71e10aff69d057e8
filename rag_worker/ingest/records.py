"""What ingestion passes around and reports: a file's result, a batch's progress and end, a prepared file, the
counters of a folder run."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:  # pragma: no cover
    from .chunk import Chunk

DEFAULT_DATASET = "default"

T = TypeVar("T")


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


@dataclass
class FileJob:
    """A file of a folder run that needs indexing: its name checked, its bytes (`document_id`, their hash) not
    indexed under that name yet."""

    label: str  # how progress names it: `name` at the folder's top level, else `dataset/name`
    dataset: str
    path: Path
    name: str
    document_id: str


class Run:
    """Counters of one folder run, shared by its steps; `indexed` is what the table held when the run started,
    {(dataset, filename): document}."""

    def __init__(self, total: int, problems: list[dict], indexed: dict[tuple[str, str], dict]):
        self.total = total
        self.indexed = indexed
        self.finished = 0
        self.documents = 0
        self.chunks = 0
        self.unchanged = 0
        self.failed = list(problems)
        self.seen: set[tuple[str, str]] = set()  # (dataset, name) of every file found, indexed or not

    def fail(self, label: str, dataset: str, code: str, message: str) -> Progress:
        from .. import metrics

        metrics.ingest_failed(label, code)
        self.finished += 1
        self.failed.append({"file": label, "code": code, "error": message})
        return Progress(label, self.finished, self.total, "failed", dataset, message, code)

    def finish(self, label: str, result: IngestResult) -> Progress:
        self.finished += 1
        self.documents += 1
        self.chunks += result.chunks
        self.unchanged += int(result.unchanged)
        if result.unchanged:
            from .. import metrics

            metrics.INGEST_FILES.labels(metrics.ingest_format(label), "unchanged").inc()
        stage = "unchanged" if result.unchanged else "indexed"
        return Progress(label, self.finished, self.total, stage, result.dataset)

    def done(self, started: float, *, removed: int, kept: int = 0) -> BatchDone:
        """The run's end: its counters, and the seconds since `started` (`time.monotonic`)."""
        return BatchDone(
            documents=self.documents,
            chunks=self.chunks,
            seconds=round(time.monotonic() - started, 3),
            unchanged=self.unchanged,
            failed=self.failed,
            removed=removed,
            kept=kept,
        )


# An engine's indexing step: index the folder into the named table, yielding Progress; returns the run's counters.
IndexInto = Callable[[str], Generator[Progress, None, Run]]


def run_steps(steps: Generator[object, None, T] | Iterator[object]) -> T:
    """Drive a steps generator to its end, ignoring what it yields; its return value."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value


def internal_error(exc: BaseException, prefix: str = "internal error") -> str:
    """The message a file (or a batch) fails with when something unexpected raised (`prefix` "" for none)."""
    text = f"{type(exc).__name__}: {exc}"
    return (f"{prefix}: {text}" if prefix else text)[:300]
