"""Render a bound predicate as a Spark column condition with the same three-valued meaning.

Partition expressions use each transform's own Spark form (`Transform.to_spark`), so `bucket(50, c) = 7`
means in Spark exactly what it means when partitions are written. pyspark is imported on use only.
"""

from __future__ import annotations

from typing import Any

from airflow_partitions.exceptions import FilterError
from airflow_partitions.pruning.expressions import (
    AlwaysFalse,
    AlwaysNull,
    AlwaysTrue,
    And,
    ColumnRef,
    Comparison,
    InList,
    IsNull,
    Not,
    Op,
    Opaque,
    Or,
    Predicate,
    Range,
    Term,
)
from airflow_partitions.transforms.parser import describe_sql_error


def spark_column_ref(name: str) -> Any:
    """A Spark column reference that means exactly `name` (dots and spaces included)."""
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def _term(term: Term) -> Any:
    """The term as a Spark column. A string column is read as UTF8_BINARY, so one with a case-insensitive
    collation (Spark 4) compares byte-wise, as the pruning and DuckDB do (transforms do the same)."""
    if isinstance(term, ColumnRef):
        from airflow_partitions.transforms import arrow_support, spark  # lazy: pyarrow and pyspark

        column = spark_column_ref(term.name)
        if arrow_support.is_string(arrow_support.normalize_type(term.type)):
            column = spark.binary_collation(column)
        return column
    return term.transform.to_spark(spark_column_ref(term.column))


def _binary_strings(tree: Any, strings: tuple[str, ...]) -> Any:
    """`tree` with every reference to a column in `strings` cast to the plain STRING type: in SQL text as
    in `binary_collation`, a collated column (`'AB' LIKE '%b'` is true under UTF8_LCASE, UNICODE_CI
    refuses LIKE) is then read as UTF8_BINARY, and Spark drops the cast on a plain column, so `LIKE`,
    `starts_with` and other functions still reach the Parquet scan. Names match as Spark and DuckDB
    resolve them, ignoring case."""
    from sqlglot import exp

    wanted = {name.casefold() for name in strings}
    if not wanted:
        return tree

    def cast(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and not node.table and node.name.casefold() in wanted:
            return exp.Cast(this=node.copy(), to=exp.DataType.build("VARCHAR"))
        return node

    return tree.transform(cast)


def _literal(value: Any) -> Any:
    from pyspark.sql import functions as F

    return F.lit(bytearray(value) if isinstance(value, bytes) else value)


def spark_condition(predicate: Predicate) -> Any:
    """A pyspark `Column` that is TRUE, FALSE or NULL exactly where `predicate` is."""
    from pyspark.sql import functions as F

    if isinstance(predicate, AlwaysTrue):
        return F.lit(True)
    if isinstance(predicate, AlwaysFalse):
        return F.lit(False)
    if isinstance(predicate, AlwaysNull):
        return F.lit(None).cast("boolean")
    if isinstance(predicate, And | Or):
        result = spark_condition(predicate.items[0])
        for item in predicate.items[1:]:
            condition = spark_condition(item)
            result = (result & condition) if isinstance(predicate, And) else (result | condition)
        return result
    if isinstance(predicate, Not):
        return ~spark_condition(predicate.child)
    if isinstance(predicate, Comparison):
        left, right = _term(predicate.term), _literal(predicate.value)
        match predicate.op:
            case Op.EQ:
                return left == right
            case Op.NE:
                return left != right
            case Op.LT:
                return left < right
            case Op.LE:
                return left <= right
            case Op.GT:
                return left > right
            case Op.GE:
                return left >= right
    if isinstance(predicate, Range):
        return spark_condition(And(tuple(predicate.bounds())))
    if isinstance(predicate, InList):
        column = _term(predicate.term)
        if not predicate.values:
            return F.when(column.isNull(), F.lit(None).cast("boolean")).otherwise(F.lit(False))
        return column.isin([_literal(v) for v in predicate.values])
    if isinstance(predicate, IsNull):
        return _term(predicate.term).isNull()
    if isinstance(predicate, Opaque):
        import sqlglot

        try:
            text = _binary_strings(sqlglot.parse_one(predicate.text, read="duckdb"), predicate.strings).sql(
                dialect="spark"
            )
        except sqlglot.errors.SqlglotError as err:
            reason = describe_sql_error(err)
            raise FilterError(f"cannot express {predicate.text!r} in Spark SQL: {reason}") from err
        return F.expr(text)
    raise FilterError(f"cannot express {predicate} as a Spark condition")
