"""`multi_bucket(N, a, b, ...)`: the Lance partitioning spec's hash of several columns into N buckets.

The Lance spec defines the transform as `abs(murmur3_multi(col0, col1, ...)) % N` with an int32 result,
where `murmur3_multi` "computes the Murmur3 hash across multiple columns. Returns a signed 32-bit
integer. NULL fields are ignored during hashing; returns NULL only if all inputs are NULL", and
`murmur3` is "the 32-bit Murmur3 hash (x86 variant, seed 0)".

The bytes hashed for one row are the bytes of its non-NULL fields, concatenated in the order the columns
are written (no separators, no lengths), each field encoded as:

* signed and unsigned integers: little-endian two's complement at the column's own width (an int8 is one
  byte, an int64 eight), as Lance's reference implementation stores them;
* float32 / float64: the little-endian IEEE 754 bits at their width, with -0.0 hashed as 0.0 and every
  NaN as the canonical quiet NaN (equal values must land in one bucket, and SQL finds -0.0 = 0.0);
* dates: int32 days since 1970-01-01, little-endian (Arrow date32);
* timestamps (naive or tz-aware, any unit): int64 microseconds since 1970-01-01T00:00 UTC, little-endian
  (naive values are UTC wall time; nanoseconds are floored, as every engine here holds microseconds);
* strings: UTF-8; binary: the bytes as they are.

Lance's reference implementation falls back to an engine's display text for every other type (booleans,
decimals, times, intervals, UUIDs, nested values); the spec does not define those bytes and engines print
them differently, so such columns are refused when the spec loads.

The hash is Murmur3 x86_32 with seed 0 (`murmur3.py`, `arrow_hash.py`: the same core as `bucket`), read
as a signed 32-bit `h`; the bucket is `abs(h) % N` computed without overflow, so `h = -2**31` gives
`2**31 % N` (Iceberg's `bucket` masks the sign bit instead; the Lance spec says `abs`). A row whose fields
are all NULL has the NULL bucket.
"""

from __future__ import annotations

import copy
import datetime as dt
import math
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Self

from airflow_partitions.exceptions import PartitionExpressionError, PartitionValueError
from airflow_partitions.transforms import murmur3
from airflow_partitions.transforms.base import (
    Transform,
    canonical_identifier,
    date_to_days,
    datetime_to_micros,
)
from airflow_partitions.transforms.projection import UNKNOWN, Op, Projection, ValueSet

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import pyarrow as pa

MAX_BUCKETS = 1_000_000
MIN_COLUMNS = 2
ACCEPTED_TYPES = (
    "int8, int16, int32, int64, uint8, uint16, uint32, uint64, float32, float64, date, timestamp "
    "(naive or with a time zone), string and binary"
)
_FLOAT_NAN_BITS = {4: b"\x00\x00\xc0\x7f", 8: b"\x00\x00\x00\x00\x00\x00\xf8\x7f"}
_INT_FORMATS = {8: "b", 16: "h", 32: "i", 64: "q"}
_UINT_FORMATS = {8: "B", 16: "H", 32: "I", 64: "Q"}


def bucket_of_hash(signed_hash: int, num_buckets: int) -> int:
    """The Lance spec's `abs(h) % N` of a signed 32-bit hash (abs taken without overflow)."""
    return abs(signed_hash) % num_buckets


def unsupported_type_reason(data_type: pa.DataType) -> str | None:
    """Why a column of `data_type` cannot feed multi_bucket, or None when its bytes are defined."""
    import pyarrow as pa

    from airflow_partitions.transforms import arrow_support as support  # lazy: loads numpy and pyarrow

    source = support.normalize_type(data_type)
    if (
        support.is_integer(source)
        or pa.types.is_float32(source)
        or pa.types.is_float64(source)
        or support.is_date(source)
        or support.is_timestamp(source)
        or support.is_string(source)
        or ((support.is_binary(source) or support.is_fixed_binary(source)) and not support.is_uuid(source))
    ):
        return None
    if support.is_boolean(source):
        what = "booleans"
    elif support.is_decimal(source):
        what = "decimals"
    elif support.is_uuid(source):
        what = "UUIDs"
    else:
        what = f"{data_type} values"
    return (
        f"the Lance spec defines no bytes for {what} (its reference implementation hashes an engine's "
        "display text, which engines print differently)"
    )


class MultiBucketTransform(Transform):
    """`multi_bucket(N, a, b, ...)`: Murmur3 of several columns' bytes into int32 buckets 0..N-1."""

    name: ClassVar[str] = "multi_bucket"
    accepts: ClassVar[str] = ACCEPTED_TYPES

    def __init__(self, source_columns: Sequence[str], num_buckets: int) -> None:
        columns = tuple(source_columns)
        if len(columns) < MIN_COLUMNS:
            raise ValueError(f"multi_bucket needs at least {MIN_COLUMNS} columns, got {len(columns)}")
        if not 0 < num_buckets <= MAX_BUCKETS:
            raise ValueError(f"num_buckets must be in 1..{MAX_BUCKETS}, got {num_buckets}")
        super().__init__(columns[0])
        self._columns = columns
        self._types: tuple[pa.DataType, ...] | None = None
        self.num_buckets = num_buckets

    # --- identity -----------------------------------------------------------------------------------

    @property
    def source_column(self) -> str:
        # A caller asking for "the" column would silently read one of several: make it fail loudly.
        raise PartitionExpressionError(
            f"partition expression {self.canonical!r} reads {len(self._columns)} columns "
            f"({', '.join(self._columns)}); this code path takes one column per partition field"
        )

    @property
    def source_columns(self) -> tuple[str, ...]:
        return self._columns

    def renamed(self, rename: Callable[[str], str]) -> Self:
        moved = copy.copy(self)
        moved._columns = tuple(rename(column) for column in self._columns)
        moved._source_column = moved._columns[0]
        return moved

    @property
    def canonical(self) -> str:
        columns = ", ".join(canonical_identifier(column) for column in self._columns)
        return f"multi_bucket({self.num_buckets}, {columns})"

    @property
    def monotonic(self) -> bool:
        return False

    @property
    def null_preserving(self) -> bool:
        # NULL only when every field is NULL: a NULL in one column alone still has a bucket.
        return False

    @property
    def has_preimage(self) -> bool:
        return False

    # --- types --------------------------------------------------------------------------------------

    @property
    def source_types(self) -> tuple[pa.DataType, ...] | None:
        return self._types

    @property
    def is_bound(self) -> bool:
        return self._types is not None

    def bind(self, source_type: pa.DataType) -> Self:
        raise PartitionExpressionError(
            f"partition expression {self.canonical!r} reads {len(self._columns)} columns; bind it with "
            "bind_columns(<one arrow type per column>)"
        )

    def bind_columns(self, source_types: Sequence[pa.DataType]) -> Self:
        types = tuple(source_types)
        if len(types) != len(self._columns):
            raise PartitionExpressionError(
                f"partition expression {self.canonical!r}: {len(types)} column types given for "
                f"{len(self._columns)} columns"
            )
        for column, data_type in zip(self._columns, types, strict=True):
            reason = unsupported_type_reason(data_type)
            if reason is not None:
                raise PartitionExpressionError(
                    f"partition expression {self.canonical!r}: column {column!r} has type {data_type}, "
                    f"which multi_bucket cannot hash: {reason}. multi_bucket accepts {ACCEPTED_TYPES}; "
                    f"cast the column in the source, or partition by it in its own partition_by entry"
                )
        bound = copy.copy(self)
        bound._types = types
        bound._source_type = types[0]
        return bound

    @property
    def result_type(self) -> pa.DataType:
        import pyarrow as pa

        return pa.int32()

    def result_type_for(self, source_type: pa.DataType) -> pa.DataType:
        import pyarrow as pa

        return pa.int32()

    def _fixed_result_type(self) -> pa.DataType:
        import pyarrow as pa

        return pa.int32()

    def _result_type(self, source_type: pa.DataType) -> pa.DataType | None:
        import pyarrow as pa

        return pa.int32() if unsupported_type_reason(source_type) is None else None

    # --- evaluation ---------------------------------------------------------------------------------

    def _require_types(self) -> tuple[pa.DataType, ...]:
        if self._types is None:
            raise PartitionExpressionError(
                f"partition expression {self.canonical!r}: the bytes hashed depend on the column types; "
                "call .bind_columns(<arrow types>) first"
            )
        return self._types

    def apply(self, values: Any) -> Any:
        raise PartitionExpressionError(
            f"partition expression {self.canonical!r} reads {len(self._columns)} columns; evaluate it with "
            "apply_columns(<one array per column>) or apply_table(<table>)"
        )

    def apply_columns(self, arrays: Sequence[Any]) -> Any:
        """The buckets of rows whose fields are `arrays` (one per column, in order), vectorised.

        Every array is first brought to the column's bound type (an engine may hand a uint8 widened to
        int16, or a timestamp in another unit): the bytes follow the spec's column type, not the engine's.
        """
        import pyarrow as pa

        from airflow_partitions.transforms import arrow_support as support  # lazy: loads numpy and pyarrow

        types = self._require_types()
        if len(arrays) != len(types):
            raise PartitionExpressionError(
                f"partition expression {self.canonical!r}: {len(arrays)} arrays given for "
                f"{len(types)} columns"
            )
        chunked = any(isinstance(array, pa.ChunkedArray) for array in arrays)
        combined = []
        for array, data_type in zip(arrays, types, strict=True):
            arrow = support.as_arrow(array)
            if isinstance(arrow, pa.ChunkedArray):
                arrow = arrow.combine_chunks() if arrow.num_chunks != 1 else arrow.chunk(0)
            if pa.types.is_dictionary(arrow.type):
                arrow = arrow.dictionary_decode()
            both_timestamps = pa.types.is_timestamp(arrow.type) and pa.types.is_timestamp(data_type)
            if arrow.type != data_type and not both_timestamps:
                # Timestamps of any unit and zone hash as UTC microseconds: only other types are cast.
                arrow = arrow.cast(data_type)
            combined.append(support.normalize_array(arrow))
        lengths = {len(array) for array in combined}
        if len(lengths) != 1:
            raise PartitionExpressionError(
                f"partition expression {self.canonical!r}: columns of different lengths {sorted(lengths)}"
            )
        result = multi_bucket_array(combined, self.num_buckets)
        return pa.chunked_array([result], type=pa.int32()) if chunked else result

    def apply_table(self, table: Any) -> Any:
        return self.apply_columns([table.column(column) for column in self._columns])

    def apply_row(self, values: Sequence[Any] | Mapping[str, Any]) -> int | None:
        """The bucket of one row given as its field values (in column order, or by column name)."""
        if isinstance(values, Mapping):
            values = [values.get(column) for column in self._columns]
        types = self._require_types()
        if len(values) != len(types):
            raise PartitionValueError(
                f"partition expression {self.canonical!r}: {len(values)} values given for "
                f"{len(types)} columns"
            )
        if all(value is None for value in values):
            return None
        data = b"".join(
            field_bytes(value, data_type, self.canonical)
            for value, data_type in zip(values, types, strict=True)
            if value is not None
        )
        return bucket_of_hash(murmur3.hash_bytes(data), self.num_buckets)

    def apply_scalar(self, value: Any) -> Any:
        raise PartitionValueError(
            f"partition expression {self.canonical!r} reads {len(self._columns)} columns; evaluate one row "
            "with apply_row(<one value per column>)"
        )

    def _apply_array(self, values: pa.Array) -> pa.Array:
        raise PartitionExpressionError(f"partition expression {self.canonical!r}: use apply_columns")

    def _apply_scalar(self, value: Any) -> Any:
        raise PartitionValueError(f"partition expression {self.canonical!r}: use apply_row")

    def to_spark(self, column: Any) -> Any:
        raise PartitionExpressionError(
            f"partition expression {self.canonical!r} reads {len(self._columns)} columns; use "
            "to_spark_columns(<one Spark column per source column>)"
        )

    def to_spark_columns(self, columns: Sequence[Any]) -> Any:
        """The same buckets in Spark: an Arrow UDF running `apply_columns` on Spark's Arrow batches.

        Spark's own `hash()` is Murmur3 with seed 42 over Spark's encoding of each argument (its string
        tail is mixed byte by byte, not as Murmur3's tail), so it cannot give these values.
        """
        from airflow_partitions.transforms import arrow_support, spark  # lazy: loads pyarrow and pyspark

        types = self.source_types
        if types is None:
            raise PartitionExpressionError(
                f"partition expression {self.canonical!r}: to_spark_columns needs the column types; call "
                ".bind_columns(<arrow types>) first"
            )
        if len(columns) != len(types):
            raise PartitionExpressionError(
                f"partition expression {self.canonical!r}: {len(columns)} Spark columns for "
                f"{len(types)} source columns"
            )
        # Each batch array is brought back to the column's bound type inside the kernel (Spark widens
        # uint8 to SHORT, holds uint64 as DECIMAL(20,0)); timestamps hash as UTC microseconds.
        if any(arrow_support.is_timestamp(t) and arrow_support.normalize_type(t).tz is None for t in types):
            spark.require_utc_session(self.canonical, self.source_columns)
        # Strings byte-wise whatever their Spark collation, as every transform reads them.
        columns = [
            spark.binary_collation(c) if arrow_support.is_string(arrow_support.normalize_type(t)) else c
            for c, t in zip(columns, types, strict=True)
        ]
        return spark.multi_bucket_column(self.apply_columns, columns)

    # --- pruning: one value per column, all columns pinned -------------------------------------------

    def project(self, op: Op, value: Any) -> Projection:
        return UNKNOWN

    def project_in(self, values: Sequence[Any]) -> Projection:
        return UNKNOWN

    def project_range(self, *args: Any, **kwargs: Any) -> Projection:
        return UNKNOWN

    def project_rows(self, rows: Sequence[Sequence[Any]]) -> Projection:
        """Rows whose every column is pinned to a value (`a = 1 AND b IN ('x', 'y')`, one tuple per
        combination): they can only lie in the buckets of those tuples. NULL literals never match."""
        try:
            images = list(dict.fromkeys(self.apply_row(row) for row in rows))
        except (PartitionValueError, PartitionExpressionError, TypeError, ValueError, OverflowError):
            return UNKNOWN
        return Projection(ValueSet(images))


def field_bytes(value: Any, data_type: pa.DataType, canonical: str = "multi_bucket") -> bytes:
    """The bytes one non-NULL field contributes (see the module docstring); the scalar twin of
    `field_layouts`. Raises `PartitionValueError` when `value` does not fit the column type."""
    from airflow_partitions.transforms import arrow_support as support  # lazy: loads numpy and pyarrow

    source = support.normalize_type(data_type)
    info = support.source_info(source)

    def wrong(expected: str) -> PartitionValueError:
        return PartitionValueError(
            f"partition expression {canonical!r}: cannot hash {value!r} ({type(value).__name__}) for a "
            f"column of type {data_type}; expected {expected}"
        )

    if info.kind in ("int", "uint"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong("an int")
        formats = _INT_FORMATS if info.kind == "int" else _UINT_FORMATS
        try:
            return struct.pack("<" + formats[info.bit_width], value)
        except struct.error as err:
            raise PartitionValueError(
                f"partition expression {canonical!r}: {value} does not fit the column type {data_type}"
            ) from err
    if _is_float(source):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise wrong("a float")
        width = source.bit_width // 8
        number = float(value)
        if math.isnan(number):
            return _FLOAT_NAN_BITS[width]
        if number == 0.0:
            number = 0.0
        if width == 4:
            packed = struct.pack("<f", number)
            if struct.unpack("<f", packed)[0] != number and not math.isinf(number):
                raise PartitionValueError(
                    f"partition expression {canonical!r}: {value!r} is not a float32 value"
                )
            return packed
        return struct.pack("<d", number)
    if info.kind == "date":
        if isinstance(value, dt.datetime) or not isinstance(value, dt.date):
            raise wrong("a datetime.date")
        return struct.pack("<i", date_to_days(value))
    if info.kind == "timestamp":
        if isinstance(value, dt.datetime):
            return struct.pack("<q", datetime_to_micros(value))
        if isinstance(value, dt.date):
            return struct.pack("<q", date_to_days(value) * 86_400_000_000)
        raise wrong("a datetime.datetime")
    if info.kind == "string":
        if not isinstance(value, str):
            raise wrong("a str")
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as err:
            raise PartitionValueError(f"string {value!r} is not valid Unicode (lone surrogate)") from err
    if info.kind == "binary" and not support.is_uuid(source):
        if not isinstance(value, bytes | bytearray | memoryview):
            raise wrong("bytes")
        return bytes(value)
    raise PartitionValueError(
        f"partition expression {canonical!r}: no bytes defined for type {data_type}: "
        f"{unsupported_type_reason(data_type)}"
    )


def _is_float(data_type: pa.DataType) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_float32(data_type) or pa.types.is_float64(data_type))


# --- vectorised ----------------------------------------------------------------------------------


def field_layouts(
    array: pa.Array,
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(bytes, start of each row's field, byte length of each row's field; 0 for NULL) of one column."""
    import numpy as np
    import pyarrow as pa

    from airflow_partitions.transforms import arrow_support as support  # lazy: loads numpy and pyarrow

    data_type = array.type
    count = len(array)
    raw: npt.NDArray[Any]
    if support.is_timestamp(data_type):
        raw = np.ascontiguousarray(support.timestamp_micros(array), dtype="<i8")
    elif support.is_date(data_type):
        raw = np.ascontiguousarray(support.fixed_width_values(array, np.dtype(np.int32)), dtype="<i4")
    elif support.is_integer(data_type):
        dtype = np.dtype(data_type.to_pandas_dtype()).newbyteorder("<")
        raw = np.ascontiguousarray(support.fixed_width_values(array, dtype))
    elif pa.types.is_float32(data_type) or pa.types.is_float64(data_type):
        dtype = np.dtype(np.float32 if pa.types.is_float32(data_type) else np.float64).newbyteorder("<")
        values = np.array(support.fixed_width_values(array, dtype), dtype=dtype)
        values[values == 0] = 0.0  # -0.0 hashes as 0.0
        nan = np.isnan(values)
        if nan.any():
            bits = values.view(np.dtype(f"<u{dtype.itemsize}"))
            bits[nan] = int.from_bytes(_FLOAT_NAN_BITS[dtype.itemsize], "little")
        raw = values
    elif support.is_string(data_type) or support.is_binary(data_type) or support.is_fixed_binary(data_type):
        data, starts, lengths = support.binary_layout(array)
        lengths = lengths.astype(np.int64, copy=True)
        mask = support.valid_mask(array)
        if mask is not None:
            lengths[~mask] = 0
        return data, starts.astype(np.int64, copy=False), lengths
    else:
        raise PartitionExpressionError(
            f"multi_bucket cannot hash {data_type}: {unsupported_type_reason(data_type)}"
        )
    width = raw.dtype.itemsize
    data = raw.view(np.uint8).reshape(-1)
    starts = np.arange(count, dtype=np.int64) * width
    lengths = np.full(count, width, dtype=np.int64)
    mask = support.valid_mask(array)
    if mask is not None:
        lengths[~mask] = 0
    return data, starts, lengths


def field_bytes_array(array: pa.Array) -> pa.Array:
    """The bytes each row's field contributes, as a binary array (NULL for NULL): for DuckDB, which
    concatenates them in SQL (`field_layouts` as Arrow)."""
    import numpy as np
    import pyarrow as pa

    from airflow_partitions.transforms import arrow_support as support  # lazy: loads numpy and pyarrow

    array = support.normalize_array(array)
    if support.is_string(array.type) or support.is_binary(array.type) or support.is_fixed_binary(array.type):
        return array.cast(pa.binary())
    data, _starts, lengths = field_layouts(array)
    width = int(data.size // max(len(array), 1)) if len(array) else 1
    validity = None if array.null_count == 0 else pa.array(lengths > 0).buffers()[1]
    fixed = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(width), len(array), [validity, pa.py_buffer(np.ascontiguousarray(data))]
    )
    return fixed.cast(pa.binary())


def concatenated_fields(
    arrays: Sequence[pa.Array],
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(bytes, starts, lengths) of each row's non-NULL fields concatenated in column order."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from airflow_partitions.transforms import arrow_support as support  # lazy: loads numpy and pyarrow

    # Each field as binary, NULL as no bytes at all ('replace' with b""; pyarrow's 'skip' mode drops rows
    # whose every field is NULL), joined element-wise with no separator.
    fields = [field_bytes_array(array).cast(pa.large_binary()) for array in arrays]
    joined = pc.binary_join_element_wise(
        *fields, pa.scalar(b"", pa.large_binary()), null_handling="replace", null_replacement=""
    )
    if len(joined) != len(arrays[0]):
        raise PartitionExpressionError("multi_bucket: the joined fields lost rows")
    data, starts, lengths = support.binary_layout(joined)
    return data, starts.astype("int64", copy=False), lengths.astype("int64", copy=False)


def multi_bucket_hashes(arrays: Sequence[pa.Array]) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.bool_]]:
    """(signed Murmur3 of each row's concatenated fields, mask of rows with at least one field)."""
    import numpy as np

    from airflow_partitions.transforms import arrow_hash  # lazy: loads numpy and pyarrow
    from airflow_partitions.transforms import arrow_support as support  # lazy: loads numpy and pyarrow

    count = len(arrays[0])
    present = np.zeros(count, dtype=bool)
    for array in arrays:
        mask = support.valid_mask(array)
        present |= np.ones(count, dtype=bool) if mask is None else mask
    data, starts, lengths = concatenated_fields(arrays)
    if count == 0:
        return np.zeros(0, dtype=np.int32), present
    return arrow_hash.hash_ragged(data, starts, lengths).view(np.int32), present


def multi_bucket_array(arrays: Sequence[pa.Array], num_buckets: int) -> pa.Array:
    """int32 buckets `abs(h) % N` of normalised, equally long arrays; NULL where every field is NULL."""
    import pyarrow as pa

    hashes, present = multi_bucket_hashes(arrays)
    return pa.array(buckets_of_hashes(hashes, num_buckets), type=pa.int32(), mask=~present)


def buckets_of_hashes(hashes: npt.NDArray[np.int32], num_buckets: int) -> npt.NDArray[np.int32]:
    """`abs(h) % N` of signed 32-bit hashes, abs taken in 64 bits (no overflow at the int32 minimum)."""
    import numpy as np

    return (np.abs(hashes.astype(np.int64)) % num_buckets).astype(np.int32)
