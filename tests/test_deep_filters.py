"""Filters nested or chained a thousand levels deep: read, plan and query answer like DuckDB, or refuse.

Before the deep-stack entry points, each of these raised a raw `RecursionError` (45 nested ORs already did).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from test_pruning_support import Acceleration, build_acceleration, sort_rows

from airflow_partitions.cli.main import main
from airflow_partitions.exceptions import FilterError, UnsafeQueryError

ROWS = 400


def make_table() -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(ROWS), pa.int64()),
            "user_id": pa.array([None if i % 9 == 0 else i % 97 for i in range(ROWS)], pa.int64()),
            "region": pa.array([["EU", "a/b=c", "50%", "it's", None][i % 5] for i in range(ROWS)]),
            "ts": pa.array([dt.datetime(2026, 1, 1) + dt.timedelta(hours=5 * i) for i in range(ROWS)]),
        }
    )


@pytest.fixture(scope="module")
def acceleration(tmp_path_factory: pytest.TempPathFactory) -> Acceleration:
    return build_acceleration(
        tmp_path_factory.mktemp("deep"), make_table(), [("region", "region"), ("b", "bucket(4, user_id)")]
    )


def flat_or(count: int) -> str:
    return " OR ".join(f"user_id = {i}" for i in range(count))


def nested_or(depth: int) -> str:
    return "(" * depth + "region = 'EU'" + "".join(f" OR user_id = {i})" for i in range(depth))


def nested_and_or(depth: int) -> str:
    # Alternating AND / OR keeps every level in the predicate tree (no flattening can shorten it).
    text = "id >= 0"
    for level in range(depth):
        operator = "OR" if level % 2 else "AND"
        text = f"(user_id <> {level} {operator} {text})"
    return text


DEEP_FILTERS = {
    "flat-1000-or": flat_or(1000),
    "nested-45-or": nested_or(45),
    "nested-1000-or": nested_or(1000),
    "alternating-1000": nested_and_or(1000),
    "not-x3000": "NOT " * 3000 + "region = 'EU'",
    "flat-1000-and": " AND ".join(f"id <> {i}" for i in range(1000)),
    # Above MAX_PUSHED_FILTER_NODES the residual is applied above DuckDB's scan (pushed down, 5,000
    # comparisons took minutes under load); the rows must be the same either way.
    "flat-5000-and": " AND ".join(f"id <> {i}" for i in range(0, 10000, 2)),
}


def duckdb_rows(table: pa.Table, where: str) -> pa.Table:
    connection = duckdb.connect()
    try:
        connection.execute("SET max_expression_depth TO 100000")
        connection.register("source", table)
        return connection.sql(f"SELECT * FROM source WHERE {where}").to_arrow_table()
    finally:
        connection.close()


@pytest.mark.parametrize("name", list(DEEP_FILTERS))
def test_deep_filter_reads_what_duckdb_reads_over_the_source(acceleration: Acceleration, name: str) -> None:
    where = DEEP_FILTERS[name]
    expected = duckdb_rows(acceleration.table, where)
    reader = acceleration.reader()
    try:
        got = reader.read(where)
        plan = reader.plan(where)
        assert plan.explain()  # rendering the plan walks the predicate too
    finally:
        reader.close()
    assert sort_rows(got) == sort_rows(expected)


QUERY_FILTERS = {
    "flat-1000-or": flat_or(1000),
    # DuckDB runs the query itself and refuses expressions deeper than its max_expression_depth (1000).
    "nested-900-or": nested_or(900),
    "not-x900": "NOT " * 900 + "region = 'EU'",
}


@pytest.mark.parametrize("name", list(QUERY_FILTERS))
def test_deep_filter_in_query_matches_duckdb(acceleration: Acceleration, name: str) -> None:
    where = QUERY_FILTERS[name]
    expected = duckdb_rows(acceleration.table, where).num_rows
    reader = acceleration.reader()
    try:
        got = reader.query(f"SELECT count(*) AS n FROM {acceleration.dataset} WHERE {where}")
    finally:
        reader.close()
    assert got.column("n").to_pylist() == [expected]


def test_query_deeper_than_duckdb_allows_says_so(acceleration: Acceleration) -> None:
    reader = acceleration.reader()
    try:
        with pytest.raises(UnsafeQueryError, match="max_expression_depth"):
            reader.query(f"SELECT count(*) FROM {acceleration.dataset} WHERE {nested_or(1200)}")
    finally:
        reader.close()


def test_deep_filter_through_the_plan_command(
    acceleration: Acceleration, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["plan", str(acceleration.spec_path), acceleration.dataset, "--where", nested_or(1000)])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "Traceback" not in out.err


def test_a_filter_beyond_any_stack_is_a_filter_error(acceleration: Acceleration, tmp_path: Path) -> None:
    """Past what the deep stack holds, the user gets a FilterError that says what to do, not a crash."""
    reader = acceleration.reader()
    try:
        with pytest.raises(FilterError, match="nests too deeply"):
            reader.plan(nested_or(20_000))
    finally:
        reader.close()


def test_the_deep_stack_limit_is_in_force_before_the_worker_runs() -> None:
    """The worker recursing at once, before the caller could raise the limit, still gets the deep limit."""
    from airflow_partitions.pruning.deep import call_with_deep_stack

    def depth(n: int) -> int:
        return 0 if n == 0 else 1 + depth(n - 1)

    for _ in range(5):
        assert call_with_deep_stack(depth, 5_000) == 5_000


def test_only_a_filter_too_deep_for_the_callers_stack_moves_to_the_deep_stack_thread(
    acceleration: Acceleration, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shallow read runs inline (a thread start costs a fifth of a cached point read); one that recursed
    too deep inline is answered on the deep-stack thread, and answered the same as DuckDB's."""
    import threading

    started: list[str] = []
    original = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        started.append(thread.name)
        original(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    reader = acceleration.reader()
    try:
        shallow = "region = 'EU' OR user_id = 3"
        got = reader.read(shallow)
        assert sort_rows(got) == sort_rows(duckdb_rows(acceleration.table, shallow))
        assert got.num_rows > 0
        assert "airflow-partitions-deep-filter" not in started, "no thread for a shallow filter"
        deep = nested_or(1000)
        got = reader.read(deep)
    finally:
        reader.close()
    assert "airflow-partitions-deep-filter" in started, "the deep filter moved to the deep stack"
    assert sort_rows(got) == sort_rows(duckdb_rows(acceleration.table, deep))
