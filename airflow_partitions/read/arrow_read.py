"""Reads that need no SQL, without DuckDB: the exact files of a local Parquet acceleration.

When every file a plan selected is exact (each of its rows satisfies the filter: an identity partition
read by its value, a read without a filter), reading is "every row of these files, these columns": no
residual, no SQL. A fresh process (a CLI call, a new Airflow task) then need not import DuckDB nor open
its database, a good part of a cold read's cost: pyarrow's Parquet reader reads the files directly,
verified against the catalog's SHA-256 first and page CRCs on the way (as `ParquetStorage.read` does),
and the result takes the dataset's schema exactly as the DuckDB scan's does (`storage.base.conform`).

Anything else returns None and the caller scans with DuckDB: a file lacking a wanted column (older files
after a schema change, which DuckDB fills with NULLs by name), or a file pyarrow cannot read (DuckDB's
scan then reports it, naming the file and the repair).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from airflow_partitions.storage.base import conform
from airflow_partitions.storage.parquet import ParquetStorage

if TYPE_CHECKING:
    from airflow_partitions.read.locations import FileLocation
    from airflow_partitions.storage import DataFile


def read_exact_parquet(
    location: FileLocation, files: Sequence[DataFile], wanted: Sequence[str], target: pa.Schema
) -> pa.Table | None:
    """The `wanted` columns of every row of `files` (local Parquet partition files) as `target`, or None
    when they must go through DuckDB (see the module docstring)."""
    import pyarrow.parquet as pq

    releases: list[Callable[[], None]] = []
    try:
        paths = location.paths_for_call(files, releases)  # size and SHA-256 checked before reading
        parts = []
        for path in paths:
            parquet = pq.ParquetFile(path, page_checksum_verification=True)
            stored = parquet.schema_arrow
            if any(name not in stored.names for name in wanted):
                return None
            table = parquet.read(columns=list(wanted), use_threads=True)
            original = ParquetStorage.original_schema(stored)
            # The types the file was written with (as `ParquetStorage.read`), then the dataset's.
            restored = pa.schema([original.field(name) for name in wanted])
            if not table.schema.equals(restored):
                table = table.cast(restored)
            parts.append(conform(table, target))
    except (OSError, KeyError, pa.ArrowException):
        return None
    finally:
        for release in releases:
            release()
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts)
