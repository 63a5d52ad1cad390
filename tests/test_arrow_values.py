"""Arrays built without pyarrow's pandas probe are exactly what `pa.array` / `to_numpy` give."""

from __future__ import annotations

import datetime as dt
import decimal
import math
import random
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from airflow_partitions.storage.arrow_values import empty_table, int64_array, to_numpy, typed_array

HOSTILE_TEXT = ["", None, "a/b", "k=v", "50%", "it's", 'q"q', "ü", "日本", "\x00", "tab\t", "😀"]
CASES: list[tuple[list[Any], pa.DataType]] = [
    ([1, None, 3, -(2**63), 2**63 - 1, 0], pa.int64()),
    ([], pa.int64()),
    ([None, None], pa.int32()),
    ([1, -2, None, 127, -128], pa.int8()),
    ([0, 2**64 - 1, None], pa.uint64()),
    ([1.5, None, math.inf, -math.inf, -0.0, 3], pa.float64()),
    ([1.5, None, 2], pa.float32()),
    ([True, None, False] * 7, pa.bool_()),
    (HOSTILE_TEXT, pa.string()),
    (HOSTILE_TEXT, pa.large_string()),
    ([None, None], pa.string()),
    ([], pa.string()),
    # Kinds it does not build itself: pa.array decides, same result.
    ([b"x", None], pa.binary()),
    ([None, 1], pa.timestamp("us", tz="UTC")),
]


def _same(built: pa.Array, expected: pa.Array) -> None:
    built.validate(full=True)
    assert built.type == expected.type
    assert built.null_count == expected.null_count
    assert repr(built.to_pylist()) == repr(expected.to_pylist())


@pytest.mark.parametrize(("values", "kind"), CASES, ids=lambda c: str(c)[:40])
def test_typed_array_equals_pa_array(values: list[Any], kind: pa.DataType) -> None:
    _same(typed_array(values, kind), pa.array(values, type=kind))


_OFFSET = dt.timezone(dt.timedelta(hours=5, minutes=30))
NAIVE = [None, dt.datetime(2024, 1, 1, 12, 30, 1, 123456), dt.datetime(1969, 12, 31, 23, 59, 59, 999999)]
AWARE = [dt.datetime(2024, 6, 1, 1, 2, 3, 4, tzinfo=_OFFSET), dt.datetime(1900, 1, 1, tzinfo=dt.UTC), None]
EXTREMES = [dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999999)]


# Whole milliseconds and seconds (what a catalog records for such columns), at, before and after the epoch.
WHOLE_MS = [None, dt.datetime(2024, 3, 1, 0, 37, 0, 5000), dt.datetime(1969, 12, 31, 23, 59, 59, 999000)]
WHOLE_S = [dt.datetime(1969, 12, 31, 23, 59, 59, tzinfo=_OFFSET), None, dt.datetime(1970, 1, 1)]
# Between two ticks of ms or s: pa.array decides how to round (and it floors before the epoch).
BETWEEN = [dt.datetime(1969, 12, 31, 23, 59, 59, 999500), dt.datetime(2024, 1, 1, 0, 0, 0, 1500), None]


@pytest.mark.parametrize("tz", [None, "UTC", "Europe/Paris"])
@pytest.mark.parametrize("unit", ["us", "ns", "ms", "s"])
@pytest.mark.parametrize(
    "values", [NAIVE, AWARE, NAIVE + AWARE, NAIVE + EXTREMES, WHOLE_MS, WHOLE_S, BETWEEN], ids=str
)
def test_typed_array_of_datetimes_equals_pa_array(values: list[Any], unit: str, tz: str | None) -> None:
    kind = pa.timestamp(unit, tz=tz)
    try:
        expected = pa.array(values, type=kind)
    except pa.ArrowInvalid:  # beyond nanoseconds' range: refused the same way
        with pytest.raises(pa.ArrowInvalid):
            typed_array(values, kind)
        return
    built = typed_array(values, kind)
    built.validate(full=True)
    assert built.type == expected.type
    assert built.equals(expected)  # (to_pylist of year 1 in Paris overflows on both sides)


D = decimal.Decimal


@pytest.mark.parametrize(
    ("values", "kind"),
    [
        (
            [D("1.5"), None, D("-1E+3"), D("0"), D("-0.00"), D("9999999999.99"), D("-9999999999.99")],
            pa.decimal128(12, 2),
        ),
        ([D("123456789012345678901234567890.12345678"), None, D("-1")], pa.decimal128(38, 8)),
        ([D("1E+40"), D("-0.000001"), None], pa.decimal256(60, 6)),
        ([None, None], pa.decimal128(5, 0)),
        ([], pa.decimal128(5, 0)),
        ([D("12"), D("7E+1")], pa.decimal128(3, 0)),
    ],
    ids=str,
)
def test_typed_array_of_decimals_equals_pa_array(values: list[Any], kind: pa.DataType) -> None:
    _same(typed_array(values, kind), pa.array(values, type=kind))


@pytest.mark.parametrize(
    ("values", "kind"),
    [
        ([D("1.555")], pa.decimal128(12, 2)),  # would need rounding
        ([D("100000")], pa.decimal128(5, 0)),  # beyond the precision
        ([D("NaN")], pa.decimal128(12, 2)),
        ([D("Infinity")], pa.decimal128(12, 2)),
    ],
    ids=str,
)
def test_typed_array_of_decimals_refuses_what_pa_array_refuses(values: list[Any], kind: pa.DataType) -> None:
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError)) as expected:
        pa.array(values, type=kind)
    with pytest.raises(expected.type):
        typed_array(values, kind)


def test_typed_array_of_dates_equals_pa_array() -> None:
    days = [None, dt.date(2024, 2, 29), dt.date(1, 1, 1), dt.date(9999, 12, 31), dt.date(1969, 12, 31)]
    assert typed_array(days, pa.date32()).equals(pa.array(days, pa.date32()))
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError, TypeError)):
        typed_array([dt.date(2024, 1, 1), "2024-01-02"], pa.date32())


def test_typed_array_keeps_nan() -> None:
    built = typed_array([math.nan, None], pa.float64()).to_pylist()
    assert math.isnan(built[0])
    assert built[1] is None


@pytest.mark.parametrize(
    ("values", "kind"),
    [([2**63], pa.int64()), ([300], pa.int8()), ([-1], pa.uint8()), (["a"], pa.int64()), ([1], pa.string())],
)
def test_typed_array_refuses_what_pa_array_refuses(values: list[Any], kind: pa.DataType) -> None:
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError)):
        pa.array(values, type=kind)
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError)):
        typed_array(values, kind)


def test_int64_array_and_empty_table() -> None:
    _same(int64_array(np.array([3, -1, 2**62])), pa.array([3, -1, 2**62], pa.int64()))
    schema = pa.schema([("a", pa.int64()), ("b", pa.string())])
    assert empty_table(schema).equals(schema.empty_table())


@pytest.mark.parametrize("kind", [pa.bool_(), pa.int64(), pa.int32(), pa.uint8(), pa.float64()])
def test_to_numpy_matches_fill_null_then_to_numpy(kind: pa.DataType) -> None:
    rng = random.Random(7)
    fill: Any = False if kind == pa.bool_() else 7

    def value() -> Any:
        if kind == pa.bool_():
            return rng.random() < 0.5
        if kind == pa.float64():
            return rng.random()
        return rng.randint(0, 9)

    for length in (0, 1, 7, 8, 9, 33):
        values = [None if rng.random() < 0.3 else value() for _ in range(length)]
        array = pa.array(values, kind)
        for offset in range(min(length, 5) + 1):
            for column in (array.slice(offset), pa.chunked_array([array.slice(offset), array], kind)):
                filled = pc.fill_null(column, fill)
                if isinstance(filled, pa.ChunkedArray):
                    filled = filled.combine_chunks()
                expected = filled.to_numpy(zero_copy_only=False)
                got = to_numpy(column, fill)
                assert got.dtype == expected.dtype
                assert np.array_equal(got, expected)


def test_to_numpy_of_other_kinds_falls_back() -> None:
    texts = pa.array(["a", None])
    assert to_numpy(texts).tolist() == ["a", None]
    dates = pa.array([None, 1], pa.date32())
    assert to_numpy(dates, fill=0).tolist() == to_numpy(pc.fill_null(dates, 0)).tolist()
