"""Turn a SQL WHERE string or a pyarrow-style DNF list into one bound predicate over the dataset schema.

Both forms end in the same `expressions` tree. Columns resolve against the dataset's Arrow schema by their
exact name, the rule `partition_by` follows (a name differing only in case is refused with the exact
spelling; lenient binding, for a query DuckDB itself resolves, also takes a unique case-insensitive match);
calls of functions that read files, the environment or settings are refused; literals are
coerced to the type of the term they meet (`literals.coerce_literal`); partition expressions written in
the filter (`bucket(50, c) = 7`, `date_part('year', ts) >= 2026`, `truncate(1000, amount)`, `id % 16`)
become `TransformRef` terms with exactly the semantics used to write partitions.

Strict binding (the default, for `plan`/`read`) raises `FilterError` for syntax errors, unknown columns
and type mismatches; boolean SQL it cannot reason about (LIKE, other functions) is kept as `Opaque`, which
prunes nothing but is still applied as the residual filter. Lenient binding (for conjuncts lifted out of a
user's query) never raises on such things: whatever it cannot use becomes `Opaque`.
"""

from __future__ import annotations

import datetime as dt
import functools
import threading
from collections.abc import Callable, Iterable, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from airflow_partitions.exceptions import FilterError, PartitionExpressionError, QueryLimitError
from airflow_partitions.lazy_module import LazyModule
from airflow_partitions.pruning.deep import deep_stack
from airflow_partitions.pruning.expressions import (
    OPERATORS_BY_TEXT,
    AlwaysFalse,
    AlwaysNull,
    AlwaysTrue,
    ColumnRef,
    Comparison,
    InList,
    IsNull,
    Op,
    Opaque,
    Predicate,
    Term,
    TransformRef,
    and_,
    not_,
    or_,
)
from airflow_partitions.pruning.limits import budget, check_budget, run_bounded
from airflow_partitions.pruning.literals import Between, coerce_literal
from airflow_partitions.pruning.prefix import like_prefix, prefix_upper_bound
from airflow_partitions.spec.model import did_you_mean
from airflow_partitions.transforms.base import DIALECT
from airflow_partitions.transforms.plain_sql import plain_comparisons

if TYPE_CHECKING:
    import sqlglot
    from sqlglot import errors, exp

    from airflow_partitions.transforms import Transform

    ColumnResolver = Callable[[exp.Column], str | None]
else:
    # SQL is parsed only for filters beyond the plain `col op value` shapes: sqlglot loads then.
    sqlglot = LazyModule("sqlglot")
    errors = LazyModule("sqlglot.errors")
    exp = LazyModule("sqlglot.expressions")


@functools.cache
def _deterministic_constant_nodes() -> tuple[type[exp.Expr], ...]:
    """Node types a lenient (query) binding may fold into a constant: deterministic, column-free."""
    return (
        exp.Literal,
        exp.Neg,
        exp.Paren,
        exp.Cast,
        exp.TryCast,
        exp.DataType,
        exp.DataTypeParam,
        exp.Interval,
        exp.Var,
        exp.Add,
        exp.Sub,
        exp.Mul,
        exp.Div,
        exp.Boolean,
        exp.Null,
        exp.HexString,
        exp.Identifier,
    )


# DuckDB functions that read files, the environment or settings. A filter names rows of the dataset; these
# would fail on the read connection (external access is off) as a storage error, or leak what they read.
OUTSIDE_WORLD_FUNCTIONS = frozenset(
    {
        "getenv",
        "current_setting",
        "glob",
        "query",
        "query_table",
        "read_text",
        "read_blob",
        "read_csv",
        "read_csv_auto",
        "sniff_csv",
        "read_parquet",
        "parquet_scan",
        "parquet_metadata",
        "parquet_schema",
        "parquet_file_metadata",
        "parquet_kv_metadata",
        "read_json",
        "read_json_auto",
        "read_json_objects",
        "read_json_objects_auto",
        "read_ndjson",
        "read_ndjson_auto",
        "read_ndjson_objects",
        "read_xlsx",
        "iceberg_scan",
        "delta_scan",
        "sqlite_scan",
        "postgres_scan",
        "mysql_scan",
    }
)

# Functions whose value is not a fact about the row: they sleep (a filter that waits), or answer
# differently each call (time, randomness, sequences), so a plan, a read and a delete of one filter would
# each select other rows.
NON_DETERMINISTIC_FUNCTIONS = frozenset(
    {
        "sleep_ms",
        "random",
        "rand",
        "setseed",
        "uuid",
        "uuidv4",
        "uuidv7",
        "gen_random_uuid",
        "now",
        "current_timestamp",
        "get_current_timestamp",
        "transaction_timestamp",
        "current_date",
        "current_time",
        "get_current_time",
        "localtimestamp",
        "localtime",
        "current_localtimestamp",
        "current_localtime",
        "today",
        "nextval",
        "currval",
    }
)
# Each constant of a filter outside a query or read budget (`limits.budget`) gets this much.
CONSTANT_SECONDS = 30.0
CONSTANT_MEMORY_BYTES = 256 * 1024**2

FilterInput = str | Sequence[Any] | Predicate | None


def render(node: exp.Expr) -> str:
    """DuckDB SQL of a sqlglot node (for messages and the SQL a filter runs as)."""
    return node.sql(dialect=DIALECT)


def duckdb_sql(node: exp.Expression, schema: pa.Schema) -> str:
    """DuckDB SQL of a boolean node, partition transforms rewritten to compute exactly our values."""
    from airflow_partitions.transforms.duckdb_rewrite import rewrite_partition_nodes  # lazy: sqlglot

    types = {field.name: field.type for field in schema}
    return render(rewrite_partition_nodes(node, types))


def parse_where_sql(where: str) -> exp.Expression:
    """The sqlglot tree of a WHERE condition; a `FilterError` for anything but one boolean expression."""
    if not isinstance(where, str) or not where.strip():
        raise FilterError("the filter is empty; pass a SQL condition such as \"region = 'EU'\" or None")
    from airflow_partitions.pruning.sql_text import parse_sql  # lazy: sqlglot
    from airflow_partitions.transforms.parser import describe_sql_error  # lazy: sqlglot

    # Parsed inside a SELECT: a bare `truncate(...)` would otherwise read as a TRUNCATE statement.
    prefix = "SELECT 1 WHERE "
    try:
        statements = parse_sql(prefix + where)
    except (errors.ParseError, errors.TokenError) as err:
        raise FilterError(
            f"syntax error in filter {where!r}: {describe_sql_error(err, prefix=prefix)}"
        ) from err
    if len(statements) != 1 or not isinstance(statements[0], exp.Select):
        raise FilterError(f"filter {where!r} must be a single condition, not several statements")
    select = statements[0]
    condition = select.args.get("where")
    extra = [key for key in ("group", "having", "order", "limit", "qualify", "from") if select.args.get(key)]
    if condition is None or extra or len(select.expressions) != 1:
        raise FilterError(f"filter {where!r} is not a single boolean condition")
    inner: exp.Expression = condition.this
    return inner


def refuse_outside_world_functions(node: exp.Expression) -> None:
    """`FilterError` when `node` calls a function that reads files, the environment or settings, or one
    that sleeps or answers differently each call (`NON_DETERMINISTIC_FUNCTIONS`)."""
    for call in node.find_all(exp.Func):
        name = (call.name if isinstance(call, exp.Anonymous) else call.sql_name()).lower()
        if name in OUTSIDE_WORLD_FUNCTIONS:
            raise FilterError(
                f"{name}() cannot be used in a filter: a filter may not read files, the environment "
                "or settings; compare the dataset's columns with values instead"
            )
        if name in NON_DETERMINISTIC_FUNCTIONS:
            raise FilterError(
                f"{name}() cannot be used in a filter: it sleeps or answers differently on each call, so "
                "the rows a filter selects would change between planning and reading; compare the "
                "columns with literal values (e.g. ts >= TIMESTAMP '2026-01-01 00:00:00+00')"
            )


def _first_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


class FilterBinder:
    """Binds filters to one Arrow schema. `lenient=True` turns every problem into an `Opaque` leaf."""

    def __init__(
        self,
        schema: pa.Schema,
        *,
        lenient: bool = False,
        resolve_column: ColumnResolver | None = None,
    ) -> None:
        self.schema = schema
        self.lenient = lenient
        self._resolve_column_node = resolve_column
        self._names = list(schema.names)
        self._by_lower: dict[str, list[str]] = {}
        for name in self._names:
            self._by_lower.setdefault(name.lower(), []).append(name)

    # --- entry points -----------------------------------------------------------------------------

    def bind(self, where: FilterInput) -> Predicate:
        """A predicate from a SQL string, a DNF list, an already built predicate, or None (no filter)."""
        if where is None:
            return AlwaysTrue()
        if isinstance(where, Predicate):
            return where
        if isinstance(where, str):
            return self.bind_sql(where)
        if isinstance(where, Sequence) and not isinstance(where, bytes | bytearray):
            return self.bind_dnf(where)
        raise FilterError(
            f"unsupported filter {where!r}: pass a SQL condition string, a DNF list such as "
            "[[('region', '=', 'EU')]], or None"
        )

    def bind_sql(self, where: str) -> Predicate:
        if not self.lenient and self._resolve_column_node is None:
            # `col op value AND ...`: what the parsed tree would bind to, without parsing SQL.
            comparisons = plain_comparisons(where)
            if comparisons is not None:
                return and_(*(self._plain_comparison(name, op, value) for name, op, value in comparisons))
        return self.bind_parsed_sql(where)

    def _plain_comparison(self, name: str, op: str, value: int | str) -> Predicate:
        check_budget()  # as `_predicate` does per node: a call's time limit covers long filters too
        return self.compare(self.resolve(name), OPERATORS_BY_TEXT[op], value)

    def bind_parsed_sql(self, where: str) -> Predicate:
        """`where` parsed by sqlglot and bound (what `bind_sql` does for every shape but the plainest)."""
        from airflow_partitions.pruning.sql_text import collection_paused  # lazy: sqlglot

        with collection_paused(where):
            return self.bind_node(parse_where_sql(where))

    def bind_node(self, node: exp.Expression) -> Predicate:
        """A predicate from a sqlglot boolean expression."""
        if not self.lenient:
            refuse_outside_world_functions(node)
        try:
            return self._predicate(node)
        except QueryLimitError:
            raise  # the call's time is spent: no binding fallback may hide that
        except FilterError:
            if self.lenient:
                return Opaque(render(node))
            raise

    # --- column resolution ------------------------------------------------------------------------

    def resolve(self, name: str) -> ColumnRef:
        """The schema column `name` refers to, spelt exactly: column names are case-sensitive, as in
        `partition_by` (`transforms.parser`). Lenient binding (a query's conditions, which DuckDB resolves
        itself) also takes a unique case-insensitive match."""
        exact = self._names.count(name)
        if exact == 1:
            return ColumnRef(name, self.schema.field(name).type)
        if exact > 1:
            raise FilterError(f"column {name!r} appears {exact} times in the dataset schema; it is ambiguous")
        matches = self._by_lower.get(name.lower(), [])
        if len(matches) == 1 and self.lenient:
            return ColumnRef(matches[0], self.schema.field(matches[0]).type)
        if matches:
            spelled = " or ".join(repr(match) for match in matches)
            raise FilterError(
                f"unknown column {name!r} in filter: column names are case-sensitive; did you mean {spelled}?"
            )
        listing = ", ".join(self._names) if len(self._names) <= 30 else f"{len(self._names)} columns"
        raise FilterError(
            f"unknown column {name!r} in filter{did_you_mean(name, self._names)}; the dataset has: {listing}"
        )

    def _column(self, node: exp.Column) -> ColumnRef:
        if self._resolve_column_node is not None:
            resolved = self._resolve_column_node(node)
            if resolved is None:
                raise FilterError(f"column {node.sql(dialect=DIALECT)} does not belong to this dataset")
            return self.resolve(resolved)
        if node.table:
            raise FilterError(
                f"qualified column {node.sql(dialect=DIALECT)} in filter; "
                "name dataset columns without a table"
            )
        return self.resolve(node.name)

    # --- predicates -------------------------------------------------------------------------------

    def _predicate(self, node: exp.Expression) -> Predicate:
        check_budget()
        if isinstance(node, exp.Paren):
            return self._predicate(node.this)
        if isinstance(node, exp.And):
            return and_(self._predicate(node.this), self._predicate(node.expression))
        if isinstance(node, exp.Or):
            return or_(self._predicate(node.this), self._predicate(node.expression))
        if isinstance(node, exp.Not):
            return not_(self._predicate(node.this))
        if isinstance(node, exp.Boolean):
            return AlwaysTrue() if node.this else AlwaysFalse()
        if isinstance(node, exp.Null):
            return AlwaysNull()
        try:
            return self._leaf(node)
        except QueryLimitError:
            raise  # the call's time is spent: no binding fallback may hide that
        except FilterError:
            if self.lenient:
                return Opaque(render(node))
            raise

    def _leaf(self, node: exp.Expression) -> Predicate:
        comparison = _comparison_nodes().get(type(node))
        if comparison is not None:
            return self._comparison(node, comparison)
        if isinstance(node, exp.NullSafeEQ | exp.NullSafeNEQ):
            return self._null_safe(node)
        if isinstance(node, exp.Between):
            return self._between(node)
        if isinstance(node, exp.In):
            return self._in(node)
        if isinstance(node, exp.Like | exp.StartsWith):
            prefixed = self._prefix_range(node)
            if prefixed is not None:
                return prefixed
        if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
            term = self._term(node.this)
            if term is None:
                return self._opaque(node)
            return IsNull(term)
        if isinstance(node, exp.Column):
            column = self._column(node)
            if not pa.types.is_boolean(column.type):
                raise FilterError(
                    f"column {column.name!r} of type {column.type} is used as a condition; compare it, "
                    f"e.g. {column.name} = ..."
                )
            return Comparison(column, Op.EQ, True)
        return self._opaque(node)

    def _prefix_range(self, node: exp.Like | exp.StartsWith) -> Predicate | None:
        """`t LIKE 'p%'` / `starts_with(t, 'p')` on a string term as the range it selects (exact)."""
        pattern = node.expression
        extra = {key for key, value in node.args.items() if value} - {"this", "expression", "negate"}
        if extra or not isinstance(pattern, exp.Literal) or not pattern.is_string:
            return None
        text = str(pattern.this)
        prefix = like_prefix(text) if isinstance(node, exp.Like) else (text or None)
        term = self._term(node.this) if prefix is not None else None
        if term is None or prefix is None or not pa.types.is_string(term.type):
            return None
        lower = self.compare(term, Op.GE, prefix)
        upper = prefix_upper_bound(prefix)
        selected = lower if upper is None else and_(lower, self.compare(term, Op.LT, upper))
        return not_(selected) if node.args.get("negate") else selected

    def _opaque(self, node: exp.Expression) -> Predicate:
        """Boolean SQL pruning cannot use; its columns must still exist (strict) and it must be read-only."""
        if node.find(exp.Select, exp.Subquery) is not None:
            raise FilterError(f"subqueries are not supported in filters: {render(node)}")
        from airflow_partitions.transforms import arrow_support  # lazy: loads pyarrow

        columns = [self._column(column) for column in node.find_all(exp.Column)]
        referenced = [column.name for column in columns]
        strings = [c.name for c in columns if arrow_support.is_string(arrow_support.normalize_type(c.type))]
        text = render(node)
        return Opaque(
            text,
            tuple(dict.fromkeys(referenced)),
            duckdb_sql(node, self.schema),
            tuple(dict.fromkeys(strings)),
        )

    def _comparison(self, node: exp.Expression, op: Op) -> Predicate:
        left, right = node.this, node.expression
        left_term = self._term(left)
        if left_term is not None and _is_constant(right):
            return self.compare(left_term, op, self._constant(right))
        right_term = self._term(right)
        if right_term is not None and _is_constant(left):
            return self.compare(right_term, op.flip(), self._constant(left))
        return self._opaque(node)

    def _null_safe(self, node: exp.Expression) -> Predicate:
        # `x IS NOT DISTINCT FROM v` is `x = v` with NULL -> FALSE; `IS DISTINCT FROM` its negation.
        equal = isinstance(node, exp.NullSafeEQ)
        pair = (node.this, node.expression)
        for term_node, value_node in (pair, pair[::-1]):
            term = self._term(term_node)
            if term is not None and _is_constant(value_node):
                value = self._constant(value_node)
                if value is None:
                    return IsNull(term) if equal else not_(IsNull(term))
                same = and_(not_(IsNull(term)), self.compare(term, Op.EQ, value))
                return same if equal else not_(same)
        return self._opaque(node)

    def _between(self, node: exp.Between) -> Predicate:
        term = self._term(node.this)
        low, high = node.args.get("low"), node.args.get("high")
        if (
            term is None
            or low is None
            or high is None
            or not _is_constant(low)
            or not _is_constant(high)
            or node.args.get("symmetric")
        ):
            return self._opaque(node)
        return and_(
            self.compare(term, Op.GE, self._constant(low)),
            self.compare(term, Op.LE, self._constant(high)),
        )

    def _in(self, node: exp.In) -> Predicate:
        if node.args.get("query") is not None or node.args.get("unnest") is not None:
            if self.lenient:
                return Opaque(render(node))
            raise FilterError(f"IN (subquery) is not supported in filters: {render(node)}")
        term = self._term(node.this)
        values = node.expressions
        if term is None or not all(_is_constant(v) for v in values):
            return self._opaque(node)
        return self.in_list(term, [self._constant(v) for v in values])

    # --- building leaves from Python values --------------------------------------------------------

    def compare(self, term: Term, op: Op, value: Any) -> Predicate:
        """`term op value` with `value` coerced to the term's type (NULL makes the comparison NULL)."""
        if value is None:
            return AlwaysNull()
        if _is_nan(value) and pa.types.is_floating(term.type):
            # NaN orders above every number in DuckDB but not in Python or Arrow: prune nothing.
            return Opaque(f"{term.sql()} {'<>' if op is Op.NE else op.value} {_nan_sql()}", (term.column,))
        coerced = coerce_literal(value, term.type, column=str(term))
        if isinstance(coerced, Between):
            return _between_comparison(term, op, coerced)
        return Comparison(term, op, coerced)

    def in_list(self, term: Term, values: Iterable[Any]) -> Predicate:
        """`term IN (values)`; a NULL among the values makes non-matching rows NULL instead of FALSE."""
        # A dict keeps the first spelling of each value in order: membership in a list made big IN lists
        # quadratic (20,000 values took seconds).
        kept: dict[Any, None] = {}
        has_null = False
        for value in values:
            if value is None:
                has_null = True
                continue
            if _is_nan(value) and pa.types.is_floating(term.type):
                return Opaque(
                    f"{term.sql()} IN ({', '.join(_nan_sql() if _is_nan(v) else repr(v) for v in values)})",
                    (term.column,),
                )
            coerced = coerce_literal(value, term.type, column=str(term))
            if not isinstance(coerced, Between):
                kept.setdefault(coerced)
        leaf = InList(term, tuple(kept))
        return or_(leaf, AlwaysNull()) if has_null else leaf

    # --- terms and constants ----------------------------------------------------------------------

    def _term(self, node: exp.Expression) -> Term | None:
        """A column or a partition expression over one column; None for anything else."""
        while isinstance(node, exp.Paren):
            node = node.this
        if isinstance(node, exp.Column):
            return self._column(node)
        if node.find(exp.Select, exp.Subquery) is not None:
            return None
        columns = list(node.find_all(exp.Column))
        if len({(found.table, found.name) for found in columns}) != 1:
            return None
        column = self._column(columns[0])
        rewritten = node.copy()
        for found in list(rewritten.find_all(exp.Column)):
            found.replace(exp.column(exp.to_identifier(column.name, quoted=True)))
        transform = _transform_of(rewritten)
        if transform is None:
            return None
        try:
            bound = transform.bind(column.type)
        except PartitionExpressionError as err:
            if transform.name == "expression":
                # Not a partition expression (`amount * 1.5`, a double): DuckDB evaluates it as written.
                return None
            raise FilterError(f"{render(node)} cannot apply to column {column.name!r}: {err}") from err
        return TransformRef(bound, column)

    def term_from_text(self, text: str) -> Term:
        """A term named in a DNF tuple: a column name, or a partition expression such as `bucket(8, id)`."""
        if text in self._names or text.lower() in self._by_lower:
            return self.resolve(text)
        from airflow_partitions.transforms.parser import describe_sql_error  # lazy: sqlglot

        try:
            statements = sqlglot.parse(f"SELECT {text}", read=DIALECT)
        except (errors.ParseError, errors.TokenError) as err:
            reason = describe_sql_error(err, prefix="SELECT ")
            raise FilterError(f"syntax error in filter term {text!r}: {reason}") from err
        if (
            len(statements) != 1
            or not isinstance(statements[0], exp.Select)
            or len(statements[0].expressions) != 1
        ):
            raise FilterError(f"filter term {text!r} must be a column name or one partition expression")
        term = self._term(statements[0].expressions[0])
        if term is None:
            raise FilterError(
                f"filter term {text!r} is neither a column of the dataset nor a partition expression "
                "(bucket, truncate, date_part, date_trunc, %)"
            )
        return term

    def _constant(self, node: exp.Expression) -> Any:
        while isinstance(node, exp.Paren):
            node = node.this
        if isinstance(node, exp.Null):
            return None
        if isinstance(node, exp.Boolean):
            return bool(node.this)
        if isinstance(node, exp.Literal):
            return _literal_value(node)
        if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
            return -_literal_value(node.this)
        if isinstance(node, exp.HexString):
            return bytes.fromhex(node.this if len(node.this) % 2 == 0 else "0" + node.this)
        if self.lenient and any(not isinstance(n, _deterministic_constant_nodes()) for n in node.walk()):
            raise FilterError(f"{render(node)} is not a deterministic constant")
        return evaluate_constant(render(node))

    # --- DNF ------------------------------------------------------------------------------------

    def bind_dnf(self, filters: Sequence[Any]) -> Predicate:
        """`[[(col, op, value), ...], ...]` (OR of ANDs) or `[(col, op, value), ...]` (one AND)."""
        if not filters:
            return AlwaysTrue()
        if all(_is_dnf_tuple(item) for item in filters):
            groups: Sequence[Any] = [filters]
        elif all(isinstance(group, list | tuple) and not _is_dnf_tuple(group) for group in filters):
            groups = filters
        else:
            raise FilterError(
                f"malformed DNF filter {filters!r}: use [(col, op, value), ...] for AND or "
                "[[(col, op, value), ...], [...]] for OR of ANDs"
            )
        disjuncts = []
        for group in groups:
            if not group or not all(_is_dnf_tuple(item) for item in group):
                raise FilterError(
                    f"malformed DNF group {group!r}: expected a non-empty list of (col, op, value)"
                )
            disjuncts.append(and_(*(self._dnf_leaf(*item) for item in group)))
        return or_(*disjuncts)

    def _dnf_leaf(self, name: str, op_text: str, value: Any) -> Predicate:
        term = self.term_from_text(name)
        op_key = op_text.strip().lower() if isinstance(op_text, str) else op_text
        if op_key in ("in", "not in"):
            if isinstance(value, str | bytes) or not isinstance(value, Iterable):
                raise FilterError(f"operator {op_text!r} on {name!r} needs a list of values, got {value!r}")
            leaf = self.in_list(term, list(value))
            return not_(leaf) if op_key == "not in" else leaf
        if op_key in ("is", "is not"):
            if value is not None:
                raise FilterError(f"operator {op_text!r} on {name!r} only takes None (IS NULL / IS NOT NULL)")
            leaf = IsNull(term)
            return not_(leaf) if op_key == "is not" else leaf
        op = OPERATORS_BY_TEXT.get(op_key) if isinstance(op_key, str) else None
        if op is None:
            raise FilterError(
                f"unknown operator {op_text!r} on {name!r}; use one of =, ==, !=, <>, <, <=, >, >=, in, "
                "not in, is, is not"
            )
        if value is None:
            raise FilterError(f"({name!r}, {op_text!r}, None) compares with NULL; use ({name!r}, 'is', None)")
        return self.compare(term, op, value)


@functools.cache
def _comparison_nodes() -> dict[type[exp.Expression], Op]:
    return {exp.EQ: Op.EQ, exp.NEQ: Op.NE, exp.LT: Op.LT, exp.LTE: Op.LE, exp.GT: Op.GT, exp.GTE: Op.GE}


def _between_comparison(term: Term, op: Op, between: Between) -> Predicate:
    """`term op v` for a `v` strictly between two representable values, rewritten exactly."""
    never = InList(term, ())
    if op is Op.EQ:
        return never
    if op is Op.NE:
        return not_(never)
    if op in (Op.LT, Op.LE):
        return never if between.below is None else Comparison(term, Op.LE, between.below)
    return never if between.above is None else Comparison(term, Op.GE, between.above)


def _is_dnf_tuple(item: Any) -> bool:
    return (
        isinstance(item, tuple | list)
        and len(item) == 3
        and isinstance(item[0], str)
        and isinstance(item[1], str)
    )


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and value != value


def _nan_sql() -> str:
    return "CAST('NaN' AS DOUBLE)"


def _is_constant(node: exp.Expression | None) -> bool:
    if node is None:
        return False
    if isinstance(node, exp.Literal | exp.Null | exp.Boolean) or (
        isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal)
    ):
        return True  # the common cases, without walking (IN lists of 100,000 values)
    return node.find(exp.Column, exp.Select, exp.Subquery, exp.Star, exp.Placeholder, exp.Parameter) is None


def _literal_value(node: exp.Literal) -> Any:
    text = node.this
    if node.is_string:
        return text
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return Decimal(text)
    except ArithmeticError as err:
        raise FilterError(f"invalid number {text!r} in filter") from err


_CONSTANTS_LOCK = threading.Lock()
_constants_connection: Any = None


def _constants() -> Any:
    """One sandboxed in-memory DuckDB for constant folding: UTC, no file or environment access."""
    global _constants_connection
    if _constants_connection is None:
        import duckdb

        connection = duckdb.connect()
        connection.execute("SET TimeZone = 'UTC'")
        connection.execute(f"SET memory_limit = '{CONSTANT_MEMORY_BYTES}B'")
        connection.execute("SET temp_directory = ''")
        connection.execute("SET enable_external_access = false")
        connection.execute("SET lock_configuration = true")
        _constants_connection = connection
    return _constants_connection


def evaluate_constant(sql: str) -> Any:
    """Evaluate a column-free SQL expression with DuckDB (so casts and intervals mean what DuckDB says)."""
    import duckdb

    hint = "compute the value beforehand and compare the column with it"
    with _CONSTANTS_LOCK, budget(CONSTANT_SECONDS, CONSTANT_MEMORY_BYTES, hint):
        connection = _constants()
        try:
            table = run_bounded(
                connection,
                lambda: connection.sql(f"SELECT ({sql}) AS value").to_arrow_table(),
                memory=f"{CONSTANT_MEMORY_BYTES // 1024**2}MiB",
            )
        except duckdb.Error as err:
            raise FilterError(f"cannot evaluate {sql!r} in filter: {_first_line(err)}") from err
    column = table.column(0)
    kind = column.type
    if pa.types.is_interval(kind) or pa.types.is_duration(kind) or pa.types.is_nested(kind):
        raise FilterError(f"{sql!r} evaluates to {kind}, which cannot be compared with a column")
    value = column[0].as_py()
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        value = value.astimezone(dt.UTC)
    return value


def _transform_of(node: exp.Expression) -> Transform | None:
    from airflow_partitions.transforms.parser import transform_from_node  # lazy: sqlglot

    try:
        return transform_from_node(node)
    except PartitionExpressionError:
        return None


@deep_stack
def bind_filter(where: FilterInput, schema: pa.Schema) -> Predicate:
    """Strictly bind `where` (SQL string, DNF list, predicate or None) to `schema`."""
    return FilterBinder(schema).bind(where)
