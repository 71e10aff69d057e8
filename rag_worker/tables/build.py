"""A sheet to a typed Arrow table and its card: header found, columns named and typed, text kept beside."""

from __future__ import annotations

from .cells import cell_text, column_type, convert, detect_header, identifier, json_cell
from .model import Column, Sheet, Table

SAMPLE_ROWS = 3


def build_table(sheet: Sheet, *, name: str, dataset: str, filename: str):
    """A sheet to (Table card, pyarrow Table); None when the sheet holds no data rows."""
    import pyarrow as pa

    header_at = detect_header(sheet.rows)
    header: list[object] = [] if header_at is None else sheet.rows[header_at]
    start = 0 if header_at is None else header_at + 1
    data = [r for r in sheet.rows[start:] if any(cell_text(v) for v in r)]
    if not data:
        return None
    width = _width(header, data)
    columns, arrays, names = _columns(header, data, width)
    samples = [
        [json_cell(v) for v in (r[j] if j < len(r) else None for j in range(width))]
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
    return card, pa.Table.from_arrays(arrays, names=names)


def _width(header: list[object], data: list[list[object]]) -> int:
    """The table's width without the trailing columns empty in the header and every row."""
    width = max(len(header), *(len(r) for r in data))
    while (
        width
        and not cell_text(header[width - 1] if width <= len(header) else None)
        and not any(cell_text(r[width - 1]) for r in data if width <= len(r))
    ):
        width -= 1
    return width


def _unique(name: str, used: set[str]) -> str:
    col, n = name, 2
    while col in used:
        col, n = f"{name}_{n}", n + 1
    used.add(col)
    return col


def _columns(header: list[object], data: list[list[object]], width: int):
    """Each column named, typed and converted; a typed column's original text kept in `<name>_text`."""
    import pyarrow as pa

    columns: list[Column] = []
    arrays = []
    names: list[str] = []
    used: set[str] = set()
    for j in range(width):
        source = cell_text(header[j]) if j < len(header) else ""
        col = _unique(identifier(source, f"column_{j + 1}"), used)
        values = [r[j] if j < len(r) else None for r in data]
        kind = column_type(values)
        column = Column(col, kind, source)
        arrays.append(pa.array([convert(v, kind) for v in values], type=_ARROW[kind]()))
        names.append(col)
        if kind != "VARCHAR":
            text_name = f"{col}_text"
            while text_name in used:
                text_name += "_"
            used.add(text_name)
            column.text_column = text_name
            arrays.append(pa.array([cell_text(v) or None for v in values], type=pa.string()))
            names.append(text_name)
        columns.append(column)
    return columns, arrays, names


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
