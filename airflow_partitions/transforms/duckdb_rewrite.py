"""Partition-transform calls in DuckDB SQL rewritten to compute exactly our values (`duckdb_functions`).

The SQL side of `transforms.duckdb_functions`, apart so that registering the UDFs and writing a bound
transform's SQL (a point read's residual filter) load no SQL parser.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa
import sqlglot
from sqlglot import exp

from airflow_partitions.exceptions import FilterError, PartitionExpressionError
from airflow_partitions.transforms.base import DIALECT
from airflow_partitions.transforms.duckdb_functions import duckdb_columns_expression, duckdb_expression
from airflow_partitions.transforms.parser import (
    describe_sql_error,
    is_multi_bucket_call,
    is_transform_call,
    transform_from_node,
)


def rewrite_partition_functions(sql: str, column_types: Mapping[str, pa.DataType]) -> str:
    """Rewrite partition-transform calls in one DuckDB statement so DuckDB computes our values.

    `bucket(N, col)` and `truncate(W, col)` become `ap_*` UDF calls (register them first with
    `register_duckdb_functions`); calendar functions get our result types and UTC semantics. Calls
    are matched by the type of their column in `column_types` (Arrow types, names as in the data).
    A bucket/truncate over a column whose type is unknown raises `FilterError`.
    """
    try:
        tree = sqlglot.parse_one(sql, read=DIALECT)
    except sqlglot.errors.SqlglotError as err:
        raise FilterError(f"syntax error in SQL {sql!r}: {describe_sql_error(err)}") from err
    return rewrite_partition_nodes(tree, column_types).sql(dialect=DIALECT)


def rewrite_partition_nodes(tree: exp.Expr, column_types: Mapping[str, pa.DataType]) -> exp.Expr:
    """`rewrite_partition_functions` on a parsed tree: a rewritten copy (`tree` is left as it is)."""

    def rewrite(node: exp.Expr) -> exp.Expr:
        if is_multi_bucket_call(node):
            return _rewrite_multi_bucket(node, column_types)
        if not is_transform_call(node):
            return node
        columns = list(node.find_all(exp.Column))
        if len(columns) != 1:
            return node
        column = columns[0]
        column_type = _lookup_type(column.name, column_types)
        bare = node.copy()
        next(bare.find_all(exp.Column)).replace(exp.column(column.name, quoted=True))
        needs_udf = _needs_udf(node)
        try:
            transform = transform_from_node(bare)
        except PartitionExpressionError as err:
            if needs_udf:
                raise FilterError(f"cannot evaluate {node.sql(dialect=DIALECT)} in DuckDB: {err}") from err
            return node
        if column_type is None:
            if needs_udf:
                raise FilterError(
                    f"cannot evaluate {node.sql(dialect=DIALECT)} in DuckDB: the type of column "
                    f"{column.name!r} is unknown; pass it in column_types"
                )
            return node
        try:
            replacement = duckdb_expression(transform.bind(column_type), column.sql(dialect=DIALECT))
        except PartitionExpressionError as err:
            raise FilterError(f"cannot evaluate {node.sql(dialect=DIALECT)} in DuckDB: {err}") from err
        return sqlglot.parse_one(replacement, read=DIALECT)

    return tree.transform(rewrite)


def _rewrite_multi_bucket(node: exp.Expr, column_types: Mapping[str, pa.DataType]) -> exp.Expr:
    shown = node.sql(dialect=DIALECT)
    columns = list(node.find_all(exp.Column))
    bare = node.copy()
    for column in list(bare.find_all(exp.Column)):
        column.replace(exp.column(column.name, quoted=True))
    try:
        transform = transform_from_node(bare)
    except PartitionExpressionError as err:
        raise FilterError(f"cannot evaluate {shown} in DuckDB: {err}") from err
    types = []
    for column in columns:
        column_type = _lookup_type(column.name, column_types)
        if column_type is None:
            raise FilterError(
                f"cannot evaluate {shown} in DuckDB: the type of column {column.name!r} is unknown; "
                "pass it in column_types"
            )
        types.append(column_type)
    try:
        sql = duckdb_columns_expression(
            transform.bind_columns(types), [column.sql(dialect=DIALECT) for column in columns]
        )
    except PartitionExpressionError as err:
        raise FilterError(f"cannot evaluate {shown} in DuckDB: {err}") from err
    return sqlglot.parse_one(sql, read=DIALECT)


def _needs_udf(node: exp.Expr) -> bool:
    return isinstance(node, exp.Trunc) or (
        isinstance(node, exp.Anonymous) and str(node.name).lower() in ("bucket", "truncate")
    )


def _lookup_type(name: str, column_types: Mapping[str, pa.DataType]) -> pa.DataType | None:
    if name in column_types:
        return column_types[name]
    folded = [key for key in column_types if key.lower() == name.lower()]
    # DuckDB resolves identifiers case-insensitively, so a unique case-insensitive match is the column.
    return column_types[folded[0]] if len(folded) == 1 else None
