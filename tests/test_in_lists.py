"""Big IN lists: pruned reads equal DuckDB over the source, whatever the list holds.

The lists are hostile on purpose: thousands of values with duplicates, NULL, unicode, quotes, the empty
string and values the data does not hold, over identity, bucket and truncate layouts. Speed is measured in
benchmarks/bench_in_lists.py, not here.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.test_pruning_support import build_acceleration, sort_rows

NAMES = [
    "Zürich",
    "東京",
    "rocket 🚀",
    "a'b",
    "",
    "O''Brien",
    'say "hi"',
    "tab\there",
    "ß",
    "SS",
    "nul\u0000x",
]
LAYOUTS = {
    "identity": [("zone", "zone"), ("name", "name")],
    "bucket": [("zb", "bucket(16, zone)"), ("nb", "bucket(8, name)")],
    "truncate": [("zt", "truncate(100, zone)"), ("nt", "truncate(2, name)")],
}


def _table() -> pa.Table:
    rng = random.Random(13)
    zones: list[int | None] = [rng.randrange(-500, 3000) for _ in range(3000)] + [None] * 20
    names: list[str | None] = [
        rng.choice(NAMES) + str(rng.randrange(40)) if rng.random() < 0.9 else rng.choice(NAMES)
        for _ in range(3000)
    ] + [None] * 20
    return pa.table({"zone": pa.array(zones, pa.int64()), "name": pa.array(names, pa.string())})


def _sql_literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return str(value)


def _in_list(column: str, values: list[Any], *, negated: bool = False) -> str:
    return f"{column} {'NOT IN' if negated else 'IN'} ({', '.join(_sql_literal(v) for v in values)})"


def _zone_values() -> list[Any]:
    rng = random.Random(7)
    present = [rng.randrange(-500, 3000) for _ in range(2500)]
    absent = list(range(100_000, 100_500))  # far outside the data
    values: list[Any] = present + present[:300] + absent + [None, -500, 2999]
    rng.shuffle(values)
    return values


def _name_values() -> list[Any]:
    rng = random.Random(8)
    present = [name + str(i) for name in NAMES for i in range(0, 40, 2)]
    absent = [f"absent {i} ✓" for i in range(2000)]
    values: list[Any] = present + present[:50] + absent + [None, "", "Zürich", "zürich"]
    rng.shuffle(values)
    return values


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def acceleration(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    layout = request.param
    directory: Path = tmp_path_factory.mktemp(f"in-lists-{layout}")
    return build_acceleration(directory, _table(), LAYOUTS[layout])


@pytest.mark.parametrize("negated", [False, True], ids=["in", "not-in"])
@pytest.mark.parametrize("column", ["zone", "name"])
@pytest.mark.parametrize("with_null", [True, False], ids=["with-null", "without-null"])
def test_big_in_list_reads_what_duckdb_reads(
    acceleration: Any, column: str, negated: bool, with_null: bool
) -> None:
    values = _zone_values() if column == "zone" else _name_values()
    if not with_null:
        values = [v for v in values if v is not None]
    assert len(values) > 2000, "a list of thousands of values"
    where = _in_list(column, values, negated=negated)
    expected = acceleration.expected_rows(where)
    with acceleration.reader() as reader:
        result = reader.read(where)
    assert sort_rows(result).equals(sort_rows(expected)), (
        f"{column} {'NOT IN' if negated else 'IN'} ({len(values)} values): read {result.num_rows} rows, "
        f"DuckDB over the source {expected.num_rows}"
    )
    if not negated and not with_null:
        assert expected.num_rows > 0, "the list holds values the data has"


def test_big_dnf_in_list_equals_the_sql_form(acceleration: Any) -> None:
    values = _name_values()
    expected = acceleration.expected_rows(_in_list("name", values))
    with acceleration.reader() as reader:
        result = reader.read([("name", "in", values)])
    assert sort_rows(result).equals(sort_rows(expected)), "a DNF IN list reads the rows its SQL form reads"


def test_big_in_list_prunes_partitions(acceleration: Any) -> None:
    values = [v for v in _zone_values() if v is not None and v >= 100_000]
    plan = acceleration.plan(_in_list("zone", values))
    assert plan.files == [], (
        "Should not read: no value of the list is in the data (all >= 100,000, data below 3,000)"
    )


_LITERALS = ["-1", "2.50", "'x''y'", "NULL", "TRUE", "false", "007", "-0.5", "'IN (1, 2)'", "'東京 🚀'", "''"]
_LIST = ", ".join(_LITERALS * 10)


@pytest.mark.parametrize(
    "sql",
    [
        f"SELECT 1 WHERE a IN ({_LIST})",
        f"SELECT 1 WHERE a NOT IN ({_LIST}) AND b in({_LIST}) OR c = 'x IN ({_LIST})'",
        f"SELECT 1 WHERE a IN ({_LIST}, 1 + 1)",
        f'SELECT 1 WHERE "IN (" = 1 -- IN ({_LIST})\n AND z IN ({_LIST})',
        f"SELECT 1 WHERE a IN ({_LIST}",
        f"SELECT 1 WHERE a IN ({_LIST}) AND b = 'it''s \\' IN ({_LIST})'",
        f"SELECT count(*) FROM t WHERE a IN ({_LIST}); SELECT 2",
        f"SELECT 1 WHERE a IN ({_LIST}) /* IN ({_LIST}) */",
    ],
)
def test_long_literal_lists_parse_to_the_tree_sqlglot_builds(sql: str) -> None:
    import sqlglot

    from airflow_partitions.pruning.sql_text import parse_sql

    try:
        expected: Any = [repr(tree) for tree in sqlglot.parse(sql, read="duckdb")]
    except sqlglot.errors.SqlglotError as err:
        expected = type(err)
    try:
        parsed: Any = [repr(tree) for tree in parse_sql(sql)]
    except sqlglot.errors.SqlglotError as err:
        parsed = type(err)
    assert parsed == expected, "the shortcut for long literal lists builds exactly sqlglot's tree"
