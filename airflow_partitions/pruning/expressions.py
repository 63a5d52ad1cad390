"""The typed predicate tree filters are bound to: terms, literals, boolean nodes, and their DuckDB SQL.

A predicate is built once per filter (from SQL or a DNF list, see `filters.py`), bound to the dataset's
Arrow schema: every column is known, every literal already has the Python type of its term. The tree is
small and immutable, in the style of pyiceberg's expressions:

* terms: `ColumnRef` (a column) and `TransformRef` (a partition expression over a column, such as
  `bucket(50, user_id)`);
* leaves: `Comparison`, `InList`, `IsNull`, `Range` (a merged `lower <op> term <op> upper`), and `Opaque`
  (any other boolean SQL, which pruning cannot reason about but the residual filter still applies);
* boolean nodes: `And`, `Or`, `Not`, and the constants `AlwaysTrue`, `AlwaysFalse`, `AlwaysNull`.

Semantics are SQL's three-valued logic, exactly: a leaf over a NULL term is NULL (except `IsNull`), `NOT
NULL` is NULL, and a row is selected only where the predicate is TRUE. `sql()` renders each node as DuckDB
SQL with the same meaning; that rendering is what the reader applies as the residual filter.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from airflow_partitions.quoting import quote_identifier
from airflow_partitions.transforms.base import renamed_transform
from airflow_partitions.transforms.duckdb_functions import duckdb_expression
from airflow_partitions.transforms.projection import Op

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.transforms import Transform


OPERATORS_BY_TEXT: dict[str, Op] = {
    "=": Op.EQ,
    "==": Op.EQ,
    "!=": Op.NE,
    "<>": Op.NE,
    "<": Op.LT,
    "<=": Op.LE,
    ">": Op.GT,
    ">=": Op.GE,
}


# --- SQL rendering of names and values ------------------------------------------------------------


def quote_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def sql_literal(value: Any) -> str:
    """DuckDB SQL for a typed Python literal; the value round-trips exactly (no float or decimal drift)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "CAST('NaN' AS DOUBLE)"
        if math.isinf(value):
            return "CAST('Infinity' AS DOUBLE)" if value > 0 else "CAST('-Infinity' AS DOUBLE)"
        return f"CAST({quote_string(repr(value))} AS DOUBLE)"
    if isinstance(value, Decimal):
        _sign, digits, exponent = value.as_tuple()
        scale = max(0, -int(exponent))
        precision = max(len(digits), scale + 1)
        if precision > 38:
            return f"CAST({quote_string(str(value))} AS DOUBLE)"
        return f"CAST({quote_string(format(value, 'f'))} AS DECIMAL({precision}, {scale}))"
    if isinstance(value, str):
        return quote_string(value)
    if isinstance(value, bytes):
        return f"from_hex({quote_string(value.hex())})"
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            utc = value.astimezone(dt.UTC).replace(tzinfo=None)
            return f"TIMESTAMPTZ {quote_string(utc.isoformat(sep=' ', timespec='microseconds') + '+00')}"
        return f"TIMESTAMP {quote_string(value.isoformat(sep=' ', timespec='microseconds'))}"
    if isinstance(value, dt.date):
        return f"DATE {quote_string(value.isoformat())}"
    raise TypeError(f"no SQL literal for {type(value).__name__} {value!r}")


def display_literal(value: Any) -> str:
    """A short human form of a literal for explanations (`'EU'`, `42`, `2026-01-01`)."""
    if isinstance(value, str):
        return quote_string(value)
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, bytes):
        return f"x'{value.hex()}'"
    if value is None:
        return "NULL"
    return str(value)


# --- terms ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ColumnRef:
    """A column of the dataset, with its Arrow type."""

    name: str
    type: pa.DataType

    @property
    def column(self) -> str:
        return self.name

    @property
    def key(self) -> str:
        """Identity of the term (for grouping leaves on the same term)."""
        return f"col:{self.name}"

    def sql(self) -> str:
        return quote_identifier(self.name)

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class TransformRef:
    """A partition expression over a column, e.g. `bucket(50, user_id)`; `transform` is bound to its type."""

    transform: Transform
    column_ref: ColumnRef

    @property
    def column(self) -> str:
        return self.column_ref.name

    @property
    def type(self) -> pa.DataType:
        return self.transform.result_type

    @property
    def key(self) -> str:
        return f"expr:{self.transform.canonical}"

    def sql(self) -> str:
        return f"({duckdb_expression(self.transform, self.column_ref.sql())})"

    def __str__(self) -> str:
        return str(self.transform.canonical)


Term = ColumnRef | TransformRef


# --- predicates -----------------------------------------------------------------------------------


class Predicate:
    """Base of every predicate node."""

    __slots__ = ()

    def sql(self) -> str:
        raise NotImplementedError

    def children(self) -> tuple[Predicate, ...]:
        return ()

    def columns(self) -> set[str]:
        """Names of every column the predicate reads."""
        found: set[str] = set()
        for node in walk(self):
            found.update(node._own_columns())
        return found

    def _own_columns(self) -> tuple[str, ...]:
        return ()

    def __str__(self) -> str:
        return self.sql()


@dataclass(frozen=True, slots=True)
class AlwaysTrue(Predicate):
    """TRUE for every row (no filter)."""

    def sql(self) -> str:
        return "TRUE"


@dataclass(frozen=True, slots=True)
class AlwaysFalse(Predicate):
    """FALSE for every row."""

    def sql(self) -> str:
        return "FALSE"


@dataclass(frozen=True, slots=True)
class AlwaysNull(Predicate):
    """NULL for every row (e.g. `x = NULL`): never selects a row, and neither does its negation."""

    def sql(self) -> str:
        return "CAST(NULL AS BOOLEAN)"


@dataclass(frozen=True, slots=True)
class And(Predicate):
    """TRUE where every child is TRUE."""

    items: tuple[Predicate, ...]

    def children(self) -> tuple[Predicate, ...]:
        return self.items

    def sql(self) -> str:
        return "(" + " AND ".join(child.sql() for child in self.items) + ")"

    def __str__(self) -> str:
        return " AND ".join(_nested(child) for child in self.items)


@dataclass(frozen=True, slots=True)
class Or(Predicate):
    """TRUE where any child is TRUE."""

    items: tuple[Predicate, ...]

    def children(self) -> tuple[Predicate, ...]:
        return self.items

    def sql(self) -> str:
        return "(" + " OR ".join(child.sql() for child in self.items) + ")"

    def __str__(self) -> str:
        return " OR ".join(_nested(child) for child in self.items)


@dataclass(frozen=True, slots=True)
class Not(Predicate):
    """TRUE where the child is FALSE (NULL stays NULL)."""

    child: Predicate

    def children(self) -> tuple[Predicate, ...]:
        return (self.child,)

    def sql(self) -> str:
        return f"(NOT {self.child.sql()})"

    def __str__(self) -> str:
        if isinstance(self.child, IsNull):
            return f"{self.child.term} IS NOT NULL"
        if isinstance(self.child, InList):
            return f"{self.child.term} NOT IN ({', '.join(display_literal(v) for v in self.child.values)})"
        return f"NOT {_nested(self.child)}"


@dataclass(frozen=True, slots=True)
class Comparison(Predicate):
    """`term op value` with a non-NULL literal typed like the term."""

    term: Term
    op: Op
    value: Any

    def _own_columns(self) -> tuple[str, ...]:
        return (self.term.column,)

    def sql(self) -> str:
        op = "<>" if self.op is Op.NE else self.op.value
        return f"({self.term.sql()} {op} {sql_literal(self.value)})"

    def __str__(self) -> str:
        return f"{self.term} {self.op.value} {display_literal(self.value)}"


@dataclass(frozen=True, slots=True)
class InList(Predicate):
    """`term IN (values...)` over non-NULL literals; the empty list is FALSE (NULL for a NULL term)."""

    term: Term
    values: tuple[Any, ...]

    def _own_columns(self) -> tuple[str, ...]:
        return (self.term.column,)

    def sql(self) -> str:
        if not self.values:
            # FALSE for every non-NULL value and NULL for NULL, like any other comparison.
            return f"(CASE WHEN {self.term.sql()} IS NULL THEN NULL ELSE FALSE END)"
        return f"({self.term.sql()} IN ({', '.join(sql_literal(v) for v in self.values)}))"

    def __str__(self) -> str:
        return f"{self.term} IN ({', '.join(display_literal(v) for v in self.values)})"


@dataclass(frozen=True, slots=True)
class IsNull(Predicate):
    """`term IS NULL` (never NULL itself)."""

    term: Term

    def _own_columns(self) -> tuple[str, ...]:
        return (self.term.column,)

    def sql(self) -> str:
        return f"({self.term.sql()} IS NULL)"

    def __str__(self) -> str:
        return f"{self.term} IS NULL"


@dataclass(frozen=True, slots=True)
class Range(Predicate):
    """`lower <(=) term <(=) upper`, either bound optional; the merge of range comparisons on one term."""

    term: Term
    lower: Any
    lower_inclusive: bool
    upper: Any
    upper_inclusive: bool

    def __post_init__(self) -> None:
        if self.lower is None and self.upper is None:
            raise ValueError("a Range needs at least one bound")

    def _own_columns(self) -> tuple[str, ...]:
        return (self.term.column,)

    def bounds(self) -> Iterator[Comparison]:
        if self.lower is not None:
            yield Comparison(self.term, Op.GE if self.lower_inclusive else Op.GT, self.lower)
        if self.upper is not None:
            yield Comparison(self.term, Op.LE if self.upper_inclusive else Op.LT, self.upper)

    def sql(self) -> str:
        return "(" + " AND ".join(c.sql() for c in self.bounds()) + ")"

    def __str__(self) -> str:
        return " AND ".join(str(c) for c in self.bounds())


@dataclass(frozen=True, slots=True)
class Opaque(Predicate):
    """Boolean SQL pruning cannot reason about (LIKE, arbitrary functions): might be TRUE, FALSE or NULL."""

    text: str
    referenced: tuple[str, ...] = ()
    duckdb_text: str | None = None  # `text` with partition transforms rewritten for DuckDB
    strings: tuple[str, ...] = ()  # the referenced columns of string type (Spark reads them as UTF8_BINARY)

    def _own_columns(self) -> tuple[str, ...]:
        return self.referenced

    def sql(self) -> str:
        return f"({self.duckdb_text if self.duckdb_text is not None else self.text})"

    def __str__(self) -> str:
        return self.text


LEAF_TYPES = (Comparison, InList, IsNull, Range, Opaque)


def _nested(predicate: Predicate) -> str:
    text = str(predicate)
    return f"({text})" if isinstance(predicate, And | Or) else text


def walk(predicate: Predicate) -> Iterator[Predicate]:
    """Every node of the tree, parents before children."""
    stack = [predicate]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(node.children()))


def conjuncts(predicate: Predicate) -> tuple[Predicate, ...]:
    """The top-level AND items of a predicate (itself when it is not an AND)."""
    if isinstance(predicate, And):
        return predicate.items
    if isinstance(predicate, AlwaysTrue):
        return ()
    return (predicate,)


def and_(*items: Predicate) -> Predicate:
    """AND of `items`, flattened, with TRUE dropped and FALSE absorbing."""
    flat: list[Predicate] = []
    for item in items:
        if isinstance(item, AlwaysFalse):
            return item
        if isinstance(item, AlwaysTrue):
            continue
        flat.extend(item.items if isinstance(item, And) else (item,))
    if not flat:
        return AlwaysTrue()
    return flat[0] if len(flat) == 1 else And(tuple(flat))


def or_(*items: Predicate) -> Predicate:
    """OR of `items`, flattened, with FALSE dropped and TRUE absorbing."""
    flat: list[Predicate] = []
    for item in items:
        if isinstance(item, AlwaysTrue):
            return item
        if isinstance(item, AlwaysFalse):
            continue
        flat.extend(item.items if isinstance(item, Or) else (item,))
    if not flat:
        return AlwaysFalse()
    return flat[0] if len(flat) == 1 else Or(tuple(flat))


def not_(item: Predicate) -> Predicate:
    """NOT pushed down where three-valued logic allows it exactly (De Morgan, negated comparisons)."""
    if isinstance(item, AlwaysTrue):
        return AlwaysFalse()
    if isinstance(item, AlwaysFalse):
        return AlwaysTrue()
    if isinstance(item, AlwaysNull):
        return item
    if isinstance(item, Not):
        return item.child
    if isinstance(item, And):
        return or_(*(not_(child) for child in item.items))
    if isinstance(item, Or):
        return and_(*(not_(child) for child in item.items))
    if isinstance(item, Comparison):
        return Comparison(item.term, item.op.negate(), item.value)
    if isinstance(item, Range):
        return or_(*(not_(bound) for bound in item.bounds()))
    return Not(item)


def renamed_columns(predicate: Predicate, rename: Callable[[str], str]) -> Predicate:
    """`predicate` reading column `rename(c)` wherever it reads column `c` (types and values kept).

    A dataset whose source renamed a column binds filters to the current names and prunes and reads
    with the stored ones (`spec.renames`)."""
    from dataclasses import fields, replace

    def term(value: Any) -> Any:
        if isinstance(value, ColumnRef):
            return ColumnRef(rename(value.name), value.type)
        if isinstance(value, TransformRef):
            return TransformRef(renamed_transform(value.transform, rename), term(value.column_ref))
        if isinstance(value, Predicate):
            return renamed_columns(value, rename)
        if isinstance(value, tuple) and any(isinstance(item, Predicate) for item in value):
            return tuple(term(item) for item in value)
        return value

    if isinstance(predicate, Opaque):
        return Opaque(
            _renamed_sql(predicate.text, rename),
            tuple(rename(name) for name in predicate.referenced),
            _renamed_sql(predicate.duckdb_text, rename) if predicate.duckdb_text is not None else None,
            tuple(rename(name) for name in predicate.strings),
        )
    if not hasattr(predicate, "__dataclass_fields__"):
        return predicate
    changes = {f.name: term(getattr(predicate, f.name)) for f in fields(predicate)}  # type: ignore[arg-type]
    return replace(predicate, **changes)  # type: ignore[type-var]


def _renamed_sql(text: str, rename: Callable[[str], str]) -> str:
    """SQL `text` with each unqualified column reference `c` made `rename(c)`."""
    import sqlglot
    from sqlglot import exp

    tree = sqlglot.parse_one(text, read="duckdb")
    for column in list(tree.find_all(exp.Column)):
        if not column.table and rename(column.name) != column.name:
            column.set("this", exp.to_identifier(rename(column.name), quoted=True))
    return str(tree.sql(dialect="duckdb"))
