"""`parse_transform`: a built-in transform in its plain form is built directly, anything else by sqlglot.

The plain forms (`transforms.plain_sql`: a bare column, `bucket(N, col)`, `truncate(W, col)`, `col % N`,
`date_trunc('unit', col)`, `date_part('unit', col)`) give the same transform the sqlglot parser gives;
arguments out of range and every other expression go to `transforms.parser`, which says what is wrong.
"""

from __future__ import annotations

from airflow_partitions.transforms.base import Transform
from airflow_partitions.transforms.bucket import MAX_BUCKETS, BucketTransform
from airflow_partitions.transforms.identity import IdentityTransform
from airflow_partitions.transforms.mod import ModTransform
from airflow_partitions.transforms.plain_sql import builtin_transform_parts
from airflow_partitions.transforms.temporal import DATE_UNITS, DatePartTransform, DateTruncTransform
from airflow_partitions.transforms.truncate import TruncateTransform

INT64_MAX = (1 << 63) - 1


def parse_transform(expression: str) -> Transform:
    """Parse one `partition_by` expression; raises `PartitionExpressionError` saying what to change."""
    built = plain_transform(expression) if isinstance(expression, str) else None
    if built is not None:
        return built
    from airflow_partitions.transforms.parser import parse_sql_transform  # lazy: sqlglot

    return parse_sql_transform(expression)


def plain_transform(expression: str) -> Transform | None:
    """The transform a plain built-in form spells, None when the sqlglot parser must read it."""
    parts = builtin_transform_parts(expression.strip())
    if parts is None:
        return None
    form, column, argument = parts
    if form == "identity":
        return IdentityTransform(column)
    if form in ("date_trunc", "date_part"):
        if argument not in DATE_UNITS:
            return None
        unit = str(argument)
        return DateTruncTransform(column, unit) if form == "date_trunc" else DatePartTransform(column, unit)
    if not isinstance(argument, int) or argument <= 0:
        return None
    if form == "bucket":
        return BucketTransform(column, argument, 64) if argument <= MAX_BUCKETS else None
    if argument > INT64_MAX:
        return None
    return TruncateTransform(column, argument) if form == "truncate" else ModTransform(column, argument)
