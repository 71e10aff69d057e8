"""`Converter.convert` in a child process (rag_worker/sandbox.py), with a memory and a time limit.

The worker and the indexing CLI convert through `IsolatedConverter` (held by `Services.converter`): a file that
needs too much memory or time is refused and takes nothing from the process that asked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator
from pathlib import Path

from docling_core.types.doc import DoclingDocument

from ..errors import ApiError
from . import mail_office
from . import ocr as ocr_mod
from .convert import Converted, Converter
from .formats import IngestError, kind_of
from .limits import Limits

_CHILD_CONVERTER: Converter | None = None


def warm_child(args: dict) -> None:
    """Run once in the sandbox helper: import Docling and build its converter, so each job's fork has them."""
    global _CHILD_CONVERTER
    _CHILD_CONVERTER = Converter(artifacts_path=args.get("artifacts_path") or None)
    _CHILD_CONVERTER.prepare()
    if mail_office.office_available():
        mail_office.no_network_prefix()  # probed once here, inherited by every job's fork


def convert_task(args: dict, emit) -> dict:
    """The sandbox task: convert one file, write the document as JSON next to it, say where and what it was."""
    converter = _CHILD_CONVERTER or Converter(artifacts_path=args.get("artifacts_path") or None)
    converter.limits = Limits(**args["limits"])
    if args.get("ocr"):
        converter.ocr = ocr_mod.OcrOptions(**args["ocr"])
    # Each page OCR reads is reported as it is read: a long scan shows where it is (the pipe to the worker).
    converted = converter.convert(Path(args["path"]), args["filename"], progress=emit)
    emit({"stage": "converted", "pages": converted.pages})
    out = Path(args["out"])
    out.write_text(converted.document.model_dump_json(), encoding="utf-8")
    attachments = []
    for i, (name, data) in enumerate(converted.attachments):
        kept = out.parent / f"attachment-{i}"
        kept.write_bytes(data)
        attachments.append([name, str(kept)])
    return {
        "document": str(out),
        "kind": converted.kind,
        "pages": converted.pages,
        "metadata": converted.metadata,
        "attachments": attachments,
    }


class IsolatedConverter:
    """`Converter.convert` in a child process: a file that needs too much memory or time is refused (422) and
    takes nothing from the worker; all its memory is returned when the child ends.

    `convert` blocks only the calling greenlet under gevent: call it from the request's greenlet, not through
    `runtime.offload` (waiting on a child is I/O; gevent's native threads cannot wait on its pipes).
    """

    TASK = "rag_worker.ingest.isolated:convert_task"
    # Plain text up to this size is converted in the calling process: its document (paragraphs of the decoded
    # text) is a small multiple of the file, which the chunker holds in this process anyway, so a child adds no
    # protection, only a fork, a JSON round trip and a parse per file (about 0.1 s: half the time of indexing a
    # folder of abstracts, bench/ingest_throughput.py). Kinds whose conversion memory is not bounded by the
    # file's size (PDF, Office, packages, mail) always go to the child.
    INLINE_KINDS = ("txt",)
    INLINE_MAX_BYTES = 4 << 20

    def __init__(
        self,
        *,
        artifacts_path: Path | str | None = None,
        limits: Limits | None = None,
        memory_mb: int = 2048,
        timeout_s: float = 600.0,
        scratch: Path | None = None,
        ocr: ocr_mod.OcrOptions | None = None,
    ):
        from ..sandbox import Sandbox

        self.artifacts_path = Path(artifacts_path) if artifacts_path else None
        self.limits = limits or Limits()
        self.ocr = ocr or ocr_mod.OcrOptions()
        self.memory_mb, self.timeout_s = memory_mb, timeout_s
        self.scratch = scratch
        self.sandbox = Sandbox(
            warm=["rag_worker.ingest.isolated:warm_child"],
            warm_args={"artifacts_path": str(self.artifacts_path) if self.artifacts_path else None},
        )

    @property
    def pdf_pipeline(self) -> str:
        return "standard" if self.artifacts_path else "native"

    def prepare(self) -> None:
        """Start the child now (it imports Docling for a few seconds; a first job waits for that)."""
        self.sandbox.start()

    def close(self) -> None:
        self.sandbox.close()

    def convert(self, path: Path, filename: str | None = None, on_event=None) -> Converted:
        steps = self.convert_steps(path, filename)
        while True:
            try:
                event = next(steps)
            except StopIteration as stop:
                return stop.value
            if on_event is not None:
                on_event(event)

    def convert_steps(self, path: Path, filename: str | None = None) -> Generator[dict, None, Converted]:
        """`convert` as a generator: yields the child's progress events (OCR's pages) as they arrive, returns
        the Converted file. Closing it early ends the child's work."""
        import shutil
        import tempfile

        from ..runtime import offload
        from ..sandbox import SandboxError

        filename = filename or path.name
        kind = kind_of(filename)  # 415 at once, without a child
        if kind in self.INLINE_KINDS and Path(path).stat().st_size <= self.INLINE_MAX_BYTES:
            inline = Converter(limits=self.limits, ocr=self.ocr)
            return offload(inline.convert, Path(path), filename)
        if self.scratch is not None:
            self.scratch.mkdir(parents=True, exist_ok=True)
        out_dir = Path(tempfile.mkdtemp(prefix="convert-", dir=self.scratch))
        try:
            args = {
                "path": str(Path(path).resolve()),
                "filename": filename,
                "limits": dataclasses.asdict(self.limits),
                "ocr": dataclasses.asdict(self.ocr),
                "artifacts_path": str(self.artifacts_path) if self.artifacts_path else None,
                "out": str(out_dir / "document.json"),
            }
            try:
                answer = yield from self.sandbox.run_steps(
                    self.TASK, args, timeout_s=self.timeout_s, memory_mb=self.memory_mb, scratch=out_dir
                )
            except SandboxError as err:
                raise self._refusal(err) from None
            except IngestError:
                raise
            except ApiError as err:  # an IngestError raised in the child arrives as its code, status, message
                raise IngestError(err.code, err.message, field=err.field) from None
            text = Path(answer["document"]).read_text(encoding="utf-8")
            doc = offload(DoclingDocument.model_validate_json, text)
            attachments = [(name, Path(kept).read_bytes()) for name, kept in answer.get("attachments") or []]
            return Converted(
                document=doc,
                kind=answer["kind"],
                pages=answer["pages"],
                metadata=answer.get("metadata") or {},
                attachments=attachments,
            )
        finally:
            shutil.rmtree(out_dir, ignore_errors=True)

    def _refusal(self, err) -> IngestError:
        if err.reason == "memory":
            return IngestError(
                "convert_memory",
                f"converting the file needed more memory than the limit of {self.memory_mb:,} MB "
                "(CONVERT_MAX_MEMORY_MB); split it into smaller files",
            )
        if err.reason == "timeout":
            return IngestError(
                "convert_timeout",
                f"converting the file took longer than the limit of {self.timeout_s:g} s (CONVERT_TIMEOUT_S); "
                "split it into smaller files",
            )
        if err.reason == "crashed":
            return IngestError(
                "convert_failed",
                f"the converter stopped ({err.detail}): the file is damaged or needs more memory than the "
                f"limit of {self.memory_mb:,} MB (CONVERT_MAX_MEMORY_MB)",
            )
        return IngestError(
            "converter_unavailable", f"the converter process ended unexpectedly ({err.detail}); try again"
        )
