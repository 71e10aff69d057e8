"""Reading the sheets of a tabular file (CSV/TSV, XLSX, XLS/ODS) as rows of raw cell values."""

from __future__ import annotations

import csv
import io
import logging
from pathlib import Path

from .cells import is_nan
from .model import Sheet

log = logging.getLogger(__name__)

TABULAR_KINDS = {"csv", "tsv", "xlsx", "xls", "ods"}


def read_sheets(path: Path, kind: str, max_cells: int = 1_000_000) -> list[Sheet]:
    """The sheets of a tabular file as rows of raw values (strings for CSV/TSV, typed cells for workbooks)."""
    if kind in ("csv", "tsv"):
        return [Sheet("", _read_delimited(path, kind, max_cells))]
    if kind == "xlsx":
        return _read_xlsx(path, max_cells)
    if kind in ("xls", "ods"):
        import pandas as pd

        engine = "xlrd" if kind == "xls" else "odf"
        frames = pd.read_excel(path, sheet_name=None, header=None, engine=engine, dtype=object)
        sheets = []
        for name, frame in frames.items():
            rows = [[None if is_nan(v) else v for v in row] for row in frame.itertuples(index=False)]
            sheets.append(Sheet(str(name), rows))
        return sheets
    raise ValueError(f"not a tabular kind: {kind}")


def _read_delimited(path: Path, kind: str, max_cells: int) -> list[list[object]]:
    from ..ingest.formats import decode_text

    text = decode_text(path.read_bytes())
    delimiter = "\t" if kind == "tsv" else _sniff_delimiter(text)
    rows: list[list[object]] = []
    cells = 0
    for row in csv.reader(io.StringIO(text), delimiter=delimiter):
        cells += len(row)
        if cells > max_cells:
            raise ValueError(f"more than {max_cells} cells")
        rows.append(list(row))
    return rows


def _sniff_delimiter(text: str) -> str:
    sample = text[:8192]
    try:
        return csv.Sniffer().sniff(sample, delimiters=",;\t|").delimiter
    except csv.Error:
        return ","


def _read_xlsx(path: Path, max_cells: int) -> list[Sheet]:
    import openpyxl

    book = openpyxl.load_workbook(path, read_only=True, data_only=True)
    try:
        sheets = []
        cells = 0
        for ws in book.worksheets:
            rows = []
            for row in ws.iter_rows(values_only=True):
                cells += len(row)
                if cells > max_cells:
                    raise ValueError(f"more than {max_cells} cells")
                rows.append(list(row))
            sheets.append(Sheet(ws.title, rows))
        return sheets
    finally:
        book.close()


def sheets_or_none(path: Path, kind: str, max_cells: int) -> list[Sheet] | None:
    """The sheets of a tabular file, or None for other kinds. A sheet that cannot be read as a table costs the
    file its SQL tables, never its indexing (the text chunks are already made)."""
    if kind not in TABULAR_KINDS:
        return None
    try:
        return read_sheets(path, kind, max_cells)
    except Exception as exc:
        log.warning("no SQL tables for %s: %s", path.name, exc)
        return []
