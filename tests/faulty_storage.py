"""Storage engines that fail on purpose, for tests of what a failed partition write leaves behind.

They run where the rows are written: on the Spark executors (`StageMode.WRITTEN`), whose Python workers
cannot import the test tree, so Spark ships this module's classes by value.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark import cloudpickle

from airflow_partitions.storage.parquet import ParquetStorage


class OnePartitionFailingStorage(ParquetStorage):
    """Fails to write one partition (a full disk, say); writes the others."""

    def __init__(self, victim: str) -> None:
        super().__init__()
        self.victim = victim

    def write(self, table: pa.Table, dataset_root: Path, key_path: str, *, sync: bool = True) -> list[Any]:
        if key_path == self.victim:
            raise OSError(28, "No space left on device")
        return super().write(table, dataset_root, key_path, sync=sync)


class RowLosingStorage(ParquetStorage):
    """Loses the first row of every file it writes for one partition, yet records the rows it was given."""

    def __init__(self, victim: str) -> None:
        super().__init__()
        self.victim = victim

    def write(self, table: pa.Table, dataset_root: Path, key_path: str, *, sync: bool = True) -> list[Any]:
        self.writing = key_path
        return super().write(table, dataset_root, key_path, sync=sync)

    def _write_file(self, table: pa.Table, path: Path) -> None:
        super()._write_file(table.slice(1) if self.writing == self.victim else table, path)


cloudpickle.register_pickle_by_value(sys.modules[__name__])
