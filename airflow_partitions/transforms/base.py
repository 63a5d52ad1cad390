"""The partition transform model: `Transform`, the source-value `Interval`, and shared scalar helpers.

A transform is one small object per partition expression. Unbound, it knows its canonical string and
which column it reads; bound (`bind(arrow_type)`) it also knows its result type and can validate scalar
inputs against the column type. pyarrow, numpy and pyspark are imported inside methods only: this module
is imported when a DAG file loads a spec.
"""

from __future__ import annotations

import copy
import datetime as dt
import functools
import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, localcontext
from typing import TYPE_CHECKING, Any, ClassVar, Self

from airflow_partitions.exceptions import PartitionExpressionError, PartitionValueError
from airflow_partitions.quoting import quote_identifier
from airflow_partitions.transforms.plain_sql import is_plain_name
from airflow_partitions.transforms.projection import (
    EVALUATION_ERRORS,
    UNKNOWN,
    Op,
    PartitionCondition,
    Projection,
    ValueBound,
    ValueSet,
    all_of,
    any_of,
    arrow_errors,
    enumerate_range,
    range_bounds,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.transforms.arrow_support import SourceInfo

EPOCH_DATE = dt.date(1970, 1, 1)
EPOCH_NAIVE = dt.datetime(1970, 1, 1)
UTC = dt.UTC
# Beyond this many values (an IN list) images are computed as one Arrow array: hashing 100,000 values one
# Python call at a time took seconds.
VECTORISED_IMAGES = 64
# The SQL dialect partition expressions are written and evaluated in.
DIALECT = "duckdb"
_PLAIN_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, slots=True)
class Interval:
    """A range of source values; a `None` bound is unbounded on that side."""

    lower: Any
    upper: Any
    lower_inclusive: bool = True
    upper_inclusive: bool = False

    def contains(self, value: Any) -> bool:
        """Whether `value` lies in the interval (NULL never does)."""
        if value is None:
            return False
        if self.lower is not None and (
            value < self.lower or (value == self.lower and not self.lower_inclusive)
        ):
            return False
        return not (
            self.upper is not None
            and (value > self.upper or (value == self.upper and not self.upper_inclusive))
        )


class Transform(ABC):
    """A partition transform over one source column (see the package docstring for the semantics)."""

    name: ClassVar[str]
    #: Human description of accepted source types, used in error messages.
    accepts: ClassVar[str]

    def __init__(self, source_column: str) -> None:
        self._source_column = source_column
        self._source_type: pa.DataType | None = None
        self._info: SourceInfo | None = None

    # --- identity -----------------------------------------------------------------------------------

    @property
    def source_column(self) -> str:
        """The referenced column, exactly as written (case preserved, quotes removed)."""
        return self._source_column

    @property
    def source_columns(self) -> tuple[str, ...]:
        """Every column the transform reads, in order (one, except `multi_bucket`)."""
        return (self._source_column,)

    @property
    def source_types(self) -> tuple[pa.DataType, ...] | None:
        """The bound Arrow type of each column in `source_columns`, or None when unbound."""
        return None if self._source_type is None else (self._source_type,)

    @property
    def column_sql(self) -> str:
        """The column as it appears in the canonical string (quoted only when it must be)."""
        return canonical_identifier(self._source_column)

    @property
    @abstractmethod
    def canonical(self) -> str:
        """The one canonical expression string; `parse_transform(t.canonical) == t`."""

    def __str__(self) -> str:
        return self.canonical

    def __repr__(self) -> str:
        bound = f" bound to {self._source_type}" if self._source_type is not None else ""
        return f"<{type(self).__name__} {self.canonical}{bound}>"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Transform):
            return NotImplemented
        return self.canonical == other.canonical

    def __hash__(self) -> int:
        return hash(self.canonical)

    # --- what pruning needs -------------------------------------------------------------------------

    @property
    @abstractmethod
    def monotonic(self) -> bool:
        """Whether the partition value never decreases as the source value increases."""

    @property
    def null_preserving(self) -> bool:
        """Whether NULL, and only NULL, maps to NULL (every built-in transform; not `coalesce(c, 'x')`)."""
        return True

    @property
    def has_preimage(self) -> bool:
        """Whether `preimage` gives the source range of each partition value (a source can push it down)."""
        return self.monotonic

    @property
    def one_to_one(self) -> bool:
        """Whether distinct source values always give distinct partition values."""
        return False

    def preimage(self, partition_value: Any) -> Interval | None:
        """The source values that map to `partition_value`, for monotonic transforms; else None.

        The NULL partition holds exactly the rows whose source value is NULL, which no interval can
        express, so `preimage(None)` is None too.
        """
        return None

    @property
    def calendar_field(self) -> str | None:
        """The calendar field whose number this transform gives (date_part's unit); None for the others."""
        return None

    def project(self, op: Op, value: Any) -> Projection:
        """`source op value` projected onto partition values (see `transforms.projection`).

        This default serves transforms that keep no order (bucket, mod): a point lands in the partition
        of its image, and nothing else is known.
        """
        if op is not Op.EQ:
            return UNKNOWN
        images = self._images([value])
        return Projection(None if images is None else ValueSet(images))

    def project_in(self, values: Sequence[Any]) -> Projection:
        """`source IN values` projected onto partition values: the images of the values.

        Only a one-to-one transform also knows where the condition may fail: outside those images.
        """
        images = self._images(values)
        if images is None:
            return UNKNOWN
        return Projection(ValueSet(images), ValueSet(images, negated=True) if self.one_to_one else None)

    def project_rows(self, rows: Sequence[Sequence[Any]]) -> Projection:
        """Rows whose source columns take one of these value tuples, projected onto partition values."""
        return self.project_in([row[0] for row in rows])

    def project_range(
        self,
        lower: Any,
        upper: Any,
        lower_inclusive: bool,
        upper_inclusive: bool,
        *,
        column_type: pa.DataType,
        max_candidates: int,
    ) -> Projection:
        """A range of the source column (`None`: unbounded side) projected onto partition values.

        This default enumerates a bounded range (up to `max_candidates` source values on the grid of
        `column_type`) and keeps the images; order-preserving transforms project each bound instead.
        """
        candidates = enumerate_range(
            column_type,
            lower,
            upper,
            lower_inclusive,
            upper_inclusive,
            timestamp_step_micros=self._timestamp_step_micros(),
            cap=max_candidates,
        )
        if candidates is None:
            return UNKNOWN
        images = self._images_of_array(candidates)
        return Projection(None if images is None else ValueSet(images))

    def values_of(self, other: Transform, partition_values: Any) -> Any:
        """The values of `other` (a transform of the same column) for rows with these partition values.

        Only when the partition values determine them: `other` is this transform, or this one keeps the
        source values (identity); else None. May raise what `apply` raises.
        """
        return partition_values if other == self else None

    def wrapping(self, inner: Transform) -> Transform | None:
        """The built-in transform this one applies to the values of `inner`, when this one is exactly a
        built-in wrapped around `inner` (`bucket(16, lower(email))` around `lower(email)`); else None.

        A condition on `inner` then projects through the returned transform, bound to `inner`'s type.
        """
        return None

    def _timestamp_step_micros(self) -> int:
        """Timestamps in one UTC-aligned step of this many microseconds share a partition value."""
        return 1

    def _images(self, values: Iterable[Any]) -> Sequence[Any] | pa.Array | None:
        """The distinct partition values of `values`, or None when one cannot be evaluated."""
        if not isinstance(values, Sequence):
            values = list(values)
        if len(values) > VECTORISED_IMAGES and self._source_type is not None:
            images = self._images_as_array(values)
            if images is not None:
                return images
        try:
            return list(dict.fromkeys(self.apply_scalar(value) for value in values))
        except EVALUATION_ERRORS:
            return None

    def _images_as_array(self, values: Sequence[Any]) -> pa.Array | None:
        """The distinct images of many values through the Arrow kernel (same values as `apply_scalar`);
        None when Arrow cannot take them, and the scalar path then decides."""
        import pyarrow as pa

        try:
            candidates = pa.array(values, type=self._source_type)
        except (*EVALUATION_ERRORS, *arrow_errors()):
            return None
        return self._images_of_array(candidates)

    def _images_of_array(self, candidates: pa.Array) -> pa.Array | None:
        import pyarrow as pa
        import pyarrow.compute as pc

        if len(candidates) == 0:
            return pa.array([], type=self.result_type)
        try:
            images = self.apply(candidates)
        except (*EVALUATION_ERRORS, *arrow_errors()):
            return None
        return pc.unique(images)

    # The projection of order-preserving transforms, for their `project` / `project_range`.

    def _project_in_order(self, op: Op, value: Any) -> Projection:
        """`c op value` through a monotonic transform: partitions compare with the image of `value`."""
        return Projection(self._ordered_bound(op, value), self._ordered_bound(op.negate(), value))

    def _project_range_in_order(
        self, lower: Any, upper: Any, lower_inclusive: bool, upper_inclusive: bool
    ) -> Projection:
        bounds = range_bounds(lower, upper, lower_inclusive, upper_inclusive)
        return Projection(
            all_of(self._ordered_bound(op, value) for op, value in bounds),
            any_of(self._ordered_bound(op.negate(), value) for op, value in bounds),
        )

    def _ordered_bound(self, op: Op, value: Any) -> PartitionCondition | None:
        """Partition values `p` such that some `c` with `T(c) = p` may satisfy `c op value`."""
        try:
            image = self.apply_scalar(value)
        except EVALUATION_ERRORS:
            return None
        if op is Op.NE:
            return ValueBound(Op.NE, image) if self.one_to_one else None
        if op in (Op.EQ, Op.LE, Op.GE):
            return ValueBound(op, image)
        # The partition holding `value` itself also qualifies if its preimage reaches past `value`.
        try:
            interval = self.preimage(image)
        except EVALUATION_ERRORS:
            interval = None
        if op is Op.LT:
            reaches = interval is None or interval.lower is None or _safe_less(interval.lower, value)
            return ValueBound(Op.LE if reaches else Op.LT, image)
        reaches = interval is None or interval.upper is None or _safe_less(value, interval.upper)
        return ValueBound(Op.GE if reaches else Op.GT, image)

    # --- types --------------------------------------------------------------------------------------

    @property
    def source_type(self) -> pa.DataType | None:
        """The Arrow type this transform is bound to, or None when unbound."""
        return self._source_type

    @property
    def is_bound(self) -> bool:
        return self._source_type is not None

    def bind(self, source_type: pa.DataType) -> Self:
        """A copy bound to the column's Arrow type; raises `PartitionExpressionError` if it does not fit."""
        from airflow_partitions.transforms import arrow_support  # lazy: loads pyarrow

        self.result_type_for(source_type)
        bound = copy.copy(self)
        bound._source_type = source_type
        bound._info = arrow_support.source_info(arrow_support.normalize_type(source_type))
        return bound

    def bind_columns(self, source_types: Sequence[pa.DataType]) -> Self:
        """A copy bound to the type of each column in `source_columns` (in order)."""
        types = list(source_types)
        if len(types) != 1:
            raise PartitionExpressionError(
                f"partition expression {self.canonical!r} reads one column; {len(types)} types given"
            )
        return self.bind(types[0])

    @property
    def result_type(self) -> pa.DataType:
        """The Arrow type of the partition values (binding is needed when it depends on the input)."""
        if self._source_type is not None:
            return self.result_type_for(self._source_type)
        fixed = self._fixed_result_type()
        if fixed is None:
            raise PartitionExpressionError(
                f"partition expression {self.canonical!r}: the result type of {self.name} depends on the "
                f"type of column {self.source_column!r}; call .bind(<arrow type of the column>) first"
            )
        return fixed

    def result_type_for(self, source_type: pa.DataType) -> pa.DataType:
        """The result type for a column of `source_type`; raises if the transform cannot take it."""
        from airflow_partitions.transforms import arrow_support  # lazy: loads pyarrow

        normalized = arrow_support.normalize_type(source_type)
        result = self._result_type(normalized)
        if result is None:
            raise PartitionExpressionError(
                f"partition expression {self.canonical!r}: column {self.source_column!r} has type "
                f"{source_type}, but {self.name} accepts {self.accepts}. "
                f"Choose a transform that fits the column type, or cast the column in the source"
            )
        if not self._allows_result_type(result):
            raise PartitionExpressionError(
                f"partition expression {self.canonical!r}: over column {self.source_column!r} "
                f"({source_type}) it gives {result} values, but partition values must be string, integer, "
                "boolean, date or timestamp. Use a transform that gives one (e.g. bucket(N, col) or "
                "truncate(W, col)), or cast the column in the source"
            )
        return result

    def _fixed_result_type(self) -> pa.DataType | None:
        """The result type when it does not depend on the input type (bucket, date_part)."""
        return None

    @abstractmethod
    def _result_type(self, source_type: pa.DataType) -> pa.DataType | None:
        """Result type for a normalised source type, or None when the input type is not accepted."""

    def _allows_result_type(self, result_type: pa.DataType) -> bool:
        from airflow_partitions.transforms import arrow_support  # lazy: loads pyarrow

        return arrow_support.is_partition_value_type(result_type)

    # --- evaluation ---------------------------------------------------------------------------------

    def apply(self, values: Any) -> Any:
        """Partition values of `values` (pyarrow Array/ChunkedArray, numpy array), vectorised.

        Returns the same container kind (ChunkedArray in, ChunkedArray out; otherwise an Array).
        NULL in gives NULL out.
        """
        from airflow_partitions.transforms import arrow_support  # lazy: loads pyarrow

        arrow = arrow_support.as_arrow(values)
        result_type = self.result_type_for(arrow.type)
        return arrow_support.map_array(arrow, result_type, self._apply_array)

    def apply_columns(self, arrays: Sequence[Any]) -> Any:
        """Partition values of rows given as one array per column in `source_columns`."""
        if len(arrays) != 1:
            raise PartitionExpressionError(
                f"partition expression {self.canonical!r} reads one column; {len(arrays)} arrays given"
            )
        return self.apply(arrays[0])

    def apply_table(self, table: Any) -> Any:
        """Partition values of every row of a pyarrow Table / RecordBatch holding the source columns."""
        return self.apply_columns([table.column(column) for column in self.source_columns])

    def routing_values(self, table: Any) -> Any:
        """`apply_table`'s values for routing: the same values, or (where that is cheaper to build) a
        dictionary array of them; `write.routing` groups a dictionary array on its indices."""
        return self.apply_table(table)

    def apply_row(self, values: Sequence[Any] | Mapping[str, Any]) -> Any:
        """The partition value of one row, given its values in `source_columns` order or by name."""
        if isinstance(values, Mapping):
            return self.apply_scalar(values.get(self._source_column))
        if len(values) != 1:
            raise PartitionValueError(
                f"partition expression {self.canonical!r} reads one column; {len(values)} values given"
            )
        return self.apply_scalar(values[0])

    @abstractmethod
    def _apply_array(self, values: pa.Array) -> pa.Array:
        """The kernel over one normalised, non-dictionary array with at least one non-NULL value."""

    def apply_scalar(self, value: Any) -> Any:
        """The partition value of one Python value (same result as `apply`); None gives None."""
        if value is None:
            return None
        return self._apply_scalar(value)

    @abstractmethod
    def _apply_scalar(self, value: Any) -> Any: ...

    # --- Spark --------------------------------------------------------------------------------------

    def to_spark(self, column: Any) -> Any:
        """The same transform as a pyspark Column expression over `column` (needs a bound transform).

        The Spark column is expected to hold the column's Spark form: signed integers as is, uint8/16/32
        widened to SMALLINT/INT/BIGINT, uint64 as DECIMAL(20,0), tz-aware timestamps as TIMESTAMP,
        naive ones as TIMESTAMP_NTZ (or TIMESTAMP in a UTC session), nanoseconds floored to microseconds.
        A string column of any collation is read as UTF8_BINARY (`spark.binary_collation`).
        """
        from airflow_partitions.transforms import arrow_support, spark  # lazy: loads pyarrow and pyspark

        if self.source_type is None:
            raise PartitionExpressionError(
                f"partition expression {self.canonical!r}: to_spark needs the column type; call "
                ".bind(<arrow type>) first (pyspark.sql.pandas.types.to_arrow_type converts a Spark type)"
            )
        source = arrow_support.normalize_type(self.source_type)
        if arrow_support.is_timestamp(source) and source.tz is None:
            spark.require_utc_session(self.canonical, self.source_columns)
        if arrow_support.is_string(source):
            column = spark.binary_collation(column)
        return self._spark_form(column, source)

    def _spark_form(self, column: Any, source: pa.DataType) -> Any:
        """The Spark column over `column`, whose values are of the normalised Arrow type `source`: each
        transform picks its builder in `transforms.spark` (which imports no transform)."""
        raise PartitionExpressionError(f"no Spark form for {type(self).__name__}")

    def to_spark_columns(self, columns: Sequence[Any]) -> Any:
        """The transform as a pyspark Column over one Spark column per entry of `source_columns`."""
        if len(columns) != 1:
            raise PartitionExpressionError(
                f"partition expression {self.canonical!r} reads one column; "
                f"{len(columns)} Spark columns given"
            )
        return self.to_spark(columns[0])

    def spark_value(self) -> Any:
        """The transform over its own source columns, by name, in the current Spark frame."""
        from pyspark.sql import functions as F

        # Backticks, doubled inside: Spark parses the reference back to exactly the column's name.
        return self.to_spark_columns(
            [F.col("`" + column.replace("`", "``") + "`") for column in self.source_columns]
        )

    # --- helpers for subclasses ---------------------------------------------------------------------

    def _coerce_scalar(self, value: Any) -> Any:
        """Check `value` against the bound column type and bring it to the form the kernels use.

        Datetimes come out naive (UTC wall time) or UTC-aware, following the bound type when bound and
        the value otherwise; decimals are brought to the column's scale; unbound values pass through.
        """
        info = self._info
        if isinstance(value, dt.datetime):
            if info is not None and info.kind == "date":
                raise self._scalar_error(value, "a datetime.date")
            aware = (
                info.tz_aware
                if info is not None and info.kind == "timestamp"
                else value.utcoffset() is not None
            )
            return with_result_zone(utc_wall_clock(value), aware)
        if info is None:
            return value
        kind = info.kind
        if kind in ("int", "uint"):
            if isinstance(value, bool) or not isinstance(value, int):
                raise self._scalar_error(value, "an int")
            return value
        if kind == "bool":
            if not isinstance(value, bool):
                raise self._scalar_error(value, "a bool")
            return value
        if kind == "string":
            if not isinstance(value, str):
                raise self._scalar_error(value, "a str")
            return value
        if kind == "binary":
            if not isinstance(value, bytes | bytearray | memoryview):
                raise self._scalar_error(value, "bytes")
            return bytes(value)
        if kind == "uuid":
            if isinstance(value, uuid.UUID):
                return value
            if isinstance(value, bytes) and len(value) == 16:
                return uuid.UUID(bytes=value)
            raise self._scalar_error(value, "a uuid.UUID")
        if kind == "decimal":
            if isinstance(value, bool) or not isinstance(value, Decimal | int):
                raise self._scalar_error(value, "a decimal.Decimal")
            unscaled, scale = decimal_unscaled(Decimal(value), info.scale)
            return decimal_from_unscaled(unscaled, scale)
        if kind == "date":
            if not isinstance(value, dt.date):
                raise self._scalar_error(value, "a datetime.date")
            return value
        if kind == "timestamp":
            if isinstance(value, dt.date):
                # A date compared with a timestamp column means its midnight (UTC wall time).
                midnight = dt.datetime(value.year, value.month, value.day)
                return with_result_zone(midnight, info.tz_aware)
            raise self._scalar_error(value, "a datetime.datetime")
        return value

    def _require_bound(self, purpose: str) -> pa.DataType:
        if self._source_type is None:
            raise PartitionExpressionError(
                f"partition expression {self.canonical!r}: {purpose} depends on the type of column "
                f"{self.source_column!r}; call .bind(<arrow type of the column>) first"
            )
        return self._source_type

    def _scalar_error(self, value: Any, expected: str) -> PartitionValueError:
        bound = f" (column type {self._source_type})" if self._source_type is not None else ""
        return PartitionValueError(
            f"partition expression {self.canonical!r}: cannot evaluate {value!r} "
            f"({type(value).__name__}); expected {expected}{bound}"
        )

    def renamed(self, rename: Callable[[str], str]) -> Self:
        """A copy reading column `rename(c)` for its column `c` (`renamed_transform`)."""
        moved = copy.copy(self)
        moved._source_column = rename(self._source_column)
        return moved

    def resolve_source_column(self, column_names: Iterable[str]) -> str:
        """The dataset column this transform reads, matched exactly (column names are case-sensitive).

        Raises `PartitionExpressionError` naming the near miss when only the case differs.
        """
        names = list(column_names)
        if self._source_column in names:
            return self._source_column
        folded = [name for name in names if name.lower() == self._source_column.lower()]
        hint = (
            f"; column names are case-sensitive — did you mean {folded[0]!r}?"
            if len(folded) == 1
            else f"; known columns: {', '.join(names[:20])}{', ...' if len(names) > 20 else ''}"
        )
        raise PartitionExpressionError(
            f"partition expression {self.canonical!r} references unknown column {self._source_column!r}{hint}"
        )


class OrderPreservingTransform(Transform):
    """A transform whose partition values keep the order of the source values: comparisons project."""

    @property
    def monotonic(self) -> bool:
        return True

    def project(self, op: Op, value: Any) -> Projection:
        return self._project_in_order(op, value)

    def project_range(
        self,
        lower: Any,
        upper: Any,
        lower_inclusive: bool,
        upper_inclusive: bool,
        *,
        column_type: pa.DataType,
        max_candidates: int,
    ) -> Projection:
        return self._project_range_in_order(lower, upper, lower_inclusive, upper_inclusive)


# --- scalar helpers ---------------------------------------------------------------------------------


def _safe_less(left: Any, right: Any) -> bool:
    """`left < right`, or True (doubt) when the two cannot be compared."""
    try:
        return bool(left < right)
    except TypeError:
        return True


def canonical_identifier(name: str) -> str:
    """`name` in a canonical string: bare when it is a plain identifier that parses back to itself."""
    if _PLAIN_IDENTIFIER.fullmatch(name) and parses_as_plain_column(name):
        return name
    return quote_identifier(name)


@functools.lru_cache(maxsize=4096)
def parses_as_plain_column(name: str) -> bool:
    """Whether `name` written bare parses back as an unquoted reference to the column `name`."""
    if _PLAIN_IDENTIFIER.fullmatch(name):
        return is_plain_name(name)  # no sqlglot: its keywords are listed in `plain_sql.RESERVED_WORDS`
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import SqlglotError

    try:
        tree = sqlglot.parse_one(name, read=DIALECT)
    except SqlglotError:
        return False
    return (
        isinstance(tree, exp.Column)
        and not tree.table
        and isinstance(tree.this, exp.Identifier)
        and tree.this.this == name
    )


def utc_wall_clock(value: dt.datetime) -> dt.datetime:
    """A naive datetime holding UTC wall time: naive values already are; aware ones are converted."""
    if value.tzinfo is None or value.utcoffset() is None:
        return value.replace(tzinfo=None) if value.tzinfo is not None else value
    return value.astimezone(UTC).replace(tzinfo=None)


def datetime_to_micros(value: dt.datetime) -> int:
    """Microseconds since 1970-01-01T00:00 UTC (naive values are UTC wall time); sub-µs is floored."""
    delta = utc_wall_clock(value) - EPOCH_NAIVE
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def date_to_days(value: dt.date) -> int:
    return (value - EPOCH_DATE).days


def with_result_zone(value: dt.datetime, tz_aware: bool) -> dt.datetime:
    """A naive UTC wall-clock datetime, tagged UTC when the result type is tz-aware."""
    return value.replace(tzinfo=UTC) if tz_aware else value


_DECIMAL_CONTEXT_PRECISION = 100


def decimal_unscaled(value: Decimal, scale: int | None) -> tuple[int, int]:
    """(unscaled integer, scale) of `value` at `scale` (its own exponent when None); must be exact."""
    if not value.is_finite():
        raise PartitionValueError(
            f"decimal {value} has no partition value (NaN and infinity are not allowed)"
        )
    if scale is None:
        exponent = value.as_tuple().exponent
        scale = max(0, -int(exponent))
    with localcontext() as context:
        context.prec = _DECIMAL_CONTEXT_PRECISION
        scaled = value.scaleb(scale)
        unscaled = int(scaled)
        if scaled != unscaled:
            raise PartitionValueError(f"decimal {value} has more than {scale} fractional digits")
    return unscaled, scale


def decimal_from_unscaled(unscaled: int, scale: int) -> Decimal:
    """The Decimal `unscaled * 10**-scale`, keeping exactly `scale` fractional digits."""
    with localcontext() as context:
        context.prec = _DECIMAL_CONTEXT_PRECISION
        return Decimal(unscaled).scaleb(-scale)


def renamed_transform(transform: Transform, rename: Callable[[str], str]) -> Transform:
    """A copy of `transform` (bound state kept) reading column `rename(c)` for each column `c` it reads.

    The copy computes the same values over the renamed column as the original over the old one: only the
    column references change (in a custom expression's tree too), never the function.
    """
    if all(rename(column) == column for column in transform.source_columns):
        return transform
    return transform.renamed(rename)
