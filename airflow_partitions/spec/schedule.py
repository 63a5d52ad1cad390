"""Check a `refresh.schedule` (an Airflow preset or a 5-field cron expression) without importing Airflow.

The spec is validated in the core, which must not import Airflow, yet a typo in a cron field should fail at
load with a precise message rather than when the scheduler first parses the DAG. The checks cover what
Airflow's cron support accepts: numbers, ranges, steps, lists, month and weekday names, and the `L`, `W`
and `#` forms for days.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

AIRFLOW_PRESETS: tuple[str, ...] = (
    "@once",
    "@continuous",
    "@hourly",
    "@daily",
    "@weekly",
    "@monthly",
    "@quarterly",
    "@yearly",
    "@annually",
)

_MONTH_NAMES = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
_WEEKDAY_NAMES = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")


@dataclass(frozen=True)
class _CronField:
    label: str
    low: int
    high: int
    names: tuple[str, ...] = ()
    # Day fields also accept `?`, `L` (last), `nW` (nearest weekday) or `d#n` (n-th weekday).
    special: re.Pattern[str] | None = None

    def value(self, token: str) -> int | None:
        upper = token.upper()
        if upper in self.names:
            return self.names.index(upper) + (1 if self.label == "month" else 0)
        return int(token) if token.isdigit() else None


_FIELDS = (
    _CronField("minute", 0, 59),
    _CronField("hour", 0, 23),
    _CronField("day of month", 1, 31, special=re.compile(r"^(\?|L|L-\d{1,2}|\d{1,2}W|LW)$", re.IGNORECASE)),
    _CronField("month", 1, 12, names=_MONTH_NAMES),
    _CronField(
        "day of week",
        0,
        7,
        names=_WEEKDAY_NAMES,
        special=re.compile(r"^(\?|[0-7]L|[0-7]#[1-5])$", re.IGNORECASE),
    ),
)


def _item_problem(field: _CronField, item: str) -> str | None:
    if field.special is not None and field.special.match(item):
        return None
    base, slash, step = item.partition("/")
    if slash and (not step.isdigit() or int(step) == 0):
        return f"{field.label} step {step!r} must be a positive integer"
    if base == "*":
        return None
    bounds = base.split("-")
    if len(bounds) > 2 or not all(bounds):
        return f"{field.label} item {item!r} is not a number, a range a-b, a step x/n or *"
    values: list[int] = []
    for bound in bounds:
        value = field.value(bound)
        if value is None:
            names = f" or one of {', '.join(field.names)}" if field.names else ""
            return f"{field.label} value {bound!r} is not a number{names}"
        if not field.low <= value <= field.high:
            return f"{field.label} value {value} is outside {field.low}-{field.high}"
        values.append(value)
    if len(values) == 2 and values[0] > values[1]:
        return f"{field.label} range {base!r} runs backwards"
    return None


def schedule_problem(schedule: str) -> str | None:
    """Why `schedule` is not an Airflow preset or a valid 5-field cron expression, or None when it is."""
    text = schedule.strip()
    if text.startswith("@"):
        if text.lower() in AIRFLOW_PRESETS:
            return None
        return (
            f"unknown schedule preset {text!r}; use one of {', '.join(AIRFLOW_PRESETS)} or a cron expression"
        )
    fields = text.split()
    if len(fields) != len(_FIELDS):
        return (
            f"schedule {text!r} has {len(fields)} field(s); a cron expression has 5 "
            "(minute hour day-of-month month day-of-week), or use a preset such as @hourly"
        )
    for field, part in zip(_FIELDS, fields, strict=True):
        for item in part.split(","):
            problem = _item_problem(field, item)
            if problem:
                return f"schedule {text!r}: {problem}"
    return None
