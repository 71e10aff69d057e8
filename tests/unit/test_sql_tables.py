"""Spreadsheets as typed SQL tables, and the validator that decides which model-written queries may run."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import pytest

from rag_worker import tables
from rag_worker.pipeline.sql import Refused, extract_sql, validate

WARDS_CSV = (
    "Ward admissions 2024\n"
    "\n"
    "Ward,Admitted,Cost,Resident,Private\n"
    'North,2024-03-02,"$1,200.50",Ann,yes\n'
    "South,2024-03-15,$800,Bob,no\n"
    "North,2024-04-01,$950,Cy,no\n"
)


@pytest.fixture
def settings(tmp_path):
    return SimpleNamespace(index_store=tmp_path)


@pytest.fixture
def wards(tmp_path, settings):
    path = tmp_path / "wards.csv"
    path.write_text(WARDS_CSV)
    sheets = tables.read_sheets(path, "csv")
    cards = tables.replace_tables(settings, "hosp", "default", "wards.csv", sheets)
    return cards[0]


def test_header_row_below_a_title_is_found_and_columns_are_typed(wards):
    assert wards.name == "wards" and wards.header_row == 3 and wards.rows == 3
    types = {c.name: c.type for c in wards.columns}
    assert types == {
        "ward": "VARCHAR",
        "admitted": "DATE",
        "cost": "DOUBLE",
        "resident": "VARCHAR",
        "private": "BOOLEAN",
    }
    cost = next(c for c in wards.columns if c.name == "cost")
    assert cost.source == "Cost" and cost.text_column == "cost_text"
    assert "wards.csv" in wards.describe() and "cost DOUBLE" in wards.describe()


def test_queries_compute_over_parsed_values_and_keep_the_original_text(settings, wards):
    known = {"wards": wards}
    sql = validate("SELECT ward, SUM(cost) AS total FROM wards GROUP BY ward ORDER BY ward", set(known))
    result = tables.run_query(settings, known, {"wards": "hosp"}, sql, max_rows=10, timeout_s=10)
    assert result.columns == ["ward", "total"] and result.rows == [["North", 2150.5], ["South", 800.0]]
    march = tables.run_query(
        settings,
        known,
        {"wards": "hosp"},
        validate("SELECT count(*) FROM wards WHERE month(admitted) = 3", set(known)),
        max_rows=10,
        timeout_s=10,
    )
    assert march.rows == [[2]]
    text = tables.run_query(
        settings,
        known,
        {"wards": "hosp"},
        "SELECT cost_text FROM wards WHERE resident = 'Ann'",
        max_rows=5,
        timeout_s=10,
    )
    assert text.rows == [["$1,200.50"]]


def test_row_limit_truncates_and_says_so(settings, wards):
    result = tables.run_query(
        settings, {"wards": wards}, {"wards": "hosp"}, "SELECT * FROM wards", max_rows=2, timeout_s=10
    )
    assert len(result.rows) == 2 and result.truncated is True


def test_time_limit_interrupts_a_runaway_query(settings, wards):
    runaway = "SELECT count(*) FROM range(100000000000) a, range(1000000) b WHERE a.range + b.range < 0"
    with pytest.raises(tables.QueryError, match="ran longer than"):
        tables.run_query(settings, {"wards": wards}, {"wards": "hosp"}, runaway, max_rows=5, timeout_s=0.5)


def test_the_engine_itself_refuses_file_access_even_past_the_validator(settings, wards, tmp_path):
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n1\n")
    with pytest.raises(tables.QueryError):
        tables.run_query(
            settings,
            {"wards": wards},
            {"wards": "hosp"},
            f"SELECT * FROM read_csv('{secret}')",
            max_rows=5,
            timeout_s=5,
        )


@pytest.mark.parametrize(
    ("sql", "why"),
    [
        ("DROP TABLE wards", "only SELECT"),
        ("SELECT * FROM wards; DROP TABLE wards", "one statement"),
        ("SELECT 1; SELECT 2", "one statement"),
        ("SELECT * FROM patients", "unknown table 'patients'"),
        ("SELECT * FROM read_csv('/etc/passwd')", "table functions"),
        ("SELECT * FROM '/etc/passwd'", "unknown table"),
        ("SELECT read_text('/etc/passwd')", "not allowed"),
        ("SELECT getenv('HOME')", "not allowed"),
        ("SELECT * FROM glob('/*')", "table functions"),
        ("SELECT current_setting('memory_limit')", "not allowed"),
        ("COPY wards TO '/tmp/x.csv'", "only SELECT"),
        ("ATTACH '/tmp/x.db' AS x", "only SELECT"),
        ("PRAGMA show_tables", "only SELECT"),
        ("SELECT * FROM other.wards", "unknown table"),
        ("SELEC ward FROM", "not valid SQL"),
    ],
)
def test_the_validator_refuses_what_is_not_a_plain_read(sql, why):
    with pytest.raises(Refused, match=why):
        validate(sql, {"wards"})


def test_the_validator_accepts_ctes_unions_and_subqueries():
    for sql in (
        "WITH n AS (SELECT * FROM wards WHERE ward = 'North') SELECT count(*) FROM n",
        "SELECT ward FROM wards UNION SELECT resident FROM wards",
        "SELECT * FROM wards WHERE cost > (SELECT avg(cost) FROM wards)",
    ):
        assert validate(sql, {"wards"})


@pytest.mark.parametrize(
    "sql",
    [
        # A CTE is visible only in the query its WITH belongs to: elsewhere the same name is a file read.
        '(WITH "/etc/x.csv" AS (SELECT 1) SELECT * FROM "/etc/x.csv") UNION SELECT * FROM "/etc/x.csv"',
        'SELECT * FROM (WITH "/etc/x.csv" AS (SELECT 1) SELECT * FROM "/etc/x.csv") JOIN "/etc/x.csv" ON true',
        'WITH a AS (WITH "/etc/x.csv" AS (SELECT 1) SELECT * FROM "/etc/x.csv") SELECT * FROM "/etc/x.csv"',
        # Inside its own WITH a CTE sees only the earlier ones, and itself only under RECURSIVE.
        'WITH "/etc/x.csv" AS (SELECT * FROM "/etc/x.csv") SELECT * FROM "/etc/x.csv"',
        'WITH a AS (SELECT * FROM "/etc/x.csv"), "/etc/x.csv" AS (SELECT 1) SELECT * FROM a',
    ],
)
def test_a_cte_name_counts_only_where_the_cte_is_visible(sql):
    with pytest.raises(Refused, match="unknown table '/etc/x.csv'"):
        validate(sql, {"wards"})


def test_ctes_visible_where_they_are_named_are_accepted():
    for sql in (
        "WITH a AS (SELECT * FROM wards) SELECT * FROM a UNION SELECT * FROM a",
        "WITH b AS (SELECT 1 AS x), a AS (SELECT * FROM b) SELECT * FROM a",
        "WITH a AS (SELECT 1 AS x) SELECT * FROM wards WHERE EXISTS (SELECT 1 FROM (SELECT * FROM a) AS s)",
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3) SELECT * FROM r",
    ):
        assert validate(sql, {"wards"})


def test_a_result_is_cut_at_its_byte_and_cell_limits_and_says_which(settings, wards):
    known, where = {"wards": wards}, {"wards": "hosp"}
    wide = "SELECT repeat('x', 100) AS a FROM wards"
    by_bytes = tables.run_query(settings, known, where, wide, max_rows=10, timeout_s=10, max_bytes=250)
    assert len(by_bytes.rows) == 2 and by_bytes.truncated and by_bytes.limit == "250 bytes"
    by_cells = tables.run_query(
        settings, known, where, "SELECT * FROM wards", max_rows=10, timeout_s=10, max_cells=20
    )
    assert len(by_cells.rows) == 2 and by_cells.truncated and by_cells.limit == "20 cells"
    whole = tables.run_query(settings, known, where, "SELECT ward FROM wards", max_rows=10, timeout_s=10)
    assert len(whole.rows) == 3 and not whole.truncated


def test_a_single_huge_row_is_refused_saying_so(settings, wards):
    with pytest.raises(
        tables.QueryError, match="too large: its first row alone has .* bytes, over the limit"
    ):
        tables.run_query(
            settings,
            {"wards": wards},
            {"wards": "hosp"},
            "SELECT range(100000) AS r",
            max_rows=5,
            timeout_s=10,
        )


def test_past_its_memory_limit_a_query_fails_without_spilling_to_disk(settings, wards, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    hungry = "SELECT count(*) FROM (SELECT DISTINCT a.range * 100000 + b.range AS k FROM range(100000) a, range(200) b)"
    with pytest.raises(tables.QueryError, match="needed more than 64 MB of memory"):
        tables.run_query(
            settings, {"wards": wards}, {"wards": "hosp"}, hungry, max_rows=5, timeout_s=60, memory_mb=64
        )
    assert not (tmp_path / ".tmp").exists()


def test_model_replies_are_unwrapped():
    assert extract_sql("```sql\nSELECT 1;\n```") == "SELECT 1"
    assert extract_sql("<think>hmm</think>\nSELECT count(*) FROM t;") == "SELECT count(*) FROM t"
    assert extract_sql("NONE") is None and extract_sql("") is None


def test_replacing_and_removing_a_files_tables(tmp_path, settings, wards):
    other = tmp_path / "costs.csv"
    other.write_text("item,price\npen,2\nbook,10\n")
    tables.replace_tables(settings, "hosp", "default", "costs.csv", tables.read_sheets(other, "csv"))
    assert {t.name for t in tables.list_tables(settings, "hosp")} == {"wards", "costs"}
    assert tables.remove_tables(settings, "hosp", "default", "wards.csv") == 1
    assert [t.name for t in tables.list_tables(settings, "hosp")] == ["costs"]
    folder = tables.tables_dir(settings, "hosp")
    assert sorted(p.name for p in folder.iterdir()) == ["costs.json", "costs.parquet"]


def test_a_sheet_without_a_header_gets_numbered_columns(tmp_path):
    path = tmp_path / "raw.csv"
    path.write_text("1,2024-01-05,3.5\n2,2024-01-06,4\n")
    card, arrow = tables.build_table(
        tables.read_sheets(path, "csv")[0], name="raw", dataset="d", filename="raw.csv"
    )
    assert card.header_row is None
    assert [(c.name, c.type) for c in card.columns] == [
        ("column_1", "BIGINT"),
        ("column_2", "DATE"),
        ("column_3", "DOUBLE"),
    ]
    assert arrow.column("column_2").to_pylist()[0] == dt.date(2024, 1, 5)


def test_numbers_in_many_spellings():
    assert tables.parse_number("1,234.50") == 1234.5
    assert tables.parse_number("(300)") == -300
    assert tables.parse_number("12%") == pytest.approx(0.12)
    assert tables.parse_number("€ 1 000") == 1000
    assert tables.parse_number("1 000 EUR") == 1000
    assert tables.parse_number("12 apples") is None
    assert tables.parse_number("2024-01-01") is None
