"""Partition expressions evaluated by DuckDB over Arrow arrays: one connection per thread, the values in
input order, and the Arrow type DuckDB gives an expression. Below the expression and case-mapping modules,
which both evaluate through it."""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import PartitionExpressionError, PartitionValueError
from airflow_partitions.quoting import quote_identifier

if TYPE_CHECKING:
    import pyarrow as pa

_LOCAL = threading.local()
_INPUT_TABLE = "ap_expression_values"


def _connection() -> Any:
    """A DuckDB connection per thread (Spark's Arrow UDFs and the Arrow strategy run in threads)."""
    connection = getattr(_LOCAL, "connection", None)
    if connection is None:
        import duckdb

        connection = duckdb.connect()
        # Every engine reads time-zone dependent functions (date_trunc of a TIMESTAMPTZ, casts) in UTC.
        connection.execute("SET TimeZone = 'UTC'")
        connection.execute("SET threads = 1")
        _LOCAL.connection = connection
    return connection


def _query(sql: str, column: str, array: pa.Array) -> pa.Array:
    import duckdb
    import pyarrow as pa

    connection = _connection()
    table = pa.table({column: array})
    connection.register(_INPUT_TABLE, table)
    try:
        # Insertion order is preserved for a plain projection (DuckDB's preserve_insertion_order).
        result = connection.sql(f"SELECT ({sql}) AS value FROM {_INPUT_TABLE}").to_arrow_table()
    except duckdb.Error as err:
        raise PartitionValueError(
            f"partition expression {sql!r} cannot be evaluated on column {quote_identifier(column)} "
            f"({array.type}): {str(err).splitlines()[0]}"
        ) from err
    finally:
        connection.unregister(_INPUT_TABLE)
    return result.column(0).combine_chunks()


def _normalized_result(array: pa.Array) -> pa.Array:
    import pyarrow as pa

    kind = array.type
    if pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return array.cast(pa.string())
    return array


@functools.lru_cache(maxsize=4096)
def expression_result_type(sql: str, column: str, source_type: pa.DataType, text: str) -> pa.DataType:
    """The Arrow type DuckDB gives the expression over a column of `source_type`."""
    import pyarrow as pa

    try:
        empty = pa.array([], type=source_type)
        result = _query(sql, column, empty)
    except PartitionValueError as err:
        raise PartitionExpressionError(
            f"partition expression {text!r} does not apply to column {column!r} of type {source_type}: "
            f"{err.args[0].split(': ', 1)[-1]}; cast the column inside the expression to a type the "
            f"function takes, e.g. CAST({column} AS <type>)"
        ) from err
    return _normalized_result(result).type


def evaluate_sql(sql: str, column: str, array: pa.Array, result_type: pa.DataType, text: str) -> pa.Array:
    """The expression's values over `array` (one value per element, in order), of `result_type`."""
    result = _normalized_result(_query(sql, column, array))
    if len(result) != len(array):
        raise PartitionValueError(
            f"partition expression {text!r} gave {len(result)} values for {len(array)} rows"
        )
    return result if result.type.equals(result_type) else result.cast(result_type)
