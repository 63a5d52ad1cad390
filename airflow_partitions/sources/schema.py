"""Which Arrow type changes lose nothing: the one rule for unifying file schemas and casting columns."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

_TIMESTAMP_UNITS = ("s", "ms", "us", "ns")
_MAX_DECIMAL128_DIGITS = 38
_MAX_DECIMAL256_DIGITS = 76


def unify_types(left: pa.DataType, right: pa.DataType) -> pa.DataType | None:
    """The narrowest type holding every value of both, or None when only a lossy cast would unify them.

    Integers widen (a signed and an unsigned one to a signed type twice as wide), floats to the wider
    float, an integer and a float to float64 (each value is checked for exactness when cast: a float64
    holds integers exactly only up to 2^53), timestamps to the finer unit (naive and tz-aware never mix;
    two zones become UTC, the same instants), strings and binaries to their large forms, decimals to the
    precision and scale holding both. A NULL-only column takes the other type.
    """
    import pyarrow as pa
    import pyarrow.types as t

    if left == right:
        return left
    if t.is_dictionary(left):
        return unify_types(left.value_type, right)
    if t.is_dictionary(right):
        return unify_types(left, right.value_type)
    if t.is_null(left):
        return right
    if t.is_null(right):
        return left
    if t.is_integer(left) and t.is_integer(right):
        if t.is_signed_integer(left) == t.is_signed_integer(right):
            return left if left.bit_width >= right.bit_width else right
        signed, unsigned = (left, right) if t.is_signed_integer(left) else (right, left)
        width = max(signed.bit_width, unsigned.bit_width * 2)
        return {8: pa.int8(), 16: pa.int16(), 32: pa.int32(), 64: pa.int64()}.get(width)
    if t.is_floating(left) and t.is_floating(right):
        return left if left.bit_width >= right.bit_width else right
    if (t.is_integer(left) and t.is_floating(right)) or (t.is_floating(left) and t.is_integer(right)):
        return pa.float64()
    if t.is_timestamp(left) and t.is_timestamp(right):
        if (left.tz is None) != (right.tz is None):
            return None
        unit = max(left.unit, right.unit, key=_TIMESTAMP_UNITS.index)
        zone = left.tz if left.tz == right.tz else "UTC"
        return pa.timestamp(unit, zone)
    if _is_text(left) and _is_text(right):
        return pa.large_string()
    if _is_bytes(left) and _is_bytes(right):
        return pa.large_binary()
    if t.is_decimal(left) and t.is_decimal(right):
        scale = max(left.scale, right.scale)
        digits = scale + max(left.precision - left.scale, right.precision - right.scale)
        if digits <= _MAX_DECIMAL128_DIGITS:
            return pa.decimal128(digits, scale)
        if digits <= _MAX_DECIMAL256_DIGITS:
            return pa.decimal256(digits, scale)
    return None


def needs_exactness_check(source: pa.DataType, target: pa.DataType) -> bool:
    """True when `source` -> `target` is allowed but some values may not survive it (integers to float)."""
    import pyarrow.types as t

    return t.is_integer(source) and t.is_floating(target)


def widens_losslessly(source: pa.DataType, target: pa.DataType) -> bool:
    """True when every value of `source` casts to `target` unchanged, whatever the value."""
    return unify_types(source, target) == target and not needs_exactness_check(source, target)


def _is_text(data_type: pa.DataType) -> bool:
    import pyarrow.types as t

    return bool(t.is_string(data_type) or t.is_large_string(data_type))


def _is_bytes(data_type: pa.DataType) -> bool:
    import pyarrow.types as t

    return bool(t.is_binary(data_type) or t.is_large_binary(data_type))
