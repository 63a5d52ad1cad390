"""Parses a partition expression with sqlglot into a typed `Transform`, rejecting what cannot partition.

The grammar is DuckDB's (a Postgres-like SQL): `bucket(N, col)`, `bucket(N::int32, col)`,
`truncate(W, col)`, `date_part('unit', col)`, `extract(unit FROM col)`, `YEAR(col)` and the other unit
functions, `date_trunc('unit', col)`, `col % N` (or `mod(col, N)`), or a bare column; and any other scalar
expression over one column from the function set of `transforms.expression` (`lower(region)`,
`CASE WHEN amount > 1000 THEN 'big' ELSE 'small' END`), which the built-in transforms may also wrap
(`bucket(16, lower(email))`).

Column names are taken exactly as written, quoted or not (`PULocationID` and `"PULocationID"` are the
same column, and neither is `pulocationid`): names are case-sensitive, as in Arrow and Parquet schemas.
Double quotes are needed only for names that are not plain identifiers (spaces, dots, SQL keywords).
"""

from __future__ import annotations

import functools
import re
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from airflow_partitions.exceptions import PartitionExpressionError
from airflow_partitions.transforms.base import DIALECT, Transform
from airflow_partitions.transforms.bucket import MAX_BUCKETS, BucketTransform
from airflow_partitions.transforms.expression import (
    COMPOSED_INPUT,
    UNIT_FUNCTIONS,
    ExpressionTransform,
    check_expression,
    reject_non_deterministic,
)
from airflow_partitions.transforms.identity import IdentityTransform
from airflow_partitions.transforms.mod import ModTransform
from airflow_partitions.transforms.multi_bucket import MAX_BUCKETS as MULTI_BUCKET_MAX
from airflow_partitions.transforms.multi_bucket import MIN_COLUMNS as MULTI_BUCKET_MIN_COLUMNS
from airflow_partitions.transforms.multi_bucket import MultiBucketTransform
from airflow_partitions.transforms.plain_sql import SUPPORTED_FORMS
from airflow_partitions.transforms.temporal import DATE_UNITS, DatePartTransform, DateTruncTransform
from airflow_partitions.transforms.truncate import TruncateTransform

INT64_MAX = (1 << 63) - 1
# Print SQL in messages as the user wrote it: DuckDB syntax, function names in their original case.
_AS_WRITTEN: dict[str, Any] = {"dialect": DIALECT, "normalize_functions": False}
_UNIT_LIST = ", ".join(f"'{unit}'" for unit in DATE_UNITS)
_INTEGER_TEXT = re.compile(r"[0-9]+")
_UNIT_FUNCTIONS = UNIT_FUNCTIONS
# Every sqlglot node a calendar transform (date_part, extract, the unit functions, date_trunc) parses to.
CALENDAR_NODES: tuple[type[exp.Expr], ...] = (
    exp.Extract,
    exp.DateTrunc,
    exp.TimestampTrunc,
    *_UNIT_FUNCTIONS,
)
# Every spelling of a transform call contains one of these (YEAR(, EXTRACT(, date_trunc(, trunc(, ...).
_TRANSFORM_CALL_WORDS = (
    "bucket",
    "trunc",
    "date",
    "extract",
    "year",
    "quarter",
    "month",
    "week",
    "day",
    "hour",
    "minute",
)
# Cast targets allowed on bucket's N, and the result width each one gives.
_BUCKET_CAST_BITS = {exp.DataType.Type.INT: 32, exp.DataType.Type.BIGINT: 64}


def parse_sql_transform(expression: str) -> Transform:
    """Parse one `partition_by` expression with sqlglot (`transforms.parse.parse_transform` reads the
    plain built-in forms without it); raises `PartitionExpressionError` saying what to change."""
    if not isinstance(expression, str) or not expression.strip():
        raise PartitionExpressionError(
            f"partition expression {expression!r} is empty; write a column or a transform of one column, "
            "e.g. bucket(16, user_id)"
        )
    text = expression.strip()
    return _from_tree(text, _parse_single(text))


def transform_from_node(node: exp.Expr) -> Transform:
    """The transform an already parsed expression spells (what `parse_transform` gives for its SQL).

    For callers holding a sqlglot tree (a filter's term, a query's call), so nothing is printed and
    parsed again; messages quote the node's DuckDB SQL.
    """
    return _from_tree(node.sql(dialect=DIALECT), node)


def is_transform_call(node: exp.Expr) -> bool:
    """Whether `node` is a call a partition transform can be spelled with (its arguments unchecked)."""
    return isinstance(node, (exp.Trunc, *CALENDAR_NODES)) or _is_function(
        node, "bucket", "truncate", "date_part", "datepart"
    )


def is_multi_bucket_call(node: exp.Expr) -> bool:
    """Whether `node` is a `multi_bucket(...)` call (its arguments unchecked)."""
    return _is_function(node, "multi_bucket")


def may_call_transforms(sql: str) -> bool:
    """A cheap test on text: False when `sql` cannot hold a transform call, so it need not be parsed."""
    lowered = sql.lower()
    return any(word in lowered for word in _TRANSFORM_CALL_WORDS)


def _from_tree(text: str, tree: exp.Expr) -> Transform:
    _reject_forbidden(text, tree)
    reject_non_deterministic(text, tree)
    if _is_function(_unwrap(tree), "multi_bucket"):
        return _build_multi_bucket(text, _unwrap(tree))
    columns = _column_references(tree)
    if not columns:
        raise _error(
            text,
            "references no column",
            "a partition expression must reference exactly one column of the dataset, "
            "e.g. bucket(16, user_id)",
        )
    names = sorted({column.sql(**_AS_WRITTEN) for column in columns})
    distinct = {(column.table, column.name) for column in columns}
    if len(distinct) > 1:
        listed = ", ".join(names)
        raise _error(
            text,
            f"references {len(distinct)} columns ({listed})",
            "a partition expression must reference exactly one column (multi_bucket(N, a, b, ...) is the "
            "one exception: it hashes several columns into N buckets); add one partition_by entry per "
            "column",
        )
    return _build(text, _unwrap(tree))


# --- SQL errors in plain words -----------------------------------------------------------------------

# What an incomplete node is, by sqlglot class name: its messages name classes ("Required keyword:
# 'expression' missing for <class 'sqlglot.expressions.core.EQ'>"), which mean nothing to a user.
_INCOMPLETE_NODES: dict[str, str] = {
    "EQ": "comparison '='",
    "NEQ": "comparison '<>'",
    "LT": "comparison '<'",
    "LTE": "comparison '<='",
    "GT": "comparison '>'",
    "GTE": "comparison '>='",
    "NullSafeEQ": "comparison 'IS NOT DISTINCT FROM'",
    "NullSafeNEQ": "comparison 'IS DISTINCT FROM'",
    "And": "condition 'AND'",
    "Or": "condition 'OR'",
    "Not": "condition 'NOT'",
    "Between": "BETWEEN (write BETWEEN low AND high)",
    "In": "IN list",
    "Like": "LIKE",
    "ILike": "ILIKE",
    "Is": "IS",
    "Add": "arithmetic '+'",
    "Sub": "arithmetic '-'",
    "Mul": "arithmetic '*'",
    "Div": "arithmetic '/'",
    "Mod": "arithmetic '%'",
    "Cast": "CAST",
}
_REQUIRED_KEYWORD = re.compile(r"Required keyword: '\w+' missing for <class '[\w.]*?(\w+)'>")
_CLASS_NAME = re.compile(r"<class '[\w.]*?(\w+)'>")


def describe_sql_error(err: Exception, *, prefix: str = "") -> str:
    """A sqlglot parse or tokenize error of `prefix + text` in plain words about `text`: what is wrong and
    at which character of `text`, without parser class names, terminal escapes or the added `prefix`."""
    details = getattr(err, "errors", None) or []
    if not details:
        # Tokenizer errors carry only the text read so far: the usual cause is a quote left open.
        return "unclosed quote or unreadable character; close every '...' string and \"...\" name"
    first = details[0]
    description = str(first.get("description") or type(err).__name__)
    highlight = str(first.get("highlight") or "")
    required = _REQUIRED_KEYWORD.fullmatch(description)
    if required is not None:
        what = f"incomplete {_INCOMPLETE_NODES.get(required.group(1), 'expression')}"
    elif description.startswith("Expecting )"):
        what = "missing ')'"
    elif description.startswith("Invalid expression / Unexpected token"):
        what = f"unexpected {highlight!r}"
    else:
        what = _CLASS_NAME.sub(lambda match: match.group(1), description).rstrip(".")
    line, column = first.get("line"), first.get("col")
    if not isinstance(line, int) or not isinstance(column, int):
        return what
    # sqlglot reports the column of the highlighted token's last character.
    start = column - max(len(highlight), 1) + 1
    if line == 1:
        start -= len(prefix)
        return f"{what} at character {max(start, 1)}"
    return f"{what} at line {line}, character {max(start, 1)}"


# --- parsing and rejection ------------------------------------------------------------------------


def _error(text: str, problem: str, fix: str) -> PartitionExpressionError:
    return PartitionExpressionError(f"partition expression {text!r} {problem}; {fix}")


def _parse_single(text: str) -> exp.Expr:
    try:
        trees = sqlglot.parse(text, read=DIALECT)
    except SqlglotError as err:
        reason = describe_sql_error(err)
        raise _error(
            text, f"is not valid SQL ({reason})", f"write a SQL expression such as {SUPPORTED_FORMS}"
        ) from err
    statements = [tree for tree in trees if tree is not None]
    if len(statements) != 1:
        raise _error(
            text, "must be exactly one SQL expression", "remove the ';' and keep a single expression"
        )
    return statements[0]


def _reject_forbidden(text: str, tree: exp.Expr) -> None:
    nodes = list(tree.walk())
    one_per_row = "a partition value is computed from one row"

    def first(*kinds: type[exp.Expr]) -> exp.Expr | None:
        return next((node for node in nodes if isinstance(node, kinds)), None)

    if first(exp.Exists) is not None:
        raise _error(
            text, "contains EXISTS (a subquery)", f"{one_per_row}; partition by a column or a transform of it"
        )
    if first(exp.Subquery, exp.Query) is not None:
        raise _error(
            text,
            "contains a subquery",
            f"{one_per_row} and cannot read other rows or tables; partition by a column",
        )
    if first(exp.Window) is not None:
        raise _error(
            text,
            "contains a window function (OVER ...)",
            f"{one_per_row}, not from a window of rows; partition by a column or a transform of it",
        )
    aggregate = first(exp.AggFunc)
    if isinstance(aggregate, exp.Func):
        raise _error(
            text,
            f"contains the aggregate function {aggregate.sql_name()}()",
            f"aggregates combine many rows but {one_per_row}; "
            "partition by the column itself or a transform of it",
        )
    if first(exp.Unnest, exp.Explode) is not None:
        raise _error(
            text,
            "contains UNNEST",
            "UNNEST turns one row into many but a partition expression must give one value per row",
        )
    placeholder = first(exp.Placeholder, exp.Parameter, exp.SessionParameter)
    if placeholder is None:
        placeholder = next(
            (node for node in nodes if isinstance(node, exp.Column) and node.name.startswith(("$", "?"))),
            None,
        )
    if placeholder is not None:
        raise _error(
            text,
            f"contains the placeholder {_placeholder_text(text, placeholder)}",
            "partition expressions are fixed when the spec loads; write the literal value instead",
        )
    alias = first(exp.Alias)
    if alias is not None:
        mapping = f'- {alias.alias}: "{alias.this.sql(**_AS_WRITTEN)}"'
        raise _error(
            text,
            f"aliases its result ({alias.sql(**_AS_WRITTEN)})",
            f"name the partition with the mapping form instead: `{mapping}`",
        )
    if first(exp.Star) is not None:
        raise _error(text, "contains *", "a partition expression must reference exactly one column by name")
    if not isinstance(tree, exp.Condition):
        raise _error(text, "is a SQL statement, not an expression", f"write one of: {SUPPORTED_FORMS}")


def _placeholder_text(text: str, node: exp.Expr) -> str:
    """The placeholder as the user wrote it (`?`, `$1`, `:name`), not as a dialect would print it."""
    name = str(node.name) if node.name else ""
    for spelling in (f":{name}", f"${name}", f"@{name}") if name else ():
        if spelling in text:
            return spelling
    return node.sql(**_AS_WRITTEN) if not isinstance(node, exp.Placeholder) or name else "?"


def _column_references(tree: exp.Expr) -> list[exp.Column]:
    """Column references, minus unit keywords written bare (`date_part(day, ts)` names one column)."""
    skipped: set[int] = set()
    for node in tree.walk():
        if _is_function(node, "date_part", "datepart") and node.expressions:
            unit = node.expressions[0]
            if isinstance(unit, exp.Column) and _bare_unit(unit) is not None:
                skipped.add(id(unit))
    return [node for node in tree.find_all(exp.Column) if id(node) not in skipped]


def _is_function(node: exp.Expr, *names: str) -> bool:
    return isinstance(node, exp.Anonymous) and str(node.name).lower() in names


def _bare_unit(node: exp.Column) -> str | None:
    if node.table or not isinstance(node.this, exp.Identifier) or node.this.quoted:
        return None
    name = str(node.name).lower()
    return name if name in DATE_UNITS else None


def _unwrap(node: exp.Expr) -> exp.Expr:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


# --- building transforms --------------------------------------------------------------------------


def _build(text: str, node: exp.Expr) -> Transform:
    if isinstance(node, exp.Column):
        return IdentityTransform(_column_name(text, node, "the partition column"))
    if isinstance(node, exp.Mod) and (
        isinstance(_unwrap(node.this), exp.Column) or _positive_integer(node.expression) is not None
    ):
        return _build_mod(text, node)
    if isinstance(node, exp.Trunc) or _is_function(node, "truncate"):
        return _build_truncate(text, node)
    if _is_function(node, "bucket"):
        return _build_bucket(text, node)
    if _is_function(node, "date_part", "datepart"):
        args = _arguments(text, node, "date_part", 2)
        unit = _unit(text, args[0], "date_part")
        return _over(text, args[1], "date_part", lambda column: DatePartTransform(column, unit))
    if isinstance(node, exp.Extract):
        unit = _unit(text, node.this, "extract")
        return _over(text, node.expression, "extract", lambda column: DatePartTransform(column, unit))
    if isinstance(node, exp.DateTrunc | exp.TimestampTrunc):
        unit_node = node.args.get("unit")
        if unit_node is None:
            raise _error(text, "has no date_trunc unit", f"write date_trunc('day', col); units: {_UNIT_LIST}")
        trunc_unit = _unit(text, unit_node, "date_trunc")
        return _over(text, node.this, "date_trunc", lambda column: DateTruncTransform(column, trunc_unit))
    for function_type, unit in _UNIT_FUNCTIONS.items():
        if type(node) is function_type:
            return _over(
                text, node.this, f"{unit.upper()}()", functools.partial(DatePartTransform, unit=unit)
            )
    return _expression(text, node)


def _expression(text: str, node: exp.Expr) -> ExpressionTransform:
    """A custom expression over the one column `node` references (checked against the function set)."""
    check_expression(text, node)
    columns = _column_references(node)
    if not columns:
        raise _error(text, "references no column", "a partition expression must reference exactly one column")
    return ExpressionTransform(_column_name(text, columns[0], "the expression"), node)


def _over(text: str, argument: exp.Expr | None, where: str, make: Any) -> Transform:
    """A built-in transform over a plain column, or over an expression of one (composed)."""
    inner = _unwrap(argument) if argument is not None else None
    if inner is None or isinstance(inner, exp.Column):
        built: Transform = make(_column_name(text, inner, where))
        return built
    expression = _expression(text, inner)
    return ExpressionTransform(expression.source_column, inner, outer=make(COMPOSED_INPUT))


def _describe(node: exp.Expr) -> str:
    if isinstance(node, exp.Anonymous):
        return f"the function {node.name}()"
    if isinstance(node, exp.Func):
        return f"the function {node.sql_name()}()"
    if isinstance(node, exp.Binary):
        return f"the operator expression {node.sql(**_AS_WRITTEN)}"
    return f"{type(node).__name__.upper()} ({node.sql(**_AS_WRITTEN)})"


def _arguments(text: str, node: exp.Expr, function: str, count: int) -> list[exp.Expr]:
    args = list(node.expressions) if isinstance(node, exp.Anonymous) else []
    if len(args) != count:
        raise _error(
            text,
            f"calls {function} with {len(args)} argument(s)",
            f"{function} takes {count}; supported: {SUPPORTED_FORMS}",
        )
    return [_unwrap(arg) for arg in args]


def _column_name(text: str, node: exp.Expr | None, where: str) -> str:
    node = _unwrap(node) if node is not None else None
    if not isinstance(node, exp.Column):
        shown = node.sql(**_AS_WRITTEN) if node is not None else "nothing"
        raise _error(
            text,
            f"passes {shown} where {where} needs a column",
            "the argument must be a plain column reference; "
            "nested functions and arithmetic are not supported",
        )
    if node.table:
        raise _error(
            text,
            f"uses the qualified column {node.sql(**_AS_WRITTEN)}",
            f"write just the column name ({node.name}); a partition expression reads one dataset",
        )
    if "\x00" in node.name:
        raise _error(text, "names a column holding a NUL character", "rename the column in the source")
    return str(node.name)


def _positive_integer(node: exp.Expr | None) -> int | None:
    node = _unwrap(node) if node is not None else None
    if isinstance(node, exp.Literal) and not node.is_string and _INTEGER_TEXT.fullmatch(node.this):
        value = int(node.this)
        return value if value > 0 else None
    return None


def _shown(node: exp.Expr | None) -> str:
    return "nothing" if node is None else node.sql(**_AS_WRITTEN)


def _build_bucket(text: str, node: exp.Expr) -> Transform:
    count_node, column_node = _arguments(text, node, "bucket", 2)
    result_bits = 64
    literal: exp.Expr = count_node
    if isinstance(count_node, exp.Cast):
        target = count_node.to.this
        if target not in _BUCKET_CAST_BITS:
            raise _error(
                text,
                f"casts bucket's N to {count_node.to.sql(**_AS_WRITTEN)}",
                "cast N to int32 (INT, for int32 bucket values) or bigint (the default, int64), "
                "e.g. 16::int32",
            )
        result_bits = _BUCKET_CAST_BITS[target]
        literal = _unwrap(count_node.this)
    count = _positive_integer(literal)
    if count is None or count > MAX_BUCKETS:
        order_hint = " (the arguments are bucket(N, column))" if isinstance(literal, exp.Column) else ""
        raise _error(
            text,
            f"has bucket N = {_shown(literal)}{order_hint}",
            f"N must be a positive integer literal ≤ {MAX_BUCKETS:,}, optionally cast: bucket(16, col) or "
            "bucket(16::int32, col)",
        )
    return _over(text, column_node, "bucket", lambda column: BucketTransform(column, count, result_bits))


def _build_multi_bucket(text: str, node: exp.Expr) -> Transform:
    """`multi_bucket(N, a, b, ...)`: N a positive integer literal, then two or more distinct plain columns."""
    args = [_unwrap(arg) for arg in node.expressions] if isinstance(node, exp.Anonymous) else []
    usage = "write multi_bucket(N, col_a, col_b, ...): N buckets, then two or more columns"
    if len(args) < 1 + MULTI_BUCKET_MIN_COLUMNS:
        raise _error(
            text,
            f"calls multi_bucket with {len(args)} argument(s)",
            f"{usage}; for one column write bucket(N, col)",
        )
    count = _positive_integer(args[0])
    if count is None or count > MULTI_BUCKET_MAX:
        order_hint = (
            " (the arguments are multi_bucket(N, col_a, col_b, ...))"
            if isinstance(args[0], exp.Column)
            else ""
        )
        raise _error(
            text,
            f"has multi_bucket N = {_shown(args[0])}{order_hint}",
            f"N must be a positive integer literal ≤ {MULTI_BUCKET_MAX:,}; {usage}",
        )
    columns: list[str] = []
    for position, arg in enumerate(args[1:], start=1):
        if not isinstance(arg, exp.Column):
            raise _error(
                text,
                f"passes {_shown(arg)} as multi_bucket argument {position + 1}",
                f"multi_bucket hashes plain columns only (no expressions inside it); {usage}",
            )
        columns.append(_column_name(text, arg, "multi_bucket"))
    repeated = sorted({column for column in columns if columns.count(column) > 1})
    if repeated:
        raise _error(
            text,
            f"names column(s) {', '.join(repeated)} more than once",
            "list each column once (a repeated column hashes its bytes twice and adds nothing)",
        )
    return MultiBucketTransform(columns, count)


def _build_truncate(text: str, node: exp.Expr) -> Transform:
    if isinstance(node, exp.Trunc):
        width_node, column_node = node.this, node.args.get("decimals")
        if column_node is None:
            raise _error(text, "calls truncate with 1 argument", "truncate takes two: truncate(W, column)")
    else:
        width_node, column_node = _arguments(text, node, "truncate", 2)
    width = _positive_integer(width_node)
    if width is None or width > INT64_MAX:
        order_hint = (
            " (the arguments are truncate(W, column))" if isinstance(_unwrap(width_node), exp.Column) else ""
        )
        raise _error(
            text,
            f"has truncate width W = {_shown(width_node)}{order_hint}",
            "W must be a positive integer literal (at most 2**63-1), e.g. truncate(1000, amount)",
        )
    return _over(text, column_node, "truncate", lambda column: TruncateTransform(column, width))


def _build_mod(text: str, node: exp.Mod) -> Transform:
    modulus = _positive_integer(node.expression)
    if modulus is None or modulus > INT64_MAX:
        raise _error(
            text,
            f"has modulus N = {_shown(node.expression)}",
            "in `column % N`, N must be a positive integer literal, e.g. id % 16",
        )
    return _over(text, node.this, "the % operator", lambda column: ModTransform(column, modulus))


def _unit(text: str, node: exp.Expr | None, function: str) -> str:
    node = _unwrap(node) if node is not None else None
    unit: str | None = None
    if isinstance(node, exp.Literal) and node.is_string:
        unit = str(node.this).lower()
    elif isinstance(node, exp.Var):
        unit = str(node.name).lower()
        node = exp.Literal.string(unit)
    elif isinstance(node, exp.Column) and not node.table:
        unit = str(node.name).lower()
    if unit not in DATE_UNITS:
        raise _error(
            text,
            f"has {function} unit {_shown(node)}",
            f"the unit must be one of {_UNIT_LIST} (a quoted string)",
        )
    return unit
