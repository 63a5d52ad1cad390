"""Arrow arrays from Python values without importing pandas.

`pa.array`, `pa.scalar` and `Schema.empty_table` ask pyarrow's pandas shim whether the input is a pandas
object, and the first such question imports pandas (~0.3 s) when it is installed. A fresh process's first
read (a CLI call, a new Airflow task) builds the catalog state and the pruning index from Python values, so
these helpers build the common kinds (integers, floats, booleans, strings, timestamps of every unit, dates,
decimals) straight from buffers, exactly as `pa.array` would, and leave the rest to `pa.array` (which also
decides, and refuses as it does, whenever a value would need rounding or does not fit).
"""

from __future__ import annotations

import datetime as dt
import decimal
from array import array as py_array
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import pyarrow as pa

_MAX_STRING_BYTES = 2**31 - 1


def empty_table(schema: pa.Schema) -> pa.Table:
    """`schema.empty_table()` without the pandas probe."""
    import pyarrow as pa

    return pa.Table.from_batches([], schema=schema)


def _validity(values: Sequence[Any]) -> tuple[pa.Buffer | None, int]:
    import numpy as np
    import pyarrow as pa

    valid = np.fromiter((value is not None for value in values), dtype=bool, count=len(values))
    missing = len(values) - int(valid.sum())
    if not missing:
        return None, 0
    return pa.py_buffer(np.packbits(valid, bitorder="little")), missing


def int64_array(values: npt.NDArray[np.int64]) -> pa.Array:
    """An int64 array over a numpy int64 array (no NULLs), sharing its memory."""
    import numpy as np
    import pyarrow as pa

    data = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(data), [None, pa.py_buffer(data)])


def _bits(buffer: pa.Buffer, offset: int, length: int) -> npt.NDArray[np.bool_]:
    import numpy as np

    raw = np.frombuffer(buffer, dtype=np.uint8)
    return np.unpackbits(raw, bitorder="little", count=offset + length)[offset:].astype(bool)


def _numpy_dtype(kind: pa.DataType) -> np.dtype[Any] | None:
    import numpy as np
    import pyarrow as pa

    if pa.types.is_boolean(kind):
        return np.dtype(bool)
    if kind in (pa.float32(), pa.float64()):
        return np.dtype(f"f{kind.bit_width // 8}")
    if pa.types.is_integer(kind):
        return np.dtype(f"{'u' if pa.types.is_unsigned_integer(kind) else 'i'}{kind.bit_width // 8}")
    return None


def to_numpy(values: pa.Array | pa.ChunkedArray, fill: Any = None) -> npt.NDArray[Any]:
    """A boolean, integer or float column as numpy, NULLs replaced by `fill` (`to_numpy` and `fill_null`
    with a Python value would probe for pandas). Other columns, and NULLs without a `fill`, go through
    pyarrow's `to_numpy` itself."""
    import numpy as np
    import pyarrow as pa

    dtype = _numpy_dtype(values.type)
    if dtype is None or (values.null_count and fill is None):
        if values.null_count and fill is not None:
            import pyarrow.compute as pc

            values = pc.fill_null(values, fill)
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        return values.to_numpy(zero_copy_only=False)
    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    parts = []
    for chunk in chunks:
        if not len(chunk):
            continue
        validity, data = chunk.buffers()[:2]
        if dtype == np.dtype(bool):
            part = _bits(data, chunk.offset, len(chunk))
        else:
            part = np.frombuffer(data, dtype=dtype, count=len(chunk), offset=chunk.offset * dtype.itemsize)
        if chunk.null_count:
            part = np.where(_bits(validity, chunk.offset, len(chunk)), part, np.asarray(fill, dtype=dtype))
        parts.append(part)
    if not parts:
        return np.zeros(0, dtype=dtype)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _numeric(values: Sequence[Any], kind: pa.DataType) -> pa.Array | None:
    import numpy as np
    import pyarrow as pa

    dtype = _numpy_dtype(kind)
    assert dtype is not None
    for value in values:
        if value is None:
            continue
        if pa.types.is_boolean(kind):
            ok = isinstance(value, bool)
        elif pa.types.is_floating(kind):
            ok = isinstance(value, float | int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, int) and not isinstance(value, bool)
        if not ok:
            return None
    validity, missing = _validity(values)
    boolean = pa.types.is_boolean(kind)
    fill: Any = False if boolean else 0
    try:
        data = np.array([fill if value is None else value for value in values], dtype=dtype)
    except OverflowError:
        return None
    if pa.types.is_integer(kind) and data.size:
        # Ints beyond the type must fail as pa.array makes them fail, whatever numpy would do with them.
        info = np.iinfo(dtype)
        if any(value is not None and not info.min <= value <= info.max for value in values):
            return None
    if pa.types.is_floating(kind) and any(
        isinstance(value, int) and float(value) != value for value in values
    ):  # an int a float cannot hold exactly: let pa.array decide (it refuses)
        return None
    buffer = pa.py_buffer(np.packbits(data, bitorder="little") if boolean else data)
    return pa.Array.from_buffers(kind, len(values), [validity, buffer], null_count=missing)


def _strings(values: Sequence[Any], kind: pa.DataType) -> pa.Array | None:
    import pyarrow as pa

    if any(value is not None and not isinstance(value, str) for value in values):
        return None
    encoded = [b"" if value is None else value.encode("utf-8") for value in values]
    offsets = py_array("q", [0])
    total = 0
    for item in encoded:
        total += len(item)
        offsets.append(total)
    if total > _MAX_STRING_BYTES and not pa.types.is_large_string(kind):
        return None
    if not pa.types.is_large_string(kind):
        offsets = py_array("i", offsets)
    validity, missing = _validity(values)
    buffers = [validity, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
    return pa.Array.from_buffers(kind, len(values), buffers, null_count=missing)


_EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()
_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MICROSECOND = dt.timedelta(microseconds=1)
_PER_MICROSECOND = {"us": 1, "ns": 1000}
# Units coarser than a microsecond: microseconds per tick. A value between two ticks goes to pa.array.
_MICROSECONDS_PER = {"ms": 1000, "s": 1_000_000}


def _temporal(values: Sequence[Any], kind: pa.DataType) -> pa.Array | None:
    """date32 from `datetime.date`, timestamp[s|ms|us|ns] from `datetime.datetime` (naive ones as UTC,
    aware ones at their instant, as pa.array does), through int64 and a cast."""
    import pyarrow as pa

    if pa.types.is_date32(kind):
        if any(value is not None and type(value) is not dt.date for value in values):
            return None
        days = [None if value is None else value.toordinal() - _EPOCH_ORDINAL for value in values]
        built = _numeric(days, pa.int32())
        return None if built is None else built.cast(kind)
    if not pa.types.is_timestamp(kind):
        return None
    if any(value is not None and type(value) is not dt.datetime for value in values):
        return None
    micros = [
        None if value is None else (value - (_EPOCH if value.tzinfo is None else _EPOCH_UTC)) // _MICROSECOND
        for value in values
    ]
    ticks: list[int | None]
    if kind.unit in _PER_MICROSECOND:
        scale = _PER_MICROSECOND[kind.unit]
        ticks = [None if value is None else value * scale for value in micros]
    else:
        per = _MICROSECONDS_PER[kind.unit]
        if any(value is not None and value % per for value in micros):
            return None  # between two ticks: how pa.array rounds it is pa.array's to say
        ticks = [None if value is None else value // per for value in micros]
    built = _numeric(ticks, pa.int64())
    if built is None:
        return None
    return built.cast(kind)


def _decimals(values: Sequence[Any], kind: pa.DataType) -> pa.Array | None:
    """decimal128 / decimal256 from `decimal.Decimal` values that fit the type exactly (no rounding, within
    its precision): their unscaled integers as little-endian two's complement, as Arrow stores them."""
    import pyarrow as pa

    width = 16 if pa.types.is_decimal128(kind) else 32
    limit = 10**kind.precision
    unscaled: list[int] = []
    for value in values:
        if value is None:
            unscaled.append(0)
            continue
        if type(value) is not decimal.Decimal or not value.is_finite():
            return None
        sign, digits, exponent = value.as_tuple()
        assert isinstance(exponent, int)  # finite
        shift = exponent + kind.scale
        if shift < 0:
            return None  # more fractional digits than the scale: pa.array refuses or decides
        number = int("".join(map(str, digits)) or "0") * 10**shift
        if number >= limit:
            return None
        unscaled.append(-number if sign else number)
    validity, missing = _validity(values)
    data = b"".join(number.to_bytes(width, "little", signed=True) for number in unscaled)
    return pa.Array.from_buffers(kind, len(values), [validity, pa.py_buffer(data)], null_count=missing)


def typed_array(values: Sequence[Any], kind: pa.DataType) -> pa.Array:
    """`pa.array(values, type=kind)` for a list of Python values, without the pandas probe where the kind
    and the values allow it (exactly the same array); otherwise `pa.array` itself decides."""
    import pyarrow as pa

    values = list(values)
    built: pa.Array | None = None
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        built = _strings(values, kind)
    elif pa.types.is_integer(kind) or pa.types.is_boolean(kind) or kind in (pa.float32(), pa.float64()):
        built = _numeric(values, kind)
    elif pa.types.is_date32(kind) or pa.types.is_timestamp(kind):
        built = _temporal(values, kind)
    elif pa.types.is_decimal128(kind) or pa.types.is_decimal256(kind):
        built = _decimals(values, kind)
    if built is not None:
        return built
    return pa.array(values, type=kind)


__all__ = ["empty_table", "int64_array", "to_numpy", "typed_array"]
