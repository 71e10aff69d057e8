"""Running one validated SELECT over an index's tables in a locked-down in-memory DuckDB."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from .cells import json_cell
from .files import tables_dir
from .model import Table


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
    return Result(columns, [[json_cell(v) for v in r] for r in rows[:max_rows]], truncated)
