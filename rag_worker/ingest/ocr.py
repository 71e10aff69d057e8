"""OCR with Tesseract for scanned PDF pages and images (.png, .jpg, .jpeg, .tiff, .webp).

Debian's `tesseract-ocr` + `tesseract-ocr-eng` (scripts/setup.sh installs them); more languages with
`OCR_LANGUAGES=eng+deu` and their packs (`tesseract-ocr-deu`). `OCR=off` turns it off: scans are refused as
before. Each page runs `tesseract` as its own child process (rag_worker/ingest/mail_office.run_limited: own
session, address-space limit, killed at the deadline); the whole file shares one time limit (OCR_TIMEOUT_S).
Mixed PDFs: only the pages without a text layer are rendered (pdfium, 300 dpi) and read.

Languages: OCR_LANGUAGES names the packs OCR may use (`eng+fra+deu`, each installed: scripts/setup.sh installs
`tesseract-ocr-<pack>` for those named). A page is read with the first pack (or the one the previous page of the
file turned out to need); when there are several, the language of what it read is detected (rag_worker/i18n) and,
when it is another configured pack's language, the page is read again with that pack (`PackChooser`): a French
scan read with `eng` loses its accents and ligatures, and one pack at a time reads better and faster than
`eng+fra+deu` together.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .formats import IngestError
from .mail_office import run_limited

log = logging.getLogger(__name__)

IMAGE_KINDS = {"png", "jpg", "tiff", "webp"}
RENDER_SCALE = 300 / 72  # 300 dpi, Tesseract's sweet spot for body text


@dataclass(frozen=True)
class OcrOptions:
    enabled: bool = True
    languages: str = "eng"
    timeout_s: float = 300.0
    memory_mb: int = 1024


# ISO 639-1 (what rag_worker/i18n detects) -> Tesseract's pack name.
PACKS = {
    "ar": "ara",
    "cs": "ces",
    "da": "dan",
    "de": "deu",
    "el": "ell",
    "en": "eng",
    "es": "spa",
    "fi": "fin",
    "fr": "fra",
    "hu": "hun",
    "it": "ita",
    "ja": "jpn",
    "ko": "kor",
    "nl": "nld",
    "pl": "pol",
    "pt": "por",
    "ro": "ron",
    "ru": "rus",
    "sv": "swe",
    "tr": "tur",
    "uk": "ukr",
    "zh": "chi_sim",
}


class PackChooser:
    """Which pack reads the pages of one file: the first configured one, then the one the text's language calls
    for (among the configured packs only: `status` has checked they are installed)."""

    def __init__(self, options: OcrOptions):
        self.options = options
        self.packs = [lang for lang in options.languages.split("+") if lang] or ["eng"]
        self.current = self.packs[0]
        self.rereads = 0

    def read(self, image: Path, deadline: float) -> str:
        return self.read_page(image, deadline, boxes=False).text

    def read_page(self, image: Path, deadline: float, *, boxes: bool = True) -> OcrPage:
        """The page read with the current pack, and again with the pack its text's language calls for when that
        differs (with the paragraphs' line boxes when `boxes`)."""
        page = _tesseract(image, self.options, deadline, boxes=boxes, languages=self.current)
        if len(self.packs) < 2:
            return page
        from ..i18n import detect

        among = tuple(code for code, pack in PACKS.items() if pack in self.packs)
        pack = PACKS.get(detect(page.text, among) or "")
        if pack is None or pack == self.current or pack not in self.packs:
            return page
        log.info("OCR: the page reads as %s, not %s: reading it again", pack, self.current)
        self.current = pack
        self.rereads += 1
        return _tesseract(image, self.options, deadline, boxes=boxes, languages=pack)


INSTALL_HINT = "install the Debian packages tesseract-ocr and tesseract-ocr-eng (scripts/setup.sh --dev does)"


def tesseract() -> str | None:
    return shutil.which("tesseract")


@functools.lru_cache(maxsize=8)
def _languages(binary: str) -> frozenset[str]:
    with tempfile.TemporaryDirectory(prefix="rag-ocr-") as tmp:
        log_path = Path(tmp) / "langs.txt"
        try:
            run_limited(
                [binary, "--list-langs"], timeout_s=30, memory_mb=512, env=dict(os.environ), log_path=log_path
            )
        except TimeoutError:
            return frozenset()
        lines = log_path.read_text("utf-8", "replace").splitlines()
    return frozenset(ln.strip() for ln in lines[1:] if ln.strip() and " " not in ln.strip())


def status(options: OcrOptions) -> dict:
    """For /health: whether OCR can run, and why not."""
    if not options.enabled:
        return {"available": False, "enabled": False, "reason": "OCR=off"}
    binary = tesseract()
    if binary is None:
        return {"available": False, "enabled": True, "reason": f"tesseract is not installed: {INSTALL_HINT}"}
    wanted = [lang for lang in options.languages.split("+") if lang]
    missing = [lang for lang in wanted if lang not in _languages(binary)]
    if missing:
        return {
            "available": False,
            "enabled": True,
            "reason": f"language data missing for {', '.join(missing)}: install tesseract-ocr-{missing[0]}",
        }
    return {"available": True, "enabled": True, "languages": wanted}


def require(options: OcrOptions, what: str) -> None:
    """Raise the refusal a user can act on when OCR cannot run for `what`."""
    state = status(options)
    if state["available"]:
        return
    if not state["enabled"]:
        raise IngestError("no_text_layer", f"{what} has no text layer and OCR is off (OCR=off)")
    raise IngestError("no_text_layer", f"{what} has no text layer and OCR is unavailable: {state['reason']}")


@dataclass
class OcrParagraph:
    """One paragraph Tesseract read: its words joined, and each of its lines' box in image pixels (l, t, r, b;
    origin top left)."""

    text: str
    lines: list[tuple[int, int, int, int]]


@dataclass
class OcrPage:
    text: str
    paragraphs: list[OcrParagraph]
    width: int  # the image's size in pixels
    height: int


def ocr_image(image: Path, options: OcrOptions, deadline: float, languages: str | None = None) -> str:
    """Text of one image file read with `languages` (OCR_LANGUAGES unless given); IngestError when it runs past
    the file's deadline or cannot be read."""
    return _tesseract(image, options, deadline, boxes=False, languages=languages).text


def ocr_image_boxes(
    image: Path, options: OcrOptions, deadline: float, languages: str | None = None
) -> OcrPage:
    """`ocr_image` with the paragraphs and their line boxes (Tesseract's TSV, from the same run)."""
    return _tesseract(image, options, deadline, boxes=True, languages=languages)


def _tesseract(
    image: Path, options: OcrOptions, deadline: float, *, boxes: bool, languages: str | None = None
) -> OcrPage:
    binary = tesseract() or "tesseract"
    left = deadline - time.monotonic()
    if left <= 0:
        raise IngestError("timeout", f"OCR took longer than {options.timeout_s:g} s (OCR_TIMEOUT_S)")
    out_base = image.with_suffix("")
    log_path = image.with_suffix(".log")
    cmd = [binary, str(image), str(out_base), "-l", languages or options.languages]
    cmd += ["txt", "tsv"] if boxes else []
    try:
        code = run_limited(
            cmd,
            timeout_s=left,
            memory_mb=options.memory_mb,
            env={**os.environ, "OMP_THREAD_LIMIT": "1"},
            log_path=log_path,
        )
    except TimeoutError as exc:
        raise IngestError("timeout", f"OCR took longer than {options.timeout_s:g} s (OCR_TIMEOUT_S)") from exc
    text_path = out_base.with_suffix(".txt")
    if code != 0 or not text_path.exists():
        detail = log_path.read_text("utf-8", "replace").strip().splitlines()[-1:] if log_path.exists() else []
        raise IngestError(
            "corrupt", f"the image cannot be read by OCR ({(detail or [f'exit {code}'])[0][:200]})"
        )
    text = text_path.read_text("utf-8", "replace")
    tsv_path = out_base.with_suffix(".tsv")
    if not boxes or not tsv_path.exists():
        return OcrPage(text, [], 0, 0)
    return parse_tsv(text, tsv_path.read_text("utf-8", "replace"))


def parse_tsv(text: str, tsv: str) -> OcrPage:
    """Tesseract's TSV as paragraphs of words with one box per line (level 5 rows are words)."""
    width = height = 0
    paragraphs: dict[tuple[int, int], dict] = {}
    for row in tsv.splitlines()[1:]:
        cols = row.split("\t")
        if len(cols) < 12:
            continue
        try:
            level, _, block, par, line, _, left, top, w, h = (int(v) for v in cols[:10])
        except ValueError:
            continue
        if level == 1:
            width, height = w, h
        word = cols[11].strip()
        if level != 5 or not word:
            continue
        para = paragraphs.setdefault((block, par), {"words": [], "lines": {}})
        para["words"].append(word)
        box = para["lines"].get(line)
        right, bottom = left + w, top + h
        para["lines"][line] = (
            (left, top, right, bottom)
            if box is None
            else (min(box[0], left), min(box[1], top), max(box[2], right), max(box[3], bottom))
        )
    out = [
        OcrParagraph(" ".join(p["words"]), [p["lines"][k] for k in sorted(p["lines"])])
        for _, p in sorted(paragraphs.items())
    ]
    return OcrPage(text, out, width, height)


def normalise_image(path: Path, out: Path) -> Path:
    """Any accepted image as a PNG Tesseract reads (webp and CMYK JPEGs are not all readable by its Leptonica)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            frames = getattr(img, "n_frames", 1)
            img.seek(0)
            rgb = img.convert("L") if img.mode not in ("L", "RGB") else img.copy()
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise IngestError("corrupt", f"the image is damaged or not an image ({exc})") from exc
    if frames > 1:
        log.info("%s has %d frames; reading the first", path.name, frames)
    rgb.save(out, format="PNG")
    return out


def ocr_image_file(path: Path, options: OcrOptions) -> str:
    deadline = time.monotonic() + options.timeout_s
    with tempfile.TemporaryDirectory(prefix="rag-ocr-") as tmp:
        png = normalise_image(path, Path(tmp) / "page.png")
        return PackChooser(options).read(png, deadline)


def pages_without_text(path: Path) -> tuple[int, list[int]]:
    """(page count, 1-based numbers of the pages whose text layer is empty)."""
    import pypdfium2 as pdfium

    pdf = pdfium.PdfDocument(str(path))
    try:
        empty = []
        for i in range(len(pdf)):
            page = pdf[i]
            textpage = page.get_textpage()
            try:
                if not textpage.get_text_range().strip():
                    empty.append(i + 1)
            finally:
                textpage.close()
                page.close()
        return len(pdf), empty
    finally:
        pdf.close()


def ocr_pdf_pages(
    path: Path,
    pages: list[int],
    options: OcrOptions,
    progress: Callable[[int, int, int], None] | None = None,
) -> dict[int, OcrPage]:
    """OCR the given 1-based pages of a PDF; page number -> what was read (text, paragraphs with line boxes in
    pixels of the page rendered at RENDER_SCALE). `progress(done, total, page)` after each page."""
    import pypdfium2 as pdfium

    deadline = time.monotonic() + options.timeout_s
    out: dict[int, OcrPage] = {}
    chooser = PackChooser(options)
    pdf = pdfium.PdfDocument(str(path))
    try:
        with tempfile.TemporaryDirectory(prefix="rag-ocr-") as tmp:
            for done, number in enumerate(pages, start=1):
                page = pdf[number - 1]
                try:
                    image = page.render(scale=RENDER_SCALE, grayscale=True).to_pil()
                finally:
                    page.close()
                png = Path(tmp) / f"page-{number}.png"
                image.save(png, format="PNG")
                out[number] = chooser.read_page(png, deadline)
                png.unlink(missing_ok=True)
                if progress:
                    progress(done, len(pages), number)
    finally:
        pdf.close()
    return out


def ocr_options(settings) -> OcrOptions:
    return OcrOptions(
        enabled=settings.ocr == "on", languages=settings.ocr_languages, timeout_s=settings.ocr_timeout_s
    )
