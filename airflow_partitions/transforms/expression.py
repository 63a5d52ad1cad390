"""Custom partition expressions: any scalar SQL expression over one column, with one definition.

`lower(region)`, `substr(code, 1, 2)`, `CASE WHEN amount > 1000 THEN 'big' ELSE 'small' END`,
`CAST(floor(amount / 100) AS BIGINT)`: a partition value is what DuckDB (session time zone UTC)
computes for the expression. Engines disagree on exactly the cases a partition key must not get wrong
(Spark lower-cases 'İ' to 'i̇' and upper-cases 'ß' to 'SS' where DuckDB gives 'i' and 'ẞ'; integer
division, modulo of negatives, substr index 0, rounding half-way, overflow and casts of text differ too),
so every engine evaluates the expression with the same DuckDB SQL rather than a translation that could
route a row elsewhere:

* Arrow (`apply`): the column is handed to an in-process DuckDB connection as an Arrow table (zero copy)
  and the expression runs vectorised over it; `apply_scalar` is the same over one value. Comparisons,
  boolean logic, CASE over literals, code point prefixes and `lower` / `upper` run as Arrow compute
  kernels instead (`arrow_native`; case mapping with DuckDB's values on every row: `case_mapping`);
* DuckDB reads (`duckdb_functions.duckdb_expression`): the SQL itself, the column substituted;
* Spark (`transforms.spark`): the same shared subset as native columns (`lower` / `upper` as Spark's own
  on pure ASCII rows and a `translate` with DuckDB's table on the others), the rest an Arrow UDF over
  Spark's Arrow batches calling `apply` (local, Connect and cluster alike, the workers need the package
  and DuckDB);
* Postgres discovery (`sources.pg_sql.partition_sql`): not translated, so the source groups by the raw
  column and `apply` computes the partition values.

The function set is an allow-list (`SUPPORTED_EXPRESSION_FUNCTIONS`): string, numeric, conditional,
comparison and boolean operators and the calendar functions. Everything else is refused when the spec
loads, non-deterministic functions (`random()`, `now()`, `uuid()`, ...) with that reason.

A built-in transform may wrap an expression (`bucket(16, lower(email))`,
`date_trunc('month', ts + INTERVAL 9 HOUR)`): the expression runs first, then the built-in transform on
its values, with the built-in's own semantics.

Unlike the built-in transforms, an expression may map NULL to a value (`coalesce(region, 'none')`, a
CASE band) or a value to NULL (`nullif(code, '')`); `null_preserving` says which, and pruning only
equates "NULL partition" with "NULL column" when it holds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Self

from sqlglot import exp

from airflow_partitions.exceptions import PartitionExpressionError, PartitionValueError
from airflow_partitions.transforms.arrow_native import evaluate
from airflow_partitions.transforms.base import DIALECT, Transform, canonical_identifier
from airflow_partitions.transforms.duckdb_eval import evaluate_sql, expression_result_type

if TYPE_CHECKING:
    import pyarrow as pa

# The column a wrapping built-in transform is defined over, replaced by the expression in its canonical.
COMPOSED_INPUT = "ap_expression_input"

# sqlglot nodes an expression may contain; calls are checked by class, so a function DuckDB knows but
# this list does not (say `md5`, `strftime`) is refused rather than trusted blindly.
_STRUCTURE: tuple[type[exp.Expr], ...] = (
    exp.Column,
    exp.Identifier,
    exp.Literal,
    exp.Null,
    exp.Boolean,
    exp.Paren,
    exp.DataType,
    exp.DataTypeParam,
    exp.Var,
    exp.Interval,
)

# The calendar functions that take one date or timestamp and name a unit (`year(ts)` = date_part('year', ts)):
# the one map the parser, this module and the Postgres forms share.
UNIT_FUNCTIONS: dict[type[exp.Expr], str] = {
    exp.Year: "year",
    exp.Quarter: "quarter",
    exp.Month: "month",
    exp.Week: "week",
    exp.WeekOfYear: "week",
    exp.Day: "day",
    exp.DayOfMonth: "day",
    exp.Hour: "hour",
    exp.Minute: "minute",
}
_FUNCTIONS: dict[type[exp.Expr], str] = {
    exp.Lower: "lower",
    exp.Upper: "upper",
    exp.Substring: "substr / substring",
    exp.Left: "left",
    exp.Right: "right",
    exp.Trim: "trim / ltrim / rtrim",
    exp.Length: "length",
    exp.Replace: "replace",
    exp.SplitPart: "split_part",
    exp.Concat: "concat",
    exp.DPipe: "||",
    exp.RegexpExtract: "regexp_extract",
    exp.StartsWith: "starts_with",
    exp.Like: "LIKE",
    exp.Add: "+",
    exp.Sub: "-",
    exp.Mul: "*",
    exp.Div: "/",
    exp.IntDiv: "//",
    exp.Mod: "%",
    exp.Neg: "unary -",
    exp.Abs: "abs",
    exp.Floor: "floor",
    exp.Ceil: "ceil",
    exp.Round: "round",
    exp.Cast: "CAST / ::",
    exp.TryCast: "TRY_CAST",
    exp.Case: "CASE",
    exp.If: "CASE WHEN / if",
    exp.Coalesce: "coalesce",
    exp.Nullif: "nullif",
    exp.Greatest: "greatest",
    exp.Least: "least",
    exp.EQ: "=",
    exp.NEQ: "<>",
    exp.GT: ">",
    exp.GTE: ">=",
    exp.LT: "<",
    exp.LTE: "<=",
    exp.And: "AND",
    exp.Or: "OR",
    exp.Not: "NOT",
    exp.Is: "IS NULL",
    exp.In: "IN",
    exp.Between: "BETWEEN",
    exp.Extract: "extract",
    exp.DateTrunc: "date_trunc",
    exp.TimestampTrunc: "date_trunc",
    **UNIT_FUNCTIONS,
}
_NAMED_FUNCTIONS = frozenset({"date_part", "datepart"})
SUPPORTED_EXPRESSION_FUNCTIONS = tuple(dict.fromkeys([*_FUNCTIONS.values(), "date_part"]))
# Functions whose value changes between calls or sessions: a row would move between refreshes.
_NON_DETERMINISTIC: tuple[type[exp.Expr], ...] = (
    exp.Rand,
    exp.Uuid,
    exp.CurrentDate,
    exp.CurrentTimestamp,
    exp.CurrentTime,
    exp.CurrentUser,
)
_NON_DETERMINISTIC_NAMES = frozenset(
    {
        "now",
        "random",
        "rand",
        "uuid",
        "gen_random_uuid",
        "nextval",
        "currval",
        "current_timestamp",
        "current_date",
        "current_time",
        "get_current_timestamp",
        "transaction_timestamp",
        "current_localtimestamp",
        "setseed",
    }
)
# Nodes that may map NULL to a value or a value to NULL.
_NULL_CHANGING: tuple[type[exp.Expr], ...] = (
    exp.Null,
    exp.In,
    exp.Case,
    exp.If,
    exp.Coalesce,
    exp.Nullif,
    exp.Is,
    exp.TryCast,
    exp.Or,
    exp.And,
    exp.Greatest,
    exp.Least,
    exp.Concat,
    exp.RegexpExtract,
    exp.Div,
    exp.IntDiv,
    exp.Mod,
)
_NUMERIC_KINDS = frozenset({"int", "uint", "decimal", "float"})
_ORDERED_CAST_TARGETS = frozenset(
    {
        exp.DataType.Type.TINYINT,
        exp.DataType.Type.SMALLINT,
        exp.DataType.Type.INT,
        exp.DataType.Type.BIGINT,
        exp.DataType.Type.INT128,
        exp.DataType.Type.DOUBLE,
        exp.DataType.Type.FLOAT,
        exp.DataType.Type.DECIMAL,
        exp.DataType.Type.DATE,
        exp.DataType.Type.TIMESTAMP,
        exp.DataType.Type.TIMESTAMPTZ,
    }
)


def reject_non_deterministic(text: str, tree: exp.Expr) -> None:
    """Refuse `random()`, `now()`, `uuid()` and the like: their value is not a function of the row."""
    for node in tree.walk():
        if isinstance(node, _NON_DETERMINISTIC) or (
            isinstance(node, exp.Anonymous) and str(node.name).lower() in _NON_DETERMINISTIC_NAMES
        ):
            raise PartitionExpressionError(
                f"partition expression {text!r} calls {node.sql(dialect=DIALECT)}, which is not "
                "deterministic: a row would move between partitions from one refresh to the next; "
                "partition by a function of the column's value only"
            )


def check_expression(text: str, tree: exp.Expr) -> None:
    """Refuse what an expression may not contain, naming the node and the fix."""
    reject_non_deterministic(text, tree)
    for node in tree.walk():
        if isinstance(node, _STRUCTURE) or type(node) in _FUNCTIONS:
            continue
        if isinstance(node, exp.Anonymous) and str(node.name).lower() in _NAMED_FUNCTIONS:
            continue
        shown = f"{node.name}()" if isinstance(node, exp.Anonymous) else node.sql(dialect=DIALECT)
        raise PartitionExpressionError(
            f"partition expression {text!r} uses {shown}, which is not in the partition expression "
            f"function set; use one of: {', '.join(SUPPORTED_EXPRESSION_FUNCTIONS)} "
            "(or a built-in transform: bucket, truncate, date_part, date_trunc, %)"
        )


def canonical_tree(tree: exp.Expr) -> exp.Expr:
    """A copy of `tree` with every column written as its canonical identifier."""
    copy = tree.copy()
    for column in list(copy.find_all(exp.Column)):
        column.replace(exp.column(_identifier(canonical_identifier(str(column.name)))))
    return copy


def _identifier(text: str) -> exp.Identifier:
    quoted = text.startswith('"')
    return exp.to_identifier(text[1:-1].replace('""', '"') if quoted else text, quoted=quoted)


def expression_sql(tree: exp.Expr) -> str:
    """The canonical SQL of an expression tree: DuckDB syntax, function names in lower case."""
    return tree.sql(dialect=DIALECT, normalize_functions="lower")


class ExpressionTransform(Transform):
    """A scalar SQL expression over one column, evaluated with DuckDB's semantics in every engine.

    `outer`, when set, is a built-in transform over `COMPOSED_INPUT` applied to the expression's values
    (`bucket(16, lower(email))`).
    """

    name: ClassVar[str] = "expression"
    accepts: ClassVar[str] = "columns the expression's functions take (DuckDB decides)"

    def __init__(self, source_column: str, tree: exp.Expr, outer: Transform | None = None) -> None:
        super().__init__(source_column)
        self._tree = canonical_tree(tree)
        self.sql = expression_sql(self._tree)
        self.outer = outer
        self._outer_bound: Transform | None = None
        # Arrow compute kernels for the forms whose meaning is DuckDB's (`arrow_native`), once bound.
        self._native: Any = None
        self._encoded: Any = None  # the same values as a dictionary array, for routing (string CASE)

    # --- identity -----------------------------------------------------------------------------------

    def renamed(self, rename: Callable[[str], str]) -> Self:
        # The tree names the column too: both move, and the SQL every engine runs is rebuilt from the
        # tree. The Arrow kernel (`_native`) and a wrapping built-in (`outer`) read values, not names.
        moved = super().renamed(rename)
        tree = self._tree.copy()
        for column in list(tree.find_all(exp.Column)):
            column.replace(exp.column(_identifier(canonical_identifier(rename(str(column.name))))))
        moved._tree = tree
        moved.sql = expression_sql(tree)
        return moved

    @property
    def canonical(self) -> str:
        if self.outer is None:
            return self.sql
        inner = f"({self.sql})" if self.outer.name == "mod" else self.sql
        return self.outer.canonical.replace(COMPOSED_INPUT, inner)

    @property
    def tree(self) -> exp.Expr:
        return self._tree.copy()

    # --- what pruning needs -------------------------------------------------------------------------

    @property
    def null_preserving(self) -> bool:
        return not any(isinstance(node, _NULL_CHANGING) for node in self._tree.walk())

    @property
    def has_preimage(self) -> bool:
        return False

    @property
    def monotonic(self) -> bool:
        if self._info is None:
            return False
        if self.outer is not None and not self.outer.monotonic:
            return False
        return _non_decreasing(self._tree, self._info.kind)

    def wrapping(self, inner: Transform) -> Transform | None:
        if (
            self._outer_bound is None
            or not isinstance(inner, ExpressionTransform)
            or inner.outer is not None
            or inner.source_column != self.source_column
            or inner.sql != self.sql
            or not inner.is_bound
            or not inner.result_type.equals(self._outer_bound.source_type)
        ):
            return None
        return self._outer_bound

    def project(self, op: Any, value: Any) -> Any:
        if self.monotonic:
            return self._project_in_order(op, value)
        return super().project(op, value)

    def project_range(
        self,
        lower: Any,
        upper: Any,
        lower_inclusive: bool,
        upper_inclusive: bool,
        *,
        column_type: pa.DataType,
        max_candidates: int,
    ) -> Any:
        if self.monotonic:
            return self._project_range_in_order(lower, upper, lower_inclusive, upper_inclusive)
        return super().project_range(
            lower,
            upper,
            lower_inclusive,
            upper_inclusive,
            column_type=column_type,
            max_candidates=max_candidates,
        )

    # --- types --------------------------------------------------------------------------------------

    def _result_type(self, source_type: pa.DataType) -> pa.DataType | None:
        inner = expression_result_type(self.sql, self.source_column, source_type, self.canonical)
        if self.outer is None:
            return inner
        return self.outer.bind(inner).result_type

    def result_type_for(self, source_type: pa.DataType) -> pa.DataType:
        from airflow_partitions.transforms import arrow_support  # lazy: loads pyarrow

        result = self._result_type(arrow_support.normalize_type(source_type))
        assert result is not None
        if not arrow_support.is_partition_value_type(result):
            raise PartitionExpressionError(
                f"partition expression {self.canonical!r}: over column {self.source_column!r} "
                f"({source_type}) it gives {result} values, but partition values must be string, integer, "
                "boolean, date or timestamp; cast the result, e.g. CAST(floor(amount / 100) AS BIGINT)"
            )
        return result

    def bind(self, source_type: pa.DataType) -> ExpressionTransform:
        from airflow_partitions.transforms import arrow_native, arrow_support  # lazy: loads pyarrow

        bound = super().bind(source_type)
        bound._native = arrow_native.native_kernel(self._tree, arrow_support.normalize_type(source_type))
        bound._encoded = arrow_native.encoded_kernel(self._tree, arrow_support.normalize_type(source_type))
        if self.outer is not None:
            inner = expression_result_type(self.sql, self.source_column, source_type, self.canonical)
            bound._outer_bound = self.outer.bind(inner)
        return bound

    def inner_result_type(self) -> pa.DataType:
        """The type of the expression's own values (before a wrapping built-in transform)."""
        source_type = self._require_bound("the type of the expression")
        return expression_result_type(self.sql, self.source_column, source_type, self.canonical)

    @property
    def outer_bound(self) -> Transform | None:
        """The wrapping built-in transform bound to the expression's type (None when there is none)."""
        return self._outer_bound

    # --- evaluation ---------------------------------------------------------------------------------

    def apply(self, values: Any) -> Any:
        import pyarrow as pa

        from airflow_partitions.transforms import arrow_support  # lazy: loads pyarrow

        arrow = arrow_support.as_arrow(values)
        chunked = isinstance(arrow, pa.ChunkedArray)
        array = self._source_array(arrow)
        inner_type = self.inner_result_type()
        result = None
        if self._native is not None:
            result = evaluate(self._native, array)
        if result is None:
            result = evaluate_sql(self.sql, self.source_column, array, inner_type, self.canonical)
        elif not result.type.equals(inner_type):
            result = result.cast(inner_type)
        if self._outer_bound is not None:
            result = self._outer_bound.apply(result)
        if not result.type.equals(self.result_type):
            result = result.cast(self.result_type)
        return pa.chunked_array([result], type=result.type) if chunked else result

    def _source_array(self, arrow: Any) -> pa.Array:
        """One plain array of the bound source type (chunks combined, a dictionary decoded)."""
        import pyarrow as pa

        source_type = self._require_bound("evaluating the expression")
        # One chunk (a column read whole, a Spark batch) needs no copy.
        chunked = isinstance(arrow, pa.ChunkedArray)
        array = (arrow.chunk(0) if arrow.num_chunks == 1 else arrow.combine_chunks()) if chunked else arrow
        if pa.types.is_dictionary(array.type):
            array = array.dictionary_decode()
        if not array.type.equals(source_type):
            array = _to_source_type(array, source_type, self.canonical)
        return array

    def routing_values(self, table: Any) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc

        from airflow_partitions.transforms import arrow_support  # lazy: loads pyarrow

        array = self._source_array(arrow_support.as_arrow(table.column(self.source_column)))
        # A CASE over string literals: its values as indices into the literals
        # (`arrow_native.encoded_kernel`), which routing groups without building a string per row.
        if self._encoded is not None and self._outer_bound is None:
            encoded = evaluate(self._encoded, array)
            if encoded is not None and encoded.type.value_type.equals(self.result_type):
                return encoded
        # Strings that repeat (a sample of at most half distinct values): the expression over each
        # distinct value (NULL included) once, spread to the rows by index. The value of a row depends
        # only on its own value (one column, deterministic), so these are `apply`'s values.
        if arrow_support.is_string(array.type) and len(array) >= _DISTINCT_SAMPLE:
            step = len(array) // _DISTINCT_SAMPLE
            sample = array.take(pa.array(range(0, step * _DISTINCT_SAMPLE, step), pa.int64()))
            if pc.count_distinct(sample, mode="all").as_py() * 2 <= len(sample):
                distinct = pc.dictionary_encode(array, null_encoding="encode")
                return pa.DictionaryArray.from_arrays(distinct.indices, self.apply(distinct.dictionary))
        return super().routing_values(table)

    def apply_scalar(self, value: Any) -> Any:
        import pyarrow as pa

        source_type = self._require_bound("evaluating the expression on a value")
        if value is not None:
            value = self._coerce_scalar(value)
        try:
            array = pa.array([value], type=source_type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as err:
            raise self._scalar_error(value, f"a value of type {source_type}") from err
        return self.apply(array)[0].as_py()

    def _apply_array(self, values: pa.Array) -> pa.Array:
        result: pa.Array = self.apply(values)
        return result

    def _apply_scalar(self, value: Any) -> Any:
        return self.apply_scalar(value)

    def _spark_form(self, column: Any, source: pa.DataType) -> Any:
        from airflow_partitions.transforms import spark  # lazy: loads pyspark

        def type_of(part: exp.Expr) -> tuple[str, pa.DataType]:
            text = expression_sql(part)
            return text, expression_result_type(text, self.source_column, source, text)

        return spark.expression_column(
            column,
            source,
            result_type=self.result_type,
            native_tree=self.tree if self.outer_bound is None else None,
            type_of=type_of,
            apply=self.apply,
        )


_DISTINCT_SAMPLE = 4096  # rows sampled to decide whether routing evaluates distinct strings only


def _to_source_type(array: pa.Array, source_type: pa.DataType, text: str) -> pa.Array:
    """Spark hands uint8/16/32 widened and uint64 as DECIMAL(20,0): back to the bound type, exactly."""
    import pyarrow as pa

    try:
        return array.cast(source_type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
        raise PartitionValueError(
            f"partition expression {text!r}: values of type {array.type} do not fit the column type "
            f"{source_type}: {err}"
        ) from err


# --- monotonicity -------------------------------------------------------------------------------------


def _constant(node: exp.Expr) -> bool:
    return node.find(exp.Column) is None


def _positive_number(node: exp.Expr) -> bool:
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            return float(node.this) > 0
        except ValueError:
            return False
    return False


def _non_decreasing(node: exp.Expr, source_kind: str) -> bool:
    """Whether the expression never decreases as its column increases (structurally, conservatively)."""
    if isinstance(node, exp.Column):
        return True
    if isinstance(node, exp.Paren):
        return _non_decreasing(node.this, source_kind)
    if isinstance(node, exp.Add):
        left, right = node.this, node.expression
        if _constant(right):
            return _non_decreasing(left, source_kind)
        return _constant(left) and _non_decreasing(right, source_kind)
    if isinstance(node, exp.Sub):
        return _constant(node.expression) and _non_decreasing(node.this, source_kind)
    if isinstance(node, exp.Mul):
        left, right = node.this, node.expression
        if _positive_number(right):
            return _non_decreasing(left, source_kind)
        return _positive_number(left) and _non_decreasing(right, source_kind)
    if isinstance(node, exp.Div | exp.IntDiv):
        return _positive_number(node.expression) and _non_decreasing(node.this, source_kind)
    if isinstance(node, exp.Floor | exp.Ceil):
        return not node.args.get("decimals") and _non_decreasing(node.this, source_kind)
    if isinstance(node, exp.Greatest | exp.Least):
        arguments = [node.this, *node.expressions]
        variable = [argument for argument in arguments if not _constant(argument)]
        return len(variable) == 1 and _non_decreasing(variable[0], source_kind)
    if isinstance(node, exp.Cast):
        # Numbers and times keep their order through a numeric or temporal cast; text does not.
        target = node.to.this
        return (
            source_kind in _NUMERIC_KINDS | {"date", "timestamp"}
            and target in _ORDERED_CAST_TARGETS
            and _non_decreasing(node.this, source_kind)
        )
    if isinstance(node, exp.DateTrunc | exp.TimestampTrunc):
        return _non_decreasing(node.this, source_kind)
    if isinstance(node, exp.Year):
        return _non_decreasing(node.this, source_kind)
    if isinstance(node, exp.Left):
        # A prefix of a fixed number of code points keeps the (code point) order of strings.
        return source_kind == "string" and _non_decreasing(node.this, source_kind)
    if isinstance(node, exp.Substring):
        start, length = node.args.get("start"), node.args.get("length")
        return (
            source_kind == "string"
            and isinstance(start, exp.Literal)
            and start.this == "1"
            and length is not None
            and _positive_number(length)
            and _non_decreasing(node.this, source_kind)
        )
    return False
