"""Spreadsheets as SQL tables: every indexed CSV/TSV/XLSX/XLS/ODS sheet, typed, queryable with DuckDB.

Each index keeps its tables under `index_store/tables/<index>/`: one Parquet file per sheet plus a JSON card
(the source file, the sheet, the detected header row, each column's name, type and a few sample rows). DuckDB is
the query engine. Parquet files rather than one DuckDB database file: a DuckDB file takes a process-wide
exclusive lock while open for writing, and several processes (gunicorn workers, the CLI) share one index; a
Parquet file is replaced atomically (`os.replace`) and read by any number of processes.

Typing: a column becomes BIGINT, DOUBLE, DATE, TIMESTAMP or BOOLEAN when every non-empty cell parses as that
(currency signs, thousands separators and percent signs are understood); otherwise it stays VARCHAR. A typed
column keeps its cells' original text beside it in `<column>_text`.

Queries run in a fresh in-memory DuckDB that loads only the tables the (already validated) query names, then
turns off file access and locks its configuration before running it, under a row and a time limit.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import re
import threading
import uuid
from dataclasses import dataclass, field
from datetime import date, datetime, time
from pathlib import Path

from .names import check_name

log = logging.getLogger(__name__)

TABULAR_KINDS = {"csv", "tsv", "xlsx", "xls", "ods"}
SAMPLE_ROWS = 3
HEADER_SCAN_ROWS = 10


@dataclass
class Sheet:
    name: str
    rows: list[list[object]]  # raw cell values, header row included


@dataclass
class Column:
    name: str
    type: str  # DuckDB type
    source: str  # the header cell as written
    text_column: str | None = None  # `<name>_text` for typed columns


@dataclass
class Table:
    name: str
    dataset: str
    filename: str
    sheet: str
    header_row: int | None  # 1-based row of the header in the sheet, None when the sheet has none
    columns: list[Column]
    rows: int
    samples: list[list[object]] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "dataset": self.dataset,
            "filename": self.filename,
            "sheet": self.sheet,
            "header_row": self.header_row,
            "columns": [c.__dict__ for c in self.columns],
            "rows": self.rows,
            "samples": self.samples,
        }

    @classmethod
    def from_dict(cls, data: dict) -> Table:
        return cls(
            name=data["name"],
            dataset=data["dataset"],
            filename=data["filename"],
            sheet=data["sheet"],
            header_row=data.get("header_row"),
            columns=[Column(**c) for c in data["columns"]],
            rows=int(data["rows"]),
            samples=data.get("samples", []),
        )

    def describe(self) -> str:
        """One line for the overview and the SQL prompt: table, source, columns with types."""
        cols = ", ".join(f"{c.name} {c.type}" for c in self.columns)
        where = f"{self.filename}" + (f" sheet '{self.sheet}'" if self.sheet else "")
        return f"table {self.name} ({self.rows} rows, from {where}): {cols}"


# -- reading sheets -----------------------------------------------------------------------------------------------


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
            rows = [[None if _is_nan(v) else v for v in row] for row in frame.itertuples(index=False)]
            sheets.append(Sheet(str(name), rows))
        return sheets
    raise ValueError(f"not a tabular kind: {kind}")


def _is_nan(value: object) -> bool:
    return isinstance(value, float) and value != value


def _read_delimited(path: Path, kind: str, max_cells: int) -> list[list[object]]:
    from .ingest.formats import decode_text

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


# -- header detection and typing ----------------------------------------------------------------------------------

_NUMBER_RE = re.compile(
    r"^(?P<neg>[-(])?\s*(?P<cur>[$€£¥]|[A-Z]{3}\s)?\s*(?P<num>\d{1,3}(?:[, ]\d{3})+|\d+)(?P<frac>\.\d+)?"
    r"\s*(?P<cur2>[$€£¥]|\s[A-Z]{3})?\s*(?P<pct>%)?\)?$"
)
_DATE_FORMATS = (
    "%Y-%m-%d",
    "%d/%m/%Y",
    "%m/%d/%Y",
    "%d.%m.%Y",
    "%Y/%m/%d",
    "%d %b %Y",
    "%d %B %Y",
    "%b %d, %Y",
)
_DATETIME_FORMATS = ("%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M")
_BOOLS = {"true": True, "false": False, "yes": True, "no": False}


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat(sep=" ") if value.time() != time(0) else value.date().isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def parse_number(value: object) -> float | int | None:
    """A cell as a number: 1,234.50 / $1,200 / (300) / 12% / 1 000 EUR; None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return None if _is_nan(value) else value
    text = _text(value)
    m = _NUMBER_RE.match(text)
    if not m:
        return None
    digits = m.group("num").replace(",", "").replace(" ", "")
    number: float | int = float(digits + m.group("frac")) if m.group("frac") else int(digits)
    if m.group("pct"):
        number = number / 100
    if m.group("neg"):
        if m.group("neg") == "(" and not text.endswith(")"):
            return None
        number = -number
    return number


def parse_date(value: object) -> date | datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, date):
        return value
    text = _text(value)
    if not text or not text[0].isalnum():
        return None
    if len(text) == 10 and text[4] == "-" and text[7] == "-":  # ISO dates: the common case, fast
        try:
            return date.fromisoformat(text)
        except ValueError:
            pass
    if not text[0].isdigit() and not text[:3].isalpha():
        return None
    for fmt in _DATETIME_FORMATS:
        try:
            return datetime.strptime(text, fmt)
        except ValueError:
            pass
    for fmt in _DATE_FORMATS:
        try:
            return datetime.strptime(text, fmt).date()
        except ValueError:
            pass
    return None


def _is_label(value: object) -> bool:
    text = _text(value)
    return bool(text) and parse_number(value) is None and parse_date(value) is None


def detect_header(rows: list[list[object]]) -> int | None:
    """Index of the header row: the first non-empty row (of the first few) made only of labels and covering at
    least half the table's width, so a title line above the header is skipped; None when the data starts at
    once (then columns are named column_1, column_2, ...)."""
    filled_rows = [i for i, row in enumerate(rows) if any(_text(v) for v in row)]
    if not filled_rows:
        return None
    width = max(len([v for v in rows[i] if _text(v)]) for i in filled_rows[:50])
    for i in filled_rows[:HEADER_SCAN_ROWS]:
        filled = [v for v in rows[i] if _text(v)]
        if len(filled) * 2 >= width and all(_is_label(v) for v in filled):
            return i
        if any(not _is_label(v) for v in filled):
            return None  # data before any header
    return None


_IDENT_RE = re.compile(r"[^a-z0-9_]+")


def identifier(text: str, fallback: str) -> str:
    ident = _IDENT_RE.sub("_", text.lower()).strip("_")
    if not ident:
        ident = fallback
    if ident[0].isdigit():
        ident = f"_{ident}"
    return ident[:60]


def _column_type(values: list[object]) -> str:
    """The narrowest type every non-empty cell parses as; each test stops at the first cell that fails."""
    filled = [v for v in values if _text(v)]
    if not filled:
        return "VARCHAR"
    if all(isinstance(v, bool) or _text(v).lower() in _BOOLS for v in filled):
        return "BOOLEAN"
    if all(parse_number(v) is not None for v in filled):
        ints = all(isinstance(n, int) and abs(n) < 2**62 for n in map(parse_number, filled))
        return "BIGINT" if ints else "DOUBLE"
    if all(parse_date(v) is not None for v in filled):
        timed = any(isinstance(d, datetime) and d.time() != time(0) for d in map(parse_date, filled))
        return "TIMESTAMP" if timed else "DATE"
    return "VARCHAR"


def _convert(value: object, kind: str) -> object:
    if not _text(value):
        return None
    if kind == "VARCHAR":
        return _text(value)
    if kind == "BOOLEAN":
        return value if isinstance(value, bool) else _BOOLS[_text(value).lower()]
    if kind in ("BIGINT", "DOUBLE"):
        n = parse_number(value)
        return float(n) if kind == "DOUBLE" else int(n)
    d = parse_date(value)
    if kind == "DATE" and isinstance(d, datetime):
        return d.date()
    return d


def build_table(sheet: Sheet, *, name: str, dataset: str, filename: str):
    """A sheet to (Table card, pyarrow Table); None when the sheet holds no data rows."""
    import pyarrow as pa

    rows = [r for r in sheet.rows]
    header_at = detect_header(rows)
    if header_at is None:
        data = [r for r in rows if any(_text(v) for v in r)]
        header: list[object] = []
    else:
        header = rows[header_at]
        data = [r for r in rows[header_at + 1 :] if any(_text(v) for v in r)]
    if not data:
        return None
    width = max(len(header), *(len(r) for r in data))
    # Trailing columns empty in the header and every row are dropped.
    while (
        width
        and not _text(header[width - 1] if width <= len(header) else None)
        and not any(_text(r[width - 1]) for r in data if width <= len(r))
    ):
        width -= 1
    columns: list[Column] = []
    arrays = []
    names: list[str] = []
    used: set[str] = set()
    for j in range(width):
        source = _text(header[j]) if j < len(header) else ""
        col = identifier(source, f"column_{j + 1}")
        base, n = col, 2
        while col in used:
            col, n = f"{base}_{n}", n + 1
        used.add(col)
        values = [r[j] if j < len(r) else None for r in data]
        kind = _column_type(values)
        column = Column(col, kind, source)
        converted = [_convert(v, kind) for v in values]
        arrays.append(pa.array(converted, type=_ARROW[kind]()))
        names.append(col)
        if kind != "VARCHAR":
            text_name = f"{col}_text"
            while text_name in used:
                text_name += "_"
            used.add(text_name)
            column.text_column = text_name
            arrays.append(pa.array([_text(v) or None for v in values], type=pa.string()))
            names.append(text_name)
        columns.append(column)
    arrow = pa.Table.from_arrays(arrays, names=names)
    samples = [
        [_json_cell(v) for v in (r[j] if j < len(r) else None for j in range(width))]
        for r in data[:SAMPLE_ROWS]
    ]
    card = Table(
        name=name,
        dataset=dataset,
        filename=filename,
        sheet=sheet.name,
        header_row=None if header_at is None else header_at + 1,
        columns=columns,
        rows=len(data),
        samples=samples,
    )
    return card, arrow


def _json_cell(value: object) -> object:
    if value is None or isinstance(value, bool | int | float | str):
        return None if _is_nan(value) else value
    return _text(value)


def _arrow_types():
    import pyarrow as pa

    return {
        "VARCHAR": pa.string,
        "BIGINT": pa.int64,
        "DOUBLE": pa.float64,
        "BOOLEAN": pa.bool_,
        "DATE": pa.date32,
        "TIMESTAMP": lambda: pa.timestamp("us"),
    }


class _Lazy(dict):
    def __missing__(self, key):
        self.update(_arrow_types())
        return dict.__getitem__(self, key)


_ARROW = _Lazy()


# -- the per-index table store -----------------------------------------------------------------------------------


def tables_dir(settings, index: str) -> Path:
    return settings.index_store / "tables" / check_name(index, "index")


def list_tables(settings, index: str) -> list[Table]:
    folder = tables_dir(settings, index)
    if not folder.is_dir():
        return []
    cards = []
    for path in sorted(folder.glob("*.json")):
        try:
            card = Table.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("unreadable table card %s: %s", path, exc)
            continue
        if (folder / f"{card.name}.parquet").exists():
            cards.append(card)
    return cards


def _table_base(dataset: str, filename: str, sheet: str, sheets: int) -> str:
    stem = identifier(Path(filename).stem, "table")
    base = stem if dataset == "default" else f"{identifier(dataset, 'dataset')}_{stem}"
    if sheets > 1:
        base = f"{base}_{identifier(sheet, 'sheet')}"
    return base[:60]


def replace_tables(settings, index: str, dataset: str, filename: str, sheets: list[Sheet]) -> list[Table]:
    """Write a file's sheets as tables, replacing the tables the same (dataset, filename) had.

    Called under the index's write lock. Each Parquet file and card is written to a temporary name and moved
    into place, so a reader sees the old table or the new one, never half of one.
    """
    import pyarrow.parquet as pq

    folder = tables_dir(settings, index)
    folder.mkdir(parents=True, exist_ok=True)
    existing = list_tables(settings, index)
    mine = [t for t in existing if (t.dataset, t.filename) == (dataset, filename)]
    taken = {t.name for t in existing} - {t.name for t in mine}
    built: list[Table] = []
    for sheet in sheets:
        base = _table_base(dataset, filename, sheet.name, len(sheets))
        name, n = base, 2
        while name in taken or name in _RESERVED:
            name, n = f"{base}_{n}", n + 1
        result = build_table(sheet, name=name, dataset=dataset, filename=filename)
        if result is None:
            continue
        taken.add(name)
        card, arrow = result
        tmp = folder / f".{name}.{uuid.uuid4().hex}.tmp"
        pq.write_table(arrow, tmp)
        os.replace(tmp, folder / f"{name}.parquet")
        tmp_card = folder / f".{name}.{uuid.uuid4().hex}.json.tmp"
        tmp_card.write_text(json.dumps(card.to_dict(), default=str), encoding="utf-8")
        os.replace(tmp_card, folder / f"{name}.json")
        built.append(card)
    for old in mine:
        if old.name not in {t.name for t in built}:
            _remove(folder, old.name)
    return built


def remove_tables(settings, index: str, dataset: str, filename: str) -> int:
    folder = tables_dir(settings, index)
    gone = 0
    for card in list_tables(settings, index):
        if (card.dataset, card.filename) == (dataset, filename):
            _remove(folder, card.name)
            gone += 1
    return gone


def drop_tables(settings, index: str) -> None:
    import shutil

    folder = tables_dir(settings, index)
    if folder.is_dir():
        shutil.rmtree(folder, ignore_errors=True)


def _remove(folder: Path, name: str) -> None:
    (folder / f"{name}.json").unlink(missing_ok=True)
    (folder / f"{name}.parquet").unlink(missing_ok=True)


# SQL keywords a table may not be named after (the prompt and the validator stay unambiguous).
_RESERVED = {"select", "from", "where", "group", "order", "table", "index", "limit", "values", "user"}


# -- running a validated query -----------------------------------------------------------------------------------


@dataclass
class Result:
    columns: list[str]
    rows: list[list[object]]
    truncated: bool


class QueryError(Exception):
    """The query failed or ran past a limit; the message says which."""


def run_query(
    settings, tables: dict[str, Table], index_of: dict[str, str], sql: str, *, max_rows: int, timeout_s: float
) -> Result:
    """Run one validated SELECT over the named tables in a locked-down in-memory DuckDB."""
    import duckdb
    import pyarrow.parquet as pq

    con = duckdb.connect(":memory:", config={"threads": 1, "memory_limit": "512MB"})
    timer = threading.Timer(timeout_s, con.interrupt)
    try:
        for name in tables:
            # Read here (memory-mapped Arrow) and handed over in-process: the query itself never touches files.
            path = tables_dir(settings, index_of[name]) / f"{name}.parquet"
            con.register(name, pq.read_table(path, memory_map=True))
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        timer.start()
        try:
            cursor = con.execute(f"SELECT * FROM ({sql}) AS q LIMIT {int(max_rows) + 1}")
            columns = [d[0] for d in cursor.description]
            rows = cursor.fetchall()
        except duckdb.InterruptException as exc:
            raise QueryError(f"the query ran longer than {timeout_s:g} s") from exc
        except duckdb.Error as exc:
            raise QueryError(f"the query failed: {str(exc).splitlines()[0][:300]}") from exc
    finally:
        timer.cancel()
        con.close()
    truncated = len(rows) > max_rows
    return Result(columns, [[_json_cell(v) for v in r] for r in rows[:max_rows]], truncated)


# -- the ingestion hooks ------------------------------------------------------------------------------------------


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


def store_sheets(settings, index: str, prepared) -> list[str]:
    """Replace the prepared file's tables (under the index lock); the tables' one-line descriptions."""
    if prepared.sheets is None:
        return []
    try:
        cards = replace_tables(settings, index, prepared.dataset, prepared.filename, prepared.sheets)
    except Exception:
        log.exception("loading the tables of %s failed", prepared.filename)
        remove_tables(settings, index, prepared.dataset, prepared.filename)
        return []
    return [card.describe() for card in cards]
