"""Parse the column types of a spec's `schema:` block (`int64`, `timestamp[us, UTC]`, ...) into Arrow types.

The accepted spellings are Arrow's own, so `str(pa_type)` of any supported type parses back to the same
type: `timestamp[us, tz=UTC]`, `decimal128(10, 2)`, `list<item: int64>`. Shorter forms are accepted
too: `timestamp` (microseconds, no time zone), `timestamp[ms, UTC]`, `date`, `decimal(10,2)`, `bool`,
`list<int64>`. pyarrow is imported only when a type is actually parsed, so loading a spec without a
`schema:` block never pays for it.
"""

from __future__ import annotations

import re
import zoneinfo
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import PartitionSpecError

if TYPE_CHECKING:
    import pyarrow as pa

# Name -> pyarrow factory name, for the types without parameters.
_SIMPLE_TYPES: dict[str, str] = {
    "null": "null",
    "bool": "bool_",
    "boolean": "bool_",
    "int8": "int8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "uint8": "uint8",
    "uint16": "uint16",
    "uint32": "uint32",
    "uint64": "uint64",
    "halffloat": "float16",
    "float16": "float16",
    "float": "float32",
    "float32": "float32",
    "double": "float64",
    "float64": "float64",
    "string": "string",
    "utf8": "string",
    "large_string": "large_string",
    "large_utf8": "large_string",
    "binary": "binary",
    "large_binary": "large_binary",
    "date": "date32",
    "date32": "date32",
    "date32[day]": "date32",
    "date64": "date64",
    "date64[ms]": "date64",
}
_TIME_UNITS = ("s", "ms", "us", "ns")
_TIME32_UNITS = ("s", "ms")
_TIME64_UNITS = ("us", "ns")
_MAX_DECIMAL_PRECISION = {"decimal": 76, "decimal128": 38, "decimal256": 76}
_FIXED_OFFSET = re.compile(r"^[+-]\d{2}:\d{2}$")

SUPPORTED_TYPES_HELP = (
    "bool, int8..int64, uint8..uint64, float16/float32/float64, string, large_string, binary, "
    "large_binary, date (date32), date64, timestamp[unit] or timestamp[unit, TZ] (unit s|ms|us|ns), "
    "time32[s|ms], time64[us|ns], duration[unit], decimal(P, S), decimal256(P, S), list<TYPE>, "
    "large_list<TYPE>"
)


def _unsupported(text: str, why: str) -> PartitionSpecError:
    return PartitionSpecError(f"unsupported column type {text!r}: {why}")


def _split_args(inner: str) -> list[str]:
    return [part.strip() for part in inner.split(",")] if inner.strip() else []


def _unit(text: str, value: str, allowed: tuple[str, ...]) -> str:
    if value.lower() not in allowed:
        raise _unsupported(text, f"unit {value!r} is not one of {', '.join(allowed)}")
    return value.lower()


def _time_zone(text: str, value: str) -> str:
    zone = value.removeprefix("tz=").strip()
    if zone.upper() == "UTC":
        return "UTC"
    if _FIXED_OFFSET.match(zone):
        return zone
    try:
        zoneinfo.ZoneInfo(zone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as err:
        raise _unsupported(text, f"unknown time zone {zone!r} (use UTC, +HH:MM or an IANA name)") from err
    return zone


def _timestamp(pa: Any, text: str, args: list[str]) -> pa.DataType:
    if not args:
        return pa.timestamp("us")
    if len(args) > 2:
        raise _unsupported(text, "timestamp takes [unit] or [unit, time zone]")
    unit = _unit(text, args[0], _TIME_UNITS)
    return pa.timestamp(unit, tz=_time_zone(text, args[1])) if len(args) == 2 else pa.timestamp(unit)


def _one_unit(factory: str, allowed: tuple[str, ...]) -> Callable[[Any, str, list[str]], pa.DataType]:
    def build(pa: Any, text: str, args: list[str]) -> pa.DataType:
        if len(args) != 1:
            raise _unsupported(text, f"{factory} takes exactly one unit: [{'|'.join(allowed)}]")
        return getattr(pa, factory)(_unit(text, args[0], allowed))

    return build


_BRACKET_TYPES: dict[str, Callable[[Any, str, list[str]], pa.DataType]] = {
    "timestamp": _timestamp,
    "time32": _one_unit("time32", _TIME32_UNITS),
    "time64": _one_unit("time64", _TIME64_UNITS),
    "duration": _one_unit("duration", _TIME_UNITS),
}


def _decimal(pa: Any, text: str, name: str, args: list[str]) -> pa.DataType:
    if len(args) not in (1, 2) or not all(re.fullmatch(r"-?\d+", a) for a in args):
        raise _unsupported(text, f"{name} takes (precision, scale) as integers")
    precision = int(args[0])
    scale = int(args[1]) if len(args) == 2 else 0
    limit = _MAX_DECIMAL_PRECISION[name]
    if not 1 <= precision <= limit:
        raise _unsupported(text, f"precision {precision} is outside 1..{limit}")
    if not 0 <= scale <= precision:
        raise _unsupported(text, f"scale {scale} must be between 0 and the precision {precision}")
    factory = pa.decimal256 if name == "decimal256" or precision > 38 else pa.decimal128
    return factory(precision, scale)


def parse_arrow_type(text: str) -> pa.DataType:
    """The Arrow type named by `text`; raises `PartitionSpecError` naming the supported spellings."""
    import pyarrow as pa

    if not isinstance(text, str) or not text.strip():
        raise _unsupported(str(text), f"expected a type name; supported: {SUPPORTED_TYPES_HELP}")
    spelled = text.strip()
    lowered = spelled.lower()
    if lowered in _SIMPLE_TYPES:
        return getattr(pa, _SIMPLE_TYPES[lowered])()

    if lowered in _BRACKET_TYPES:
        return _BRACKET_TYPES[lowered](pa, text, [])
    bracket = re.fullmatch(r"([a-z0-9_]+)\s*\[(.*)\]", spelled, flags=re.IGNORECASE | re.DOTALL)
    if bracket and bracket.group(1).lower() in _BRACKET_TYPES:
        return _BRACKET_TYPES[bracket.group(1).lower()](pa, text, _split_args(bracket.group(2)))

    paren = re.fullmatch(r"(decimal|decimal128|decimal256)\s*\((.*)\)", spelled, flags=re.IGNORECASE)
    if paren:
        return _decimal(pa, text, paren.group(1).lower(), _split_args(paren.group(2)))

    angle = re.fullmatch(r"(list|large_list)\s*<(.*)>", spelled, flags=re.IGNORECASE | re.DOTALL)
    if angle:
        inner = angle.group(2).strip()
        # Arrow prints list fields as `list<item: int64>`; strip the field name, keep the type.
        named = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\s*:\s*(.+)", inner, flags=re.DOTALL)
        if named:
            inner = named.group(1).strip()
        value_type = parse_arrow_type(inner)
        return pa.list_(value_type) if angle.group(1).lower() == "list" else pa.large_list(value_type)

    name = re.match(r"[A-Za-z0-9_]*", spelled)
    head = name.group(0).lower() if name else ""
    if head in _BRACKET_TYPES or head in _MAX_DECIMAL_PRECISION or head in ("list", "large_list"):
        raise _unsupported(text, "malformed parameters")
    raise _unsupported(text, f"unknown type name; supported: {SUPPORTED_TYPES_HELP}")
