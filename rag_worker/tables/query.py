"""Running one validated SELECT over an index's tables in a locked-down in-memory DuckDB.

The limits, all enforced here whoever calls:
- time: a watchdog on a real OS thread interrupts DuckDB at the limit. Under gevent's monkey-patching a
  `threading.Timer` is a greenlet, and no greenlet runs while DuckDB holds the thread, so the watchdog is started
  with the interpreter's own `_thread` functions; the query itself runs in gevent's native thread pool
  (`runtime.offload`), so the worker's other connections (`/health` among them) keep being served meanwhile;
- memory: DuckDB's `memory_limit`, with nowhere to spill (`temp_directory` is empty, `max_temp_directory_size`
  zero): a query that needs more fails instead of writing under the working directory;
- size: the result is kept in DuckDB until each row's size is known; rows are returned while they fit in a
  number of bytes (each cell counted as its text) and of cells, and a cut result says which limit cut it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..runtime import offload
from .cells import json_cell
from .files import tables_dir
from .model import Table

# The result table inside the query's own in-memory database (table names never start with "_").
_RESULT = "_result"


@dataclass
class Result:
    columns: list[str]
    rows: list[list[object]]
    truncated: bool
    limit: str = ""  # the limit that cut the rows when truncated: "200 rows", "65,536 bytes", "10,000 cells"


class QueryError(Exception):
    """The query failed or ran past a limit; the message says which."""


def _native_thread_primitives():
    """`start_new_thread` and `allocate_lock` of the OS threads, even where gevent patched them into greenlets."""
    try:
        from gevent import monkey
    except ImportError:  # pragma: no cover - gevent is a worker dependency
        import _thread

        return _thread.start_new_thread, _thread.allocate_lock
    return monkey.get_original("_thread", "start_new_thread"), monkey.get_original("_thread", "allocate_lock")


class _Watchdog:
    """Interrupts a DuckDB connection once `seconds` have passed, from a thread of its own (a real one), and
    again every 50 ms until stopped, so a statement that starts after the first interrupt is stopped too."""

    def __init__(self, con, seconds: float):
        start_new_thread, allocate_lock = _native_thread_primitives()
        self.fired = False
        self._stop = allocate_lock()
        self._stop.acquire()
        self._ended = allocate_lock()
        self._ended.acquire()
        start_new_thread(self._watch, (con, seconds))

    def _watch(self, con, seconds: float) -> None:
        try:
            if self._stop.acquire(timeout=seconds):
                return
            self.fired = True
            while True:
                con.interrupt()
                if self._stop.acquire(timeout=0.05):
                    return
        finally:
            self._ended.release()

    def stop(self) -> None:
        """Stop watching, and wait until the watchdog has let go of the connection (it may then be closed)."""
        self._stop.release()
        self._ended.acquire()


def run_query(
    settings,
    tables: dict[str, Table],
    index_of: dict[str, str],
    sql: str,
    *,
    max_rows: int,
    timeout_s: float,
    max_bytes: int = 65_536,
    max_cells: int = 10_000,
    memory_mb: int = 512,
) -> Result:
    """Run one validated SELECT over the named tables in a locked-down in-memory DuckDB, off the gevent loop."""
    return offload(
        _run,
        settings,
        tables,
        index_of,
        sql,
        max_rows=max_rows,
        timeout_s=timeout_s,
        max_bytes=max_bytes,
        max_cells=max_cells,
        memory_mb=memory_mb,
    )


def _run(settings, tables, index_of, sql, *, max_rows, timeout_s, max_bytes, max_cells, memory_mb) -> Result:
    import duckdb
    import pyarrow.parquet as pq

    config = {
        "threads": 1,
        "memory_limit": f"{int(memory_mb)}MB",
        "temp_directory": "",  # nowhere to spill: past memory_limit a query fails (not `<cwd>/.tmp`)
        "max_temp_directory_size": "0B",
        "python_enable_replacements": False,  # an unknown name is never looked up among Python variables
    }
    con = duckdb.connect(":memory:", config=config)
    watchdog = None
    try:
        for name in tables:
            # Read here (memory-mapped Arrow) and handed over in-process: the query itself never touches files.
            path = tables_dir(settings, index_of[name]) / f"{name}.parquet"
            con.register(name, pq.read_table(path, memory_map=True))
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        watchdog = _Watchdog(con, timeout_s)
        try:
            con.execute(
                f"CREATE TEMP TABLE {_RESULT} AS SELECT * FROM ({sql}) AS q LIMIT {int(max_rows) + 1}"
            )
            return _bounded_result(con, max_rows=max_rows, max_bytes=max_bytes, max_cells=max_cells)
        except duckdb.Error as exc:
            if watchdog.fired or isinstance(exc, duckdb.InterruptException):
                raise QueryError(f"the query ran longer than {timeout_s:g} s") from exc
            if isinstance(exc, duckdb.OutOfMemoryException):
                raise QueryError(f"the query needed more than {int(memory_mb)} MB of memory") from exc
            raise QueryError(f"the query failed: {str(exc).splitlines()[0][:300]}") from exc
    finally:
        if watchdog is not None:
            watchdog.stop()
        con.close()


def _bounded_result(con, *, max_rows: int, max_bytes: int, max_cells: int) -> Result:
    """The rows of the result table that fit in max_rows, max_bytes and max_cells, fetched only once they are
    known to fit (a one-row result can be a list of millions of values)."""
    columns = [d[0] for d in con.execute(f"SELECT * FROM {_RESULT} LIMIT 0").description]
    # Each cell's size as text (NULL as 4, "null"), plus 2 for its separator: close to its size in the reply.
    sizes = con.execute(
        f"SELECT coalesce(strlen(CAST(COLUMNS(*) AS VARCHAR)), 4) + 2 FROM {_RESULT} ORDER BY rowid"
    ).fetchall()
    keep, used, limit = 0, 0, ""
    for row in sizes:
        if keep == max_rows:
            limit = f"{max_rows:,} rows"
            break
        if (keep + 1) * len(columns) > max_cells:
            limit = f"{max_cells:,} cells"
            break
        if used + sum(row) > max_bytes:
            limit = f"{max_bytes:,} bytes"
            break
        keep, used = keep + 1, used + sum(row)
    if limit and keep == 0:
        first = f"{len(columns):,} cells" if limit.endswith("cells") else f"{sum(sizes[0]):,} bytes"
        raise QueryError(
            f"the result is too large: its first row alone has {first}, over the limit of {limit}"
        )
    rows = con.execute(f"SELECT * FROM {_RESULT} ORDER BY rowid LIMIT {keep}").fetchall()
    return Result(columns, [[json_cell(v) for v in r] for r in rows], bool(limit), limit)
