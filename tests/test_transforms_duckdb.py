"""DuckDB computes the same partition values as `Transform.apply`, through the registered UDFs and rewrite."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from decimal import Context, Decimal
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from airflow_partitions.exceptions import FilterError
from airflow_partitions.transforms import parse_transform
from airflow_partitions.transforms.duckdb_functions import duckdb_expression, register_duckdb_functions
from airflow_partitions.transforms.duckdb_rewrite import rewrite_partition_functions

ROWS = 20_000
WIDE = Context(prec=100)
EPOCH = dt.datetime(1970, 1, 1)


def _micros(rng: np.random.Generator, low_year: int, high_year: int) -> np.ndarray[Any, Any]:
    low = (dt.datetime(low_year, 1, 1) - EPOCH) // dt.timedelta(microseconds=1)
    high = (dt.datetime(high_year, 12, 31, 23, 59, 59) - EPOCH) // dt.timedelta(microseconds=1)
    values = rng.integers(low, high, ROWS)
    # Around the US and EU daylight-saving switches of 2024 and the 2024 leap day.
    for i, moment in enumerate(
        [dt.datetime(2024, 3, 10, 7), dt.datetime(2024, 10, 27, 1), dt.datetime(2024, 2, 29)]
    ):
        centre = (moment - EPOCH) // dt.timedelta(microseconds=1)
        values[i * 500 : (i + 1) * 500] = centre + rng.integers(-7_200_000_000, 7_200_000_000, 500)
    return values


def _nullable(rng: np.random.Generator, values: Any, arrow_type: pa.DataType) -> pa.Array:
    return pa.array(values, arrow_type, mask=rng.random(ROWS) < 0.05)


@pytest.fixture(scope="module")
def table() -> pa.Table:
    rng = np.random.default_rng(11)
    columns: dict[str, pa.Array] = {}
    for name in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"):
        info = np.iinfo(np.dtype(name))
        values = rng.integers(info.min, info.max, ROWS, dtype=np.dtype(name), endpoint=True)
        values[:2] = [info.min, info.max]
        columns[name] = _nullable(rng, values, pa.from_numpy_dtype(np.dtype(name)))
        # Floors must stay inside the type: keep clear of the minimum by the widest width used below.
        margin = 1000 if info.bits >= 32 else 10
        safe = np.maximum(values, np.array(info.min + margin, dtype=values.dtype)) if info.min < 0 else values
        columns[f"{name}_safe"] = _nullable(rng, safe, pa.from_numpy_dtype(np.dtype(name)))
    alphabet = np.array(list("abcé中😀 _-"))
    strings = ["".join(alphabet[rng.integers(0, len(alphabet), rng.integers(0, 12))]) for _ in range(ROWS)]
    columns["text"] = _nullable(rng, strings, pa.large_string())
    columns["blob"] = _nullable(rng, [s.encode() + b"\xff" for s in strings], pa.binary())
    columns["day"] = _nullable(rng, rng.integers(-719162, 2932896, ROWS).astype(np.int32), pa.date32())
    columns["ts"] = _nullable(rng, _micros(rng, 1, 9999), pa.timestamp("us"))
    columns["ts_ns"] = _nullable(
        rng, _micros(rng, 1700, 2200) * 1000 + rng.integers(0, 1000, ROWS), pa.timestamp("ns")
    )
    columns["ts_ms"] = _nullable(rng, _micros(rng, 1, 9999) // 1000, pa.timestamp("ms"))
    columns["ts_tz"] = _nullable(rng, _micros(rng, 1800, 2200), pa.timestamp("us", "America/New_York"))
    unscaled = rng.integers(-(10**9), 10**9, ROWS)
    columns["amount"] = _nullable(rng, [Decimal(int(v)).scaleb(-2) for v in unscaled], pa.decimal128(10, 2))
    big = [
        Decimal(int(a) * 10**20 + int(b)).scaleb(-10, WIDE)
        for a, b in rng.integers(-(10**7), 10**7, (ROWS, 2))
    ]
    columns["big"] = _nullable(rng, big, pa.decimal128(38, 10))
    uuids = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(16), ROWS, [None, pa.py_buffer(rng.bytes(16 * ROWS))]
    )
    columns["id"] = pa.ExtensionArray.from_storage(pa.uuid(), uuids)
    return pa.table(columns)


@pytest.fixture
def connection(table: pa.Table) -> Iterator[Any]:
    con = duckdb.connect()
    # A non-UTC session zone: tz-aware partition values must still be computed in UTC.
    con.execute("SET TimeZone = 'America/New_York'")
    register_duckdb_functions(con)
    con.register("t", table)
    yield con
    con.close()


def _comparable(array: pa.Array) -> pa.Array:
    data_type = array.type
    if pa.types.is_integer(data_type):
        return array.cast(pa.decimal128(20, 0))
    if pa.types.is_timestamp(data_type):
        return array.cast(pa.timestamp(data_type.unit)).cast(pa.timestamp("us")).cast(pa.int64())
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return array.cast(pa.large_string())
    if pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type):
        return array.cast(pa.large_binary())
    return array


CASES = [
    *[
        (c, f"bucket(1000, {c})")
        for c in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
    ],
    *[(c, f"bucket(7::int32, {c})") for c in ("int64", "text", "day", "ts_tz")],
    *[
        (c, f"bucket(100, {c})")
        for c in ("text", "blob", "day", "ts", "ts_ns", "ts_ms", "ts_tz", "amount", "big", "id")
    ],
    *[
        (f"{c}_safe", f"truncate(10, {c}_safe)")
        for c in ("int8", "int16", "int32", "int64", "uint8", "uint64")
    ],
    ("int32_safe", "truncate(1000, int32_safe)"),
    ("text", "truncate(2, text)"),
    ("blob", "truncate(3, blob)"),
    ("amount", "truncate(1000, amount)"),
    ("big", "truncate(1000, big)"),
    *[(c, f"{c} % 7") for c in ("int8", "int32", "int64", "uint8", "uint64")],
    *[
        (c, f"date_part('{u}', {c})")
        for c in ("day", "ts", "ts_ns", "ts_tz")
        for u in ("year", "quarter", "month", "week", "day")
    ],
    *[(c, f"date_part('{u}', {c})") for c in ("ts", "ts_tz") for u in ("hour", "minute")],
    *[
        (c, f"date_trunc('{u}', {c})")
        for c in ("day", "ts", "ts_ms", "ts_tz")
        for u in ("year", "quarter", "month", "week", "day")
    ],
    *[(c, f"date_trunc('{u}', {c})") for c in ("ts", "ts_ns", "ts_tz") for u in ("hour", "minute")],
    ("ts_tz", "YEAR(ts_tz)"),
    ("ts_tz", "extract(hour FROM ts_tz)"),
    ("text", "text"),
]


@pytest.mark.parametrize(("column", "expression"), CASES, ids=[e for _, e in CASES])
def test_duckdb_matches_arrow_row_for_row(
    connection: Any, table: pa.Table, column: str, expression: str
) -> None:
    types = {name: table.schema.field(name).type for name in table.column_names}
    sql = rewrite_partition_functions(f"SELECT {expression} AS value FROM t", types)
    actual = connection.sql(sql).to_arrow_table().column("value").combine_chunks()
    source = table.column(column).combine_chunks()
    expected = parse_transform(expression).bind(source.type).apply(source)
    left, right = _comparable(expected), _comparable(actual)
    assert left.type == right.type, (
        f"{expression}: Arrow gives {expected.type}, DuckDB gives {actual.type} ({sql})"
    )
    agree = pc.and_(pc.equal(left.is_null(), right.is_null()), pc.fill_null(pc.equal(left, right), True))
    if not pc.all(agree).as_py():
        bad = np.flatnonzero(~agree.to_numpy(zero_copy_only=False))[:5].tolist()
        pairs = [(source[i].as_py(), expected[i].as_py(), actual[i].as_py()) for i in bad]
        raise AssertionError(
            f"{expression}: DuckDB disagrees with Arrow via {sql}; (source, arrow, duckdb): {pairs}"
        )


def test_sql_modulo_keeps_the_sign_of_the_dividend_like_duckdb(connection: Any) -> None:
    values = pa.array([-7, 7, -1, 0, -128, 127, None], pa.int8())
    ours = parse_transform("v % 3").apply(values).to_pylist()
    duck = connection.sql(
        "SELECT v % 3 AS r FROM (SELECT unnest(?::TINYINT[]) AS v)", params=[values.to_pylist()]
    ).fetchall()
    assert ours == [row[0] for row in duck] == [-1, 1, -1, 0, -2, 1, None]


def test_rewrite_keeps_other_sql_and_qualified_columns(table: pa.Table) -> None:
    types = {"user_id": pa.int64(), "Zone": pa.string()}
    sql = rewrite_partition_functions(
        "SELECT count(*) FROM t AS x WHERE bucket(16, x.user_id) = 3 AND zone = 'EU' AND user_id % 4 = 1",
        types,
    )
    assert "AP_BUCKET_BIGINT(16, CAST(x.user_id AS BIGINT)) = 3" in sql
    assert "zone = 'EU'" in sql
    assert "user_id % 4 = 1" in sql
    # Identifiers resolve case-insensitively in DuckDB, so the rewrite does too.
    assert "AP_BUCKET_VARCHAR(4, zone)" in rewrite_partition_functions("SELECT bucket(4, zone) FROM t", types)


def test_rewrite_refuses_bucket_over_a_column_of_unknown_type() -> None:
    with pytest.raises(FilterError, match="the type of column 'mystery' is unknown; pass it in column_types"):
        rewrite_partition_functions("SELECT bucket(4, mystery) FROM t", {"user_id": pa.int64()})
    with pytest.raises(FilterError, match="bucket N = 0"):
        rewrite_partition_functions("SELECT bucket(0, user_id) FROM t", {"user_id": pa.int64()})
    with pytest.raises(FilterError, match="bucket accepts integer"):
        rewrite_partition_functions("SELECT bucket(4, flag) FROM t", {"flag": pa.bool_()})


def test_registration_is_idempotent_and_udfs_check_their_constant(connection: Any) -> None:
    register_duckdb_functions(connection)
    assert connection.sql("SELECT ap_bucket_bigint(16, 34), ap_bucket_varchar(16, 'iceberg')").fetchall() == [
        (3, 9)
    ]
    with pytest.raises(duckdb.Error, match="bucket N must be one positive integer constant"):
        connection.sql("SELECT ap_bucket_bigint(0, 34)").fetchall()


def test_duckdb_expression_needs_a_bound_transform() -> None:
    from airflow_partitions.exceptions import PartitionExpressionError

    with pytest.raises(PartitionExpressionError, match=r"call \.bind"):
        duckdb_expression(parse_transform("bucket(4, c)"), "c")


def test_udfs_accept_empty_chunks() -> None:
    """DuckDB calls scalar UDFs with empty chunks when a filter removes every row of a vector."""
    import duckdb

    from airflow_partitions.transforms.duckdb_functions import register_duckdb_functions

    con = duckdb.connect()
    register_duckdb_functions(con)
    con.execute("CREATE TABLE t AS SELECT range AS v FROM range(5000)")
    rows = con.execute(
        "SELECT ap_bucket_bigint(16, v), ap_truncate_bigint(10, v) FROM t WHERE v < 0 OR v > 10000"
    ).fetchall()
    assert rows == []
    # The UDFs themselves, as DuckDB calls them for a vector the filter emptied.
    from airflow_partitions.transforms import duckdb_functions

    empty = pa.chunked_array([pa.array([], type=pa.int64())])
    assert duckdb_functions._bucket_udf(empty, empty).to_pylist() == []
    assert duckdb_functions._truncate_udf(empty, empty).to_pylist() == []
