"""Coerce filter literals to the Arrow type of the term they are compared with, as DuckDB would cast them.

A literal either converts exactly (`'2026-01-01'` against a timestamp column is midnight UTC), or falls
strictly between two representable values of the type (`2.5` against an integer column, a 10:30 timestamp
against a date column, `1000` against an int8 column): `Between(below, above)` then lets the caller rewrite
the comparison exactly (`c < 2.5` is `c <= 2`, `c = 2.5` is never true). Anything else is a `FilterError`
naming the column, its type and the literal.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal, InvalidOperation
from typing import Any

import pyarrow as pa

from airflow_partitions.exceptions import FilterError

_EPOCH = dt.datetime(1970, 1, 1)
_TZ_SUFFIX = re.compile(r"(Z|[+-]\d{2}(:?\d{2})?)$")
_TRUE_TEXTS = frozenset({"true", "t", "yes", "y", "1"})
_FALSE_TEXTS = frozenset({"false", "f", "no", "n", "0"})


@dataclass(frozen=True, slots=True)
class Between:
    """The literal lies strictly between `below` and `above` (either `None` when out of the type's range)."""

    below: Any
    above: Any


Coerced = Any  # the converted value, or a `Between`


def type_label(kind: pa.DataType) -> str:
    """Short type name for messages: `int64`, `timestamp[us, tz=UTC]`, `string`."""
    return str(kind)


def _mismatch(column: str, kind: pa.DataType, value: Any, hint: str = "") -> FilterError:
    shown = repr(value) if not isinstance(value, str) else "'" + value + "'"
    extra = f"; {hint}" if hint else ""
    return FilterError(
        f"cannot compare column {column!r} of type {type_label(kind)} with {shown} "
        f"({type(value).__name__}){extra}"
    )


def is_integer_type(kind: pa.DataType) -> bool:
    return bool(pa.types.is_integer(kind))


def is_string_type(kind: pa.DataType) -> bool:
    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind))


def is_binary_type(kind: pa.DataType) -> bool:
    return bool(
        pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_fixed_size_binary(kind)
        or pa.types.is_binary_view(kind)
    )


def integer_bounds(kind: pa.DataType) -> tuple[int, int]:
    width = kind.bit_width
    if pa.types.is_signed_integer(kind):
        return -(1 << (width - 1)), (1 << (width - 1)) - 1
    return 0, (1 << width) - 1


def coerce_literal(value: Any, kind: pa.DataType, *, column: str) -> Coerced:
    """`value` as a Python value of Arrow type `kind`, or a `Between`; raises `FilterError` on a mismatch.

    Strings convert like DuckDB casts a string literal to the column's type (numbers, ISO dates and
    timestamps, booleans); typed values (int, Decimal, float, date, datetime, bytes, bool) convert only
    to compatible types.
    """
    if value is None:
        raise FilterError(f"NULL literal compared with column {column!r}; use IS NULL / IS NOT NULL")
    if pa.types.is_dictionary(kind):
        return coerce_literal(value, kind.value_type, column=column)
    if is_integer_type(kind):
        return _to_integer(value, kind, column)
    if pa.types.is_floating(kind):
        return _to_float(value, kind, column)
    if pa.types.is_decimal(kind):
        return _to_decimal(value, kind, column)
    if is_string_type(kind):
        if isinstance(value, str):
            return value
        raise _mismatch(column, kind, value, "quote the value to compare with a string column, e.g. 'EU'")
    if is_binary_type(kind):
        if isinstance(value, bytes | bytearray):
            return bytes(value)
        if isinstance(value, str):
            return value.encode("utf-8")
        raise _mismatch(column, kind, value)
    if pa.types.is_boolean(kind):
        return _to_bool(value, kind, column)
    if pa.types.is_date(kind):
        return _to_date(value, kind, column)
    if pa.types.is_timestamp(kind):
        return _to_timestamp(value, kind, column)
    raise FilterError(
        f"column {column!r} has type {type_label(kind)}, which filters cannot compare; "
        "filter on integer, float, decimal, string, binary, boolean, date or timestamp columns"
    )


# --- numbers --------------------------------------------------------------------------------------


def _number(value: Any, kind: pa.DataType, column: str) -> Decimal | float:
    if isinstance(value, bool):
        raise _mismatch(column, kind, value, "booleans do not compare with numbers")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, Decimal):
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, str):
        text = value.strip()
        try:
            number = Decimal(text)
        except InvalidOperation:
            raise _mismatch(column, kind, value, "the text is not a number") from None
        if number.is_nan() or number.is_infinite():
            return float(text)
        return number
    raise _mismatch(column, kind, value)


def _to_integer(value: Any, kind: pa.DataType, column: str) -> Coerced:
    low, high = integer_bounds(kind)
    number = _number(value, kind, column)
    if isinstance(number, float):
        if math.isnan(number) or number == math.inf:
            # DuckDB orders NaN above every number: both behave like a value above the type's range.
            return Between(high, None)
        if number == -math.inf:
            return Between(None, low)
        number = Decimal(repr(number))
    if number == number.to_integral_value():
        as_int = int(number)
        if low <= as_int <= high:
            return as_int
        return Between(high, None) if as_int > high else Between(None, low)
    below = int(number.to_integral_value(rounding=ROUND_FLOOR))
    above = int(number.to_integral_value(rounding=ROUND_CEILING))
    return Between(
        None if below < low else min(below, high),
        None if above > high else max(above, low),
    )


def _to_float(value: Any, kind: pa.DataType, column: str) -> Coerced:
    number = _number(value, kind, column)
    return float(number)


def _to_decimal(value: Any, kind: pa.DataType, column: str) -> Coerced:
    number = _number(value, kind, column)
    if isinstance(number, float):
        if math.isnan(number) or number == math.inf:
            return Between(_decimal_limit(kind), None)
        if number == -math.inf:
            return Between(None, -_decimal_limit(kind))
        number = Decimal(repr(number))
    quantum = Decimal(1).scaleb(-kind.scale)
    limit = _decimal_limit(kind)
    below = number.quantize(quantum, rounding=ROUND_FLOOR)
    above = number.quantize(quantum, rounding=ROUND_CEILING)
    if below == above:
        if -limit <= below <= limit:
            return below
        return Between(limit, None) if below > limit else Between(None, -limit)
    return Between(below if below >= -limit else None, above if above <= limit else None)


def _decimal_limit(kind: pa.DataType) -> Decimal:
    return (Decimal(10) ** kind.precision - 1).scaleb(-kind.scale)


def _to_bool(value: Any, kind: pa.DataType, column: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE_TEXTS:
            return True
        if text in _FALSE_TEXTS:
            return False
    raise _mismatch(column, kind, value, "use TRUE or FALSE")


# --- dates and times ------------------------------------------------------------------------------


def parse_date_text(text: str, *, column: str, kind: pa.DataType) -> dt.date:
    """An ISO date from `text`; like DuckDB's cast, a time part after the date is ignored."""
    stripped = text.strip()
    head = stripped[:10]
    try:
        parsed = dt.date.fromisoformat(head)
    except ValueError:
        raise _mismatch(column, kind, text, "write dates as 'YYYY-MM-DD'") from None
    rest = stripped[10:]
    if rest and rest[0] not in " T":
        raise _mismatch(column, kind, text, "write dates as 'YYYY-MM-DD'")
    return parsed


def parse_timestamp_text(text: str, *, column: str, kind: pa.DataType) -> dt.datetime:
    """An ISO timestamp from `text` (date only means midnight); aware when the text carries an offset."""
    stripped = text.strip()
    normalised = stripped[:-1] + "+00:00" if stripped.endswith(("Z", "z")) else stripped
    try:
        parsed = dt.datetime.fromisoformat(normalised)
    except ValueError:
        raise _mismatch(
            column, kind, text, "write timestamps as 'YYYY-MM-DD HH:MM:SS[.ffffff][+HH:MM]'"
        ) from None
    return parsed


def _to_date(value: Any, kind: pa.DataType, column: str) -> Coerced:
    if isinstance(value, str):
        return parse_date_text(value, column=column, kind=kind)
    if isinstance(value, dt.datetime):
        # DuckDB compares a date with a timestamp as timestamps: a time of day lies between two dates.
        naive = value.astimezone(dt.UTC).replace(tzinfo=None) if value.tzinfo is not None else value
        day = naive.date()
        if naive == dt.datetime.combine(day, dt.time()):
            return day
        return Between(day, day + dt.timedelta(days=1) if day < dt.date.max else None)
    if isinstance(value, dt.date):
        return value
    raise _mismatch(column, kind, value, "compare dates with 'YYYY-MM-DD' or DATE 'YYYY-MM-DD'")


def _to_timestamp(value: Any, kind: pa.DataType, column: str) -> Coerced:
    if isinstance(value, str):
        moment = parse_timestamp_text(value, column=column, kind=kind)
        if moment.tzinfo is not None and kind.tz is None:
            raise _mismatch(
                column,
                kind,
                value,
                "the column has no time zone (its values are UTC wall time); drop the offset",
            )
    elif isinstance(value, dt.datetime):
        moment = value
    elif isinstance(value, dt.date):
        moment = dt.datetime.combine(value, dt.time())
    else:
        raise _mismatch(column, kind, value, "compare timestamps with 'YYYY-MM-DD HH:MM:SS'")
    if kind.tz is None:
        if moment.tzinfo is not None:
            moment = moment.astimezone(dt.UTC).replace(tzinfo=None)
    else:
        moment = moment.replace(tzinfo=dt.UTC) if moment.tzinfo is None else moment.astimezone(dt.UTC)
    return _align_to_unit(moment, kind)


def _align_to_unit(moment: dt.datetime, kind: pa.DataType) -> Coerced:
    """Exact for units of a microsecond or finer; for s / ms, a value between two ticks is a `Between`."""
    step = {"s": 1_000_000, "ms": 1000}.get(kind.unit)
    if step is None:
        return moment
    naive = moment.replace(tzinfo=None)
    micros = (naive - _EPOCH) // dt.timedelta(microseconds=1)
    if micros % step == 0:
        return moment
    below = _EPOCH + dt.timedelta(microseconds=(micros // step) * step)
    above = below + dt.timedelta(microseconds=step)
    if moment.tzinfo is not None:
        below, above = below.replace(tzinfo=dt.UTC), above.replace(tzinfo=dt.UTC)
    return Between(below, above)
