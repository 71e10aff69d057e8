"""Cells: their text, numbers and dates as spreadsheets write them, header detection, column typing."""

from __future__ import annotations

import re
from datetime import date, datetime, time

HEADER_SCAN_ROWS = 10

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


def is_nan(value: object) -> bool:
    return isinstance(value, float) and value != value


def cell_text(value: object) -> str:
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
        return None if is_nan(value) else value
    text = cell_text(value)
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
    text = cell_text(value)
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


def is_label(value: object) -> bool:
    text = cell_text(value)
    return bool(text) and parse_number(value) is None and parse_date(value) is None


def detect_header(rows: list[list[object]]) -> int | None:
    """Index of the header row: the first non-empty row (of the first few) made only of labels and covering at
    least half the table's width, so a title line above the header is skipped; None when the data starts at
    once (then columns are named column_1, column_2, ...)."""
    filled_rows = [i for i, row in enumerate(rows) if any(cell_text(v) for v in row)]
    if not filled_rows:
        return None
    width = max(len([v for v in rows[i] if cell_text(v)]) for i in filled_rows[:50])
    for i in filled_rows[:HEADER_SCAN_ROWS]:
        filled = [v for v in rows[i] if cell_text(v)]
        if len(filled) * 2 >= width and all(is_label(v) for v in filled):
            return i
        if any(not is_label(v) for v in filled):
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


def column_type(values: list[object]) -> str:
    """The narrowest type every non-empty cell parses as; each test stops at the first cell that fails."""
    filled = [v for v in values if cell_text(v)]
    if not filled:
        return "VARCHAR"
    if all(isinstance(v, bool) or cell_text(v).lower() in _BOOLS for v in filled):
        return "BOOLEAN"
    if all(parse_number(v) is not None for v in filled):
        ints = all(isinstance(n, int) and abs(n) < 2**62 for n in map(parse_number, filled))
        return "BIGINT" if ints else "DOUBLE"
    if all(parse_date(v) is not None for v in filled):
        timed = any(isinstance(d, datetime) and d.time() != time(0) for d in map(parse_date, filled))
        return "TIMESTAMP" if timed else "DATE"
    return "VARCHAR"


def convert(value: object, kind: str) -> object:
    if not cell_text(value):
        return None
    if kind == "VARCHAR":
        return cell_text(value)
    if kind == "BOOLEAN":
        return value if isinstance(value, bool) else _BOOLS[cell_text(value).lower()]
    if kind in ("BIGINT", "DOUBLE"):
        n = parse_number(value)
        return float(n) if kind == "DOUBLE" else int(n)
    d = parse_date(value)
    if kind == "DATE" and isinstance(d, datetime):
        return d.date()
    return d


def json_cell(value: object) -> object:
    if value is None or isinstance(value, bool | int | float | str):
        return None if is_nan(value) else value
    return cell_text(value)
