"""Partition transforms inside DuckDB: vectorised Arrow UDFs plus a SQL rewrite to call them.

DuckDB has no `bucket` or `truncate`, and its Python UDFs can neither overload a name by argument
type nor take ANY, so each transform is registered once per DuckDB input type under an `ap_` name
(`ap_bucket_varchar`, `ap_truncate_integer`, `ap_bucket_decimal_2`, ...), each a thin wrapper over
`Transform.apply`: the same code, hence the same values, as everywhere else.

`duckdb_rewrite.rewrite_partition_functions(sql, column_types)` turns the user's spelling
(`bucket(16, user_id)`, `truncate(10, amount)`, and the calendar functions) into calls DuckDB
evaluates with our semantics, given the Arrow types of the columns. Calendar functions over dates and
naive timestamps use DuckDB's builtins (same calendar values; cast to our result types); over tz-aware
timestamps they are computed on UTC wall time, whatever the connection's TimeZone setting.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_partitions.exceptions import PartitionExpressionError
from airflow_partitions.transforms import arrow_hash
from airflow_partitions.transforms import arrow_support as support
from airflow_partitions.transforms.base import DIALECT, Transform
from airflow_partitions.transforms.bucket import MAX_BUCKETS, BucketTransform
from airflow_partitions.transforms.identity import IdentityTransform
from airflow_partitions.transforms.mod import ModTransform
from airflow_partitions.transforms.multi_bucket import MultiBucketTransform, field_bytes_array
from airflow_partitions.transforms.temporal import DatePartTransform, DateTruncTransform
from airflow_partitions.transforms.truncate import TruncateTransform

if TYPE_CHECKING:
    from airflow_partitions.transforms.expression import ExpressionTransform

_INTEGER_TYPES = {
    pa.int8(): "TINYINT",
    pa.int16(): "SMALLINT",
    pa.int32(): "INTEGER",
    pa.int64(): "BIGINT",
    pa.uint8(): "UTINYINT",
    pa.uint16(): "USMALLINT",
    pa.uint32(): "UINTEGER",
    pa.uint64(): "UBIGINT",
}
# Bucket input families: the hash depends only on the value, so every integer narrower than 64 bits
# widens to BIGINT, and s/ms timestamps widen exactly to microseconds.
_BUCKET_INPUTS = {
    "bigint": "BIGINT",
    "ubigint": "UBIGINT",
    "varchar": "VARCHAR",
    "blob": "BLOB",
    "date": "DATE",
    "timestamp": "TIMESTAMP",
    "timestamp_ns": "TIMESTAMP_NS",
    "timestamptz": "TIMESTAMP WITH TIME ZONE",
}
_TRUNCATE_INPUTS = {name.lower(): name for name in _INTEGER_TYPES.values()} | {
    "varchar": "VARCHAR",
    "blob": "BLOB",
}
_MAX_DECIMAL_DIGITS = 38
# multi_bucket field families: each column's bytes depend on its own type and width (no widening).
_MULTI_BUCKET_INPUTS = {
    **{name.lower(): name for name in _INTEGER_TYPES.values()},
    "float": "FLOAT",
    "double": "DOUBLE",
    "varchar": "VARCHAR",
    "blob": "BLOB",
    "date": "DATE",
    "timestamp": "TIMESTAMP",
    "timestamp_ns": "TIMESTAMP_NS",
    "timestamptz": "TIMESTAMP WITH TIME ZONE",
}


def register_duckdb_functions(connection: Any) -> None:
    """Register every `ap_bucket_*` / `ap_truncate_*` UDF on a DuckDB connection (once per connection)."""
    import duckdb

    existing = {
        row[0]
        for row in connection.execute(
            "SELECT function_name FROM duckdb_functions() WHERE function_name LIKE 'ap\\_%' ESCAPE '\\'"
        ).fetchall()
    }

    def register(
        name: str,
        function: Callable[[pa.ChunkedArray, pa.ChunkedArray], pa.Array],
        value_type: str,
        result: str,
    ) -> None:
        if name in existing:
            return
        connection.create_function(
            name,
            function,
            [duckdb.sqltype("BIGINT"), duckdb.sqltype(value_type)],
            duckdb.sqltype(result),
            type="arrow",
        )

    for family, value_type in _BUCKET_INPUTS.items():
        register(f"ap_bucket_{family}", _bucket_udf, value_type, "BIGINT")
    for family, value_type in _TRUNCATE_INPUTS.items():
        register(f"ap_truncate_{family}", _truncate_udf, value_type, value_type)
    for family, value_type in _MULTI_BUCKET_INPUTS.items():
        name = f"ap_mb_bytes_{family}"
        if name not in existing:
            connection.create_function(
                name, _field_bytes_udf, [duckdb.sqltype(value_type)], duckdb.sqltype("BLOB"), type="arrow"
            )
    if "ap_murmur3" not in existing:
        connection.create_function(
            "ap_murmur3", _murmur3_udf, [duckdb.sqltype("BLOB")], duckdb.sqltype("INTEGER"), type="arrow"
        )
    for scale in range(_MAX_DECIMAL_DIGITS + 1):
        decimal_type = f"DECIMAL({_MAX_DECIMAL_DIGITS}, {scale})"
        register(f"ap_bucket_decimal_{scale}", _bucket_udf, decimal_type, "BIGINT")
        register(f"ap_truncate_decimal_{scale}", _truncate_udf, decimal_type, decimal_type)


def _constant_parameter(values: pa.ChunkedArray | pa.Array, name: str, upper: int) -> int:
    distinct = pc.unique(values).to_pylist()
    if len(distinct) != 1 or distinct[0] is None or not 0 < distinct[0] <= upper:
        raise PartitionExpressionError(
            f"{name} must be one positive integer constant ≤ {upper:,} per call, got {distinct[:5]}"
        )
    return int(distinct[0])


def _as_array(values: pa.ChunkedArray | pa.Array) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def _bucket_udf(counts: pa.ChunkedArray, values: pa.ChunkedArray) -> pa.Array:
    # DuckDB may call with an empty chunk (e.g. a filter that leaves no rows): no constant to check.
    if len(values) == 0:
        return pa.array([], type=pa.int64())
    count = _constant_parameter(counts, "bucket N", MAX_BUCKETS)
    return BucketTransform("value", count).apply(_as_array(values))


def _truncate_udf(widths: pa.ChunkedArray, values: pa.ChunkedArray) -> pa.Array:
    if len(values) == 0:
        return _as_array(values)
    width = _constant_parameter(widths, "truncate width", support.INT64_MAX)
    return TruncateTransform("value", width).apply(_as_array(values))


def _field_bytes_udf(values: pa.ChunkedArray) -> pa.Array:

    array = _as_array(values)
    if len(array) == 0:
        return pa.array([], type=pa.binary())
    return field_bytes_array(array)


def _murmur3_udf(values: pa.ChunkedArray) -> pa.Array:
    """Murmur3 x86_32 (seed 0) of each blob as a signed int32; NULL for NULL."""
    import numpy as np

    array = _as_array(values).cast(pa.binary())
    if len(array) == 0:
        return pa.array([], type=pa.int32())
    hashes = arrow_hash.hash_ragged(*support.binary_layout(array)).view(np.int32)
    mask = support.valid_mask(array)
    return pa.array(hashes, type=pa.int32(), mask=None if mask is None else ~mask)


# --- SQL ------------------------------------------------------------------------------------------


def duckdb_expression(transform: Transform, column_sql: str) -> str:
    """DuckDB SQL computing a bound `transform` over `column_sql` (needs `register_duckdb_functions`)."""
    if isinstance(transform, MultiBucketTransform):
        raise PartitionExpressionError(
            f"partition expression {transform.canonical!r} reads several columns; "
            "use duckdb_columns_expression"
        )
    if transform.source_type is None:
        raise PartitionExpressionError(
            f"partition expression {transform.canonical!r}: DuckDB SQL depends on the column type; "
            "call .bind(<arrow type>) first"
        )
    return _duckdb_sql(transform, column_sql, support.normalize_type(transform.source_type))


def duckdb_columns_expression(transform: Transform, columns_sql: Sequence[str]) -> str:
    """DuckDB SQL computing a bound `transform` over one SQL expression per source column."""
    if not isinstance(transform, MultiBucketTransform):
        if len(columns_sql) != 1:
            raise PartitionExpressionError(
                f"partition expression {transform.canonical!r} reads one column; {len(columns_sql)} given"
            )
        return duckdb_expression(transform, columns_sql[0])
    types = transform.source_types
    if types is None:
        raise PartitionExpressionError(
            f"partition expression {transform.canonical!r}: DuckDB SQL depends on the column types; "
            "call .bind_columns(<arrow types>) first"
        )
    if len(columns_sql) != len(types):
        raise PartitionExpressionError(
            f"partition expression {transform.canonical!r}: {len(columns_sql)} columns for {len(types)}"
        )
    parts = [
        f"coalesce({_field_bytes_call(transform, sql, support.normalize_type(t))}, ''::BLOB)"
        for sql, t in zip(columns_sql, types, strict=True)
    ]
    all_null = " AND ".join(f"({sql}) IS NULL" for sql in columns_sql)
    hashed = f"ap_murmur3({' || '.join(parts)})"
    # abs() of the int32 minimum overflows in INTEGER: take it as BIGINT, as the spec's abs(h) % N means.
    return (
        f"(CASE WHEN {all_null} THEN NULL "
        f"ELSE CAST(abs(CAST({hashed} AS BIGINT)) % {transform.num_buckets} AS INTEGER) END)"
    )


def _field_bytes_call(transform: Transform, column_sql: str, source: pa.DataType) -> str:
    if support.is_integer(source):
        return f"ap_mb_bytes_{_INTEGER_TYPES[source].lower()}({column_sql})"
    if pa.types.is_float32(source):
        return f"ap_mb_bytes_float({column_sql})"
    if pa.types.is_float64(source):
        return f"ap_mb_bytes_double({column_sql})"
    if support.is_string(source):
        return f"ap_mb_bytes_varchar({column_sql})"
    if support.is_binary(source) or support.is_fixed_binary(source):
        return f"ap_mb_bytes_blob({column_sql})"
    if support.is_date(source):
        return f"ap_mb_bytes_date({column_sql})"
    if support.is_timestamp(source):
        if source.tz is not None:
            return f"ap_mb_bytes_timestamptz({column_sql})"
        if source.unit == "ns":
            return f"ap_mb_bytes_timestamp_ns({column_sql})"
        return f"ap_mb_bytes_timestamp(CAST({column_sql} AS TIMESTAMP))"
    raise PartitionExpressionError(f"{transform.canonical}: no DuckDB bytes for {source}")


@functools.singledispatch
def _duckdb_sql(transform: Transform, column_sql: str, source: pa.DataType) -> str:
    from airflow_partitions.transforms.expression import ExpressionTransform  # lazy: sqlglot

    # Not registered like the others: ExpressionTransform's module (and sqlglot) load only with one.
    if isinstance(transform, ExpressionTransform):
        return _expression_sql(transform, column_sql, source)
    raise PartitionExpressionError(f"no DuckDB form for {type(transform).__name__}")


def _expression_sql(transform: ExpressionTransform, column_sql: str, source: pa.DataType) -> str:
    # The expression is DuckDB SQL already: its one definition; only the column reference changes.
    import sqlglot
    from sqlglot import exp

    tree = transform.tree
    column = sqlglot.parse_one(column_sql, read=DIALECT)
    for node in list(tree.find_all(exp.Column)):
        node.replace(column.copy())
    inner = f"({tree.sql(dialect=DIALECT)})"
    outer = transform.outer_bound
    if outer is None:
        return inner
    return _duckdb_sql(outer, inner, support.normalize_type(transform.inner_result_type()))


@_duckdb_sql.register
def _identity_sql(transform: IdentityTransform, column_sql: str, source: pa.DataType) -> str:
    return column_sql


@_duckdb_sql.register
def _bucket_sql(transform: BucketTransform, column_sql: str, source: pa.DataType) -> str:
    call = _bucket_call(transform, column_sql, source)
    return call if transform.result_bits == 64 else f"CAST({call} AS INTEGER)"


@_duckdb_sql.register
def _mod_sql(transform: ModTransform, column_sql: str, source: pa.DataType) -> str:
    # DuckDB's % keeps the dividend's sign, like ours; the cast restores the column's type.
    return f"CAST(({column_sql} % {transform.modulus}) AS {_INTEGER_TYPES[source]})"


@_duckdb_sql.register
def _date_part_sql(transform: DatePartTransform, column_sql: str, source: pa.DataType) -> str:
    return f"CAST(date_part('{transform.unit}', {_wall_clock(column_sql, source)}) AS INTEGER)"


@_duckdb_sql.register
def _date_trunc_sql(transform: DateTruncTransform, column_sql: str, source: pa.DataType) -> str:
    truncated = f"date_trunc('{transform.unit}', {_wall_clock(column_sql, source)})"
    if support.is_date(source):
        return f"CAST({truncated} AS DATE)"
    if source.tz is not None:
        return f"timezone('UTC', CAST({truncated} AS TIMESTAMP))"
    return f"CAST({truncated} AS TIMESTAMP)"


def _wall_clock(column_sql: str, source: pa.DataType) -> str:
    """Tz-aware timestamps as naive UTC wall time, independent of the connection's TimeZone."""
    if support.is_timestamp(source) and source.tz is not None:
        return f"timezone('UTC', {column_sql})"
    return column_sql


def _bucket_call(transform: BucketTransform, column_sql: str, source: pa.DataType) -> str:
    count = transform.num_buckets
    if support.is_integer(source):
        family = "ubigint" if source == pa.uint64() else "bigint"
        return f"ap_bucket_{family}({count}, CAST({column_sql} AS {_BUCKET_INPUTS[family]}))"
    if support.is_string(source):
        return f"ap_bucket_varchar({count}, {column_sql})"
    if support.is_uuid(source):
        # DuckDB hands UUIDs to Python as text; its 16 bytes are the hex digits without dashes.
        return f"ap_bucket_blob({count}, unhex(replace(CAST({column_sql} AS VARCHAR), '-', '')))"
    if support.is_binary(source) or support.is_fixed_binary(source):
        return f"ap_bucket_blob({count}, {column_sql})"
    if support.is_date(source):
        return f"ap_bucket_date({count}, {column_sql})"
    if support.is_timestamp(source):
        if source.tz is not None:
            return f"ap_bucket_timestamptz({count}, {column_sql})"
        if source.unit == "ns":
            return f"ap_bucket_timestamp_ns({count}, {column_sql})"
        return f"ap_bucket_timestamp({count}, CAST({column_sql} AS TIMESTAMP))"
    if support.is_decimal(source):
        _require_duckdb_decimal(transform, source)
        widened = f"CAST({column_sql} AS DECIMAL({_MAX_DECIMAL_DIGITS}, {source.scale}))"
        return f"ap_bucket_decimal_{source.scale}({count}, {widened})"
    raise PartitionExpressionError(f"{transform.canonical}: no DuckDB bucket for {source}")


@_duckdb_sql.register
def _truncate_sql(transform: TruncateTransform, column_sql: str, source: pa.DataType) -> str:
    width = transform.width
    if support.is_integer(source):
        return f"ap_truncate_{_INTEGER_TYPES[source].lower()}({width}, {column_sql})"
    if support.is_string(source):
        return f"ap_truncate_varchar({width}, {column_sql})"
    if support.is_binary(source):
        return f"ap_truncate_blob({width}, {column_sql})"
    if support.is_decimal(source):
        _require_duckdb_decimal(transform, source)
        widened = f"CAST({column_sql} AS DECIMAL({_MAX_DECIMAL_DIGITS}, {source.scale}))"
        call = f"ap_truncate_decimal_{source.scale}({width}, {widened})"
        return f"CAST({call} AS DECIMAL({source.precision}, {source.scale}))"
    raise PartitionExpressionError(f"{transform.canonical}: no DuckDB truncate for {source}")


def _require_duckdb_decimal(transform: Transform, source: pa.DataType) -> None:
    if source.precision > _MAX_DECIMAL_DIGITS:
        raise PartitionExpressionError(
            f"{transform.canonical}: DuckDB decimals hold at most {_MAX_DECIMAL_DIGITS} digits, "
            f"column is {source}"
        )
