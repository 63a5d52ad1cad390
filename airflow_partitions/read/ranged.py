"""Ranged first reads of large Parquet files on object storage: the footer, then only the row groups a
filter may need.

A point read of a large partition file that is not in the local cache yet would otherwise GET the whole
file. Instead the reader asks for the footer (pyarrow's ranged reads), judges every row group with the
project's own pruning (`pruning.evaluator.Evaluator` over the row groups' min / max / NULL counts, turned
into the same bounds the catalog records: `storage.datafile.compute_column_stats`), fetches only the row
groups that may hold a matching row (reads of neighbouring column chunks coalesced, issued concurrently:
pyarrow's pre-buffering), and decodes them into an Arrow table with the file's own schema and metadata.
DuckDB then scans that table with the residual filter (no local file is written: `duckdb_scannable`),
exactly as it would the whole file: pruning only ever drops row groups that cannot match, and every row of
a kept row group is read. A table with a column DuckDB would bind otherwise from Arrow than from Parquet
is written to a per-call local Parquet file instead (`write_local`).

Float columns: Parquet statistics leave NaN out of min / max, so their upper bound is unknown here (as in
the catalog's statistics of a file that may hold NaN). A column a file lacks is all NULL in it.

Footers are kept per process by checksum (`storage.parquet.remember_footer`): the schema read of a file
and its ranged read fetch the footer once.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from airflow_partitions.exceptions import StorageError
from airflow_partitions.objectstore.ranges import FOOTER_READ_BYTES, ObjectReplacedError, fetch_parquet_footer
from airflow_partitions.pruning.evaluator import Evaluator
from airflow_partitions.pruning.index import ColumnStatsArrays
from airflow_partitions.storage.parquet import (
    LAYOUT_MIN_BYTES,
    known_footer,
    remember_footer,
    row_group_range,
    row_group_stats,
)

if TYPE_CHECKING:
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    from airflow_partitions.objectstore.ranges import RangedObject
    from airflow_partitions.pruning.expressions import Predicate
    from airflow_partitions.storage import DataFile
    from airflow_partitions.storage.datafile import ColumnStats, FileLayout

log = logging.getLogger(__name__)

# Files at least this large are read by ranges on their first read (the catalog knows each file's size).
# Below it, one GET of the whole file into the cache costs about as much as a footer and a row group.
# The same size as the files whose layout the writer records (`storage.parquet.LAYOUT_MIN_BYTES`).
RANGED_READ_MIN_BYTES = LAYOUT_MIN_BYTES


@dataclass(frozen=True)
class RangedRead:
    """What a ranged read fetched: the row groups kept out of all, and the rows they hold (`path`: the
    remote file read)."""

    path: str
    row_groups_read: int
    row_groups: int
    rows_read: int


class RowGroupFrame:
    """The row groups of one Parquet file as an evaluator frame: statistics only, no partition values.

    `recorded`: bounds already derived from this very footer (a layout whose footer digest was checked
    against the footer read), used as they are instead of being derived again."""

    def __init__(
        self,
        metadata: pq.FileMetaData,
        schema: pa.Schema,
        recorded: Mapping[str, tuple[ColumnStats | None, ...]] | None = None,
    ) -> None:
        self.metadata = metadata
        self.schema = schema
        self.recorded = recorded or {}
        self.size = metadata.num_row_groups
        self.values: dict[str, pa.Array] = {}
        self.rows = np.fromiter(
            (metadata.row_group(i).num_rows for i in range(self.size)), dtype=np.int64, count=self.size
        )
        self._columns = {
            metadata.row_group(0).column(j).path_in_schema: j
            for j in range(metadata.row_group(0).num_columns if self.size else 0)
        }
        self._stats: dict[str, ColumnStatsArrays | None] = {}

    def stats(self, column: str) -> ColumnStatsArrays | None:
        if column not in self._stats:
            self._stats[column] = self._build(column)
        return self._stats[column]

    def _build(self, column: str) -> ColumnStatsArrays | None:
        if column not in self.schema.names:
            return None
        kind = self.schema.field(column).type
        if pa.types.is_dictionary(kind):
            kind = kind.value_type
        recorded = self.recorded.get(column)
        if recorded is not None and len(recorded) == self.size:
            return _stats_arrays(list(recorded), kind, self.rows)
        position = self._columns.get(column)
        bounds = [
            row_group_stats(self.metadata, i, position, column, kind, int(self.rows[i]))
            for i in range(self.size)
        ]
        return _stats_arrays(bounds, kind, self.rows)


class RecordedRowGroups:
    """The row groups of one Parquet file as an evaluator frame from its recorded layout (`FileLayout`):
    the sort columns' bounds as recorded, every other column unknown (so it keeps every row group the
    footer's statistics would keep, and maybe more)."""

    def __init__(self, layout: FileLayout, schema: pa.Schema) -> None:
        self.layout = layout
        self.schema = schema
        self.size = len(layout.row_groups)
        self.values: dict[str, pa.Array] = {}
        self.rows = np.fromiter((g[2] for g in layout.row_groups), dtype=np.int64, count=self.size)

    def stats(self, column: str) -> ColumnStatsArrays | None:
        recorded = self.layout.stats.get(column)
        if recorded is None or len(recorded) != self.size or column not in self.schema.names:
            return None
        kind = self.schema.field(column).type
        if pa.types.is_dictionary(kind):
            kind = kind.value_type
        return _stats_arrays(list(recorded), kind, self.rows)


def _stats_arrays(bounds: list[ColumnStats | None], kind: pa.DataType, rows: np.ndarray) -> ColumnStatsArrays:
    """Per-row-group bounds (None: unknown) as the evaluator's arrays."""
    nulls = np.array([-1 if b is None else b.null_count for b in bounds], dtype=np.int64)
    try:
        minimum = pa.array([None if b is None else b.min for b in bounds], type=kind)
        maximum = pa.array([None if b is None else b.max for b in bounds], type=kind)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError, TypeError):
        minimum = pa.nulls(len(bounds), kind)
        maximum = pa.nulls(len(bounds), kind)
    return ColumnStatsArrays(minimum, maximum, nulls, rows)


def row_groups_to_read(
    metadata: pq.FileMetaData,
    schema: pa.Schema,
    predicate: Predicate,
    recorded: Mapping[str, tuple[ColumnStats | None, ...]] | None = None,
) -> list[int]:
    """The row groups of a file that may hold a row satisfying the prepared `predicate` (`recorded`: see
    `RowGroupFrame`)."""
    return _may_match(RowGroupFrame(metadata, schema, recorded), predicate)


def _may_match(frame: RowGroupFrame | RecordedRowGroups, predicate: Predicate) -> list[int]:
    if frame.size == 0:
        return []
    outcome = Evaluator((), frame).evaluate(predicate)
    return [int(i) for i in np.flatnonzero(outcome.true & (frame.rows > 0))]


def read_row_groups(
    filesystem: pafs.FileSystem,
    remote: str,
    file: DataFile,
    predicate: Predicate,
    schema: pa.Schema,
) -> tuple[RangedRead, pa.Table]:
    """Fetch the footer of `remote`, then the row groups that may match `predicate`; what was read, and
    those row groups' rows with the file's schema (and schema metadata)."""
    import pyarrow.parquet as pq

    try:
        with filesystem.open_input_file(remote) as handle:
            if handle.size() != file.bytes:
                raise StorageError(
                    f"{remote} holds {handle.size()} bytes, the catalog recorded {file.bytes}: it is not "
                    "the file this version references; read another version or refresh the partition"
                )
            # Pages carry CRCs (written since page checksums were switched on): each page fetched is
            # verified; the footer has none, but its row count must match the catalog's. A footer read
            # before (the schema's) is not fetched again.
            parquet = pq.ParquetFile(
                handle, metadata=known_footer(file), pre_buffer=True, page_checksum_verification=True
            )
            metadata = parquet.metadata
            _check_layout(remote, metadata, file)
            remember_footer(file, metadata)
            _check_rows(remote, metadata, file)
            kept = row_groups_to_read(metadata, schema, predicate)
            table = parquet.read_row_groups(kept, use_threads=True) if kept else None
    except (OSError, pa.ArrowException) as err:
        raise StorageError(f"cannot read {remote}: {err}") from err
    return _kept_rows(remote, parquet.schema_arrow, metadata, kept, table)


def read_row_groups_by_ranges(
    obj: RangedObject, file: DataFile, predicate: Predicate, schema: pa.Schema
) -> tuple[RangedRead, pa.Table]:
    """As `read_row_groups`, over an S3 object read by ranged GETs of its own (`objectstore.ranges`): the
    footer (unless kept from an earlier read) is one GET of the file's end, then the column chunks of the
    row groups the filter keeps are fetched at once, coalesced and concurrently, and pyarrow decodes them
    from memory. No HEAD: the catalog recorded the size, and every response is checked against it.

    With the file's layout recorded (`DataFile.layout`), the footer and the row groups the recorded bounds
    may keep are fetched together, in one round of GETs (`_fetch_footer`); the footer then decides, as
    without a layout, which row groups are read (any the first round missed is fetched then)."""
    import pyarrow.parquet as pq

    metadata = known_footer(file)
    try:
        verified = _fetch_footer(obj, file, predicate, schema) if metadata is None else None
        handle = pa.PythonFile(obj, mode="r")
        parquet = pq.ParquetFile(handle, metadata=metadata, page_checksum_verification=True)
        metadata = parquet.metadata
        remember_footer(file, metadata)
        _check_rows(obj.uri, metadata, file)
        kept = row_groups_to_read(metadata, schema, predicate, verified.stats if verified else None)
        ranges = [row_group_range(metadata, group) for group in kept]
        if file.layout is not None and ranges != [
            file.layout.row_groups[g][:2] for g in kept if g < len(file.layout.row_groups)
        ]:
            log.debug(
                "%s: the recorded row-group locations differ from its footer's; read by the footer", obj.uri
            )
        obj.prefetch(ranges)
        table = parquet.read_row_groups(kept, use_threads=False) if kept else None
    except (OSError, pa.ArrowException) as err:
        raise StorageError(f"cannot read {obj.uri}: {err}") from err
    return _kept_rows(obj.uri, parquet.schema_arrow, metadata, kept, table)


def _fetch_footer(
    obj: RangedObject, file: DataFile, predicate: Predicate, schema: pa.Schema
) -> FileLayout | None:
    """Fetch the footer of `file` into `obj`; with a usable recorded layout, the row groups its recorded
    bounds may keep in the same round of GETs, and the footer must be the one recorded (its digest): an
    object with another footer is not the file the catalog references, whatever its size. The layout
    when the footer fetched is the recorded one."""
    layout = _usable_layout(file, obj.uri)
    if layout is None:
        fetch_parquet_footer(obj)
        return None
    ahead = _may_match(RecordedRowGroups(layout, schema), predicate)
    # As much of the end as a Parquet reader's first footer read asks for: then it reads from memory.
    tail = min(file.bytes, max(layout.footer_bytes, FOOTER_READ_BYTES))
    obj.prefetch([(file.bytes - tail, tail), *(layout.row_groups[g][:2] for g in ahead)])
    footer = obj.tail(layout.footer_bytes)
    if hashlib.sha256(footer).hexdigest() != layout.footer_sha256:
        raise ObjectReplacedError(
            f"{obj.uri}: its footer differs from the one recorded when the file was written: it is not "
            "the file this version references (replaced or damaged); read another version or refresh "
            "the partition"
        )
    return layout


def _usable_layout(file: DataFile, uri: str) -> FileLayout | None:
    """`file.layout` when it fits the file (footer and row groups inside its recorded size, rows adding
    up to its row count); None otherwise, and then the read fetches the footer first."""
    layout = file.layout
    if layout is None:
        return None
    footer_start = file.bytes - layout.footer_bytes
    fits = (
        12 <= layout.footer_bytes <= file.bytes - 4
        and all(
            offset >= 4 and length >= 0 and offset + length <= footer_start
            for offset, length, _ in layout.row_groups
        )
        and sum(rows for _, _, rows in layout.row_groups) == file.rows
    )
    if not fits:
        log.debug(
            "%s: its recorded layout does not fit its %d bytes and %d rows; fetching the footer first",
            uri,
            file.bytes,
            file.rows,
        )
        return None
    return layout


def _check_layout(remote: str, metadata: pq.FileMetaData, file: DataFile) -> None:
    """A footer read through a filesystem (its bytes not at hand to digest) must at least place the row
    groups where the recorded layout does, with the same rows: another file of the same size would not."""
    layout = _usable_layout(file, remote)
    if layout is None:
        return
    found = tuple(
        (*row_group_range(metadata, i), metadata.row_group(i).num_rows)
        for i in range(metadata.num_row_groups)
    )
    if found != layout.row_groups:
        raise ObjectReplacedError(
            f"{remote}: its row groups lie elsewhere than recorded when the file was written: it is not the "
            "file this version references (replaced or damaged); read another version or refresh the "
            "partition"
        )


def _check_rows(remote: str, metadata: pq.FileMetaData, file: DataFile) -> None:
    if metadata.num_rows != file.rows:
        raise StorageError(
            f"{remote} holds {metadata.num_rows} rows, the catalog recorded {file.rows}: it is not "
            "the file this version references; read another version or refresh the partition"
        )


def _kept_rows(
    remote: str, stored: pa.Schema, metadata: pq.FileMetaData, kept: list[int], table: pa.Table | None
) -> tuple[RangedRead, pa.Table]:
    """The rows of the kept row groups as they were: the stored schema and its metadata (the original
    Arrow schema)."""
    if table is None:
        table = stored.empty_table()
    table = table.replace_schema_metadata(stored.metadata)
    return RangedRead(remote, len(kept), metadata.num_row_groups, table.num_rows), table


def duckdb_scannable(table: pa.Table) -> pa.Table | None:
    """`table` as DuckDB scans it with the types its Parquet reader gives the same columns (seconds and
    milliseconds timestamps as microseconds, as DuckDB reads them from Parquet); None when a column's
    type could bind otherwise from Arrow than from Parquet (a duration is an INTERVAL from Arrow, a
    BIGINT from Parquet; nested, time, float16, ... types are not mapped here): that table is written
    to a local Parquet file for DuckDB to read instead (`write_local`)."""
    fields = []
    for field in table.schema:
        kind = _scanned_type(field.type)
        if kind is None:
            return None
        fields.append(field.with_type(kind))
    scanned = pa.schema(fields, metadata=table.schema.metadata)
    return table if scanned.equals(table.schema) else table.cast(scanned)


def _scanned_type(kind: pa.DataType) -> pa.DataType | None:
    if pa.types.is_dictionary(kind):
        return kind if _is_text(kind.value_type) else None
    if pa.types.is_timestamp(kind):
        return pa.timestamp("us", kind.tz) if kind.unit in ("s", "ms") else kind
    simple = (
        pa.types.is_integer(kind)
        or kind in (pa.float32(), pa.float64(), pa.bool_(), pa.date32())
        or pa.types.is_decimal128(kind)
        or _is_text(kind)
        or kind in (pa.binary(), pa.large_binary())
    )
    return kind if simple else None


def _is_text(kind: pa.DataType) -> bool:
    return kind in (pa.string(), pa.large_string())


def write_local(table: pa.Table, into: Path) -> str:
    """Rows of a ranged read written to a new local Parquet file under `into` as they were (same schema,
    same metadata); its path."""
    import pyarrow.parquet as pq

    into.mkdir(parents=True, exist_ok=True)
    local = into / f"ranged-{uuid.uuid4().hex}.parquet"
    pq.write_table(
        table,
        str(local),
        compression="none",
        version="2.6",
        write_statistics=True,
    )
    return str(local)
