"""The Iceberg truncate transform: integers and decimals floored to a multiple of W, strings cut to W.

Integers: `v - (((v % W) + W) % W)`, so negatives floor (-1 -> -W). Decimals: the same on the unscaled
value (`truncate(50, 10.65)` at scale 2 is 10.50). Strings keep their first W code points, binary its
first W bytes. The result has the column's type; a floor below the type's minimum (e.g. truncating
-128 of an int8 column by 10) raises `PartitionValueError` rather than wrapping around.
"""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_partitions.exceptions import PartitionValueError
from airflow_partitions.transforms.base import (
    Interval,
    Transform,
    decimal_from_unscaled,
    decimal_unscaled,
)

if TYPE_CHECKING:
    import pyarrow as pa

MAX_CODE_POINT = 0x10FFFF
_SURROGATES = range(0xD800, 0xE000)


class TruncateTransform(Transform):
    """`truncate(W, col)`: range partitions of width W (numbers) or prefixes of length W (text, bytes)."""

    name: ClassVar[str] = "truncate"
    accepts: ClassVar[str] = "integer, decimal, string and binary columns"

    def __init__(self, source_column: str, width: int) -> None:
        super().__init__(source_column)
        if width <= 0:
            raise ValueError(f"width must be positive, got {width}")
        self.width = width

    @property
    def canonical(self) -> str:
        return f"truncate({self.width}, {self.column_sql})"

    @property
    def monotonic(self) -> bool:
        return True

    def _result_type(self, source_type: pa.DataType) -> pa.DataType | None:
        from airflow_partitions.transforms import arrow_support as support

        if (
            support.is_integer(source_type)
            or support.is_decimal(source_type)
            or support.is_string(source_type)
            or support.is_binary(source_type)
        ):
            return source_type
        return None

    def _allows_result_type(self, result_type: pa.DataType) -> bool:
        from airflow_partitions.transforms import arrow_support as support

        # Truncation bounds decimals and binary to few, short values: fine as partition values.
        return (
            super()._allows_result_type(result_type)
            or support.is_decimal(result_type)
            or support.is_binary(result_type)
        )

    # --- evaluation ---------------------------------------------------------------------------------

    def _apply_array(self, values: pa.Array) -> pa.Array:
        import pyarrow.compute as pc

        from airflow_partitions.transforms import arrow_support as support

        data_type = values.type
        if support.is_integer(data_type):
            return self._truncate_integers(values)
        if support.is_decimal(data_type):
            return self._truncate_decimals(values)
        if support.is_string(data_type):
            # Arrow's "codeunits" for UTF-8 strings are code points, like Python slicing and Iceberg.
            return pc.utf8_slice_codeunits(values, 0, self.width)
        return pc.binary_slice(values, 0, self.width)

    def _truncate_integers(self, values: pa.Array) -> pa.Array:
        import numpy as np

        from airflow_partitions.transforms import arrow_support as support

        data_type = values.type
        dtype = np.dtype(data_type.to_pandas_dtype())
        raw = support.fixed_width_values(values, dtype)
        if support.is_unsigned_integer(data_type):
            wide = raw.astype(np.uint64)
            # Unsigned floors are never negative and never above the value: no overflow possible.
            floored = wide - np.remainder(wide, np.uint64(self.width))
            return support.from_numpy(floored.astype(dtype), data_type, values)
        wide = raw.astype(np.int64)
        if self.width > support.INT64_MAX:
            raise PartitionValueError(f"{self.canonical}: width {self.width} does not fit in 64 bits")
        floored = wide - np.mod(wide, np.int64(self.width))
        lowest = int(np.iinfo(dtype).min)
        # int64 floors below -2**63 wrap around to large positives: compare against the input too.
        broken = (floored > wide) | (floored < lowest)
        checked = support.only_valid(broken, values)
        if checked.any():
            bad = int(support.only_valid(wide, values)[np.argmax(checked)])
            raise self._overflow_error(bad, str(data_type))
        return support.from_numpy(floored.astype(dtype), data_type, values)

    def _truncate_decimals(self, values: pa.Array) -> pa.Array:
        import numpy as np
        import pyarrow as pa

        from airflow_partitions.transforms import arrow_support as support

        data_type = values.type
        words_per_value = data_type.byte_width // 8
        count = len(values)
        words = np.frombuffer(
            values.buffers()[1], dtype="<u8", count=(values.offset + count) * words_per_value
        ).reshape(-1, words_per_value)[values.offset :]
        low = words[:, 0].view(np.int64)
        sign_fill = (low >> 63).view(np.uint64)
        fits_int64 = (words[:, 1:] == sign_fill[:, None]).all(axis=1)
        wide_enough = self.width <= support.INT64_MAX // 2
        if wide_enough and support.only_valid(fits_int64, values).all():
            # Common case: every unscaled value fits in int64, so floor with numpy and rebuild in place.
            floored = low - np.mod(low, np.int64(self.width))
            # A floor below -2**63 wraps to a large positive; one below -10**precision needs more digits.
            broken = floored > low
            if data_type.precision < 19:
                broken |= floored <= -(10**data_type.precision)
            if not support.only_valid(broken, values).any():
                out = np.empty((count, words_per_value), dtype="<u8")
                out[:, 0] = floored.view(np.uint64)
                out[:, 1:] = (floored >> 63).view(np.uint64)[:, None]
                return support.from_numpy(out.reshape(-1).view(np.uint8), data_type, values)
        # Wider unscaled values (beyond 18 digits) or an overflow to report: exact Python integers.
        bound = self.bind(data_type)
        return pa.array([bound.apply_scalar(v) for v in values.to_pylist()], data_type)

    def _overflow_error(self, value: Any, type_name: str) -> PartitionValueError:
        return PartitionValueError(
            f"partition expression {self.canonical!r}: truncating {value} gives a value below the smallest "
            f"{type_name}; use a smaller width or cast the column to a wider type in the source"
        )

    def _apply_scalar(self, value: Any) -> Any:
        value = self._coerce_scalar(value)
        info = self._info
        if isinstance(value, bool):
            raise self._scalar_error(value, "an int, Decimal, str or bytes")
        if isinstance(value, int):
            floored = value - value % self.width
            if info is not None and info.kind in ("int", "uint"):
                lowest = -(1 << (info.bit_width - 1)) if info.kind == "int" else 0
                if floored < lowest:
                    raise self._overflow_error(value, f"int{info.bit_width}")
            return floored
        if isinstance(value, Decimal):
            unscaled, scale = decimal_unscaled(value, info.scale if info is not None else None)
            floored = unscaled - unscaled % self.width
            if info is not None and len(str(abs(floored))) > info.precision:
                raise self._overflow_error(value, f"decimal({info.precision}, {info.scale})")
            return decimal_from_unscaled(floored, scale)
        if isinstance(value, str):
            return value[: self.width]
        if isinstance(value, bytes | bytearray | memoryview):
            return bytes(value)[: self.width]
        raise self._scalar_error(value, "an int, Decimal, str or bytes")

    # --- pruning ------------------------------------------------------------------------------------

    def preimage(self, partition_value: Any) -> Interval | None:
        if partition_value is None:
            return None
        value = self._coerce_scalar(partition_value)
        if isinstance(value, bool):
            raise self._scalar_error(value, "an int, Decimal, str or bytes")
        if isinstance(value, int):
            return Interval(value, value + self.width)
        if isinstance(value, Decimal):
            unscaled, scale = decimal_unscaled(value, self._info.scale if self._info is not None else None)
            return Interval(value, decimal_from_unscaled(unscaled + self.width, scale))
        if isinstance(value, str | bytes):
            if len(value) < self.width:
                # Shorter than W: only the value itself truncates to it.
                return Interval(value, value, lower_inclusive=True, upper_inclusive=True)
            return Interval(value, _prefix_successor(value))
        raise self._scalar_error(value, "an int, Decimal, str or bytes")


def _prefix_successor(prefix: str | bytes) -> str | bytes | None:
    """The smallest value greater than every value starting with `prefix` (None: no such value)."""
    if isinstance(prefix, bytes):
        raw = bytearray(prefix)
        while raw and raw[-1] == 0xFF:
            raw.pop()
        if not raw:
            return None
        raw[-1] += 1
        return bytes(raw)
    chars = list(prefix)
    while chars and ord(chars[-1]) == MAX_CODE_POINT:
        chars.pop()
    if not chars:
        return None
    following = ord(chars[-1]) + 1
    if following in _SURROGATES:
        # Surrogates never occur in valid strings; the next real code point bounds the same set.
        following = _SURROGATES.stop
    chars[-1] = chr(following)
    return "".join(chars)
