"""Partition file formats: parquet, duckdb (files | tables), arrow IPC; one `PartitionStorage` per engine.

Importing this package is cheap (no pyarrow / duckdb); `get_storage` imports the chosen engine.
"""

from __future__ import annotations

from typing import Any

from airflow_partitions.exceptions import StorageError
from airflow_partitions.storage.base import (
    FileVacuumResult,
    PartitionStorage,
    SharedFileCompaction,
    VacuumedFile,
    partition_directory,
    vacuum_files,
)
from airflow_partitions.storage.datafile import ColumnStats, DataFile, compute_column_stats, file_checksum
from airflow_partitions.storage.side_index import (
    DEFAULT_FPP,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_VALUES,
    ColumnIndex,
    IndexConfig,
)

ENGINES = ("parquet", "duckdb", "arrow")
PARTITION_MODES = ("files", "tables")

__all__ = [
    "ENGINES",
    "PARTITION_MODES",
    "ColumnIndex",
    "ColumnStats",
    "DataFile",
    "FileVacuumResult",
    "IndexConfig",
    "PartitionStorage",
    "SharedFileCompaction",
    "VacuumedFile",
    "compute_column_stats",
    "file_checksum",
    "get_storage",
    "index_config",
    "partition_directory",
    "vacuum_files",
]


def _name(value: Any) -> str | None:
    # Accept the spec's Enum members as well as plain strings.
    if value is None:
        return None
    return str(getattr(value, "value", value)).lower()


def get_storage(engine: Any, partition_mode: Any = None, **options: Any) -> PartitionStorage:
    """The storage engine for `engine` (`parquet` | `duckdb` | `arrow`) and, for duckdb, `partition_mode`.

    `engine` may also be a spec `AccelerationSpec`: its engine, partition_mode and the
    `acceleration.params.max_rows_per_file` setting are used, and for parquet its `row_group_rows` and
    sort columns (`params.sort_by`, else the source columns of bucket / mod fields: `sort_columns`).
    `options` go to the engine: `max_rows_per_file` (split large partitions into several files; parquet
    and arrow), for parquet `row_group_rows` (rows per row group) and `sort_by` (columns each
    partition's rows are sorted by, NULLs last), for every engine `index` (an `IndexConfig`: side
    indexes each file gets; from a spec: `params.index_columns`, `index_fpp`, `index_max_values`,
    `index_max_bytes`), and for duckdb
    `tables` mode `lock_timeout` (seconds to wait for the shared file) and `keep_staged` (keep the staged
    per-partition files after publishing; default True, from a spec: only when its snapshots are
    `enabled`, since snapshot uploads send those files).
    """
    if hasattr(engine, "engine") and hasattr(engine, "partition_mode"):
        acceleration = engine
        engine, partition_mode = acceleration.engine, acceleration.partition_mode
        limit = (getattr(acceleration, "params", None) or {}).get("max_rows_per_file")
        if limit is not None and "max_rows_per_file" not in options:
            if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
                raise StorageError(
                    f"acceleration.params.max_rows_per_file must be a positive integer, got {limit!r}"
                )
            options["max_rows_per_file"] = limit
        index = index_config(getattr(acceleration, "params", None) or {})
        if index is not None:
            options.setdefault("index", index)
        if _name(engine) == "parquet":
            row_group_rows = (getattr(acceleration, "params", None) or {}).get("row_group_rows")
            if row_group_rows is not None:
                options.setdefault("row_group_rows", row_group_rows)
            options.setdefault("sort_by", getattr(acceleration, "sort_columns", ()))
        if _name(partition_mode) == "tables" and "keep_staged" not in options:
            # Staged DuckDB copies are what snapshot uploads send; a dataset that uploads keeps them until
            # its manifest is published (see `release_staged`), any other drops them once published.
            snapshots = getattr(acceleration, "snapshots", None)
            options["keep_staged"] = _name(getattr(snapshots, "mode", None)) == "enabled"
    engine_name = _name(engine)
    mode = _name(partition_mode) or "files"
    if mode not in PARTITION_MODES:
        raise StorageError(
            f"unknown partition_mode {partition_mode!r}; use one of {', '.join(PARTITION_MODES)}"
        )
    if engine_name == "parquet":
        from airflow_partitions.storage.parquet import ParquetStorage  # lazy: loads pyarrow

        _only_files_mode(engine_name, mode)
        return ParquetStorage(**options)
    if engine_name == "arrow":
        from airflow_partitions.storage.arrow_ipc import ArrowIpcStorage  # lazy: loads pyarrow

        _only_files_mode(engine_name, mode)
        return ArrowIpcStorage(**options)
    if engine_name == "duckdb":
        from airflow_partitions.storage.duckdb_engine import (  # lazy: loads duckdb
            DuckDBFilesStorage,
            DuckDBTablesStorage,
        )

        if mode == "tables":
            return DuckDBTablesStorage(**options)
        return DuckDBFilesStorage(**options)
    raise StorageError(f"unknown storage engine {engine!r}; use one of {', '.join(ENGINES)}")


def index_config(params: Any) -> IndexConfig | None:
    """The side-index settings of `acceleration.params` (None when `index_columns` is not set)."""
    columns = params.get("index_columns")
    if not columns:
        return None
    return IndexConfig(
        columns=tuple(columns) if isinstance(columns, list | tuple) else columns,
        fpp=params.get("index_fpp", DEFAULT_FPP),
        max_values=params.get("index_max_values", DEFAULT_MAX_VALUES),
        max_bytes=params.get("index_max_bytes", DEFAULT_MAX_BYTES),
    )


def _only_files_mode(engine: str, mode: str) -> None:
    if mode != "files":
        raise StorageError(
            f"partition_mode {mode!r} is only for the duckdb engine; remove it or use engine: duckdb"
        )
