"""The `parquet` engine: one or more zstd Parquet files per partition, read back with exact Arrow types."""

from __future__ import annotations

import base64
import collections
import hashlib
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_partitions.exceptions import StorageError
from airflow_partitions.storage.base import (
    PartitionStorage,
    RemoteFileAccess,
    ScanAccess,
    _project,
    data_file_path,
    unify_schemas,
)
from airflow_partitions.storage.datafile import ColumnStats, DataFile, FileLayout, compute_column_stats
from airflow_partitions.storage.integrity import verify_file
from airflow_partitions.storage.side_index import IndexConfig, index_kind
from airflow_partitions.storage.sql import quote_identifier, quote_literal

# Parquet has no seconds unit and widens `timestamp[s]` to milliseconds; the original Arrow schema is
# kept in the footer under this key so reads restore every type exactly.
SCHEMA_METADATA_KEY = b"airflow_partitions.arrow_schema"

# Footers of remote partition files read in this process, by checksum (files are immutable): the schema
# read and the ranged first read of a file share one fetch. Bounded; the oldest go first.
FOOTERS_KEPT = 256
_footers: collections.OrderedDict[tuple[str, int], pq.FileMetaData] = collections.OrderedDict()
_footers_lock = threading.Lock()


def remember_footer(file: DataFile, metadata: pq.FileMetaData) -> None:
    """Keep the footer of a remote `file` (its row count must be the catalog's)."""
    if metadata.num_rows != file.rows:
        return
    with _footers_lock:
        _footers[(file.checksum, file.bytes)] = metadata
        _footers.move_to_end((file.checksum, file.bytes))
        while len(_footers) > FOOTERS_KEPT:
            _footers.popitem(last=False)


def forget_footers() -> None:
    """Drop every kept footer (the next read of each file fetches it again)."""
    with _footers_lock:
        _footers.clear()


def known_footer(file: DataFile) -> pq.FileMetaData | None:
    """The footer of `file` read earlier in this process, if kept."""
    with _footers_lock:
        return _footers.get((file.checksum, file.bytes))


# Parquet files at least this large get their layout recorded (`DataFile.layout`): the files a first read
# on object storage fetches by ranges (`read.ranged.RANGED_READ_MIN_BYTES`, the same size). Smaller files
# are fetched whole, and a layout (~50 bytes a row group, plus the schema) would only grow the catalog.
LAYOUT_MIN_BYTES = 8 * 1024 * 1024


def file_layout(path: Path, size: int, sort_by: Sequence[str]) -> FileLayout:
    """The layout of the Parquet file at `path` (`size` bytes) from its own footer: footer length and
    digest, each row group's byte range and rows, the row groups' bounds of the `sort_by` columns, and
    the Arrow schema it was written with."""
    with path.open("rb") as handle:
        handle.seek(size - 8)
        trailer = handle.read(8)
        footer_bytes = int.from_bytes(trailer[:4], "little") + 8
        handle.seek(size - footer_bytes)
        footer = handle.read(footer_bytes)
    metadata = pq.read_metadata(str(path))
    stored = metadata.schema.to_arrow_schema()
    schema = ParquetStorage.original_schema(stored)
    positions = {metadata.schema.column(j).path: j for j in range(metadata.num_columns)}
    stats = {}
    for name in dict.fromkeys(sort_by):
        if name not in schema.names or name not in positions:
            continue
        kind = schema.field(name).type
        stats[name] = tuple(
            row_group_stats(metadata, i, positions[name], name, kind, metadata.row_group(i).num_rows)
            for i in range(metadata.num_row_groups)
        )
    return FileLayout(
        footer_bytes=footer_bytes,
        footer_sha256=hashlib.sha256(footer).hexdigest(),
        row_groups=tuple(
            (*row_group_range(metadata, i), metadata.row_group(i).num_rows)
            for i in range(metadata.num_row_groups)
        ),
        stats=stats,
        schema=base64.b64encode(schema.serialize().to_pybytes()).decode("ascii"),
    )


def row_group_range(metadata: pq.FileMetaData, group: int) -> tuple[int, int]:
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


def row_group_stats(
    metadata: pq.FileMetaData, index: int, position: int | None, column: str, kind: pa.DataType, rows: int
) -> ColumnStats | None:
    """One row group's bounds of `column` in the catalog's form (`compute_column_stats`; None: unknown)."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
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


def recorded_schema(layout: FileLayout) -> pa.Schema | None:
    """The Arrow schema a file's layout records (None: not recorded)."""
    if layout.schema is None:
        return None
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(layout.schema)))


# Rows per row group unless `row_group_rows` says otherwise. Measured with benchmarks/bench_cold_reads.py
# on a sorted ~107k-row bucket file: a cold point read took 2.5 ms at 16k and 32k (pyarrow and DuckDB
# alike), 3.2-4.3 ms at 64k, 4.0-8.0 ms at 128k; hot reads and file size barely move between 16k and 64k.
ROW_GROUP_ROWS = 32 * 1024


class ParquetStorage(PartitionStorage):
    """Parquet files (zstd, statistics on), each partition's rows sorted by `sort_by` and cut into
    `row_group_rows`-row groups, so row-group min / max lets a point read skip most of a file; the first
    sort column delta-encoded when it holds integers, dates or timestamps, and columns of near-distinct
    values written without a dictionary (`_encoding_options`)."""

    engine = "parquet"
    format = "parquet"
    extension = "parquet"
    spark_reads_files = True

    def __init__(
        self,
        *,
        max_rows_per_file: int | None = None,
        row_group_rows: int = ROW_GROUP_ROWS,
        sort_by: Sequence[str] = (),
        index: IndexConfig | None = None,
    ) -> None:
        super().__init__(max_rows_per_file=max_rows_per_file, index=index)
        if isinstance(row_group_rows, bool) or not isinstance(row_group_rows, int) or row_group_rows < 1:
            raise StorageError(f"row_group_rows must be a positive integer, got {row_group_rows!r}")
        self.row_group_rows = row_group_rows
        self.sort_by = tuple(sort_by)

    def write(
        self, table: pa.Table, dataset_root: Path, key_path: str, *, sync: bool = True
    ) -> list[DataFile]:
        """Write `table`'s rows sorted by `sort_by` (see `sorted_rows`); nothing is replaced."""
        return super().write(sorted_rows(table, self.sort_by), dataset_root, key_path, sync=sync)

    def _write_file(self, table: pa.Table, path: Path) -> None:
        original = base64.b64encode(table.schema.remove_metadata().serialize().to_pybytes())
        metadata = dict(table.schema.metadata or {})
        metadata[SCHEMA_METADATA_KEY] = original
        pq.write_table(
            table.replace_schema_metadata(metadata),
            str(path),
            compression="zstd",
            row_group_size=self.row_group_rows,
            version="2.6",
            write_statistics=True,
            # A CRC per page, verified by every pyarrow read (compaction, ranged reads of remote files).
            write_page_checksum=True,
            bloom_filter_options=self._bloom_filter_options(table),
            **self._encoding_options(table),
        )

    def _file_layout(self, path: Path, size: int) -> FileLayout | None:
        if size < LAYOUT_MIN_BYTES:
            return None
        return file_layout(path, size, self.sort_by)

    def _encoding_options(self, table: pa.Table) -> dict[str, Any]:
        """Which columns keep a dictionary and which are delta-encoded; nothing when every column keeps
        pyarrow's defaults (a dictionary per column chunk).

        - The first sort column, when it holds integers, dates or timestamps, is `DELTA_BINARY_PACKED`.
          Sorted, such a column rises by small steps that delta encoding packs in a few bits, where a
          row group's dictionary of near-distinct keys only adds an indirection. Measured on the buckets
          of `benchmarks/bench_joins.py` (two 10M-row datasets, `bucket(16, k)` sorted by `k`): the files
          half the size, and the sixteen bucket joins 24% less CPU (DuckDB decodes the key faster).
        - A column of near-distinct values (`_near_distinct`) is written plain. Its dictionary would hold
          every value of a row group (a 32k-row group never overflows the 1 MiB dictionary page, so
          pyarrow never falls back) behind an index per row: on the taxi-like rows of
          `benchmarks/bench_arrow_memory.py` the two timestamp columns took two thirds of the encoding
          time, and plain they make the files 14% smaller and the encoding 40% faster.

        Only columns whose one Parquet leaf has their own name are chosen (a nested column's leaves keep
        their dictionaries)."""
        schema = table.schema
        first = self.sort_by[0] if self.sort_by else None
        kind = schema.field(first).type if first is not None and schema.get_field_index(first) >= 0 else None
        delta = (
            first
            if kind is not None
            and (pa.types.is_integer(kind) or pa.types.is_date(kind) or pa.types.is_timestamp(kind))
            else None
        )
        plain = {
            name
            for name in schema.names
            if name != first and schema.names.count(name) == 1 and _near_distinct(table.column(name))
        }
        if delta is None and not plain:
            return {}
        leaves = _leaf_paths(schema)
        if delta is not None and leaves.count(delta) != 1:
            delta = None  # a nested column's path spells the same name: leave its encoding alone
        plain = {name for name in plain if leaves.count(name) == 1}
        if delta is None and not plain:
            return {}
        dictionary = [path for path in leaves if path not in plain and path != delta]
        options: dict[str, Any] = {"use_dictionary": dictionary or False}
        if delta is not None:
            options["column_encoding"] = {delta: "DELTA_BINARY_PACKED"}
        return options

    def _bloom_filter_options(self, table: pa.Table) -> dict[str, dict[str, Any]] | None:
        """Parquet's own bloom filters for the index columns (not booleans: the writer refuses them).

        The catalog's side index skips whole files at planning; these let DuckDB skip row groups inside
        the files it does open (`parquet_bloom_probe` shows them). Sized for one distinct value per row.
        A file of one row group gains nothing from them over the side index, so it gets none.
        """
        if self.index is None or table.num_rows <= self.row_group_rows:
            return None
        names = [n for n in self.index.columns if n in table.column_names]
        options = {
            name: {"ndv": max(table.num_rows, 1), "fpp": self.index.fpp}
            for name in names
            if index_kind(table.schema.field(name).type) not in (None, "boolean")
        }
        return options or None

    def _read_file(self, dataset_root: Path, file: DataFile) -> pa.Table:
        path = data_file_path(dataset_root, file)
        verify_file(path, file, dataset=Path(dataset_root).name)
        table = pq.ParquetFile(str(path), page_checksum_verification=True).read()
        schema = self.original_schema(table.schema)
        return table.cast(schema) if not table.schema.equals(schema) else table

    def file_schema(self, dataset_root: Path, file: DataFile) -> pa.Schema:
        try:
            path = data_file_path(Path(dataset_root), file)
            verify_file(path, file, dataset=Path(dataset_root).name)  # a damaged footer: a wrong schema
            return self.original_schema(pq.read_schema(str(path)))
        except FileNotFoundError as err:
            raise StorageError(f"partition file {file.path} is missing under {dataset_root}") from err
        except (OSError, pa.ArrowException) as err:
            raise StorageError(
                f"could not read the footer of {file.path} under {dataset_root}: {err}"
            ) from err

    def _count_file_rows(self, dataset_root: Path, file: DataFile) -> int:
        return int(pq.read_metadata(str(data_file_path(dataset_root, file))).num_rows)

    @staticmethod
    def original_schema(stored: pa.Schema) -> pa.Schema:
        """The Arrow schema a file was written with, from the schema its footer stores."""
        metadata = dict(stored.metadata or {})
        encoded = metadata.pop(SCHEMA_METADATA_KEY, None)
        metadata.pop(b"ARROW:schema", None)
        if encoded is None:
            return stored.with_metadata(metadata) if metadata else stored.remove_metadata()
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(encoded)))
        return schema.with_metadata(metadata) if metadata else schema

    def read(
        self,
        dataset_root: Path,
        files: Sequence[DataFile],
        columns: Sequence[str] | None = None,
        filter: pc.Expression | None = None,
        *,
        schema: pa.Schema | None = None,
    ) -> pa.Table:
        """One multi-threaded dataset scan over `files`; the filter is pushed down to row groups."""
        if not files:
            return super().read(dataset_root, files, columns, filter, schema=schema)
        root = Path(dataset_root)
        unified = schema or unify_schemas([self.file_schema(root, f) for f in files], files)
        if columns is not None:
            _project(unified.empty_table(), columns)  # unknown columns: a clear error before scanning
        paths = [str(data_file_path(root, f)) for f in files]
        # Imported here, not at module level: pyarrow.dataset pulls in pandas (~0.3 s on a cold start),
        # and a point read goes through DuckDB, not this scan.
        import pyarrow.dataset as ds

        try:
            for file, path in zip(files, paths, strict=True):
                verify_file(Path(path), file, dataset=root.name)
            checked = ds.ParquetFileFormat(
                default_fragment_scan_options=ds.ParquetFragmentScanOptions(page_checksum_verification=True)
            )
            dataset = ds.dataset(paths, schema=unified, format=checked)
            return dataset.to_table(columns=list(columns) if columns is not None else None, filter=filter)
        except FileNotFoundError as err:
            raise StorageError(f"a partition file is missing under {root}: {err}") from err
        except (pa.ArrowException, OSError) as err:
            raise StorageError(f"could not read {len(files)} parquet file(s) under {root}: {err}") from err

    def register_duckdb(
        self,
        connection: Any,
        dataset_root: Path,
        files: Sequence[DataFile],
        view_name: str,
        *,
        schema: pa.Schema | None = None,
    ) -> None:
        if not files:
            self._register_empty(connection, view_name, schema)
            return
        paths = [str(data_file_path(Path(dataset_root), f)) for f in files]
        connection.execute(
            f"CREATE OR REPLACE TEMP VIEW {quote_identifier(view_name)} AS "
            f"SELECT * FROM {_read_parquet(paths, union_by_name=True)}"
        )

    def duckdb_relation(
        self,
        connection: Any,
        access: ScanAccess,
        files: Sequence[DataFile],
        schema: pa.Schema,
        *,
        union_by_name: bool,
    ) -> str:
        """`read_parquet(...)` over local copies of `files`, inline (a view would make DuckDB bind the
        files twice); DuckDB's own Parquet reader then pushes projection and filters into the scan.

        The row groups a first filtered read on object storage fetched by ranges come as Arrow tables
        (`ScanAccess.local_parts`), scanned as they are, without a local file written and read back;
        combined with the files by name."""
        del schema
        parts = access.local_parts(files)
        paths = [part for part in parts if isinstance(part, str)]
        if len(paths) == len(parts):
            return _read_parquet(paths, union_by_name=union_by_name)
        # Tables behind `OFFSET 0`: the filter stays above their scan, as for a file whose statistics
        # would prune NaN rows (`nan_outside_statistics`); their rows are few, their row groups pruned.
        relations = [_read_parquet(paths, union_by_name=union_by_name)] if paths else []
        relations.extend(
            f"(SELECT * FROM {access.arrow_relation(connection, part)} OFFSET 0)"
            for part in parts
            if not isinstance(part, str)
        )
        if len(relations) == 1:
            return relations[0]
        return "(" + " UNION ALL BY NAME ".join(f"SELECT * FROM {r}" for r in relations) + ")"

    def remote_file_schema(self, access: RemoteFileAccess, file: DataFile) -> pa.Schema:
        """The schema from the footer alone: a few ranged reads instead of the whole file. The footer is
        kept (`remember_footer`): a ranged read of the same file then fetches only its row groups."""
        recorded = recorded_schema(file.layout) if file.layout is not None else None
        if recorded is not None:
            return recorded  # kept in the catalog at write time: nothing to fetch
        cached = known_footer(file)
        if cached is not None:
            return self.original_schema(cached.schema.to_arrow_schema())
        try:
            with access.open(file) as handle:
                parquet = pq.ParquetFile(handle)
                schema = parquet.schema_arrow
                remember_footer(file, parquet.metadata)
        except (OSError, pa.ArrowException) as err:
            raise StorageError(
                f"cannot read the footer of partition file {file.path}: {err}; if its bytes are damaged, "
                "refresh the partition (or read another version)"
            ) from err
        return self.original_schema(schema)

    def nan_outside_statistics(self, file: DataFile, float_columns: Sequence[str]) -> bool:
        """Parquet statistics leave NaN out of a float column's min / max, and DuckDB prunes row groups
        with them, so a filter such as `f != 1.5` (TRUE for NaN in DuckDB) would lose NaN rows. Our
        statistics then leave `max` unknown: a file may hold NaN where that is so for a float column."""
        for name in float_columns:
            stats = file.stats.get(name)
            if stats is None or (stats.max is None and stats.null_count < file.rows):
                return True
        return False

    def spark_frame(self, spark: Any, dataset_root: Path, files: Sequence[DataFile]) -> Any:
        root = Path(dataset_root)
        for file in files:  # Spark's reader checks no page CRC: the bytes are checked here first
            verify_file(data_file_path(root, file), file, dataset=root.name)
        paths = [str(data_file_path(root, f)) for f in files]
        return spark.read.option("mergeSchema", "true").parquet(*paths)


def _leaf_paths(schema: pa.Schema) -> list[str]:
    """The Parquet column paths (`s.x`, `l.list.element`) `schema`'s columns are written under, in
    order: what `use_dictionary` / `column_encoding` name (from the footer of an empty file)."""
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, schema, version="2.6"):
        pass
    described = pq.read_metadata(pa.BufferReader(sink.getvalue())).schema
    return [described.column(i).path for i in range(len(described))]


# `_near_distinct`: the rows sampled from the start of a column, and the share of distinct values among
# them above which the column is written without a dictionary.
DICTIONARY_SAMPLE_ROWS = 4096
NEAR_DISTINCT_SHARE = 0.5


def _near_distinct(column: pa.ChunkedArray) -> bool:
    """Whether a flat column's first `DICTIONARY_SAMPLE_ROWS` non-NULL values are mostly distinct (then a
    dictionary costs more than it saves). Dictionary-typed columns keep theirs; booleans have none."""
    kind = column.type
    if pa.types.is_dictionary(kind) or pa.types.is_boolean(kind) or pa.types.is_nested(kind):
        return False
    if pa.types.is_null(kind):
        return False
    sample = column.slice(0, DICTIONARY_SAMPLE_ROWS).drop_null()
    if len(sample) < 2:
        return False
    try:
        distinct = pc.count_distinct(sample, mode="only_valid").as_py()
    except pa.ArrowException:  # a type Arrow cannot hash (an extension type): keep the default
        return False
    return bool(distinct > NEAR_DISTINCT_SHARE * len(sample))


def sorted_rows(table: pa.Table, columns: Sequence[str]) -> pa.Table:
    """`table`'s rows ordered by `columns` ascending, NULLs last, ties in their original order (Arrow's
    sort is stable): the same rows, only reordered."""
    if not columns or table.num_rows < 2:
        return table
    missing = [column for column in columns if column not in table.column_names]
    if missing:
        raise StorageError(
            f"cannot sort partition rows by {missing}: no such column; the table has "
            f"{', '.join(table.column_names)} (check acceleration.params.sort_by)"
        )
    try:
        # The sort columns made contiguous first (cheap: only they are copied): Arrow sorts one chunk of
        # small-range integers by counting, but many chunks (a partition gathered from many read
        # batches) one by one and then merges them, several times slower. The order is the same.
        keys = table.select(list(columns)).combine_chunks()
        order = pc.sort_indices(keys, sort_keys=[(column, "ascending", "at_end") for column in columns])
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise StorageError(
            f"cannot sort partition rows by {list(columns)}: {err}; sort by columns of a scalar type"
        ) from err
    return table.take(order)


def _read_parquet(paths: Sequence[str], *, union_by_name: bool) -> str:
    """DuckDB's `read_parquet(...)` over local `paths`."""
    listed = ", ".join(quote_literal(path) for path in paths)
    # Partition files sit in `name=value` directories: DuckDB's Hive auto-detection would overwrite
    # columns with the (escaped, untyped) directory values, so it is switched off explicitly.
    options = "hive_partitioning = false" + (", union_by_name = true" if union_by_name else "")
    return f"read_parquet([{listed}], {options})"
