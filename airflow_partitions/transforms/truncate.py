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
    OrderPreservingTransform,
    decimal_from_unscaled,
    decimal_unscaled,
)

if TYPE_CHECKING:
    import numpy.typing as npt
    import pyarrow as pa

MAX_CODE_POINT = 0x10FFFF
# Widths below 2**32 keep every intermediate product of the 128-bit decimal floor inside 64 bits.
_WORD_WIDTH_LIMIT = 1 << 32
_SURROGATES = range(0xD800, 0xE000)


class TruncateTransform(OrderPreservingTransform):
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

    def _result_type(self, source_type: pa.DataType) -> pa.DataType | None:
        from airflow_partitions.transforms import arrow_support as support  # lazy: loads pyarrow

        if (
            support.is_integer(source_type)
            or support.is_decimal(source_type)
            or support.is_string(source_type)
            or support.is_binary(source_type)
        ):
            return source_type
        return None

    def _allows_result_type(self, result_type: pa.DataType) -> bool:
        from airflow_partitions.transforms import arrow_support as support  # lazy: loads pyarrow

        # Truncation bounds decimals and binary to few, short values: fine as partition values.
        return (
            super()._allows_result_type(result_type)
            or support.is_decimal(result_type)
            or support.is_binary(result_type)
        )

    # --- evaluation ---------------------------------------------------------------------------------

    def _apply_array(self, values: pa.Array) -> pa.Array:
        import pyarrow.compute as pc

        from airflow_partitions.transforms import arrow_support as support  # lazy: loads pyarrow

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

        from airflow_partitions.transforms import arrow_support as support  # lazy: loads pyarrow

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
        import pyarrow as pa

        if pa.types.is_decimal128(values.type) and self.width < _WORD_WIDTH_LIMIT:
            floored = _floor_decimal128(values, self.width)
            if floored is not None:
                return floored
        # decimal256, very wide widths, or an overflow to report: exact Python integers, row by row.
        bound = self.bind(values.type)
        return pa.array([bound.apply_scalar(v) for v in values.to_pylist()], values.type)

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

    def _spark_form(self, column: Any, source: pa.DataType) -> Any:
        from airflow_partitions.transforms import spark  # lazy: loads pyspark

        # The width in the column's scale: truncate(100, d) of a decimal(9, 2) floors to multiples of 1.00.
        scale = getattr(source, "scale", None)
        step = None if scale is None else decimal_from_unscaled(self.width, scale)
        return spark.truncate_column(column, source, self.width, step, self.apply)

    # --- pruning ------------------------------------------------------------------------------------

    def preimage(self, partition_value: Any) -> Interval | None:
        if partition_value is None:
            return None
        value = self._coerce_scalar(partition_value)
        if isinstance(value, bool):
            raise self._scalar_error(value, "an int, Decimal, str or bytes")
        # A value that truncate cannot produce (not a multiple of W, longer than W) has no preimage.
        if isinstance(value, int):
            return Interval(value, value + self.width) if value % self.width == 0 else None
        if isinstance(value, Decimal):
            unscaled, scale = decimal_unscaled(value, self._info.scale if self._info is not None else None)
            if unscaled % self.width != 0:
                return None
            return Interval(value, decimal_from_unscaled(unscaled + self.width, scale))
        if isinstance(value, str | bytes):
            if len(value) > self.width:
                return None
            if len(value) < self.width:
                # Shorter than W: only the value itself truncates to it.
                return Interval(value, value, lower_inclusive=True, upper_inclusive=True)
            return Interval(value, _prefix_successor(value))
        raise self._scalar_error(value, "an int, Decimal, str or bytes")


def _floor_decimal128(values: pa.Array, width: int) -> pa.Array | None:
    """Floor every unscaled decimal128 value to a multiple of `width` (< 2**32) with 128-bit numpy math.

    Each value is `hi * 2**64 + lo` (hi signed, lo unsigned), so `v mod W` is
    `((hi mod W) * (2**64 mod W) + lo mod W) mod W`, where every product stays below 2**64. Returns None
    when a floor falls below the column's precision, so the caller can report that row.
    """
    import numpy as np

    from airflow_partitions.transforms import arrow_support as support  # lazy: loads pyarrow

    data_type = values.type
    count = len(values)
    words = np.frombuffer(values.buffers()[1], dtype="<u8", count=(values.offset + count) * 2)
    words = words.reshape(-1, 2)[values.offset :]
    low, high = words[:, 0], words[:, 1].view(np.int64)
    modulus = np.uint64(width)
    high_mod = np.mod(high, np.int64(width)).astype(np.uint64)
    remainder: npt.NDArray[Any] = (high_mod * np.uint64((1 << 64) % width)) % modulus
    remainder = (remainder + low % modulus) % modulus
    floored_low = low - remainder
    floored_high = high - (low < remainder).astype(np.int64)
    # The smallest value the column's precision allows, split the same way (floor division keeps lo >= 0).
    limit_high, limit_low = divmod(-(10**data_type.precision - 1), 1 << 64)
    below = (floored_high < limit_high) | (
        (floored_high == limit_high) & (floored_low < np.uint64(limit_low))
    )
    if support.only_valid(below, values).any():
        return None
    out = np.empty((count, 2), dtype="<u8")
    out[:, 0] = floored_low
    out[:, 1] = floored_high.view(np.uint64)
    return support.from_numpy(out.reshape(-1).view(np.uint8), data_type, values)


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
