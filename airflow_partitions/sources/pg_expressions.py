"""The Postgres form of a custom partition expression, or the reason it has none.

A Postgres source groups discovery (and the watermark counts) by the partition expressions inside
Postgres when they have a Postgres form that computes exactly what DuckDB computes; otherwise it groups by
the raw column and the expression runs in DuckDB over the grouped values, which is always right, only
more rows cross the wire. `tests/test_expression_conformance.py` evaluates every form below in a real
Postgres on the hostile values and compares row for row; a function whose Postgres meaning differs is
refused here with the reason (`PostgresExpression.refused`), which the survey reports as a note:

* `lower`, `upper`: Postgres maps case by the database's LC_CTYPE locale, DuckDB by Unicode alone
  (upper('ß') is 'ß' under glibc and 'ẞ' in DuckDB; other locales differ again);
* `regexp_extract`: Postgres has no such function, and its regular expressions are not RE2's;
* `TRY_CAST`: Postgres has no TRY_CAST (a failed cast there is an error, not NULL);
* `round`: Postgres rounds double precision half to even (round(0.5) = 0), DuckDB half away from zero;
* a CAST from text: the two accept different spellings of numbers, dates and booleans;
* a CAST to text of anything but integers and text: numbers, dates and times print differently;
* `substr` / `substring` with a negative or computed start: Postgres counts a window from before the
  string, DuckDB counts from its end;
* `split_part` with a position below 1: Postgres refuses 0 and counts negatives from the end;
* `LIKE` with a backslash in the pattern: Postgres escapes with it, DuckDB does not;
* `%` and `//` of non-integers: Postgres has no double precision modulo;
* `concat` / `||` of values other than text and integers: they print differently;
* `date_trunc` of a date: Postgres truncates it as a time stamp with time zone;
* a built-in `bucket` around an expression: Postgres has no Murmur3.

`multi_bucket(N, a, b, ...)` has no Postgres form either (`MULTI_BUCKET_PUSHDOWN_REFUSED`): discovery
groups by its raw columns and hashes the distinct combinations here, and a refresh reads the table once
and routes the rows (a bucket has no range of source values to push down as a WHERE).

What is translated is normalised where the dialects spell it differently: ordered comparisons,
`BETWEEN`, `greatest` and `least` of text compare in code point order (`COLLATE "C"`, as DuckDB does,
whatever the database collation), `/` divides as double precision (sqlglot writes the cast), `//` is
`div`, columns are always quoted (Postgres folds bare names to lower case). The session runs in UTC.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlglot import exp

from airflow_partitions.exceptions import PartitionExpressionError, PartitionValueError
from airflow_partitions.sources.pg_builtin_sql import builtin_sql, quote_ident
from airflow_partitions.transforms import parse_transform
from airflow_partitions.transforms.duckdb_eval import expression_result_type
from airflow_partitions.transforms.expression import (
    COMPOSED_INPUT,
    UNIT_FUNCTIONS,
    ExpressionTransform,
    expression_sql,
)
from airflow_partitions.transforms.temporal import DATE_UNITS

if TYPE_CHECKING:
    import pyarrow as pa

# Functions whose Postgres meaning differs from DuckDB's whatever their arguments (see the docstring).
REFUSED_FUNCTIONS: dict[type[exp.Expr], str] = {
    exp.Lower: "Postgres maps case by the database's LC_CTYPE locale, DuckDB by Unicode alone "
    "(upper('ß') is 'ß' under glibc, 'ẞ' in DuckDB)",
    exp.Upper: "Postgres maps case by the database's LC_CTYPE locale, DuckDB by Unicode alone "
    "(upper('ß') is 'ß' under glibc, 'ẞ' in DuckDB)",
    exp.RegexpExtract: "Postgres has no regexp_extract and its regular expressions are not RE2's",
    exp.TryCast: "Postgres has no TRY_CAST (a failed cast is an error there, not NULL)",
    exp.Round: "Postgres rounds double precision half to even (round(0.5) = 0), DuckDB half away from zero",
}
MULTI_BUCKET_PUSHDOWN_REFUSED = (
    "Postgres has no Murmur3 and no way to take the little-endian bytes of a value, so multi_bucket is "
    "not pushed down; a bucket is no range of source values either, so the refresh reads the table once "
    "and routes the rows"
)
_ORDERED = (exp.GT, exp.GTE, exp.LT, exp.LTE)
_UNIT_NODES = UNIT_FUNCTIONS
_CALENDAR_NUMBERS: tuple[type[exp.Expr], ...] = (exp.Extract, *_UNIT_NODES)
_TEXT_COLLATION = exp.Identifier(this="C", quoted=True)


@dataclass(frozen=True)
class PostgresExpression:
    """The Postgres SQL of an expression (`sql`), or why it has none (`refused`); exactly one is set."""

    sql: str | None
    refused: str | None


def postgres_expression(transform: ExpressionTransform) -> PostgresExpression:
    """The Postgres form of a bound expression transform over its (quoted) column."""
    if transform.source_type is None:
        return PostgresExpression(None, "the expression is not bound to the column type")
    return _translated(transform.canonical, transform.sql, transform.source_column, transform.source_type)


@functools.lru_cache(maxsize=1024)
def _translated(canonical: str, sql: str, column: str, source_type: pa.DataType) -> PostgresExpression:
    import sqlglot

    transform = parse_transform(canonical).bind(source_type)
    assert isinstance(transform, ExpressionTransform)
    tree = sqlglot.parse_one(sql, read="duckdb")
    try:
        _normalise(tree, column, source_type)
    except _Refused as refusal:
        return PostgresExpression(None, str(refusal))
    for node in list(tree.find_all(exp.Column)):
        node.replace(exp.column(exp.to_identifier(column, quoted=True)))
    inner = tree.sql(dialect="postgres")
    outer = transform.outer_bound
    if outer is None:
        return PostgresExpression(inner, None)
    wrapped = builtin_sql(outer)
    if wrapped is None:
        return PostgresExpression(
            None, f"the built-in {outer.name} around the expression has no Postgres form (no Murmur3 there)"
        )
    return PostgresExpression(wrapped.replace(quote_ident(COMPOSED_INPUT), f"({inner})"), None)


class _Refused(Exception):
    """A node without a Postgres form of the same meaning; the message says why."""


def _kind(node: exp.Expr, column: str, source_type: pa.DataType) -> str:
    """`string`, `int`, `date`, `timestamp`, `float`, `decimal`, `bool`, ... of a sub-expression's value."""
    import pyarrow as pa

    try:
        result = expression_result_type(expression_sql(node), column, source_type, expression_sql(node))
    except (PartitionExpressionError, PartitionValueError) as err:
        raise _Refused(f"the type of {expression_sql(node)} is unknown") from err
    if pa.types.is_string(result) or pa.types.is_large_string(result):
        return "string"
    if pa.types.is_integer(result):
        return "int"
    if pa.types.is_date(result):
        return "date"
    if pa.types.is_timestamp(result):
        return "timestamp"
    if pa.types.is_boolean(result):
        return "bool"
    if pa.types.is_floating(result):
        return "float"
    if pa.types.is_decimal(result):
        return "decimal"
    return str(result)


def _literal_int(node: exp.Expr | None) -> int | None:
    while isinstance(node, exp.Paren):
        node = node.this
    negative = False
    if isinstance(node, exp.Neg):
        negative, node = True, node.this
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            value = int(node.this)
        except ValueError:
            return None
        return -value if negative else value
    return None


def _normalise(tree: exp.Expr, column: str, source_type: pa.DataType) -> None:
    """Refuse what Postgres computes differently; rewrite what it spells differently (in place)."""

    def kind(node: exp.Expr) -> str:
        return _kind(node, column, source_type)

    def shown(node: exp.Expr) -> str:
        return expression_sql(node)

    # Collect first: rewriting while walking would visit the new nodes.
    collate: list[exp.Expr] = []
    numbers: list[tuple[exp.Expr, str]] = []
    for node in tree.walk():
        reason = REFUSED_FUNCTIONS.get(type(node))
        if reason is not None:
            raise _Refused(f"{shown(node)}: {reason}")
        if isinstance(node, exp.Cast):
            source = kind(node.this)
            target = node.to.this
            if source == "string" and target not in exp.DataType.TEXT_TYPES:
                raise _Refused(
                    f"{shown(node)}: a CAST from text; Postgres and DuckDB accept different spellings of "
                    "numbers, dates and booleans"
                )
            if target in exp.DataType.TEXT_TYPES and source not in ("string", "int"):
                raise _Refused(
                    f"{shown(node)}: a CAST of {source} values to text; Postgres and DuckDB print them "
                    "differently"
                )
        elif isinstance(node, exp.Substring):
            start = _literal_int(node.args.get("start"))
            length = node.args.get("length")
            if start is None or start < 0 or (length is not None and _literal_int(length) is None):
                raise _Refused(
                    f"{shown(node)}: a negative or computed start (or computed length); Postgres counts a "
                    "window from before the string, DuckDB from its end"
                )
        elif isinstance(node, exp.SplitPart):
            position = _literal_int(node.args.get("part_index"))
            if position is None or position < 1:
                raise _Refused(
                    f"{shown(node)}: a position below 1 (or computed); Postgres refuses 0 and counts "
                    "negatives from the end"
                )
        elif isinstance(node, exp.Like):
            pattern = node.expression
            if node.args.get("escape") is not None or not (
                isinstance(pattern, exp.Literal) and pattern.is_string and "\\" not in pattern.this
            ):
                raise _Refused(
                    f"{shown(node)}: a LIKE pattern with a backslash, an ESCAPE or a computed pattern; "
                    "Postgres escapes with a backslash, DuckDB does not"
                )
        elif isinstance(node, exp.Mod | exp.IntDiv):
            if kind(node.this) != "int" or kind(node.expression) != "int":
                raise _Refused(
                    f"{shown(node)}: {'%' if isinstance(node, exp.Mod) else '//'} of non-integers; "
                    "Postgres has no double precision modulo and divides numerics exactly"
                )
        elif isinstance(node, exp.Concat | exp.DPipe):
            parts = node.expressions if isinstance(node, exp.Concat) else [node.this, node.expression]
            if any(kind(part) not in ("string", "int") for part in parts):
                raise _Refused(
                    f"{shown(node)}: concatenates values other than text and integers, which Postgres and "
                    "DuckDB print differently"
                )
        elif isinstance(node, exp.DateTrunc | exp.TimestampTrunc):
            if kind(node.this) == "date":
                raise _Refused(
                    f"{shown(node)}: date_trunc of a date; Postgres truncates it as a time stamp with time "
                    "zone"
                )
        elif isinstance(node, _CALENDAR_NUMBERS) or (
            isinstance(node, exp.Anonymous) and str(node.name).lower() in ("date_part", "datepart")
        ):
            unit = _calendar_unit(node)
            if unit not in DATE_UNITS:
                raise _Refused(
                    f"{shown(node)}: the unit {unit or '?'}; Postgres gives fractions (seconds, epoch) where "
                    f"DuckDB gives integers; units with a Postgres form: {', '.join(DATE_UNITS)}"
                )
            numbers.append((node, unit))
        if isinstance(node, _ORDERED):
            collate += [side for side in (node.this, node.expression) if kind(side) == "string"]
        elif isinstance(node, exp.Between):
            parts = [node.this, node.args["low"], node.args["high"]]
            collate += [part for part in parts if kind(part) == "string"]
        elif isinstance(node, exp.Greatest | exp.Least):
            collate += [part for part in (node.this, *node.expressions) if kind(part) == "string"]
    for node in collate:
        collated = exp.Collate(this=exp.Paren(this=node.copy()), expression=_TEXT_COLLATION.copy())
        # Parenthesised: BETWEEN's bounds take no COLLATE in Postgres' grammar otherwise.
        node.replace(exp.Paren(this=collated))
    # Postgres' extract and date_part give numeric and double precision; DuckDB gives integers.
    for node, unit in numbers:
        argument = node.expressions[1] if isinstance(node, exp.Anonymous) else node.expression
        if not isinstance(node, exp.Extract | exp.Anonymous):
            argument = node.this
        extract = exp.Extract(this=exp.var(unit.upper()), expression=argument.copy())
        node.replace(exp.Cast(this=extract, to=exp.DataType.build("BIGINT")))


def _calendar_unit(node: exp.Expr) -> str | None:
    """The unit of a calendar number (`extract(hour FROM ts)`, `date_part('hour', ts)`, `hour(ts)`)."""
    if isinstance(node, exp.Extract):
        unit = node.this
    elif isinstance(node, exp.Anonymous):
        unit = node.expressions[0] if node.expressions else None
    else:
        return _UNIT_NODES.get(type(node))
    if isinstance(unit, exp.Literal | exp.Var | exp.Column):
        return str(unit.name if not isinstance(unit, exp.Literal) else unit.this).lower()
    return None
