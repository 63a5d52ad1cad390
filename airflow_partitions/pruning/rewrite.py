"""Equivalence-preserving rewrites that make a bound predicate easier to prune with.

Each rewrite keeps SQL's three-valued meaning exactly, row by row, so the rewritten predicate can decide
exactness too:

* a predicate on a monotonic partition expression becomes a range on its column through the expression's
  preimage: `date_part('year', ts) = 2026` is `ts >= 2026-01-01 AND ts < 2027-01-01`, so it meets every
  other partition field and the column's statistics;
* `f(c) IS NULL` is `c IS NULL` when `f` maps NULL, and only NULL, to NULL (every built-in transform;
  not `coalesce(c, 'x')` or a CASE band, see `Transform.null_preserving`);
* range comparisons on the same term inside one AND merge into one `Range`, so bounded ranges can be
  enumerated through non-monotonic transforms (`user_id BETWEEN 10 AND 20` against a bucket).
"""

from __future__ import annotations

from typing import Any

from airflow_partitions.exceptions import PartitionValueError
from airflow_partitions.pruning.expressions import (
    And,
    ColumnRef,
    Comparison,
    InList,
    IsNull,
    Not,
    Op,
    Or,
    Predicate,
    Range,
    Term,
    TransformRef,
    and_,
    not_,
    or_,
)

_RANGE_OPS = (Op.LT, Op.LE, Op.GT, Op.GE)


def prepare(predicate: Predicate) -> Predicate:
    """The predicate with every rewrite above applied, bottom-up."""
    if isinstance(predicate, And):
        return merge_ranges(and_(*(prepare(child) for child in predicate.items)))
    if isinstance(predicate, Or):
        return or_(*(prepare(child) for child in predicate.items))
    if isinstance(predicate, Not):
        return merge_ranges(not_(prepare(predicate.child)))
    if (
        isinstance(predicate, IsNull)
        and isinstance(predicate.term, TransformRef)
        and predicate.term.transform.null_preserving
    ):
        return IsNull(predicate.term.column_ref)
    if isinstance(predicate, Comparison | InList | Range) and isinstance(predicate.term, TransformRef):
        rewritten = _through_preimage(predicate)
        if rewritten is not None:
            return merge_ranges(rewritten) if isinstance(rewritten, And) else rewritten
    return predicate


# --- monotonic partition expressions -> column ranges ----------------------------------------------


_NOT_AN_IMAGE = object()


def _preimage(term: TransformRef, value: Any) -> Any:
    """The interval of column values whose image is `value`; `_NOT_AN_IMAGE` when no value maps to it.

    The interval is trusted only once a bound inside it is seen to map back to `value`: a literal
    that no value produces (`truncate(10, c) = 7`) makes `f(c) = v` FALSE for every row, not a range.
    """
    transform = term.transform
    try:
        interval = transform.preimage(value)
    except (PartitionValueError, ValueError, TypeError, OverflowError):
        return None
    if interval is None:
        return None
    if interval.lower is not None and interval.lower_inclusive:
        probe = interval.lower
    elif interval.upper is not None and interval.upper_inclusive:
        probe = interval.upper
    else:
        return None
    try:
        image = transform.apply_scalar(probe)
    except (PartitionValueError, ValueError, TypeError, OverflowError):
        return None
    return interval if image == value else _NOT_AN_IMAGE


def _through_preimage(leaf: Comparison | InList | Range) -> Predicate | None:
    term = leaf.term
    assert isinstance(term, TransformRef)
    if not term.transform.monotonic:
        return None
    column = term.column_ref
    if isinstance(leaf, Comparison):
        return _comparison_through_preimage(term, column, leaf.op, leaf.value)
    if isinstance(leaf, InList):
        parts = [_comparison_through_preimage(term, column, Op.EQ, value) for value in leaf.values]
        if any(part is None for part in parts):
            return None
        return or_(*(p for p in parts if p is not None)) if parts else InList(column, ())
    parts = [_comparison_through_preimage(term, column, bound.op, bound.value) for bound in leaf.bounds()]
    if any(part is None for part in parts):
        return None
    return and_(*(p for p in parts if p is not None))


def _comparison_through_preimage(
    term: TransformRef, column: ColumnRef, op: Op, value: Any
) -> Predicate | None:
    interval = _preimage(term, value)
    if interval is None:
        return None
    if interval is _NOT_AN_IMAGE:
        # FALSE for every value (NULL for NULL) when no value has this image; ranges keep their leaf.
        if op is Op.EQ:
            return InList(column, ())
        return not_(InList(column, ())) if op is Op.NE else None
    lower, upper = interval.lower, interval.upper
    # TRUE for every non-NULL value and NULL for NULL: what `f(c) <= v` is when v is above every value.
    every_value = not_(InList(column, ()))
    no_value = InList(column, ())
    match op:
        case Op.EQ | Op.NE:
            if lower is None and upper is None:
                equal: Predicate = every_value
            else:
                equal = Range(column, lower, interval.lower_inclusive, upper, interval.upper_inclusive)
            return equal if op is Op.EQ else not_(equal)
        case Op.LT:
            if lower is None:
                return no_value
            return Comparison(column, Op.LT if interval.lower_inclusive else Op.LE, lower)
        case Op.GE:
            if lower is None:
                return every_value
            return Comparison(column, Op.GE if interval.lower_inclusive else Op.GT, lower)
        case Op.LE:
            if upper is None:
                return every_value
            return Comparison(column, Op.LE if interval.upper_inclusive else Op.LT, upper)
        case Op.GT:
            if upper is None:
                return no_value
            return Comparison(column, Op.GT if interval.upper_inclusive else Op.GE, upper)
    return None


# --- range merging --------------------------------------------------------------------------------


def merge_ranges(predicate: Predicate) -> Predicate:
    """Inside an AND, fold `<`, `<=`, `>`, `>=` and `Range` items on the same term into one `Range`."""
    if not isinstance(predicate, And):
        return predicate
    bounds: dict[str, list[Comparison]] = {}
    terms: dict[str, Term] = {}
    others: list[Predicate] = []
    for item in predicate.items:
        if isinstance(item, Comparison) and item.op in _RANGE_OPS:
            bounds.setdefault(item.term.key, []).append(item)
            terms[item.term.key] = item.term
        elif isinstance(item, Range):
            bounds.setdefault(item.term.key, []).extend(item.bounds())
            terms[item.term.key] = item.term
        else:
            others.append(item)
    merged: list[Predicate] = []
    for key, comparisons in bounds.items():
        merged.append(_merge(terms[key], comparisons))
    return and_(*others, *merged)


def _merge(term: Term, comparisons: list[Comparison]) -> Predicate:
    lower: Any = None
    lower_inclusive = True
    upper: Any = None
    upper_inclusive = True
    try:
        for comparison in comparisons:
            value, op = comparison.value, comparison.op
            if op in (Op.GT, Op.GE):
                inclusive = op is Op.GE
                if lower is None or value > lower or (value == lower and not inclusive):
                    lower, lower_inclusive = value, inclusive
            else:
                inclusive = op is Op.LE
                if upper is None or value < upper or (value == upper and not inclusive):
                    upper, upper_inclusive = value, inclusive
        if (
            lower is not None
            and upper is not None
            and (lower > upper or (lower == upper and not (lower_inclusive and upper_inclusive)))
        ):
            # FALSE for every value, NULL for NULL: exactly what the conjunction of the bounds is.
            return InList(term, ())
    except TypeError:
        return and_(*comparisons)
    if len(comparisons) == 1:
        return comparisons[0]
    return Range(term, lower, lower_inclusive, upper, upper_inclusive)
