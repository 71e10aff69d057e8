"""Bounds checked before a converter sees a file: zip bombs, huge spreadsheets, PDFs with too many pages, images
of too many pixels (a few kilobytes of PNG can declare 40,000 x 40,000: gigabytes once decoded).

DOCX, PPTX and XLSX are zip packages; a few kilobytes can inflate to gigabytes. The central directory says how
large each entry is once inflated and Python's zip reader stops at that size, so summing the declared sizes is
a sound bound without inflating anything.
"""

from __future__ import annotations

import csv
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .formats import IngestError, decode_text
from .ocr import IMAGE_KINDS


@dataclass(frozen=True)
class Limits:
    max_unzipped_bytes: int = 256 * 1024 * 1024
    max_zip_entries: int = 10_000
    max_spreadsheet_cells: int = 1_000_000
    office_timeout_s: float = 120.0  # LibreOffice conversions (.doc, .xls, .ppt, .odt, .ods, .odp, .rtf)
    office_memory_mb: int = 2048
    max_pdf_pages: int = 2000
    max_image_pixels: int = 89_478_485  # Pillow's own warning bound (it refuses twice that as a "bomb")


def check_zip(path: Path, limits: Limits) -> None:
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
    except (zipfile.BadZipFile, OSError) as exc:
        raise IngestError("corrupt", f"the file is damaged and cannot be read ({exc})") from exc
    if len(infos) > limits.max_zip_entries:
        raise IngestError(
            "zip_bomb",
            f"the package holds {len(infos)} parts, more than the limit of {limits.max_zip_entries} "
            "(MAX_ZIP_ENTRIES)",
        )
    total = sum(info.file_size for info in infos)
    if total > limits.max_unzipped_bytes:
        raise IngestError(
            "zip_bomb",
            f"the package inflates to {total:,} bytes, more than the limit of {limits.max_unzipped_bytes:,} "
            "(MAX_UNZIPPED_BYTES)",
        )


def check_xlsx_cells(path: Path, limits: Limits) -> None:
    """Count the cells each sheet holds, streaming its data and stopping once past the bound.

    The dimension a sheet declares (`<dimension ref="A1:A1"/>`) is written by whoever made the file and is not
    read: a sheet declaring A1:A1 may hold 200,000 cells.
    """
    import openpyxl

    try:
        wb = openpyxl.load_workbook(path, read_only=True, data_only=True)
    except Exception as exc:  # openpyxl raises many types for damaged packages
        raise IngestError("corrupt", f"the spreadsheet is damaged and cannot be read ({exc})") from exc
    try:
        cells = 0
        for ws in wb.worksheets:
            if hasattr(ws, "reset_dimensions"):
                ws.reset_dimensions()  # stream to the end of the data, not to the declared last cell
            try:
                for row in ws.iter_rows():
                    cells += len(row)
                    if cells > limits.max_spreadsheet_cells:
                        break
            except Exception as exc:
                raise IngestError(
                    "corrupt", f"the spreadsheet is damaged and cannot be read ({exc})"[:300]
                ) from exc
            if cells > limits.max_spreadsheet_cells:
                raise IngestError(
                    "too_many_cells",
                    f"the spreadsheet has more than {limits.max_spreadsheet_cells:,} cells (MAX_SPREADSHEET_CELLS); "
                    "split it into smaller files",
                )
    finally:
        wb.close()


def check_csv_cells(path: Path, limits: Limits) -> None:
    text = decode_text(path.read_bytes())
    cells = 0
    for row in csv.reader(text.splitlines()):
        cells += len(row)
        if cells > limits.max_spreadsheet_cells:
            raise IngestError(
                "too_many_cells",
                f"the CSV file has more than {limits.max_spreadsheet_cells:,} cells (MAX_SPREADSHEET_CELLS); "
                "split it into smaller files",
            )


def check_image_pixels(path: Path, limits: Limits) -> None:
    """Read the image's declared size from its header (nothing decoded) and refuse one past the bound."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            width, height = img.size
    except Image.DecompressionBombError:  # past twice Pillow's bound it refuses before saying the size
        width = height = None
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise IngestError("corrupt", f"the image is damaged or not an image ({_short(exc)})") from exc
    if width is not None and height is not None and width * height <= limits.max_image_pixels:
        return
    size = f"{width:,} x {height:,} pixels" if width is not None else "more pixels than that"
    raise IngestError(
        "image_too_large",
        f"the image is too large to read ({size}); the limit is {limits.max_image_pixels:,} pixels "
        "(MAX_IMAGE_PIXELS): scale it down or split it",
    )


def _short(exc: Exception) -> str:
    return (str(exc) or type(exc).__name__).splitlines()[0][:200]


def check(path: Path, kind: str, limits: Limits) -> None:
    """All bounds that apply to a file of this kind."""
    if kind in ("docx", "pptx", "xlsx", "odt", "ods", "odp", "epub"):
        check_zip(path, limits)
    if kind == "xlsx":
        check_xlsx_cells(path, limits)
    elif kind in ("csv", "tsv"):
        check_csv_cells(path, limits)
    elif kind in IMAGE_KINDS:
        check_image_pixels(path, limits)
