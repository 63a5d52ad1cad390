"""Ranged first reads of large Parquet files on object storage: the footer, then only the row groups a
filter may need.

A point read of a large partition file that is not in the local cache yet would otherwise GET the whole
file. Instead the reader asks for the footer (pyarrow's ranged reads), judges every row group with the
project's own pruning (`pruning.evaluator.Evaluator` over the row groups' min / max / NULL counts, turned
into the same bounds the catalog records: `storage.datafile.compute_column_stats`), fetches only the row
groups that may hold a matching row (reads of neighbouring column chunks coalesced, issued concurrently:
pyarrow's pre-buffering), and writes them to a per-call local Parquet file with the file's own schema and
metadata. DuckDB then scans that file with the residual filter, exactly as it would the whole
file: pruning only ever drops row groups that cannot match, and every row of a kept row group is read.

Float columns: Parquet statistics leave NaN out of min / max, so their upper bound is unknown here (as in
the catalog's statistics of a file that may hold NaN). A column a file lacks is all NULL in it.

Footers are kept per process by checksum (`storage.parquet.remember_footer`): the schema read of a file
and its ranged read fetch the footer once.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from airflow_partitions.exceptions import StorageError
from airflow_partitions.objectstore.ranges import fetch_parquet_footer
from airflow_partitions.pruning.evaluator import Evaluator
from airflow_partitions.pruning.index import ColumnStatsArrays
from airflow_partitions.storage.datafile import ColumnStats, compute_column_stats
from airflow_partitions.storage.parquet import known_footer, remember_footer

if TYPE_CHECKING:
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    from airflow_partitions.objectstore.ranges import RangedObject
    from airflow_partitions.pruning.expressions import Predicate
    from airflow_partitions.storage import DataFile

# Files at least this large are read by ranges on their first read (the catalog knows each file's size).
# Below it, one GET of the whole file into the cache costs about as much as a footer and a row group.
RANGED_READ_MIN_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class RangedRead:
    """What a ranged read fetched: the row groups kept out of all, and the rows they hold."""

    path: str
    row_groups_read: int
    row_groups: int
    rows_read: int


class RowGroupFrame:
    """The row groups of one Parquet file as an evaluator frame: statistics only, no partition values."""

    def __init__(self, metadata: pq.FileMetaData, schema: pa.Schema) -> None:
        self.metadata = metadata
        self.schema = schema
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
        position = self._columns.get(column)
        bounds = [
            _row_group_stats(self.metadata, i, position, column, kind, int(self.rows[i]))
            for i in range(self.size)
        ]
        nulls = np.array([-1 if b is None else b.null_count for b in bounds], dtype=np.int64)
        try:
            minimum = pa.array([None if b is None else b.min for b in bounds], type=kind)
            maximum = pa.array([None if b is None else b.max for b in bounds], type=kind)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError, TypeError):
            minimum = pa.nulls(self.size, kind)
            maximum = pa.nulls(self.size, kind)
        return ColumnStatsArrays(minimum, maximum, nulls, self.rows)


def _row_group_stats(
    metadata: pq.FileMetaData, index: int, position: int | None, column: str, kind: pa.DataType, rows: int
) -> ColumnStats | None:
    """One row group's bounds of `column` in the catalog's form (None: unknown)."""
    if position is None:
        return ColumnStats(None, None, rows)  # the file lacks the column: every row is NULL
    chunk = metadata.row_group(index).column(position)
    statistics = chunk.statistics
    if statistics is None or not statistics.has_null_count:
        return None
    nulls = int(statistics.null_count)
    if nulls == rows:
        return ColumnStats(None, None, nulls)
    if not statistics.has_min_max:
        return ColumnStats(None, None, nulls)
    try:
        pair = pa.table({column: pa.array([statistics.min, statistics.max], type=kind)})
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError, TypeError):
        return ColumnStats(None, None, nulls)
    bounds = compute_column_stats(pair)[column]
    high = None if pa.types.is_floating(kind) else bounds.max  # NaN is outside Parquet's min / max
    return ColumnStats(bounds.min, high, nulls)


def row_groups_to_read(metadata: pq.FileMetaData, schema: pa.Schema, predicate: Predicate) -> list[int]:
    """The row groups of a file that may hold a row satisfying the prepared `predicate`."""

    frame = RowGroupFrame(metadata, schema)
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
    into: Path,
) -> RangedRead:
    """Fetch the footer of `remote`, then the row groups that may match `predicate`, into a local Parquet
    file under `into` with the same schema (and schema metadata); what was read."""
    import pyarrow.parquet as pq

    into.mkdir(parents=True, exist_ok=True)
    local = into / f"ranged-{uuid.uuid4().hex}.parquet"
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
            remember_footer(file, metadata)
            _check_rows(remote, metadata, file)
            kept = row_groups_to_read(metadata, schema, predicate)
            table = parquet.read_row_groups(kept, use_threads=True) if kept else None
    except (OSError, pa.ArrowException) as err:
        raise StorageError(f"cannot read {remote}: {err}") from err
    return _write_local(parquet.schema_arrow, metadata, kept, table, local)


def read_row_groups_by_ranges(
    obj: RangedObject, file: DataFile, predicate: Predicate, schema: pa.Schema, into: Path
) -> RangedRead:
    """As `read_row_groups`, over an S3 object read by ranged GETs of its own (`objectstore.ranges`): the
    footer (unless kept from an earlier read) is one GET of the file's end, then the column chunks of the
    row groups the filter keeps are fetched at once, coalesced and concurrently, and pyarrow decodes them
    from memory. No HEAD: the catalog recorded the size, and every response is checked against it."""
    import pyarrow.parquet as pq

    into.mkdir(parents=True, exist_ok=True)
    local = into / f"ranged-{uuid.uuid4().hex}.parquet"
    metadata = known_footer(file)
    try:
        if metadata is None:
            fetch_parquet_footer(obj)
        handle = pa.PythonFile(obj, mode="r")
        parquet = pq.ParquetFile(handle, metadata=metadata, page_checksum_verification=True)
        metadata = parquet.metadata
        remember_footer(file, metadata)
        _check_rows(obj.uri, metadata, file)
        kept = row_groups_to_read(metadata, schema, predicate)
        obj.prefetch([_row_group_range(metadata, group) for group in kept])
        table = parquet.read_row_groups(kept, use_threads=False) if kept else None
    except (OSError, pa.ArrowException) as err:
        raise StorageError(f"cannot read {obj.uri}: {err}") from err
    return _write_local(parquet.schema_arrow, metadata, kept, table, local)


def _row_group_range(metadata: pq.FileMetaData, group: int) -> tuple[int, int]:
    """`(offset, length)` of a row group's column chunks, which lie back to back in the file."""
    row_group = metadata.row_group(group)
    starts, ends = [], []
    for j in range(row_group.num_columns):
        column = row_group.column(j)
        start = column.data_page_offset
        if column.has_dictionary_page and column.dictionary_page_offset is not None:
            start = min(start, column.dictionary_page_offset)
        starts.append(start)
        ends.append(start + column.total_compressed_size)
    return (min(starts), max(ends) - min(starts)) if starts else (0, 0)


def _check_rows(remote: str, metadata: pq.FileMetaData, file: DataFile) -> None:
    if metadata.num_rows != file.rows:
        raise StorageError(
            f"{remote} holds {metadata.num_rows} rows, the catalog recorded {file.rows}: it is not "
            "the file this version references; read another version or refresh the partition"
        )


def _write_local(
    stored: pa.Schema,
    metadata: pq.FileMetaData,
    kept: list[int],
    table: pa.Table | None,
    local: Path,
) -> RangedRead:
    """The row groups read, written to `local` as they were: same schema, same metadata (the original
    Arrow schema), row groups kept whole, so the local file reads back exactly as those row groups of
    the remote one."""
    import pyarrow.parquet as pq

    if table is None:
        table = stored.empty_table()
    group_rows = max((metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)), default=1)
    pq.write_table(
        table.replace_schema_metadata(stored.metadata),
        str(local),
        compression="none",
        row_group_size=max(group_rows, 1),
        version="2.6",
        write_statistics=True,
    )
    return RangedRead(str(local), len(kept), metadata.num_row_groups, table.num_rows)
