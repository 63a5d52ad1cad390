"""The `arrow` engine: Arrow IPC files per partition, memory-mapped on read (zero-copy)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from airflow_partitions.storage.base import PartitionStorage, conform, data_file_path, unify_schemas
from airflow_partitions.storage.datafile import DataFile
from airflow_partitions.storage.integrity import verify_file

BATCH_ROWS = 64 * 1024


class ArrowIpcStorage(PartitionStorage):
    """Uncompressed Arrow IPC files: a read maps the file and hands out buffers without copying."""

    engine = "arrow"
    format = "arrow"
    extension = "arrow"

    def _write_file(self, table: pa.Table, path: Path) -> None:
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=BATCH_ROWS)

    def _read_file(self, dataset_root: Path, file: DataFile) -> pa.Table:
        return pa.ipc.open_file(_checked_map(Path(dataset_root), file)).read_all()

    def file_schema(self, dataset_root: Path, file: DataFile) -> pa.Schema:
        return pa.ipc.open_file(_checked_map(Path(dataset_root), file)).schema

    def _count_file_rows(self, dataset_root: Path, file: DataFile) -> int:
        reader = pa.ipc.open_file(_checked_map(dataset_root, file))
        # The batch lengths, read from the memory map without copying; `count_rows` is pyarrow 26+ only.
        return sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))

    def register_duckdb(
        self,
        connection: Any,
        dataset_root: Path,
        files: Sequence[DataFile],
        view_name: str,
        *,
        schema: pa.Schema | None = None,
    ) -> None:
        # DuckDB cannot open IPC files without an extension; it scans the mapped Arrow buffers instead.
        if not files:
            self._register_empty(connection, view_name, schema)
            return
        tables = self._read_many(Path(dataset_root), files, None)
        unified = schema or unify_schemas([t.schema for t in tables], files)
        connection.register(view_name, pa.concat_tables([conform(t, unified) for t in tables]))


def _checked_map(dataset_root: Path, file: DataFile) -> pa.MemoryMappedFile:
    """`file` memory-mapped once its bytes match the catalog's SHA-256: the IPC reader trusts the offsets
    in the file, so damaged bytes could otherwise make it read outside its buffers."""
    path = data_file_path(dataset_root, file)
    verify_file(path, file, dataset=dataset_root.name)
    return pa.memory_map(str(path), "r")
