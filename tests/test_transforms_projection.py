"""Each transform projects conditions on its source column onto its partition values.

The pruning evaluator only turns these projections into masks, so what a transform says here is what
pruning can prune: an order-preserving transform projects comparisons, every transform projects points,
and a bounded range is enumerated through the others.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
import pytest
import sqlglot

from airflow_partitions.exceptions import PartitionExpressionError, SourceError
from airflow_partitions.quoting import quote_identifier
from airflow_partitions.transforms import parse_transform
from airflow_partitions.transforms.parser import (
    CALENDAR_NODES,
    DIALECT,
    is_transform_call,
    may_call_transforms,
    transform_from_node,
)
from airflow_partitions.transforms.projection import (
    UNKNOWN,
    AllOf,
    AnyOf,
    Op,
    Projection,
    ValueBound,
    ValueSet,
)


def bound(expression: str, arrow_type: pa.DataType) -> Any:
    return parse_transform(expression).bind(arrow_type)


# --- order-preserving transforms --------------------------------------------------------------------


def test_truncate_lower_bound_keeps_the_partition_holding_the_literal() -> None:
    transform = bound("truncate(10, c)", pa.int64())
    # c < 25: partition 20 holds 20..24, which qualify.
    assert transform.project(Op.LT, 25) == Projection(ValueBound(Op.LE, 20), ValueBound(Op.GE, 20))
    # c < 20: partition 20 starts at 20, so nothing in it qualifies.
    assert transform.project(Op.LT, 20).may_hold == ValueBound(Op.LT, 20)
    # c > 25: partition 20 reaches up to 30, so it may hold 26..29.
    assert transform.project(Op.GT, 25).may_hold == ValueBound(Op.GE, 20)


def test_identity_projects_every_operator_and_not_equal_both_ways() -> None:
    transform = bound("c", pa.int64())
    assert transform.project(Op.LT, 5) == Projection(ValueBound(Op.LT, 5), ValueBound(Op.GE, 5))
    assert transform.project(Op.GT, 5) == Projection(ValueBound(Op.GT, 5), ValueBound(Op.LE, 5))
    assert transform.project(Op.NE, 5) == Projection(ValueBound(Op.NE, 5), ValueBound(Op.EQ, 5))
    assert transform.project_in([3, 1, 3]) == Projection(ValueSet([3, 1]), ValueSet([3, 1], negated=True))


def test_a_transform_that_is_not_one_to_one_cannot_prune_not_equal() -> None:
    transform = bound("truncate(10, c)", pa.int64())
    assert transform.project(Op.NE, 25) == Projection(None, ValueBound(Op.EQ, 20))
    assert transform.project_in([25]) == Projection(ValueSet([20]), None)


def test_date_part_year_keeps_order_and_finer_units_do_not() -> None:
    year = bound("date_part('year', ts)", pa.timestamp("us"))
    moment = dt.datetime(2026, 6, 1)
    assert year.project(Op.GT, moment).may_hold == ValueBound(Op.GE, 2026)
    assert year.project(Op.LT, dt.datetime(2026, 1, 1)).may_hold == ValueBound(Op.LT, 2026)
    month = bound("date_part('month', ts)", pa.timestamp("us"))
    assert month.project(Op.GT, moment) is UNKNOWN
    assert month.project(Op.EQ, moment) == Projection(ValueSet([6]), None)


def test_date_trunc_projects_to_the_period_start() -> None:
    transform = bound("date_trunc('month', d)", pa.date32())
    projection = transform.project(Op.GE, dt.date(2026, 3, 15))
    assert projection.may_hold == ValueBound(Op.GE, dt.date(2026, 3, 1))


def test_ordered_range_is_the_conjunction_of_its_bounds() -> None:
    transform = bound("truncate(10, c)", pa.int64())
    projection = transform.project_range(12, 25, True, False, column_type=pa.int64(), max_candidates=5)
    assert projection == Projection(
        AllOf((ValueBound(Op.GE, 10), ValueBound(Op.LE, 20))),
        # c < 12 may hold in partition 10 (10, 11); c >= 25 in partition 20.
        AnyOf((ValueBound(Op.LE, 10), ValueBound(Op.GE, 20))),
    )


# --- transforms that keep no order ------------------------------------------------------------------


def test_bucket_projects_points_only() -> None:
    transform = bound("bucket(4, c)", pa.int64())
    image = transform.apply_scalar(42)
    assert transform.project(Op.EQ, 42) == Projection(ValueSet([image]), None)
    assert transform.project(Op.LT, 42) is UNKNOWN
    assert transform.project(Op.NE, 42) is UNKNOWN
    assert transform.project_in([42, 7]) == Projection(
        ValueSet(list(dict.fromkeys([image, transform.apply_scalar(7)]))), None
    )


def test_a_literal_the_transform_cannot_evaluate_projects_to_unknown() -> None:
    # Should not prune: truncating -128 by 10 leaves int8, so nothing is known about the partitions.
    transform = bound("truncate(10, c)", pa.int8())
    assert transform.project(Op.EQ, -128).may_hold is None
    assert bound("bucket(4, c)", pa.int64()).project(Op.EQ, "not an int") == UNKNOWN


def test_bounded_range_is_enumerated_through_bucket_and_mod() -> None:
    bucket = bound("bucket(1000, c)", pa.int64())
    projection = bucket.project_range(10, 20, True, False, column_type=pa.int64(), max_candidates=100)
    assert isinstance(projection.may_hold, ValueSet)
    assert projection.may_fail is None
    assert set(projection.may_hold.values.to_pylist()) == {bucket.apply_scalar(v) for v in range(10, 20)}
    # Past the cap nothing is enumerated.
    assert bucket.project_range(0, 1000, True, True, column_type=pa.int64(), max_candidates=100) is UNKNOWN
    # An empty range selects nothing.
    empty = bound("c % 4", pa.int64()).project_range(
        5, 5, False, False, column_type=pa.int64(), max_candidates=9
    )
    assert isinstance(empty.may_hold, ValueSet)
    assert len(empty.may_hold.values) == 0


def test_date_part_range_over_timestamps_steps_by_its_unit() -> None:
    hour = bound("date_part('hour', ts)", pa.timestamp("us"))
    start = dt.datetime(2026, 1, 1, 22, 30)
    projection = hour.project_range(
        start, start + dt.timedelta(hours=3), True, False, column_type=pa.timestamp("us"), max_candidates=4
    )
    # Four hour steps (22:00 .. 01:00) cover the 3 hours; microsecond steps would be far past the cap.
    assert isinstance(projection.may_hold, ValueSet)
    assert sorted(projection.may_hold.values.to_pylist()) == [0, 1, 22, 23]


def test_calendar_field_names_date_part_units_only() -> None:
    assert parse_transform("date_part('month', ts)").calendar_field == "month"
    assert parse_transform("YEAR(ts)").calendar_field == "year"
    assert parse_transform("date_trunc('month', ts)").calendar_field is None
    assert parse_transform("bucket(4, ts)").calendar_field is None


def test_values_of_another_transform_come_from_identity_partitions_only() -> None:
    values = pa.array([3, 14, None], pa.int64())
    identity = bound("c", pa.int64())
    truncate = bound("truncate(10, c)", pa.int64())
    assert identity.values_of(truncate, values).to_pylist() == [0, 10, None]
    assert truncate.values_of(truncate, values) is values
    assert truncate.values_of(bound("c % 3", pa.int64()), values) is None


# --- one parse of a node, one list of calendar nodes -------------------------------------------------

EXPRESSIONS = [
    "user_id",
    '"Mixed Case"',
    "bucket(16, user_id)",
    "bucket(16::int32, user_id)",
    "truncate(10, amount)",
    "date_part('month', ts)",
    "datepart('day', ts)",
    "extract(hour FROM ts)",
    "YEAR(ts)",
    "quarter(ts)",
    "WEEKOFYEAR(ts)",
    "dayofmonth(ts)",
    "minute(ts)",
    "date_trunc('week', ts)",
    "id % 8",
    "mod(id, 8)",
]


@pytest.mark.parametrize("expression", EXPRESSIONS)
def test_a_parsed_node_gives_the_transform_its_text_gives(expression: str) -> None:
    node = sqlglot.parse_one(f"SELECT {expression}", read=DIALECT).expressions[0]
    assert transform_from_node(node) == parse_transform(expression)


def test_a_node_that_is_no_transform_is_refused_like_its_text() -> None:
    node = sqlglot.parse_one("SELECT md5(name)", read=DIALECT).expressions[0]
    with pytest.raises(PartitionExpressionError, match="not in the partition expression function set"):
        transform_from_node(node)


CALLS = [e for e in EXPRESSIONS if "(" in e and "mod(" not in e] + ["trunc(10, amount)"]


@pytest.mark.parametrize("expression", CALLS)
def test_every_transform_call_is_recognised(expression: str) -> None:
    """Every call DuckDB must compute our way; `%` is DuckDB's own and needs no rewrite."""
    assert may_call_transforms(expression)
    node = sqlglot.parse_one(f"SELECT {expression}", read=DIALECT).expressions[0]
    assert is_transform_call(node)


def test_calendar_nodes_cover_every_calendar_spelling() -> None:
    for expression in ("extract(day FROM ts)", "YEAR(ts)", "MONTH(ts)", "date_trunc('day', ts)", "hour(ts)"):
        node = sqlglot.parse_one(f"SELECT {expression}", read=DIALECT).expressions[0]
        assert isinstance(node, CALENDAR_NODES), expression
    assert not is_transform_call(sqlglot.parse_one("SELECT upper(x)", read=DIALECT).expressions[0])


def test_query_rewrite_and_filter_rewrite_treat_calendar_calls_alike() -> None:
    """`executable_sql` (queries) and `rewrite_partition_functions` (filters) use one list of calls."""
    from airflow_partitions.pruning import executable_sql
    from airflow_partitions.transforms.duckdb_rewrite import rewrite_partition_functions

    schema = pa.schema([("ts", pa.timestamp("us", "UTC")), ("amount", pa.int64())])
    types = {field.name: field.type for field in schema}
    for call in ("YEAR(ts)", "extract(hour FROM ts)", "date_trunc('day', ts)", "trunc(10, amount)"):
        sql = f"SELECT {call} AS v FROM t"
        rewritten = executable_sql(sql, schema)
        assert rewritten == rewrite_partition_functions(sql, types), call
        assert rewritten != sql, call
    assert "TIMEZONE('UTC', ts)" in executable_sql("SELECT YEAR(ts) FROM t", schema)
    assert "AP_TRUNCATE_BIGINT(10, amount)" in executable_sql("SELECT trunc(10, amount) FROM t", schema)
    plain = "SELECT amount + 1 FROM t WHERE amount > 3"
    assert executable_sql(plain, schema) is plain


# --- one identifier quoting ---------------------------------------------------------------------------


def test_one_identifier_quoting_everywhere() -> None:
    from airflow_partitions.pruning import expressions
    from airflow_partitions.sources import pg_sql
    from airflow_partitions.storage import sql

    assert quote_identifier('we"ird name') == '"we""ird name"'
    assert sql.quote_identifier is quote_identifier
    assert expressions.quote_identifier is quote_identifier
    assert pg_sql.quote_ident('a"b') == '"a""b"'
    with pytest.raises(ValueError, match="NUL"):
        quote_identifier("a\x00b")
    with pytest.raises(SourceError, match="NUL"):
        pg_sql.quote_ident("a\x00b")


def test_canonical_strings_quote_only_what_must_be_quoted() -> None:
    assert parse_transform('bucket(4, "user_id")').canonical == "bucket(4, user_id)"
    assert parse_transform('bucket(4, "select")').canonical == 'bucket(4, "select")'
    assert parse_transform('truncate(2, "a""b")').canonical == 'truncate(2, "a""b")'
    with pytest.raises(PartitionExpressionError, match="NUL character"):
        parse_transform('"a\x00b"')


def test_postgres_sql_dispatches_on_the_transform_type() -> None:
    from airflow_partitions.sources.pg_sql import partition_sql

    assert partition_sql(bound("c", pa.int64())) == '"c"'
    assert partition_sql(bound("bucket(4, c)", pa.int64())) is None
    assert partition_sql(bound("truncate(10, c)", pa.decimal128(10, 2))) is None
    assert partition_sql(bound("truncate(3, c)", pa.string())) == 'left("c", 3)'
    assert partition_sql(bound("c % 4", pa.int32())) == '("c" % 4)'
    assert partition_sql(bound("date_part('week', d)", pa.date32())) == 'extract(week FROM "d")::int'
    assert partition_sql(bound("date_trunc('month', d)", pa.date32())) == "date_trunc('month', \"d\")::date"
