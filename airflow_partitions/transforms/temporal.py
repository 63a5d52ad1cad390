"""Calendar transforms: `date_part(unit, col)` (and YEAR/MONTH/... aliases) and `date_trunc(unit, col)`.

Naive timestamps are UTC wall time; tz-aware ones are converted to UTC first, so a value's partition
never depends on a session or machine time zone. Weeks are ISO weeks starting on Monday; a quarter
starts on the first day of its first month.

* `date_part` gives int32 calendar numbers: year (2026), quarter (1..4), month (1..12), ISO week
  (1..53), day of month (1..31), hour (0..23), minute (0..59).
* `date_trunc` gives the start of the period: a date for date columns, a microsecond timestamp for
  timestamp columns (`timestamp[us]`, or `timestamp[us, UTC]` when the column is tz-aware).

Hours and minutes of a date column are always 0, so those units are rejected for dates.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_partitions.exceptions import PartitionExpressionError, PartitionValueError
from airflow_partitions.transforms.base import (
    Interval,
    OrderPreservingTransform,
    Transform,
    with_result_zone,
)
from airflow_partitions.transforms.projection import Op, Projection

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import pyarrow as pa

DATE_UNITS: tuple[str, ...] = ("year", "quarter", "month", "week", "day", "hour", "minute")
TIME_OF_DAY_UNITS = frozenset({"hour", "minute"})
_FIXED_PERIOD_MICROS = {
    "minute": 60 * 1_000_000,
    "hour": 3_600 * 1_000_000,
    "day": 86_400 * 1_000_000,
    "week": 7 * 86_400 * 1_000_000,
}
# For timestamps, the UTC-aligned step within which a unit's value cannot change (weeks, months,
# quarters and years all start at midnight, but not every 7 days or every month from the epoch).
_CONSTANT_WITHIN_MICROS = {
    "minute": _FIXED_PERIOD_MICROS["minute"],
    "hour": _FIXED_PERIOD_MICROS["hour"],
    "day": _FIXED_PERIOD_MICROS["day"],
    "week": _FIXED_PERIOD_MICROS["day"],
    "month": _FIXED_PERIOD_MICROS["day"],
    "quarter": _FIXED_PERIOD_MICROS["day"],
    "year": _FIXED_PERIOD_MICROS["day"],
}
# 1970-01-01 was a Thursday: shifting by 3 days aligns week boundaries on Mondays.
_WEEK_SHIFT_DAYS = 3


class _CalendarTransform(Transform):
    accepts: ClassVar[str] = "date and timestamp columns"

    def __init__(self, source_column: str, unit: str) -> None:
        super().__init__(source_column)
        if unit not in DATE_UNITS:
            raise ValueError(f"unit must be one of {DATE_UNITS}, got {unit!r}")
        self.unit = unit

    def _check_source(self, source_type: pa.DataType) -> bool:
        from airflow_partitions.transforms import arrow_support as support  # lazy: loads pyarrow

        if support.is_date(source_type) and self.unit in TIME_OF_DAY_UNITS:
            raise PartitionExpressionError(
                f"partition expression {self.canonical!r}: column {self.source_column!r} is a date "
                f"({source_type}), whose "
                f"{self.unit} is always 0; use 'day' or a coarser unit, or a timestamp column"
            )
        return bool(support.is_date(source_type) or support.is_timestamp(source_type))

    def _timestamp_step_micros(self) -> int:
        return _CONSTANT_WITHIN_MICROS[self.unit]

    def _calendar_value(self, value: Any) -> dt.date:
        """The value as a date or a naive UTC wall-clock datetime, checked against the bound type."""
        value = self._coerce_scalar(value)
        if isinstance(value, dt.datetime):
            return value.replace(tzinfo=None)
        if isinstance(value, dt.date):
            if self.unit in TIME_OF_DAY_UNITS:
                raise self._scalar_error(value, f"a datetime (a date has no {self.unit})")
            return value
        raise self._scalar_error(value, "a date or datetime")


class DatePartTransform(_CalendarTransform):
    """`date_part('unit', col)`: the int32 calendar field of the value (UTC)."""

    name: ClassVar[str] = "date_part"

    @property
    def canonical(self) -> str:
        return f"date_part('{self.unit}', {self.column_sql})"

    @property
    def monotonic(self) -> bool:
        return self.unit == "year"

    @property
    def calendar_field(self) -> str:
        return self.unit

    def project(self, op: Op, value: Any) -> Projection:
        # Years keep the order of time; months, days, ... repeat, so only their points project.
        if self.unit == "year":
            return self._project_in_order(op, value)
        return super().project(op, value)

    def project_range(
        self,
        lower: Any,
        upper: Any,
        lower_inclusive: bool,
        upper_inclusive: bool,
        *,
        column_type: pa.DataType,
        max_candidates: int,
    ) -> Projection:
        if self.unit == "year":
            return self._project_range_in_order(lower, upper, lower_inclusive, upper_inclusive)
        return super().project_range(
            lower,
            upper,
            lower_inclusive,
            upper_inclusive,
            column_type=column_type,
            max_candidates=max_candidates,
        )

    def _fixed_result_type(self) -> pa.DataType:
        import pyarrow as pa

        return pa.int32()

    def _result_type(self, source_type: pa.DataType) -> pa.DataType | None:
        return self._fixed_result_type() if self._check_source(source_type) else None

    def _apply_array(self, values: pa.Array) -> pa.Array:
        from airflow_partitions.transforms import arrow_support as support  # lazy: loads pyarrow

        return support.int_calendar_field(values, self.unit)

    def _apply_scalar(self, value: Any) -> int:
        moment = self._calendar_value(value)
        match self.unit:
            case "year":
                return moment.year
            case "quarter":
                return (moment.month - 1) // 3 + 1
            case "month":
                return moment.month
            case "week":
                return moment.isocalendar().week
            case "day":
                return moment.day
            case "hour":
                assert isinstance(moment, dt.datetime)
                return moment.hour
            case _:
                assert isinstance(moment, dt.datetime)
                return moment.minute

    def _spark_form(self, column: Any, source: pa.DataType) -> Any:
        from airflow_partitions.transforms import spark  # lazy: loads pyspark

        return spark.date_part_column(column, source, self.unit)

    def preimage(self, partition_value: Any) -> Interval | None:
        if partition_value is None or self.unit != "year":
            return None
        source_type = self._require_bound("the source range of a year")
        if isinstance(partition_value, bool) or not isinstance(partition_value, int):
            raise self._scalar_error(partition_value, "an int year")
        from airflow_partitions.transforms import arrow_support as support  # lazy: loads pyarrow

        year = partition_value
        if not dt.MINYEAR <= year <= dt.MAXYEAR:
            raise PartitionValueError(f"year {year} is outside the years Python dates can represent")
        lower = dt.date(year, 1, 1)
        upper = dt.date(year + 1, 1, 1) if year < dt.MAXYEAR else None
        if support.is_timestamp(support.normalize_type(source_type)):
            aware = source_type.tz is not None
            lower = with_result_zone(dt.datetime(year, 1, 1), aware)
            upper = with_result_zone(dt.datetime(year + 1, 1, 1), aware) if upper is not None else None
        return Interval(lower, upper)


class DateTruncTransform(_CalendarTransform, OrderPreservingTransform):
    """`date_trunc('unit', col)`: the start of the value's period (date for dates, µs timestamp otherwise)."""

    name: ClassVar[str] = "date_trunc"

    @property
    def canonical(self) -> str:
        return f"date_trunc('{self.unit}', {self.column_sql})"

    def _result_type(self, source_type: pa.DataType) -> pa.DataType | None:
        import pyarrow as pa

        from airflow_partitions.transforms import arrow_support as support  # lazy: loads pyarrow

        if not self._check_source(source_type):
            return None
        if support.is_date(source_type):
            return pa.date32()
        return pa.timestamp("us", "UTC" if source_type.tz is not None else None)

    def _apply_array(self, values: pa.Array) -> pa.Array:
        import numpy as np
        import pyarrow as pa

        from airflow_partitions.transforms import arrow_support as support  # lazy: loads pyarrow

        if support.is_date(values.type):
            days = support.fixed_width_values(values, np.dtype(np.int32))
            return support.from_numpy(truncate_days(days, self.unit), pa.date32(), values)
        micros = support.timestamp_micros(values)
        result_type = pa.timestamp("us", "UTC" if values.type.tz is not None else None)
        return support.from_numpy(truncate_micros(micros, self.unit), result_type, values)

    def _apply_scalar(self, value: Any) -> dt.date:
        original = self._coerce_scalar(value)
        moment = self._calendar_value(original)
        truncated = truncate_calendar(moment, self.unit)
        if isinstance(truncated, dt.datetime):
            aware = isinstance(original, dt.datetime) and original.tzinfo is not None
            return with_result_zone(truncated, aware)
        return truncated

    def _spark_form(self, column: Any, source: pa.DataType) -> Any:
        from airflow_partitions.transforms import spark  # lazy: loads pyspark

        return spark.date_trunc_column(column, source, self.unit)

    def preimage(self, partition_value: Any) -> Interval | None:
        if partition_value is None:
            return None
        start = self._apply_scalar(partition_value)
        normalized = self._coerce_scalar(partition_value)
        if start != normalized:
            raise PartitionValueError(
                f"partition expression {self.canonical!r}: {partition_value!r} is not the start of a "
                f"{self.unit}, so no value truncates to it"
            )
        return Interval(start, next_period_start(start, self.unit))


# --- calendar arithmetic (scalar) ------------------------------------------------------------------


def truncate_calendar(moment: dt.date, unit: str) -> dt.date:
    """The start of `moment`'s period; dates stay dates, (naive) datetimes stay datetimes."""
    is_datetime = isinstance(moment, dt.datetime)
    day = dt.date(moment.year, moment.month, moment.day)
    match unit:
        case "year":
            day = day.replace(month=1, day=1)
        case "quarter":
            day = day.replace(month=(day.month - 1) // 3 * 3 + 1, day=1)
        case "month":
            day = day.replace(day=1)
        case "week":
            day = day - dt.timedelta(days=day.weekday())
        case _:
            pass
    if not is_datetime:
        return day
    assert isinstance(moment, dt.datetime)
    hour = moment.hour if unit in ("hour", "minute") else 0
    minute = moment.minute if unit == "minute" else 0
    return dt.datetime(day.year, day.month, day.day, hour, minute, tzinfo=moment.tzinfo)


def next_period_start(start: dt.date, unit: str) -> dt.date | None:
    """The start of the period after the one starting at `start` (None past year 9999)."""
    try:
        match unit:
            case "year":
                return start.replace(year=start.year + 1)
            case "quarter" | "month":
                months = 3 if unit == "quarter" else 1
                index = start.year * 12 + start.month - 1 + months
                return start.replace(year=index // 12, month=index % 12 + 1)
            case "week":
                return start + dt.timedelta(days=7)
            case "day":
                return start + dt.timedelta(days=1)
            case "hour":
                return start + dt.timedelta(hours=1)
            case _:
                return start + dt.timedelta(minutes=1)
    except (OverflowError, ValueError):
        return None


# --- calendar arithmetic (vectorised) --------------------------------------------------------------


def truncate_micros(micros: npt.NDArray[np.int64], unit: str) -> npt.NDArray[np.int64]:
    """Period starts of microsecond timestamps (UTC wall time), as microseconds."""
    import numpy as np

    if unit in _FIXED_PERIOD_MICROS:
        period = np.int64(_FIXED_PERIOD_MICROS[unit])
        shift = np.int64(_WEEK_SHIFT_DAYS * _FIXED_PERIOD_MICROS["day"] if unit == "week" else 0)
        return micros - np.mod(micros + shift, period) if shift else micros - np.mod(micros, period)
    starts = _truncate_to_months(micros.view("M8[us]"), unit)
    return starts.astype("M8[us]").view(np.int64)


def truncate_days(days: npt.NDArray[np.int32], unit: str) -> npt.NDArray[np.int32]:
    """Period starts of dates (days since the epoch), as days."""
    import numpy as np

    if unit == "day":
        return days
    if unit == "week":
        wide = days.astype(np.int64)
        return (wide - np.mod(wide + _WEEK_SHIFT_DAYS, 7)).astype(np.int32)
    starts = _truncate_to_months(days.astype(np.int64).view("M8[D]"), unit)
    return starts.astype("M8[D]").view(np.int64).astype(np.int32)


def _truncate_to_months(moments: npt.NDArray[np.datetime64], unit: str) -> npt.NDArray[np.datetime64]:
    import numpy as np

    # numpy floors when casting to a coarser datetime unit, also before 1970.
    if unit == "year":
        return moments.astype("M8[Y]")
    months = moments.astype("M8[M]")
    if unit == "quarter":
        index = months.view(np.int64)
        months = (index - np.mod(index, 3)).view("M8[M]")
    return months
