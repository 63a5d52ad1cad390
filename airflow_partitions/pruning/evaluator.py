"""Vectorised three-valued evaluation of a predicate over many partitions (or files) at once.

For every row of a frame (a partition, or a file of a partition) and every predicate node the evaluator
computes three masks: could some row of it make the node TRUE, FALSE, or NULL. A partition is read when
its root might be TRUE (inclusive projection); it is *exact* when no row can make the root FALSE or NULL
(strict projection), and then the residual filter is not applied to it. The connectives combine masks by
SQL's rules (`NOT` swaps TRUE and FALSE; `AND` is FALSE if either side may be, ...), each time
over-approximating, so doubt only ever keeps a partition or withholds exactness.

Leaves are judged from several independent sources, each a sound over-approximation of the values a
partition can hold; their verdicts are intersected:

* each partition field over the leaf's column: the transform projects the leaf onto its partition
  values (`Transform.project` / `project_in` / `project_range`, see `transforms/projection.py`): an
  order-preserving transform through its inclusive projection (`c < v` holds somewhere in partition
  `p` only if `p <= T(v)`, refined at the boundary by the preimage), any transform by its image of
  each literal (`user_id = 42` against `bucket(100, user_id)` compares every partition with
  `bucket(100, 42)`), or by enumerating a bounded range, up to `MAX_RANGE_ENUMERATION` candidate
  values; the evaluator turns the projected conditions into masks;
* calendar chains: `date_part` fields year + quarter, or year + month (+ day, + hour, + minute), over one
  column pin each partition to one exact calendar interval, although month alone is not monotonic;
* file statistics (zone maps): per-file min / max / NULL count of any column.

Every mask is computed with Arrow compute kernels or numpy over all rows, never per partition in Python.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

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
    TransformRef,
)
from airflow_partitions.pruning.index import BoundField, ColumnStatsArrays
from airflow_partitions.pruning.limits import check_budget
from airflow_partitions.storage.arrow_values import to_numpy, typed_array
from airflow_partitions.transforms.projection import (
    EVALUATION_ERRORS,
    AllOf,
    AnyOf,
    PartitionCondition,
    ValueBound,
    ValueSet,
    to_ticks,
)

ROWS_MIGHT_MATCH = "ROWS_MIGHT_MATCH"
ROWS_CANNOT_MATCH = "ROWS_CANNOT_MATCH"
ROWS_MUST_MATCH = "ROWS_MUST_MATCH"

# Bounded ranges through bucket / mod / non-year date_part are pruned by evaluating the transform on
# every candidate source value; beyond this many candidates the range prunes nothing on that field.
MAX_RANGE_ENUMERATION = 10_000
# IN lists longer than this are judged against file statistics by their [min, max] hull.
MAX_IN_LIST_FOR_STATS = 64

Mask = npt.NDArray[np.bool_]
_ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError, TypeError)
_COMPARE: dict[Op, Callable[..., Any]] = {
    Op.EQ: pc.equal,
    Op.NE: pc.not_equal,
    Op.LT: pc.less,
    Op.LE: pc.less_equal,
    Op.GT: pc.greater,
    Op.GE: pc.greater_equal,
}
_MICROS_PER_DAY = 86_400_000_000


class Frame(Protocol):
    """Rows to judge: `size` rows, partition values per field name, and optional per-row statistics."""

    size: int
    values: dict[str, pa.Array]

    def stats(self, column: str) -> ColumnStatsArrays | None: ...


@dataclass(frozen=True, slots=True)
class Outcome:
    """Per row: might some record make the predicate TRUE, FALSE, NULL."""

    true: Mask
    false: Mask
    null: Mask

    @property
    def exact(self) -> Mask:
        """Rows where every record satisfies the predicate (no residual needed)."""
        return ~self.false & ~self.null

    def verdicts(self) -> list[str]:
        """`ROWS_CANNOT_MATCH`, `ROWS_MUST_MATCH` or `ROWS_MIGHT_MATCH` per row."""
        exact = self.exact
        return [
            ROWS_CANNOT_MATCH if not t else ROWS_MUST_MATCH if e else ROWS_MIGHT_MATCH
            for t, e in zip(self.true.tolist(), exact.tolist(), strict=True)
        ]


# --- small array helpers --------------------------------------------------------------------------


def _bool_mask(result: Any, fill: bool) -> Mask:
    return np.asarray(to_numpy(result, fill), dtype=bool)


def _scalar(value: Any, kind: pa.DataType) -> pa.Scalar:
    try:
        return typed_array([value], kind)[0]
    except _ARROW_ERRORS:
        return pa.scalar(value)


def _compare(values: pa.Array, op: Op, value: Any, fill: bool) -> Mask | None:
    """`values op value` per row (NULL -> `fill`), or None when Arrow cannot compare the two."""
    try:
        return _bool_mask(_COMPARE[op](values, _scalar(value, values.type)), fill)
    except _ARROW_ERRORS:
        return None


def _is_in(values: pa.Array, candidates: Sequence[Any] | pa.Array) -> Mask | None:
    try:
        value_set = (
            candidates if isinstance(candidates, pa.Array) else typed_array(list(candidates), values.type)
        )
        return _bool_mask(pc.is_in(values, value_set=value_set), False)
    except _ARROW_ERRORS:
        return None


# --- the evaluator --------------------------------------------------------------------------------


class Evaluator:
    """Evaluates prepared predicates (see `rewrite.prepare`) over one frame."""

    def __init__(
        self,
        fields: Sequence[BoundField],
        frame: Frame,
        *,
        max_enumeration: int = MAX_RANGE_ENUMERATION,
    ) -> None:
        self.frame = frame
        self.max_enumeration = max_enumeration
        self.fields_by_column: dict[str, list[BoundField]] = {}
        # Fields over several columns (multi_bucket): judged on a conjunction pinning all of them.
        self.multi_column_fields: list[BoundField] = []
        for field in fields:
            if field.name not in frame.values:
                continue
            if len(field.columns) == 1:
                self.fields_by_column.setdefault(field.columns[0], []).append(field)
            else:
                self.multi_column_fields.append(field)
        self._nullness_cache: dict[str, tuple[Mask, Mask]] = {}
        self._chains: dict[str, _CalendarChain | None] = {}

    # --- masks --------------------------------------------------------------------------------

    def _ones(self) -> Mask:
        return np.ones(self.frame.size, dtype=bool)

    def _zeros(self) -> Mask:
        return np.zeros(self.frame.size, dtype=bool)

    def _unknown(self) -> Outcome:
        return Outcome(self._ones(), self._ones(), self._ones())

    # --- connectives --------------------------------------------------------------------------

    def evaluate(self, predicate: Predicate) -> Outcome:
        check_budget()
        if isinstance(predicate, AlwaysTrue):
            return Outcome(self._ones(), self._zeros(), self._zeros())
        if isinstance(predicate, AlwaysFalse):
            return Outcome(self._zeros(), self._ones(), self._zeros())
        if isinstance(predicate, AlwaysNull):
            return Outcome(self._zeros(), self._zeros(), self._ones())
        if isinstance(predicate, And):
            result = self.evaluate(predicate.items[0])
            for item in predicate.items[1:]:
                result = _and(result, self.evaluate(item))
            for field in self.multi_column_fields:
                hit = self._pinned_truth(field, predicate)
                if hit is not None:
                    result = Outcome(result.true & hit, result.false, result.null)
            return result
        if isinstance(predicate, Or):
            result = self.evaluate(predicate.items[0])
            for item in predicate.items[1:]:
                result = _or(result, self.evaluate(item))
            return result
        if isinstance(predicate, Not):
            inner = self.evaluate(predicate.child)
            return Outcome(inner.false, inner.true, inner.null)
        if isinstance(predicate, Opaque):
            return self._unknown()
        if isinstance(predicate, Comparison | InList | IsNull | Range):
            return self._leaf(predicate)
        return self._unknown()

    # --- leaves -------------------------------------------------------------------------------

    def _leaf(self, leaf: Comparison | InList | IsNull | Range) -> Outcome:
        term = leaf.term
        if isinstance(term, TransformRef) and not term.transform.null_preserving:
            might_null, might_value = self._expression_nullness(term)
        else:
            might_null, might_value = self._nullness(term.column)
        if isinstance(leaf, IsNull):
            return Outcome(might_null.copy(), might_value.copy(), self._zeros())
        if isinstance(term, ColumnRef):
            true, false = self._column_truth(term, leaf)
        else:
            true, false = self._expression_truth(term, leaf)
        return Outcome(true & might_value, false & might_value, might_null.copy())

    def _nullness(self, column: str) -> tuple[Mask, Mask]:
        """(might hold NULL, might hold a value) of `column` per row."""
        cached = self._nullness_cache.get(column)
        if cached is not None:
            return cached
        might_null, might_value = self._ones(), self._ones()
        for field in self.fields_by_column.get(column, ()):
            values = self.frame.values[field.name]
            if not field.transform.null_preserving:
                # NULL rows all land in the partition of f(NULL), which says nothing about the others.
                might_null &= self._partitions_of_null(field.transform, values)
                continue
            is_null = _bool_mask(values.is_null(), True)
            might_null &= is_null
            might_value &= ~is_null
        stats = self.frame.stats(column)
        if stats is not None:
            known = stats.null_count >= 0
            might_null &= ~(known & (stats.null_count == 0))
            might_value &= ~(known & (stats.null_count >= stats.rows))
        self._nullness_cache[column] = (might_null, might_value)
        return might_null, might_value

    def _partitions_of_null(self, transform: Any, values: pa.Array) -> Mask:
        """Per row, whether the partition value is that of a NULL column value (`f(NULL)`)."""
        try:
            image = transform.apply_scalar(None)
        except (*EVALUATION_ERRORS, *_ARROW_ERRORS):
            return self._ones()
        if image is None:
            return _bool_mask(values.is_null(), True)
        mask = _compare(values, Op.EQ, image, False)
        return self._ones() if mask is None else mask

    def _expression_nullness(self, term: TransformRef) -> tuple[Mask, Mask]:
        """(might be NULL, might hold a value) of an expression that does not keep NULLs apart."""
        might_null, might_value = self._ones(), self._ones()
        for field in self.fields_by_column.get(term.column, ()):
            try:
                values = field.transform.values_of(term.transform, self.frame.values[field.name])
            except (*EVALUATION_ERRORS, *_ARROW_ERRORS):
                values = None
            if values is None:
                continue
            is_null = _bool_mask(values.is_null(), True)
            might_null &= is_null
            might_value &= ~is_null
        return might_null, might_value

    def _column_truth(self, term: ColumnRef, leaf: Comparison | InList | Range) -> tuple[Mask, Mask]:
        """Might a non-NULL value of the column make the leaf TRUE / FALSE, per row."""
        true, false = self._ones(), self._ones()
        for field in self.fields_by_column.get(term.name, ()):
            field_true, field_false = self._field_truth(field, term, leaf)
            true &= field_true
            false &= field_false
        chain = self._chain(term)
        if chain is not None:
            chain_true, chain_false = chain.truth(leaf)
            true &= chain_true
            false &= chain_false
        stats = self.frame.stats(term.name)
        if stats is not None:
            stats_true, stats_false = _stats_truth(stats, leaf, self.frame.size)
            true &= stats_true
            false &= stats_false
        return true, false

    # --- partition fields ---------------------------------------------------------------------

    def _field_truth(
        self, field: BoundField, term: ColumnRef, leaf: Comparison | InList | Range
    ) -> tuple[Mask, Mask]:
        """Through the field's transform: where might a value of the column make the leaf TRUE / FALSE."""
        return self._projected_truth(field, field.transform, term.type, leaf)

    def _projected_truth(
        self, field: BoundField, transform: Any, term_type: pa.DataType, leaf: Comparison | InList | Range
    ) -> tuple[Mask, Mask]:
        """Where might a value of a term (of `term_type`) make the leaf TRUE / FALSE, when `transform` maps
        the term's values to the field's partition values."""
        if isinstance(leaf, Comparison):
            projection = transform.project(leaf.op, leaf.value)
        elif isinstance(leaf, InList):
            if not leaf.values:
                return self._zeros(), self._ones()
            projection = transform.project_in(leaf.values)
        else:
            projection = transform.project_range(
                leaf.lower,
                leaf.upper,
                leaf.lower_inclusive,
                leaf.upper_inclusive,
                column_type=term_type,
                max_candidates=self.max_enumeration,
            )
        values = self.frame.values[field.name]
        return self._satisfies(values, projection.may_hold), self._satisfies(values, projection.may_fail)

    def _satisfies(self, values: pa.Array, condition: PartitionCondition | None) -> Mask:
        """Per row, whether the partition value meets `condition` (NULL, unknown, or not comparable: yes)."""
        if condition is None:
            return self._ones()
        if isinstance(condition, ValueBound):
            mask = _compare(values, condition.op, condition.value, True)
            return self._ones() if mask is None else mask
        if isinstance(condition, ValueSet):
            hit = _is_in(values, condition.values)
            if hit is None:
                return self._ones()
            return ~hit if condition.negated else hit
        if isinstance(condition, AllOf):
            result = self._ones()
            for item in condition.items:
                result &= self._satisfies(values, item)
            return result
        if isinstance(condition, AnyOf):
            result = self._zeros()
            for item in condition.items:
                result |= self._satisfies(values, item)
            return result
        return self._ones()

    # --- predicates on partition expressions --------------------------------------------------

    def _expression_truth(self, term: TransformRef, leaf: Comparison | InList | Range) -> tuple[Mask, Mask]:
        true, false = self._ones(), self._ones()
        for field in self.fields_by_column.get(term.column, ()):
            try:
                values = field.transform.values_of(term.transform, self.frame.values[field.name])
            except (*EVALUATION_ERRORS, *_ARROW_ERRORS):
                values = None
            if values is None:
                # `lower(email) = 'x@y'` against `bucket(16, lower(email))`: through the wrapping transform.
                outer = field.transform.wrapping(term.transform)
                if outer is not None:
                    outer_true, outer_false = self._projected_truth(field, outer, term.type, leaf)
                    true &= outer_true
                    false &= outer_false
                continue
            direct_true, direct_false = _direct_truth(values, leaf, self.frame.size)
            true &= direct_true
            false &= direct_false
        return true, false

    # --- fields over several columns -----------------------------------------------------------

    def _pinned_truth(self, field: BoundField, conjunction: And) -> Mask | None:
        """Where the conjunction might be TRUE judged by a multi-column field: every row it admits has
        each of the field's columns equal to one of its pinned literals, so its partition value is the
        field's value of one combination of them (`a = 1 AND b IN ('x', 'y')`: two buckets). None when
        some column is not pinned, or the combinations are too many to evaluate."""
        rows = pinned_rows(conjunction, field.columns, self.max_enumeration)
        if rows is None:
            return None
        projection = field.transform.project_rows(rows)
        if projection.may_hold is None:
            return None
        return self._satisfies(self.frame.values[field.name], projection.may_hold)

    # --- calendar chains ----------------------------------------------------------------------

    def _chain(self, term: ColumnRef) -> _CalendarChain | None:
        if term.name not in self._chains:
            self._chains[term.name] = _CalendarChain.build(
                self.fields_by_column.get(term.name, ()), self.frame, term.type
            )
        return self._chains[term.name]


def conjunction_leaves(predicate: Predicate) -> list[Predicate]:
    """The items of a conjunction, nested ANDs flattened."""
    if isinstance(predicate, And):
        return [leaf for item in predicate.items for leaf in conjunction_leaves(item)]
    return [predicate]


def pinned_rows(predicate: Predicate, columns: Sequence[str], max_rows: int) -> list[tuple[Any, ...]] | None:
    """Every combination of values `columns` may take where `predicate` (a conjunction) is TRUE, when
    each column is pinned by `=` or `IN` on the column itself; None otherwise or beyond `max_rows`."""
    allowed: dict[str, set[Any] | None] = {}
    for leaf in conjunction_leaves(predicate):
        if not isinstance(leaf, Comparison | InList) or not isinstance(leaf.term, ColumnRef):
            continue
        if leaf.term.name not in columns:
            continue
        if isinstance(leaf, Comparison):
            if leaf.op is not Op.EQ:
                continue
            values = {leaf.value}
        else:
            values = set(leaf.values)
        known = allowed.get(leaf.term.name)
        # Two pins on one column: a row meets both, so only the values in both remain.
        allowed[leaf.term.name] = values if known is None else known & values
    if any(allowed.get(column) is None for column in columns):
        return None
    total = 1
    for column in columns:
        total *= len(allowed[column] or ())
    if total > max_rows:
        return None
    import itertools

    ordered = [sorted(allowed[column] or (), key=repr) for column in columns]
    return list(itertools.product(*ordered))


def _and(left: Outcome, right: Outcome) -> Outcome:
    null = (left.null & (right.true | right.null)) | (right.null & (left.true | left.null))
    return Outcome(left.true & right.true, left.false | right.false, null)


def _or(left: Outcome, right: Outcome) -> Outcome:
    null = (left.null & (right.false | right.null)) | (right.null & (left.false | left.null))
    return Outcome(left.true | right.true, left.false & right.false, null)


def _direct_truth(values: pa.Array, leaf: Comparison | InList | Range, size: int) -> tuple[Mask, Mask]:
    """Exact TRUE / FALSE masks of a leaf evaluated on the rows' own values."""
    ones = np.ones(size, dtype=bool)
    if isinstance(leaf, Comparison):
        true = _compare(values, leaf.op, leaf.value, True)
        false = _compare(values, leaf.op.negate(), leaf.value, True)
        return (ones if true is None else true), (ones.copy() if false is None else false)
    if isinstance(leaf, InList):
        if not leaf.values:
            return np.zeros(size, dtype=bool), ones
        hit = _is_in(values, leaf.values)
        return (ones, ones.copy()) if hit is None else (hit, ~hit)
    true, false = ones, np.zeros(size, dtype=bool)
    for bound in leaf.bounds():
        bound_true = _compare(values, bound.op, bound.value, True)
        bound_false = _compare(values, bound.op.negate(), bound.value, True)
        if bound_true is None or bound_false is None:
            return np.ones(size, dtype=bool), np.ones(size, dtype=bool)
        true = true & bound_true
        false = false | bound_false
    return true, false


# --- zone maps ------------------------------------------------------------------------------------


def _stats_might(stats: ColumnStatsArrays, op: Op, value: Any, size: int) -> Mask:
    """Might a value within the row's [min, max] satisfy `op value` (unknown bounds: yes)."""
    low, high = stats.minimum, stats.maximum
    ones = np.ones(size, dtype=bool)
    if op is Op.EQ:
        below = _compare(low, Op.LE, value, True)
        above = _compare(high, Op.GE, value, True)
        return ones if below is None or above is None else below & above
    if op is Op.NE:
        low_equal = _compare(low, Op.EQ, value, False)
        high_equal = _compare(high, Op.EQ, value, False)
        return ones if low_equal is None or high_equal is None else ~(low_equal & high_equal)
    side = low if op in (Op.LT, Op.LE) else high
    mask = _compare(side, op, value, True)
    return ones if mask is None else mask


def _stats_truth(stats: ColumnStatsArrays, leaf: Comparison | InList | Range, size: int) -> tuple[Mask, Mask]:
    if isinstance(leaf, Comparison):
        return _stats_might(stats, leaf.op, leaf.value, size), _stats_might(
            stats, leaf.op.negate(), leaf.value, size
        )
    if isinstance(leaf, Range):
        true, false = np.ones(size, dtype=bool), np.zeros(size, dtype=bool)
        for bound in leaf.bounds():
            true &= _stats_might(stats, bound.op, bound.value, size)
            false |= _stats_might(stats, bound.op.negate(), bound.value, size)
        return true, false
    if not leaf.values:
        return np.zeros(size, dtype=bool), np.ones(size, dtype=bool)
    if len(leaf.values) <= MAX_IN_LIST_FOR_STATS:
        true = np.zeros(size, dtype=bool)
        for value in leaf.values:
            true |= _stats_might(stats, Op.EQ, value, size)
    else:
        try:
            smallest, largest = min(leaf.values), max(leaf.values)
            true = _stats_might(stats, Op.GE, smallest, size) & _stats_might(stats, Op.LE, largest, size)
        except TypeError:
            true = np.ones(size, dtype=bool)
    try:
        point = _bool_mask(pc.equal(stats.minimum, stats.maximum), False)
    except _ARROW_ERRORS:
        return true, np.ones(size, dtype=bool)
    member = _is_in(stats.minimum, leaf.values)
    if member is None:
        return true, np.ones(size, dtype=bool)
    return true, ~(point & member)


# --- calendar chains ------------------------------------------------------------------------------


_CHAIN_ORDER_MONTH = ("year", "month", "day", "hour", "minute")


@dataclass
class _CalendarChain:
    """Per row, the exact interval [start, end) of the column pinned by year + finer date_part fields."""

    start: npt.NDArray[np.int64]
    end: npt.NDArray[np.int64]
    kind: pa.DataType

    @classmethod
    def build(cls, fields: Sequence[BoundField], frame: Frame, kind: pa.DataType) -> _CalendarChain | None:
        if pa.types.is_dictionary(kind):
            kind = kind.value_type
        if not (pa.types.is_date(kind) or pa.types.is_timestamp(kind)):
            return None
        units: dict[str, pa.Array] = {}
        for field in fields:
            unit = field.transform.calendar_field
            if unit is not None:
                units.setdefault(unit, frame.values[field.name])
        if "year" not in units:
            return None
        path = ["year"]
        if "month" in units:
            for unit in _CHAIN_ORDER_MONTH[1:]:
                if unit not in units:
                    break
                path.append(unit)
        elif "quarter" in units:
            path.append("quarter")
        if len(path) == 1:
            return None

        def numbers(unit: str, fill: int) -> npt.NDArray[np.int64]:
            return np.asarray(to_numpy(units[unit], fill), dtype=np.int64)

        years = numbers("year", 1970)
        if path[1] == "quarter":
            months = (years - 1970) * 12 + (numbers("quarter", 1) - 1) * 3
            start_days = _month_days(months)
            end_days = _month_days(months + 3)
            start, end = start_days, end_days
            scale = _MICROS_PER_DAY
        else:
            months = (years - 1970) * 12 + numbers("month", 1) - 1
            if "day" in path:
                start = _month_days(months) + numbers("day", 1) - 1
                end = start + 1
            else:
                start, end = _month_days(months), _month_days(months + 1)
            scale = _MICROS_PER_DAY
        if pa.types.is_date(kind):
            return cls(start, end, kind)
        start = start * scale
        end = end * scale
        if "hour" in path:
            start = start + numbers("hour", 0) * 3_600_000_000
            end = start + 3_600_000_000
        if "minute" in path:
            start = start + numbers("minute", 0) * 60_000_000
            end = start + 60_000_000
        return cls(start, end, kind)

    def _might(self, op: Op, value: Any) -> Mask:
        tick = to_ticks(value, self.kind)
        if tick is None:
            return np.ones(len(self.start), dtype=bool)
        start, end = self.start, self.end
        match op:
            case Op.EQ:
                return (start <= tick) & (tick < end)
            case Op.NE:
                return ~((end - start == 1) & (start == tick))
            case Op.LT:
                return start < tick
            case Op.LE:
                return start <= tick
            case Op.GT:
                return tick < end - 1
            case Op.GE:
                return tick < end
        return np.ones(len(start), dtype=bool)

    def truth(self, leaf: Comparison | InList | Range) -> tuple[Mask, Mask]:
        size = len(self.start)
        if isinstance(leaf, Comparison):
            return self._might(leaf.op, leaf.value), self._might(leaf.op.negate(), leaf.value)
        if isinstance(leaf, Range):
            true, false = np.ones(size, dtype=bool), np.zeros(size, dtype=bool)
            for bound in leaf.bounds():
                true &= self._might(bound.op, bound.value)
                false |= self._might(bound.op.negate(), bound.value)
            return true, false
        ticks = [to_ticks(value, self.kind) for value in leaf.values]
        if any(tick is None for tick in ticks):
            return np.ones(size, dtype=bool), np.ones(size, dtype=bool)
        points = np.unique(np.asarray(ticks, dtype=np.int64))
        hits = np.searchsorted(points, self.end, "left") - np.searchsorted(points, self.start, "left")
        return hits > 0, np.ones(size, dtype=bool)


def _month_days(months: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Days since the epoch of the first day of `months` (months since 1970-01)."""
    return np.asarray(months.astype("M8[M]").astype("M8[D]").view(np.int64), dtype=np.int64)
