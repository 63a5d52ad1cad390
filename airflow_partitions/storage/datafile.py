"""The descriptor of one written partition file: location, size, checksum and per-column statistics.

`DataFile` is what a writer returns, what the catalog records and what pruning reads, so this module stays
light: no pyarrow at import time (the Airflow layer may import it while parsing DAGs). Statistics are
computed once, at write time, by `compute_column_stats`.

Statistics semantics (pruning relies on them):

* `min` / `max` are inclusive bounds of the non-NULL values. `None` means *unknown* (all values NULL,
  a type without an order, or a float column containing NaN for `max`, since SQL engines sort NaN above
  every number): a pruner must then assume the file might match.
* Bounds may be looser than the data, never tighter: strings and binaries longer than
  `STATS_PREFIX_LENGTH` keep a prefix (the max prefix is rounded up), nanosecond timestamps are widened to
  whole microseconds (min floored, max ceiled) because Python datetimes hold microseconds.
* `null_count` is exact.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import StorageError
from airflow_partitions.keys import value_from_json, value_to_json
from airflow_partitions.storage.side_index import ColumnIndex

if TYPE_CHECKING:
    import pyarrow as pa

STATS_PREFIX_LENGTH = 64
_CHUNK = 1 << 20
_FLOAT_TAG = "$f"


@dataclass(frozen=True, slots=True)
class ColumnStats:
    """Inclusive min / max of a column's non-NULL values (`None` = unknown) and its exact NULL count."""

    min: Any
    max: Any
    null_count: int

    def to_json(self) -> list[Any]:
        return [stat_to_json(self.min), stat_to_json(self.max), self.null_count]

    @classmethod
    def from_json(cls, data: Any) -> ColumnStats:
        low, high, nulls = data
        return cls(stat_from_json(low), stat_from_json(high), int(nulls))


@dataclass(frozen=True, slots=True)
class FileLayout:
    """Where a large Parquet file's footer and row groups lie, read from its own footer at write time, so
    a first read of the file on object storage fetches its footer and the row groups a filter may need at
    once (`read.ranged`) instead of one after the other, and the dataset's schema needs no fetch at all.

    `footer_bytes` is the length of the footer and its 8-byte trailer at the file's end, `footer_sha256`
    their digest: a footer fetched that differs is not this file's. `row_groups` holds each row group's
    `(offset, length, rows)`; `stats` the row groups' bounds of the sort columns (`ColumnStats`, None:
    unknown), which only choose what to fetch ahead (the fetched footer decides what is read); `schema`
    the Arrow schema the file was written with (base64 Arrow IPC).
    """

    footer_bytes: int
    footer_sha256: str
    row_groups: tuple[tuple[int, int, int], ...]
    stats: Mapping[str, tuple[ColumnStats | None, ...]] = field(default_factory=dict)
    schema: str | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "footer": [self.footer_bytes, self.footer_sha256],
            "row_groups": [list(group) for group in self.row_groups],
            "stats": {
                name: [None if s is None else s.to_json() for s in groups]
                for name, groups in self.stats.items()
            },
        }
        if self.schema is not None:
            data["schema"] = self.schema
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FileLayout:
        footer_bytes, footer_sha256 = data["footer"]
        return cls(
            footer_bytes=int(footer_bytes),
            footer_sha256=str(footer_sha256),
            row_groups=tuple((int(o), int(n), int(r)) for o, n, r in data["row_groups"]),
            stats={
                str(name): tuple(None if s is None else ColumnStats.from_json(s) for s in groups)
                for name, groups in data.get("stats", {}).items()
            },
            schema=data.get("schema"),
        )


@dataclass(frozen=True, slots=True)
class DataFile:
    """One immutable partition file, as recorded in the catalog.

    `path` is relative to the dataset root (`<key_path>/<unique name>`); `table` names the table inside the
    shared DuckDB file for the duckdb `tables` partition mode (`None` for every other engine and for a
    staged, not yet published, duckdb-tables file). `checksum` is the sha256 hex digest of the file bytes.
    """

    path: str
    format: str
    rows: int
    bytes: int
    checksum: str
    # Stats are derived from the file's content, which `checksum` already identifies: leave them out of
    # the hash so descriptors can live in sets.
    stats: Mapping[str, ColumnStats] = field(default_factory=dict, hash=False)
    table: str | None = None
    # Side indexes of the dataset's `index_columns` (`storage/side_index.py`), derived from the content
    # like `stats`; empty when none are configured or the file predates them.
    index: Mapping[str, ColumnIndex] = field(default_factory=dict, hash=False)
    # Where the footer and row groups lie (large Parquet files only; None for others and older files).
    layout: FileLayout | None = field(default=None, hash=False)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "path": self.path,
            "format": self.format,
            "rows": self.rows,
            "bytes": self.bytes,
            "checksum": self.checksum,
            "stats": {name: stats.to_json() for name, stats in self.stats.items()},
        }
        if self.table is not None:
            data["table"] = self.table
        if self.index:
            data["index"] = {name: column.to_json() for name, column in self.index.items()}
        if self.layout is not None:
            data["layout"] = self.layout.to_json()
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DataFile:
        try:
            return cls(
                path=data["path"],
                format=data["format"],
                rows=int(data["rows"]),
                bytes=int(data["bytes"]),
                checksum=data["checksum"],
                stats={name: ColumnStats.from_json(raw) for name, raw in data.get("stats", {}).items()},
                table=data.get("table"),
                index={name: ColumnIndex.from_json(raw) for name, raw in data.get("index", {}).items()},
                layout=FileLayout.from_json(data["layout"]) if "layout" in data else None,
            )
        except (KeyError, TypeError, ValueError) as err:
            raise StorageError(f"malformed data file descriptor {dict(data)!r}: {err}") from err


# --- statistics values in JSON ---------------------------------------------------------------------


def stat_to_json(value: Any) -> Any:
    """JSON form of a stats bound: `keys.value_to_json` for scalars, non-finite floats tagged."""
    if value is None or type(value) in (int, str, bool):
        return value  # the common case, without value_to_json's type dispatch
    if isinstance(value, float):
        # JSON has no NaN / Infinity; finite floats stay plain numbers (`2.0` parses back as a float).
        return value if math.isfinite(value) else {_FLOAT_TAG: repr(value)}
    return value_to_json(value)


def stat_from_json(data: Any) -> Any:
    """Inverse of `stat_to_json`."""
    if data is None or type(data) in (int, str, bool, float):
        # The common case, before any `isinstance(..., Mapping)`: in a freshly forked task process the
        # first such check of a type walks every registered Mapping subclass (milliseconds).
        return data
    if isinstance(data, float):
        return data
    if isinstance(data, Mapping) and _FLOAT_TAG in data:
        return float(data[_FLOAT_TAG])
    return value_from_json(data)


# --- computing statistics -------------------------------------------------------------------------


def file_checksum(path: Path) -> str:
    """sha256 hex digest of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def compute_column_stats(table: pa.Table) -> dict[str, ColumnStats]:
    """Per-column min / max / null count of `table` (see the module docstring for the bound semantics)."""
    return {name: _column_stats(table.column(name)) for name in table.column_names}


def _column_stats(column: pa.ChunkedArray) -> ColumnStats:
    import pyarrow as pa
    import pyarrow.compute as pc

    nulls = column.null_count
    kind = column.type
    if nulls == len(column) or not _has_order(kind):
        return ColumnStats(None, None, nulls)
    if pa.types.is_dictionary(kind):
        column = column.cast(kind.value_type)
        kind = kind.value_type
    bounds = pc.min_max(column)
    low, high = bounds["min"], bounds["max"]
    if pa.types.is_floating(kind):
        low_value, high_value = low.as_py(), high.as_py()
        if low_value is None or math.isnan(low_value):
            return ColumnStats(None, None, nulls)
        if pc.any(pc.is_nan(column)).as_py():
            high_value = None
        return ColumnStats(float(low_value), None if high_value is None else float(high_value), nulls)
    if pa.types.is_timestamp(kind):
        return ColumnStats(_timestamp_bound(low, up=False), _timestamp_bound(high, up=True), nulls)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return ColumnStats(_text_lower(low.as_py()), _text_upper(high.as_py()), nulls)
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind):
        return ColumnStats(_bytes_lower(low.as_py()), _bytes_upper(high.as_py()), nulls)
    return ColumnStats(low.as_py(), high.as_py(), nulls)


def _has_order(kind: pa.DataType) -> bool:
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        return _has_order(kind.value_type)
    return bool(
        pa.types.is_integer(kind)
        or pa.types.is_floating(kind)
        or pa.types.is_decimal(kind)
        or pa.types.is_boolean(kind)
        or pa.types.is_date(kind)
        or pa.types.is_timestamp(kind)
        or pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_fixed_size_binary(kind)
    )


def _timestamp_bound(scalar: pa.Scalar, *, up: bool) -> dt.datetime | None:
    """A microsecond datetime bound of a timestamp of any unit, rounded outwards (`None`: out of range)."""
    import pyarrow as pa

    kind = scalar.type
    ticks = scalar.cast(pa.int64()).as_py()
    per_micro = {"s": None, "ms": None, "us": 1, "ns": 1000}[kind.unit]
    if per_micro is None:
        micros = ticks * (1_000_000 if kind.unit == "s" else 1000)
    else:
        micros = -((-ticks) // per_micro) if up else ticks // per_micro
    try:
        base = dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=micros)
    except OverflowError:
        return None  # beyond Python's datetime range: unknown bound, never a wrong one
    if kind.tz is None:
        return base
    return base.replace(tzinfo=dt.UTC)


def _text_lower(text: str) -> str:
    return text[:STATS_PREFIX_LENGTH]


def _text_upper(text: str) -> str | None:
    if len(text) <= STATS_PREFIX_LENGTH:
        return text
    prefix = text[:STATS_PREFIX_LENGTH]
    # The smallest string above every string starting with `prefix`: bump the last bumpable character.
    for index in range(len(prefix) - 1, -1, -1):
        code = ord(prefix[index]) + 1
        if 0xD800 <= code <= 0xDFFF:
            code = 0xE000
        if code <= 0x10FFFF:
            return prefix[:index] + chr(code)
    return None


def _bytes_lower(data: bytes) -> bytes:
    return data[:STATS_PREFIX_LENGTH]


def _bytes_upper(data: bytes) -> bytes | None:
    if len(data) <= STATS_PREFIX_LENGTH:
        return data
    prefix = bytearray(data[:STATS_PREFIX_LENGTH])
    while prefix:
        if prefix[-1] < 0xFF:
            prefix[-1] += 1
            return bytes(prefix)
        prefix.pop()
    return None
