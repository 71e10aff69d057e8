"""File -> DoclingDocument, for every accepted kind, with a clear per-file error when a file cannot be read.

PDFs go through Docling's model-free native pipeline (text with page numbers, no layout model) unless
`DOCLING_ARTIFACTS_PATH` points at local layout models, in which case the standard pipeline runs from those
files (OCR stays off: no OCR engine is installed). Plain text is built into a document directly, paragraph by
paragraph, so that a `#` or `*` in a text file is not read as Markdown.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path

from docling_core.types.doc import DocItemLabel, DoclingDocument

from . import mail_office
from . import ocr as ocr_mod
from .formats import IngestError, decode_text, kind_of, sniff
from .limits import Limits, check

log = logging.getLogger(__name__)

NO_TEXT_LAYER = "no text layer; OCR is not installed"


@dataclass
class Converted:
    document: DoclingDocument
    kind: str
    pages: int | None  # paginated kinds only (PDF; spreadsheets count sheets as pages)
    metadata: dict = field(default_factory=dict)  # e-mail headers, kept on every chunk
    attachments: list[tuple[str, bytes]] = field(default_factory=list)  # e-mail attachments to index too


class Converter:
    """Holds one Docling converter (its pipelines are built once and reused) behind a lock."""

    def __init__(
        self,
        *,
        artifacts_path: Path | str | None = None,
        limits: Limits | None = None,
        pdf_threads: int = 1,
        ocr: ocr_mod.OcrOptions | None = None,
    ):
        self.artifacts_path = Path(artifacts_path) if artifacts_path else None
        self.limits = limits or Limits()
        self.ocr = ocr or ocr_mod.OcrOptions()
        self.pdf_threads = max(1, pdf_threads)
        self._lock = threading.Lock()
        self._docling = None

    @property
    def pdf_pipeline(self) -> str:
        return "standard" if self.artifacts_path else "native"

    def prepare(self) -> None:
        """Import Docling and build its converter now, on the calling (main) thread.

        Under gevent this must not first happen in the native thread pool: importing Docling calls
        `platform.processor()`, which runs a subprocess, and gevent can only watch children from its main loop.
        """
        self._converter()

    def _converter(self):
        if self._docling is None:
            from docling.datamodel.base_models import InputFormat
            from docling.document_converter import DocumentConverter, NativePdfFormatOption, PdfFormatOption

            if self.artifacts_path:
                from docling.datamodel.pipeline_options import PdfPipelineOptions

                pdf = PdfFormatOption(
                    pipeline_options=PdfPipelineOptions(artifacts_path=self.artifacts_path, do_ocr=False)
                )
            else:
                from docling.datamodel.pipeline_options import NativePdfPipelineOptions

                pdf = NativePdfFormatOption(
                    pipeline_options=NativePdfPipelineOptions(parser_threads=self.pdf_threads)
                )
            self._docling = DocumentConverter(
                allowed_formats=[
                    InputFormat.PDF,
                    InputFormat.DOCX,
                    InputFormat.PPTX,
                    InputFormat.XLSX,
                    InputFormat.CSV,
                    InputFormat.HTML,
                    InputFormat.MD,
                ],
                format_options={InputFormat.PDF: pdf},
            )
        return self._docling

    def convert(
        self, path: Path, filename: str | None = None, progress: Callable[[dict], None] | None = None
    ) -> Converted:
        """Convert one file; `filename` (the display name) decides the kind, defaulting to the path's name.

        `progress(event)` is called after each page OCR reads: `{"stage": "ocr", "ocr": {"page", "done",
        "total"}}` (`page`: the page's number in the file; `done` of `total`: the pages OCR reads in this file).

        Raises IngestError (unsupported_type, empty, encrypted, no_text_layer, corrupt, zip_bomb,
        too_many_cells, too_many_pages) for a file that cannot be ingested. This runs in the calling process:
        the worker uses `isolated.IsolatedConverter`, which runs it in a child process with a memory and a time limit.
        """
        filename = filename or path.name
        kind = kind_of(filename)
        sniff(path, kind)
        check(path, kind, self.limits)
        metadata: dict = {}
        attachments: list[tuple[str, bytes]] = []
        if kind == "txt":
            doc = text_document(decode_text(path.read_bytes()), Path(filename).stem)
            pages = None
        elif kind in mail_office.MAIL_KINDS:
            mail = mail_office.read_eml(path) if kind == "eml" else mail_office.read_msg(path)
            doc = mail_office.mail_document(mail, Path(filename).stem)
            metadata = {"email": mail.headers}
            attachments = mail.attachments
            pages = None
        elif kind in mail_office.OFFICE_TWIN:
            twin_kind = mail_office.OFFICE_TWIN[kind]
            with mail_office.temp_dir() as tmp:
                twin = mail_office.office_to_ooxml(
                    path,
                    kind,
                    Path(tmp),
                    timeout_s=self.limits.office_timeout_s,
                    memory_mb=self.limits.office_memory_mb,
                )
                check(twin, twin_kind, self.limits)
                doc = self._convert_docling(twin, twin_kind, f"{Path(filename).stem}.{twin_kind}")
            pages = (doc.num_pages() or None) if twin_kind == "xlsx" else None
        elif kind == "epub":
            title, html = mail_office.epub_to_html(path)
            with mail_office.temp_dir() as tmp:
                page = Path(tmp) / "book.html"
                page.write_text(html, encoding="utf-8")
                doc = self._convert_docling(page, "html", f"{Path(filename).stem}.html")
            pages = None
        elif kind in ocr_mod.IMAGE_KINDS:
            ocr_mod.require(self.ocr, "the image")
            doc = text_document(ocr_mod.ocr_image_file(path, self.ocr), Path(filename).stem)
            if progress is not None:
                progress(ocr_event(1, 1, 1))
            metadata = {"ocr": True}
            pages = None
        elif kind == "tsv":
            pages = None
            doc = self._convert_docling(path, kind, f"{Path(filename).stem}.csv")
        else:
            pages = pdf_page_count(path) if kind == "pdf" else None
            if pages is not None and pages > self.limits.max_pdf_pages:
                raise IngestError(
                    "too_many_pages",
                    f"the PDF has {pages:,} pages, more than the limit of {self.limits.max_pdf_pages:,} "
                    "(MAX_PDF_PAGES); split it into smaller files",
                )
            doc = self._convert_docling(path, kind, filename)
            if kind == "pdf":
                ocr_pages = self._ocr_scanned_pages(path, doc, pages, progress)
                if ocr_pages:
                    metadata = {"ocr_pages": ocr_pages}
            if kind == "xlsx":
                pages = doc.num_pages() or None
        if not has_text(doc):
            if kind == "pdf":
                raise IngestError("no_text_layer", f"the PDF has {pages} page(s) but {NO_TEXT_LAYER}")
            raise IngestError("empty", "the file contains no text")
        return Converted(document=doc, kind=kind, pages=pages, metadata=metadata, attachments=attachments)

    def _ocr_scanned_pages(
        self, path: Path, doc: DoclingDocument, pages: int | None, progress: Callable[[dict], None] | None
    ) -> list[int]:
        """OCR the pages without a text layer into `doc` (page numbers kept); the pages read.

        A PDF with no text at all and no OCR is refused (with what to install); a mixed one keeps its text pages.
        """
        total, empty = ocr_mod.pages_without_text(path)
        if not empty:
            return []
        if not ocr_mod.status(self.ocr)["available"]:
            if len(empty) == total:
                ocr_mod.require(self.ocr, f"the PDF ({total} page(s))")
            log.info("%s: %d page(s) without text skipped (no OCR)", path.name, len(empty))
            return []
        texts = ocr_mod.ocr_pdf_pages(
            path,
            empty,
            self.ocr,
            (lambda done, total, page: progress(ocr_event(page, done, total))) if progress else None,
        )
        add_page_texts(doc, path, texts)
        return [n for n, t in texts.items() if t.text.strip()]

    def _convert_docling(self, path: Path, kind: str, filename: str) -> DoclingDocument:
        from docling.datamodel.base_models import ConversionStatus
        from docling_core.types.io import DocumentStream

        # A stream with a plain ASCII name pins the format to the one we sniffed, whatever the display name.
        source = DocumentStream(
            name=f"document{Path(filename).suffix.lower()}", stream=BytesIO(path.read_bytes())
        )
        try:
            with self._lock:
                result = self._converter().convert(source, raises_on_error=False)
        except IngestError:
            raise
        except Exception as exc:  # Docling and its backends raise many types for unreadable input
            log.info("conversion of %s failed: %r", filename, exc)
            raise IngestError(
                "corrupt", f"the file is damaged or not a valid {kind} file ({_short(exc)})"
            ) from exc
        if result.status not in (ConversionStatus.SUCCESS, ConversionStatus.PARTIAL_SUCCESS):
            detail = "; ".join(e.error_message for e in result.errors)[:300] or result.status.value
            raise IngestError("corrupt", f"the file is damaged or not a valid {kind} file ({detail})")
        doc = result.document
        doc.name = Path(filename).stem
        return doc


def ocr_event(page: int, done: int, total: int) -> dict:
    """The progress event after OCR read one page (the same shape from the child and in the worker's stream)."""
    return {"stage": "ocr", "ocr": {"page": page, "done": done, "total": total}}


def pdf_page_count(path: Path) -> int:
    """Open the PDF with pdfium to tell encrypted and damaged files apart from readable ones."""
    import pypdfium2 as pdfium

    try:
        pdf = pdfium.PdfDocument(str(path))
    except pdfium.PdfiumError as exc:
        if getattr(exc, "err_code", None) == pdfium.raw.FPDF_ERR_PASSWORD:
            raise IngestError(
                "encrypted", "the PDF is password-protected; upload an unprotected copy"
            ) from exc
        raise IngestError("corrupt", f"the PDF is damaged and cannot be read ({_short(exc)})") from exc
    try:
        pages = len(pdf)
    finally:
        pdf.close()
    if pages == 0:
        raise IngestError("empty", "the PDF has no pages")
    return pages


_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")


def text_document(text: str, name: str) -> DoclingDocument:
    """A plain-text file as a document of paragraphs (blank lines separate them)."""
    doc = DoclingDocument(name=name or "text")
    for para in _PARAGRAPH_BREAK.split(text.replace("\r\n", "\n").replace("\r", "\n")):
        para = para.strip()
        if para:
            doc.add_text(label=DocItemLabel.TEXT, text=para)
    return doc


def add_page_texts(doc: DoclingDocument, path: Path, pages: dict[int, ocr_mod.OcrPage]) -> None:
    """Add OCR text to `doc` as paragraphs carrying their page number and, per line, the box Tesseract found it
    in (in PDF points, origin top left), so a chunk's passage can be highlighted on the scanned page. A page
    read without boxes keeps the text's paragraphs with the whole page as their box."""
    import pypdfium2 as pdfium
    from docling_core.types.doc import BoundingBox, CoordOrigin, ProvenanceItem, Size

    pdf = pdfium.PdfDocument(str(path))
    try:
        for number, page in sorted(pages.items()):
            width, height = pdf[number - 1].get_size()
            if number not in doc.pages:
                doc.add_page(page_no=number, size=Size(width=width, height=height))
            scale_x = width / page.width if page.width else 1.0
            scale_y = height / page.height if page.height else 1.0
            paragraphs = [(p.text, p.lines) for p in page.paragraphs if p.text.strip()]
            if not paragraphs:
                paragraphs = [
                    (" ".join(para.split()), [])
                    for para in _PARAGRAPH_BREAK.split(page.text.replace("\r\n", "\n"))
                    if para.strip()
                ]
            for text, lines in paragraphs:
                boxes = [(x0 * scale_x, y0 * scale_y, x1 * scale_x, y1 * scale_y) for x0, y0, x1, y1 in lines]
                prov = [
                    ProvenanceItem(
                        page_no=number,
                        bbox=BoundingBox(l=x0, t=y0, r=x1, b=y1, coord_origin=CoordOrigin.TOPLEFT),
                        charspan=(0, len(text)),
                    )
                    for x0, y0, x1, y1 in boxes or [(0, 0, width, height)]
                ]
                item = doc.add_text(label=DocItemLabel.TEXT, text=text, prov=prov[0])
                item.prov.extend(prov[1:])
    finally:
        pdf.close()


def has_text(doc: DoclingDocument) -> bool:
    if any(getattr(t, "text", "").strip() for t in doc.texts):
        return True
    return any(cell.text.strip() for table in doc.tables for cell in table.data.table_cells)


def _short(exc: Exception) -> str:
    return (str(exc) or type(exc).__name__).splitlines()[0][:200]
