"""Arrow plumbing shared by the transforms: type families, normalised inputs, raw buffers and validity.

Imported lazily (inside methods) by the transform classes, so the package can be imported at DAG-parse
time without pyarrow or numpy. Kernels read fixed-width values straight from the data buffer (values
under NULL slots are arbitrary and are masked back to NULL afterwards) and rebuild the result around the
input's validity bitmap, so NULL in gives NULL out with no extra pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from airflow_partitions.exceptions import PartitionValueError

MICROS_PER_SECOND = 1_000_000
# Ticks of each timestamp unit per second.
UNIT_TICKS_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
INT64_MAX = (1 << 63) - 1


# --- type families --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SourceInfo:
    """What the scalar code paths need to know about a bound source type, without importing pyarrow."""

    kind: str  # int | uint | bool | string | binary | uuid | decimal | date | timestamp | other
    bit_width: int = 0
    scale: int = 0
    precision: int = 0
    tz_aware: bool = False
    unit: str = ""


def normalize_type(data_type: pa.DataType) -> pa.DataType:
    """The type the kernels work on: dictionaries decoded, view and small-decimal types widened."""
    if pa.types.is_dictionary(data_type):
        return normalize_type(data_type.value_type)
    if pa.types.is_string_view(data_type):
        return pa.string()
    if pa.types.is_binary_view(data_type):
        return pa.binary()
    if isinstance(data_type, pa.UuidType):
        return data_type
    if isinstance(data_type, pa.BaseExtensionType):
        return normalize_type(data_type.storage_type)
    if pa.types.is_decimal32(data_type) or pa.types.is_decimal64(data_type):
        return pa.decimal128(data_type.precision, data_type.scale)
    if pa.types.is_date64(data_type):
        return pa.date32()
    return data_type


def is_signed_integer(data_type: pa.DataType) -> bool:
    return bool(pa.types.is_signed_integer(data_type))


def is_unsigned_integer(data_type: pa.DataType) -> bool:
    return bool(pa.types.is_unsigned_integer(data_type))


def is_integer(data_type: pa.DataType) -> bool:
    return bool(pa.types.is_integer(data_type))


def is_string(data_type: pa.DataType) -> bool:
    return bool(pa.types.is_string(data_type) or pa.types.is_large_string(data_type))


def is_binary(data_type: pa.DataType) -> bool:
    return bool(pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type))


def is_fixed_binary(data_type: pa.DataType) -> bool:
    return bool(pa.types.is_fixed_size_binary(data_type))


def is_uuid(data_type: pa.DataType) -> bool:
    return isinstance(data_type, pa.UuidType)


def is_decimal(data_type: pa.DataType) -> bool:
    return bool(pa.types.is_decimal128(data_type) or pa.types.is_decimal256(data_type))


def is_date(data_type: pa.DataType) -> bool:
    return bool(pa.types.is_date32(data_type))


def is_timestamp(data_type: pa.DataType) -> bool:
    return bool(pa.types.is_timestamp(data_type))


def is_boolean(data_type: pa.DataType) -> bool:
    return bool(pa.types.is_boolean(data_type))


def is_partition_value_type(data_type: pa.DataType) -> bool:
    """The result types a partition value may have: string, integer, boolean, date or timestamp."""
    return (
        is_string(data_type)
        or is_integer(data_type)
        or is_boolean(data_type)
        or is_date(data_type)
        or is_timestamp(data_type)
    )


def source_info(data_type: pa.DataType) -> SourceInfo:
    """Summarise a (normalised) source type for the scalar code paths."""
    if is_boolean(data_type):
        return SourceInfo("bool")
    if is_signed_integer(data_type):
        return SourceInfo("int", bit_width=data_type.bit_width)
    if is_unsigned_integer(data_type):
        return SourceInfo("uint", bit_width=data_type.bit_width)
    if is_string(data_type):
        return SourceInfo("string")
    if is_uuid(data_type):
        return SourceInfo("uuid")
    if is_binary(data_type) or is_fixed_binary(data_type):
        return SourceInfo("binary")
    if is_decimal(data_type):
        return SourceInfo("decimal", scale=data_type.scale, precision=data_type.precision)
    if is_date(data_type):
        return SourceInfo("date")
    if is_timestamp(data_type):
        return SourceInfo("timestamp", tz_aware=data_type.tz is not None, unit=data_type.unit)
    return SourceInfo("other")


# --- inputs ---------------------------------------------------------------------------------------


def as_arrow(values: Any) -> pa.Array | pa.ChunkedArray:
    """Accept a pyarrow Array/ChunkedArray, a numpy array or a Python sequence."""
    if isinstance(values, pa.Array | pa.ChunkedArray):
        return values
    return pa.array(values)


def normalize_array(array: pa.Array) -> pa.Array:
    """Bring a non-dictionary array to its `normalize_type` form."""
    data_type = array.type
    if pa.types.is_date64(data_type):
        millis = fixed_width_values(array, np.dtype(np.int64))
        days = np.floor_divide(millis, 86_400_000).astype(np.int32)
        return from_numpy(days, pa.date32(), array)
    if isinstance(data_type, pa.UuidType):
        return array
    if isinstance(data_type, pa.BaseExtensionType):
        return normalize_array(array.storage)
    target = normalize_type(data_type)
    if target != data_type:
        return array.cast(target)
    return array


def map_array(values: Any, result_type: pa.DataType, kernel: Callable[[pa.Array], pa.Array]) -> Any:
    """Apply `kernel` to every chunk of `values` (decoding dictionaries by transforming the dictionary)."""
    arrow = as_arrow(values)
    if isinstance(arrow, pa.ChunkedArray):
        chunks = [map_array(chunk, result_type, kernel) for chunk in arrow.chunks]
        return pa.chunked_array(chunks, type=result_type)
    if pa.types.is_dictionary(arrow.type):
        # Each distinct value is transformed once, then spread to the rows by index.
        transformed = map_array(arrow.dictionary, result_type, kernel)
        return transformed.take(arrow.indices)
    normalized = normalize_array(arrow)
    if len(normalized) == 0:
        return pa.array([], type=result_type)
    if normalized.null_count == len(normalized):
        return pa.nulls(len(normalized), type=result_type)
    result = kernel(normalized)
    if result.type != result_type:
        result = result.cast(result_type)
    return result


# --- raw buffers ----------------------------------------------------------------------------------


def fixed_width_values(array: pa.Array, dtype: np.dtype[Any]) -> npt.NDArray[Any]:
    """The values buffer of a fixed-width array as numpy (zero copy; arbitrary values under NULLs)."""
    buffer = array.buffers()[1]
    return np.frombuffer(buffer, dtype=dtype, count=array.offset + len(array))[array.offset :]


def valid_mask(array: pa.Array) -> npt.NDArray[np.bool_] | None:
    """A boolean numpy mask of non-NULL rows, or None when there are no NULLs."""
    if array.null_count == 0:
        return None
    return np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def only_valid(values: npt.NDArray[Any], array: pa.Array) -> npt.NDArray[Any]:
    """`values` restricted to the non-NULL rows of `array` (for range checks)."""
    mask = valid_mask(array)
    return values if mask is None else values[mask]


def from_numpy(values: npt.NDArray[Any], result_type: pa.DataType, like: pa.Array) -> pa.Array:
    """A fixed-width Arrow array of `result_type` holding `values`, NULL wherever `like` is NULL."""
    values = np.ascontiguousarray(values)
    count = len(like)
    if like.null_count == 0:
        return pa.Array.from_buffers(result_type, count, [None, pa.py_buffer(values)], null_count=0)
    validity = like.buffers()[0]
    offset = like.offset
    if offset % 8 == 0:
        return pa.Array.from_buffers(
            result_type,
            count,
            [validity.slice(offset // 8), pa.py_buffer(values)],
            null_count=like.null_count,
        )
    # A bit offset cannot be sliced away: shift the values instead so both buffers share the offset.
    shifted = np.empty(offset + count, dtype=values.dtype)
    shifted[offset:] = values
    return pa.Array.from_buffers(
        result_type, count, [validity, pa.py_buffer(shifted)], null_count=like.null_count, offset=offset
    )


def binary_layout(
    array: pa.Array,
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[Any], npt.NDArray[Any]]:
    """(data bytes, start of each value, byte length of each value) of a string/binary array."""
    data_type = array.type
    count = len(array)
    if pa.types.is_fixed_size_binary(data_type) or isinstance(data_type, pa.UuidType):
        storage = array.storage if isinstance(data_type, pa.UuidType) else array
        width = storage.type.byte_width
        data = np.frombuffer(storage.buffers()[1], dtype=np.uint8)
        starts = (np.arange(count, dtype=np.int64) + storage.offset) * width
        return data, starts, np.full(count, width, dtype=np.int64)
    offset_dtype = np.int64 if data_type in (pa.large_string(), pa.large_binary()) else np.int32
    _, offsets_buffer, data_buffer = array.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=offset_dtype, count=array.offset + count + 1)[
        array.offset :
    ]
    offsets = offsets.astype(np.int64, copy=False)
    data = (
        np.frombuffer(data_buffer, dtype=np.uint8)
        if data_buffer is not None and data_buffer.size
        else np.zeros(0, dtype=np.uint8)
    )
    return data, offsets[:-1], np.diff(offsets)


def timestamp_micros(array: pa.Array) -> npt.NDArray[np.int64]:
    """Microseconds since the epoch (UTC) of a timestamp array; nanoseconds are floored (Iceberg)."""
    unit = array.type.unit
    raw = fixed_width_values(array, np.dtype(np.int64))
    if unit == "us":
        return raw
    if unit == "ns":
        return np.floor_divide(raw, 1000)
    factor = MICROS_PER_SECOND // UNIT_TICKS_PER_SECOND[unit]
    limit = INT64_MAX // factor
    checked = only_valid(raw, array)
    if checked.size and (checked.max() > limit or checked.min() < -limit):
        bad = int(checked[np.argmax((checked > limit) | (checked < -limit))])
        raise PartitionValueError(
            f"timestamp value {bad} ({unit}) is outside the range of microsecond timestamps "
            "(about ±292,000 years); partition values use microseconds"
        )
    return raw * factor


def as_wall_clock(array: pa.Array) -> pa.Array:
    """A tz-aware timestamp array viewed as naive UTC wall time (zero copy); others unchanged."""
    if pa.types.is_timestamp(array.type) and array.type.tz is not None:
        return array.view(pa.timestamp(array.type.unit))
    return array


def int_calendar_field(array: pa.Array, field: str) -> pa.Array:
    """A calendar field (year, month, ...) of dates or wall-clock timestamps, as int32."""
    kernels: dict[str, Callable[[pa.Array], pa.Array]] = {
        "year": pc.year,
        "quarter": pc.quarter,
        "month": pc.month,
        "week": pc.iso_week,
        "day": pc.day,
        "hour": pc.hour,
        "minute": pc.minute,
    }
    result = kernels[field](as_wall_clock(array))
    return result.cast(pa.int32())
