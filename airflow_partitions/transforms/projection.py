"""What a condition on a source column says about partition values: the vocabulary of projection.

A transform projects `column op value`, `column IN (...)` and bounded ranges onto its partition values
(`Transform.project`, `project_in`, `project_range`) as a `Projection`: `may_hold` is the condition a
partition value must meet for some row of the partition to satisfy the source condition (inclusive
projection), `may_fail` the one it must meet for some row not to. `None` stands for "every partition":
doubt never prunes. Conditions are plain data; the pruning evaluator turns them into masks over many
partitions at once. pyarrow and numpy are imported inside functions only.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import PartitionExpressionError, PartitionValueError

if TYPE_CHECKING:
    import pyarrow as pa


class Op(Enum):
    """A comparison operator; `negate()` is the operator of `NOT (a op b)`, `flip()` that of `b op a`."""

    EQ = "="
    NE = "!="
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="

    def negate(self) -> Op:
        return _NEGATED[self]

    def flip(self) -> Op:
        return _FLIPPED[self]

    def holds(self, left: Any, right: Any) -> bool:
        """`left op right` on two non-NULL Python values."""
        match self:
            case Op.EQ:
                return bool(left == right)
            case Op.NE:
                return bool(left != right)
            case Op.LT:
                return bool(left < right)
            case Op.LE:
                return bool(left <= right)
            case Op.GT:
                return bool(left > right)
            case Op.GE:
                return bool(left >= right)
        raise AssertionError(self)


_NEGATED = {Op.EQ: Op.NE, Op.NE: Op.EQ, Op.LT: Op.GE, Op.LE: Op.GT, Op.GT: Op.LE, Op.GE: Op.LT}
_FLIPPED = {Op.EQ: Op.EQ, Op.NE: Op.NE, Op.LT: Op.GT, Op.LE: Op.GE, Op.GT: Op.LT, Op.GE: Op.LE}

#: What evaluating a transform on a literal may raise; a projection that meets one knows nothing.
EVALUATION_ERRORS: tuple[type[Exception], ...] = (
    PartitionValueError,
    PartitionExpressionError,
    ValueError,
    TypeError,
    OverflowError,
    ArithmeticError,
)


# --- conditions on partition values ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ValueBound:
    """Partition values `op value`."""

    op: Op
    value: Any


@dataclass(frozen=True, slots=True)
class ValueSet:
    """Partition values among `values` (a sequence or an Arrow array); not among them when `negated`."""

    values: Any
    negated: bool = False


@dataclass(frozen=True, slots=True)
class AllOf:
    """Every one of `items` holds."""

    items: tuple[PartitionCondition, ...]


@dataclass(frozen=True, slots=True)
class AnyOf:
    """At least one of `items` holds (none: nothing does)."""

    items: tuple[PartitionCondition, ...]


PartitionCondition = ValueBound | ValueSet | AllOf | AnyOf


def all_of(conditions: Iterable[PartitionCondition | None]) -> PartitionCondition | None:
    """The conjunction; an unknown (`None`) condition constrains nothing."""
    known = tuple(condition for condition in conditions if condition is not None)
    if not known:
        return None
    return known[0] if len(known) == 1 else AllOf(known)


def any_of(conditions: Iterable[PartitionCondition | None]) -> PartitionCondition | None:
    """The disjunction; one unknown (`None`) condition makes the whole unknown."""
    items = tuple(conditions)
    if any(condition is None for condition in items):
        return None
    known = tuple(condition for condition in items if condition is not None)
    return known[0] if len(known) == 1 else AnyOf(known)


@dataclass(frozen=True, slots=True)
class Projection:
    """Where a source condition may be TRUE (`may_hold`) and FALSE (`may_fail`); None: anywhere."""

    may_hold: PartitionCondition | None = None
    may_fail: PartitionCondition | None = None


UNKNOWN = Projection()


def range_bounds(
    lower: Any, upper: Any, lower_inclusive: bool, upper_inclusive: bool
) -> list[tuple[Op, Any]]:
    """The comparisons a range is the conjunction of (lower first; a `None` bound is absent)."""
    bounds: list[tuple[Op, Any]] = []
    if lower is not None:
        bounds.append((Op.GE if lower_inclusive else Op.GT, lower))
    if upper is not None:
        bounds.append((Op.LE if upper_inclusive else Op.LT, upper))
    return bounds


# --- enumerating a bounded range ------------------------------------------------------------------

_EPOCH_DATE = dt.date(1970, 1, 1)
_EPOCH = dt.datetime(1970, 1, 1)


def to_ticks(value: Any, kind: pa.DataType) -> int | None:
    """An integer position of `value` on the column's enumeration grid (ints, days, microseconds)."""
    import pyarrow as pa

    if pa.types.is_integer(kind):
        return int(value)
    if pa.types.is_date(kind):
        return (value - _EPOCH_DATE).days if isinstance(value, dt.date) else None
    if pa.types.is_timestamp(kind) and isinstance(value, dt.datetime):
        naive = value.astimezone(dt.UTC).replace(tzinfo=None) if value.tzinfo is not None else value
        return (naive - _EPOCH) // dt.timedelta(microseconds=1)
    return None


def enumerate_range(
    kind: pa.DataType,
    lower: Any,
    upper: Any,
    lower_inclusive: bool,
    upper_inclusive: bool,
    *,
    timestamp_step_micros: int,
    cap: int,
) -> pa.Array | None:
    """Source values covering every partition value a bounded range can reach, or None past `cap`.

    Integer and date ranges are enumerated value by value; timestamp ranges every
    `timestamp_step_micros` on the UTC grid (a step within which the transform cannot change value).
    """
    import numpy as np
    import pyarrow as pa

    if lower is None or upper is None:
        return None
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    low, high = to_ticks(lower, kind), to_ticks(upper, kind)
    if low is None or high is None:
        return None
    step = timestamp_step_micros if pa.types.is_timestamp(kind) else 1
    if not lower_inclusive:
        low += 1
    if not upper_inclusive:
        high -= 1
    if pa.types.is_timestamp(kind):
        low -= low % step  # the first step that meets the range starts at or before its lower bound
    if high < low:
        return pa.nulls(0, kind)
    if (high - low) // step + 1 > cap:
        return None
    # From the int64 buffer, not `pa.array(ndarray)`: that would import pandas to ask what it is given.
    raw = np.arange(low, high + 1, step, dtype=np.int64)
    ticks = pa.Array.from_buffers(pa.int64(), len(raw), [None, pa.py_buffer(raw)])
    try:
        if pa.types.is_integer(kind):
            return ticks.cast(kind)
        if pa.types.is_date(kind):
            return ticks.cast(pa.int32()).cast(pa.date32()).cast(kind)
        return ticks.cast(pa.timestamp("us", None if kind.tz is None else "UTC"))
    except arrow_errors():
        return None


def arrow_errors() -> tuple[type[Exception], ...]:
    """What Arrow raises when values cannot be cast, compared or computed."""
    import pyarrow as pa

    return (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError, TypeError)
