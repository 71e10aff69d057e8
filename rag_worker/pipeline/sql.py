"""The `sql` route: aggregate questions over spreadsheet tables, answered from a computed result.

The utility model writes one SELECT from the tables' schema and a few sample rows; `validate` checks it with a
real SQL parser (sqlglot, DuckDB dialect): one statement, a query and nothing else, only known tables or CTEs
visible where they are named (scoped as DuckDB scopes them), no table functions and no function that reads files,
the environment or settings; DuckDB's own `enable_external_access=false` is the second layer. The query then
runs in a locked-down in-memory DuckDB (rag_worker/tables/) under a time, memory, row, byte and cell limit. Its
result becomes one document of kind `table` (with the query) that the generator answers from. Anything that fails
says why, and the turn falls back to ordinary retrieval.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass

from .. import tables as tables_mod
from .turn import Turn

log = logging.getLogger("rag_worker.pipeline")

# Words that ask for arithmetic over rows: counting, summing, averaging, ranking, filtering.
AGGREGATE_RE = re.compile(
    r"\b(how many|how much|number of|count|total|sum|average|avg|mean|median|maximum|minimum|max|min|"
    r"highest|lowest|largest|smallest|most|least|top \d+|rank|per|each|more than|less than|at least|"
    r"between|percentage|proportion|ratio)\b",
    re.IGNORECASE,
)

_DENIED_FUNCTION = re.compile(
    r"^(read_|glob|.*scan|query|getenv|current_setting|set_|sniff|parquet_|duckdb_|pragma|load|install|"
    r"export|import|copy|attach|detach|http|s3|iceberg|delta|sqlite|postgres|mysql|which_secret|file|"
    r"list_files|checkpoint|force_checkpoint|enable_|disable_)",
    re.IGNORECASE,
)


class Refused(Exception):
    """The query is not one the worker will run; the message says why."""


@dataclass
class Outcome:
    documents: list[dict]
    query: str | None
    reason: str  # what happened, for the step label
    ok: bool


def tables_for(turn: Turn) -> tuple[dict[str, tables_mod.Table], dict[str, str]]:
    """The tables of the turn's indexes (restricted to its datasets), by name, and each one's index."""
    found: dict[str, tables_mod.Table] = {}
    index_of: dict[str, str] = {}
    datasets = set(turn.request.datasets or [])
    for index in turn.request.indexes:
        for card in tables_mod.list_tables(turn.settings, index):
            if datasets and card.dataset not in datasets:
                continue
            if card.name not in found:
                found[card.name] = card
                index_of[card.name] = index
    return found, index_of


def wants_sql(query: str) -> bool:
    return bool(AGGREGATE_RE.search(query))


def schema_text(tables: dict[str, tables_mod.Table]) -> str:
    parts = []
    for card in tables.values():
        cols = []
        for c in card.columns:
            note = f" (header '{c.source}')" if c.source and c.source != c.name else ""
            cols.append(f"  {c.name} {c.type}{note}")
            if c.text_column:
                cols.append(f"  {c.text_column} VARCHAR (the cells of {c.name} as written)")
        sample = "\n".join(
            "  " + " | ".join("" if v is None else str(v) for v in row) for row in card.samples
        )
        where = card.filename + (f", sheet '{card.sheet}'" if card.sheet else "")
        parts.append(
            f"TABLE {card.name} -- {card.rows} rows from {where}\n"
            + "\n".join(cols)
            + f"\nSample rows:\n{sample}"
        )
    return "\n\n".join(parts)


def sql_messages(turn: Turn, query: str, tables: dict[str, tables_mod.Table]) -> list[dict]:
    return [
        {"role": "system", "content": turn.prompt("sql")},
        {"role": "user", "content": f"{schema_text(tables)}\n\nQuestion: {query}\nSQL:"},
    ]


_FENCE = re.compile(r"```(?:sql)?\s*(.*?)```", re.DOTALL | re.IGNORECASE)
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)


def extract_sql(reply: str) -> str | None:
    text = _THINK.sub("", reply or "").strip()
    fenced = _FENCE.search(text)
    if fenced:
        text = fenced.group(1).strip()
    if not text or text.upper().rstrip(".") == "NONE":
        return None
    return text.rstrip().rstrip(";").strip() or None


def validate(sql: str, known: set[str]) -> str:
    """The query normalised to DuckDB SQL, or Refused saying what is wrong with it."""
    import sqlglot
    from sqlglot import exp

    try:
        statements = [s for s in sqlglot.parse(sql, read="duckdb") if s is not None]
    except sqlglot.errors.ParseError as exc:
        raise Refused(f"not valid SQL ({str(exc).splitlines()[0][:200]})") from exc
    if len(statements) != 1:
        raise Refused(f"one statement expected, got {len(statements)}")
    tree = statements[0]
    if not isinstance(tree, exp.Select | exp.SetOperation):
        raise Refused(f"only SELECT is allowed, not {tree.key.upper()}")
    forbidden = (
        exp.Insert,
        exp.Update,
        exp.Delete,
        exp.Drop,
        exp.Create,
        exp.Alter,
        exp.Command,
        exp.Pragma,
        exp.Copy,
        exp.Attach,
        exp.Detach,
        exp.Set,
        exp.Use,
        exp.Merge,
        exp.Into,
        exp.Transaction,
    )
    for node in tree.walk():
        if isinstance(node, forbidden):
            raise Refused(f"only reading is allowed ({node.key.upper()} found)")
    for table in tree.find_all(exp.Table):
        if not isinstance(table.this, exp.Identifier):
            raise Refused("table functions are not allowed")
        if table.args.get("db") or table.args.get("catalog"):
            raise Refused(f"unknown table '{table.sql(dialect='duckdb')}'")
        if table.name.lower() not in known and not _names_visible_cte(table):
            raise Refused(f"unknown table '{table.name}'; known: {', '.join(sorted(known)) or 'none'}")
    for func in tree.find_all(exp.Func):
        name = func.name if isinstance(func, exp.Anonymous) else func.sql_name()
        if _DENIED_FUNCTION.match(name or "") or type(func).__name__.lower().startswith("read"):
            raise Refused(f"the function {name} is not allowed")
    return tree.sql(dialect="duckdb")


def _names_visible_cte(table) -> bool:
    """Whether the table reference names a CTE visible where it stands, as DuckDB scopes them: a WITH's CTEs are
    visible in the query it belongs to (both sides of a UNION included) and in the queries nested in it; inside
    the WITH, a CTE sees only the ones defined before it (and itself under RECURSIVE). A CTE of a subquery is
    invisible outside it, so `FROM "/etc/x.csv"` next to a subquery defining a CTE of that name is a file read.
    Never wider than DuckDB's own scoping: a name taken for a CTE here is one for DuckDB too."""
    from sqlglot import exp

    name = table.name.lower()
    below, node = table, table.parent
    while node is not None:
        seen = []
        if isinstance(node, exp.With):
            # Reached from inside one of its CTEs (`below`): only the earlier ones, and itself when recursive.
            position = next((i for i, cte in enumerate(node.expressions) if cte is below), None)
            if position is not None:
                seen = node.expressions[: position + 1 if node.args.get("recursive") else position]
        else:
            # The query a WITH belongs to sees all of its CTEs, unless the path came up through the WITH itself.
            with_ = next((v for v in node.args.values() if isinstance(v, exp.With)), None)
            if with_ is not None and with_ is not below:
                seen = with_.expressions
        if any(cte.alias_or_name.lower() == name for cte in seen):
            return True
        below, node = node, node.parent
    return False


def referenced(sql: str, known: set[str]) -> set[str]:
    import sqlglot
    from sqlglot import exp

    tree = sqlglot.parse_one(sql, read="duckdb")
    return {t.name.lower() for t in tree.find_all(exp.Table)} & known


def result_document(
    sql: str, result: tables_mod.Result, used: list[tables_mod.Table], index_of: dict[str, str]
) -> dict:
    header = "| " + " | ".join(result.columns) + " |"
    rule = "| " + " | ".join("---" for _ in result.columns) + " |"
    body = ["| " + " | ".join("" if v is None else str(v) for v in row) + " |" for row in result.rows]
    more = f"\n(more rows not shown: the result is limited to {result.limit})" if result.truncated else ""
    sources = ", ".join(sorted({c.filename for c in used}))
    text = (
        f"Result of a SQL query over {sources}\n"
        + "\n".join([header, rule, *body])
        + more
        + f"\n\nQuery: {sql}"
    )
    first = used[0] if used else None
    return {
        "id": "sql:" + hashlib.sha256(sql.encode()).hexdigest()[:16],
        "kind": "table",
        "query": sql,
        "columns": result.columns,
        "rows": result.rows,
        "truncated": result.truncated,
        "tables": [c.name for c in used],
        "document_id": "",
        "filename": first.filename if first else "",
        "dataset": first.dataset if first else "default",
        "index": index_of.get(first.name) if first else None,
        "page": None,
        "chunk_index": None,
        "text": text,
        "score": None,
        "rank": 1,
        "ref": "S1",
    }


def answer_with_sql(turn: Turn, query: str) -> Iterator:
    """Yield the sql steps; return an Outcome (ok with one table document, or the reason it fell back)."""
    tables, index_of = tables_for(turn)
    if not tables:
        return Outcome([], None, "no tables in this index", False)
    yield turn.step("sql", f"Writing a query over {len(tables)} table{'s' if len(tables) != 1 else ''}")
    settings = turn.settings
    try:
        reply = turn.utility_chat(sql_messages(turn, query, tables), max_tokens=settings.sql_max_tokens)
    except Exception as exc:  # the model is a helper here; retrieval still answers
        log.warning("utility model failed writing SQL: %s", exc)
        return Outcome([], None, f"the model could not write a query ({type(exc).__name__})", False)
    sql = extract_sql(reply)
    if sql is None:
        return Outcome([], None, "the model found no query for this question", False)
    known = set(tables)
    try:
        sql = validate(sql, known)
    except Refused as exc:
        return Outcome([], sql, f"query refused: {exc}", False)
    used_names = referenced(sql, known)
    yield turn.step("sql", "Running the query", query=sql)
    try:
        result = tables_mod.run_query(
            settings,
            {n: tables[n] for n in used_names},
            index_of,
            sql,
            max_rows=settings.sql_max_rows,
            timeout_s=settings.sql_timeout_s,
            max_bytes=settings.sql_max_result_bytes,
            max_cells=settings.sql_max_cells,
            memory_mb=settings.sql_memory_mb,
        )
    except tables_mod.QueryError as exc:
        return Outcome([], sql, str(exc), False)
    used = [tables[n] for n in sorted(used_names)]
    doc = result_document(sql, result, used, index_of)
    rows = len(result.rows)
    label = f"{rows} row{'s' if rows != 1 else ''}" + (
        f" (truncated at {result.limit})" if result.truncated else ""
    )
    return Outcome([doc], sql, label, True)


def sql_route(turn: Turn, query: str) -> str | None:
    """For triage: the tables an aggregate question would be computed over ("2 tables"), or None."""
    if not wants_sql(query):
        return None
    try:
        tables, _ = tables_for(turn)
    except Exception as exc:  # tables are an addition; a broken card must not sink triage
        log.warning("listing tables failed: %s", exc)
        return None
    if not tables:
        return None
    return f"{len(tables)} table{'s' if len(tables) != 1 else ''}"


def sql_turn(turn: Turn, query: str):
    """The chat hook: yield steps; return (documents, route): the table document and "sql", or ([], "rag")."""
    with turn.timed("sql_ms"):
        outcome = yield from answer_with_sql(turn, query)
    if outcome.query:
        turn.flags["sql"] = outcome.query
    if outcome.ok:
        yield turn.step("sql", f"Query returned {outcome.reason}", "llm", query=outcome.query)
        return outcome.documents, "sql"
    turn.flags["sql_fallback"] = outcome.reason
    detail = {"query": outcome.query} if outcome.query else {}
    yield turn.step(
        "sql",
        f"{outcome.reason[:1].upper()}{outcome.reason[1:]}; searching the documents instead",
        "fallback",
        **detail,
    )
    return [], "rag"
