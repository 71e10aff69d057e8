"""What a sheet becomes: the raw `Sheet` read from a file, and the `Table` card kept beside its Parquet file."""

from __future__ import annotations

from dataclasses import dataclass, field


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
