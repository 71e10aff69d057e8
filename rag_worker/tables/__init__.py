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
turns off file access and locks its configuration before running it, under a time, memory, row, byte and cell
limit (query.py), in a native thread so the gevent loop keeps serving.
"""

from __future__ import annotations

from .build import build_table
from .cells import detect_header, identifier, parse_date, parse_number
from .files import drop_tables, list_tables, remove_tables, replace_tables, store_sheets, tables_dir
from .model import Column, Sheet, Table
from .query import QueryError, Result, run_query
from .read import TABULAR_KINDS, read_sheets, sheets_or_none

__all__ = [
    "TABULAR_KINDS",
    "Column",
    "QueryError",
    "Result",
    "Sheet",
    "Table",
    "build_table",
    "detect_header",
    "drop_tables",
    "identifier",
    "list_tables",
    "parse_date",
    "parse_number",
    "read_sheets",
    "remove_tables",
    "replace_tables",
    "run_query",
    "sheets_or_none",
    "store_sheets",
    "tables_dir",
]
