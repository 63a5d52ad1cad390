"""Postgres SQL for partition transforms: grouping expressions for discovery, range predicates for pushdown.

Only transforms whose Postgres meaning is the same as ours are translated (the session runs in UTC);
others (`bucket`, decimal `truncate`, custom expressions with a function Postgres computes differently,
see `pg_expressions`) return None and the caller groups by the raw column and applies the transform
itself, which is always right, only slower on high-cardinality columns.
"""

from __future__ import annotations

from typing import Any

from airflow_partitions.exceptions import SourceError
from airflow_partitions.sources.pg_builtin_sql import builtin_sql, quote_ident, sql_literal
from airflow_partitions.sources.pg_expressions import postgres_expression
from airflow_partitions.transforms import Transform
from airflow_partitions.transforms.expression import ExpressionTransform

__all__ = ["partition_sql", "preimage_predicate", "quote_ident", "sql_literal"]


def partition_sql(transform: Transform) -> str | None:
    """The partition value of `transform` as a Postgres expression, or None when not translatable.

    Transforms without a Postgres form (bucket, refused expressions) are grouped by the raw column instead.
    """
    if isinstance(transform, ExpressionTransform):
        return postgres_expression(transform).sql
    return builtin_sql(transform)


def preimage_predicate(transform: Transform, value: Any) -> str:
    """A WHERE clause selecting the source rows whose partition value may be `value` (a superset is fine;
    readers filter exactly afterwards). Needs a monotonic transform."""
    import pyarrow as pa

    column = quote_ident(transform.source_column)
    if value is None:
        return f"{column} IS NULL"
    interval = transform.preimage(value)
    if interval is None:
        raise SourceError(
            f"partition expression {transform.canonical!r} cannot be pushed down to Postgres as a range; "
            "the refresh scans the table once instead"
        )
    source_type = transform.source_type
    textual = source_type is not None and (
        pa.types.is_string(source_type) or pa.types.is_large_string(source_type)
    )
    if interval.lower is not None and interval.lower == interval.upper:
        return f"{column} = {sql_literal(interval.lower)}"
    # Prefix ranges follow code point order, which only the C collation guarantees.
    operand = f'{column} COLLATE "C"' if textual else column
    clauses = []
    if interval.lower is not None:
        clauses.append(f"{operand} {'>=' if interval.lower_inclusive else '>'} {sql_literal(interval.lower)}")
    if interval.upper is not None:
        clauses.append(f"{operand} {'<=' if interval.upper_inclusive else '<'} {sql_literal(interval.upper)}")
    return " AND ".join(clauses) or f"{column} IS NOT NULL"
