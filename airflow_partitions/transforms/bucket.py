"""The Iceberg bucket transform: Murmur3 x86_32 (seed 0) of the value's canonical bytes, modulo N.

Canonical bytes, as in the Iceberg spec (Appendix B): integers of any width widened to 64-bit
little-endian two's complement (uint64 by its bits), dates as days since 1970-01-01, timestamps as
microseconds since the epoch in UTC (nanoseconds floored), strings as UTF-8, binary and UUIDs as is,
decimals as the minimal big-endian two's-complement bytes of the unscaled value. The bucket is
`(hash & 0x7FFFFFFF) % N`, typed int64 (`bucket(N, c)`) or int32 (`bucket(N::int32, c)`).
"""

from __future__ import annotations

import datetime as dt
import functools
import uuid
from decimal import Decimal
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_partitions.exceptions import PartitionValueError
from airflow_partitions.transforms import murmur3
from airflow_partitions.transforms.base import (
    Transform,
    date_to_days,
    datetime_to_micros,
    decimal_unscaled,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import pyarrow as pa

MAX_BUCKETS = 1_000_000
_UINT64_LIMIT = 1 << 64
_INT64_MIN = -(1 << 63)


class BucketTransform(Transform):
    """`bucket(N, col)`: stable hash buckets 0..N-1, identical to Iceberg's and DuckLake's."""

    name: ClassVar[str] = "bucket"
    accepts: ClassVar[str] = "integer, date, timestamp, string, binary, decimal and UUID columns"

    def __init__(self, source_column: str, num_buckets: int, result_bits: int = 64) -> None:
        super().__init__(source_column)
        if not 0 < num_buckets <= MAX_BUCKETS:
            raise ValueError(f"num_buckets must be in 1..{MAX_BUCKETS}, got {num_buckets}")
        if result_bits not in (32, 64):
            raise ValueError(f"result_bits must be 32 or 64, got {result_bits}")
        self.num_buckets = num_buckets
        self.result_bits = result_bits

    @property
    def canonical(self) -> str:
        literal = str(self.num_buckets) if self.result_bits == 64 else f"{self.num_buckets}::int32"
        return f"bucket({literal}, {self.column_sql})"

    @property
    def monotonic(self) -> bool:
        return False

    def _fixed_result_type(self) -> pa.DataType:
        import pyarrow as pa

        return pa.int64() if self.result_bits == 64 else pa.int32()

    def _result_type(self, source_type: pa.DataType) -> pa.DataType | None:
        from airflow_partitions.transforms import arrow_support as support  # lazy: loads pyarrow

        accepted = (
            support.is_integer(source_type)
            or support.is_date(source_type)
            or support.is_timestamp(source_type)
            or support.is_string(source_type)
            or support.is_binary(source_type)
            or support.is_fixed_binary(source_type)
            or support.is_uuid(source_type)
            or support.is_decimal(source_type)
        )
        return self._fixed_result_type() if accepted else None

    # --- hashing ------------------------------------------------------------------------------------

    def hash_array(self, values: Any) -> Any:
        """Iceberg's signed 32-bit hash of every value (int32 array), NULL for NULL; vectorised."""
        import numpy as np
        import pyarrow as pa

        from airflow_partitions.transforms import arrow_support as support  # lazy: loads pyarrow

        arrow = support.as_arrow(values)
        self.result_type_for(arrow.type)

        def kernel(array: pa.Array) -> pa.Array:
            return support.from_numpy(_unsigned_hashes(array).view(np.int32), pa.int32(), array)

        return support.map_array(arrow, pa.int32(), kernel)

    def hash_scalar(self, value: Any) -> int:
        """Iceberg's signed 32-bit hash of one Python value (after checking it against a bound type)."""
        value = self._coerce_scalar(value)
        if isinstance(value, bool):
            raise self._scalar_error(value, "a non-boolean value (booleans cannot be bucketed)")
        if isinstance(value, int):
            if not _INT64_MIN <= value < _UINT64_LIMIT:
                raise PartitionValueError(
                    f"partition expression {self.canonical!r}: integer {value} does not fit in 64 bits"
                )
            return murmur3.hash_long(value)
        if isinstance(value, str):
            try:
                return murmur3.hash_bytes(value.encode("utf-8"))
            except UnicodeEncodeError as err:
                raise PartitionValueError(f"string {value!r} is not valid Unicode (lone surrogate)") from err
        if isinstance(value, bytes | bytearray | memoryview):
            return murmur3.hash_bytes(bytes(value))
        if isinstance(value, uuid.UUID):
            return murmur3.hash_bytes(value.bytes)
        if isinstance(value, Decimal):
            unscaled, _ = decimal_unscaled(value, self._info.scale if self._info is not None else None)
            return murmur3.hash_bytes(_minimal_twos_complement(unscaled))
        if isinstance(value, dt.datetime):
            return murmur3.hash_long(datetime_to_micros(value))
        if isinstance(value, dt.date):
            return murmur3.hash_long(date_to_days(value))
        raise self._scalar_error(value, "an int, str, bytes, UUID, Decimal, date or datetime")

    # --- evaluation ---------------------------------------------------------------------------------

    def _apply_array(self, values: pa.Array) -> pa.Array:
        from airflow_partitions.transforms import arrow_hash  # lazy: loads numpy
        from airflow_partitions.transforms import arrow_support as support  # lazy: loads pyarrow

        result_type = self._fixed_result_type()
        dtype = result_type.to_pandas_dtype()
        integers = _as_int64_words(values)
        if integers is not None:
            buckets = arrow_hash.bucket_int64(integers, self.num_buckets, dtype)
        else:
            buckets = arrow_hash.bucket_of_hashes(_unsigned_hashes(values), self.num_buckets, dtype)
        return support.from_numpy(buckets, result_type, values)

    def _apply_scalar(self, value: Any) -> int:
        return (self.hash_scalar(value) & 0x7FFFFFFF) % self.num_buckets

    def _spark_form(self, column: Any, source: pa.DataType) -> Any:
        from airflow_partitions.transforms import spark  # lazy: loads pyspark

        return spark.bucket_column(column, source, self.num_buckets, self.result_bits, self.apply)


def _minimal_twos_complement(unscaled: int) -> bytes:
    """Big-endian two's complement in the fewest bytes (Java's BigInteger.toByteArray)."""
    bits = unscaled.bit_length() if unscaled >= 0 else (unscaled + 1).bit_length()
    return unscaled.to_bytes(bits // 8 + 1, "big", signed=True)


def _unsigned_hashes(values: pa.Array) -> npt.NDArray[np.uint32]:
    """Unsigned Murmur3 hashes of a normalised array (arbitrary values under NULL slots)."""

    from airflow_partitions.transforms import arrow_hash  # lazy: loads numpy
    from airflow_partitions.transforms import arrow_support as support  # lazy: loads pyarrow

    integers = _as_int64_words(values)
    if integers is not None:
        return arrow_hash.hash_int64(integers)
    if support.is_decimal(values.type):
        return arrow_hash.hash_ragged(*_decimal_minimal_bytes(values))
    return arrow_hash.hash_ragged(*support.binary_layout(values))


def _as_int64_words(values: pa.Array) -> npt.NDArray[Any] | None:
    """The 64-bit integers Iceberg hashes for integer, date and timestamp arrays; None for others."""
    import numpy as np

    from airflow_partitions.transforms import arrow_support as support  # lazy: loads pyarrow

    data_type = values.type
    if support.is_integer(data_type):
        raw = support.fixed_width_values(values, np.dtype(data_type.to_pandas_dtype()))
        signed = support.is_signed_integer(data_type)
        return raw.astype(np.int64 if signed else np.uint64, copy=False)
    if support.is_date(data_type):
        return support.fixed_width_values(values, np.dtype(np.int32)).astype(np.int64)
    if support.is_timestamp(data_type):
        return support.timestamp_micros(values)
    return None


@functools.cache
def _bit_length_table() -> npt.NDArray[np.int64]:
    import numpy as np

    return np.array([i.bit_length() for i in range(256)], dtype=np.int64)


def _decimal_minimal_bytes(
    values: pa.Array,
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(big-endian bytes, starts, lengths) of each unscaled value's minimal two's-complement form."""
    import numpy as np

    width = values.type.byte_width
    count = len(values)
    raw = np.frombuffer(values.buffers()[1], dtype=np.uint8, count=(values.offset + count) * width)
    little_endian = raw[values.offset * width :].reshape(count, width)
    negative = little_endian[:, width - 1] >= 0x80
    # Significant bits of v, or of ~v for negatives (the sign bit is then implied): Java's bitLength.
    magnitude = np.where(negative[:, None], ~little_endian, little_endian)
    nonzero_from_top = (magnitude != 0)[:, ::-1]
    has_bits = nonzero_from_top.any(axis=1)
    top = width - 1 - nonzero_from_top.argmax(axis=1)
    top_byte = magnitude[np.arange(count), top]
    bit_length = np.where(has_bits, 8 * top + _bit_length_table()[top_byte], 0)
    lengths = bit_length // 8 + 1
    big_endian = np.ascontiguousarray(little_endian[:, ::-1]).reshape(-1)
    starts = np.arange(count, dtype=np.int64) * width + (width - lengths)
    return big_endian, starts, lengths.astype(np.int64)
