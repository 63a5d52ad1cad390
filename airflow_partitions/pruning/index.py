"""A columnar view of one catalog snapshot for pruning: partition values per field, files and statistics.

Built once per snapshot (catalog versions are immutable, so a reader caches it per version) from the
snapshot's own columnar partition table, without decoding every `PartitionEntry`: keys are parsed in bulk
into one Arrow array per partition field, and file descriptors (with their per-column min / max / NULL
counts) are decoded only for the partitions that survive pruning on the keys.

Partition fields come from the snapshot's recorded partition spec, not from today's YAML: an old version
is pruned with the expressions that wrote it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from airflow_partitions.exceptions import CatalogError, PartitionExpressionError
from airflow_partitions.keys import value_from_json
from airflow_partitions.storage.datafile import DataFile

if TYPE_CHECKING:
    from airflow_partitions.catalog import PartitionEntry, Snapshot
    from airflow_partitions.transforms import Transform


@dataclass(frozen=True, slots=True)
class BoundField:
    """One partition field of a snapshot: its name, position in the key, and transform bound to the schema."""

    name: str
    position: int
    transform: Transform

    @property
    def column(self) -> str:
        return self.transform.source_column

    @property
    def canonical(self) -> str:
        return str(self.transform.canonical)


def bind_fields(canonicals: Sequence[tuple[str, str]], schema: pa.Schema) -> tuple[BoundField, ...]:
    """Fields `(name, canonical expression)` bound to `schema`; a field over a missing column is left out.

    Leaving a field out only loses pruning on it (its partitions are then judged by the other fields and
    statistics), never correctness.
    """
    from airflow_partitions.transforms import parse_transform

    bound: list[BoundField] = []
    for position, (name, canonical) in enumerate(canonicals):
        try:
            transform = parse_transform(canonical)
        except PartitionExpressionError as err:
            raise CatalogError(
                f"partition field {name!r}: cannot parse recorded expression {canonical!r}: {err}"
            ) from err
        column = transform.source_column
        if column not in schema.names:
            continue
        try:
            bound.append(BoundField(name, position, transform.bind(schema.field(column).type)))
        except PartitionExpressionError:
            continue
    return tuple(bound)


def _decode_key_value(value: Any) -> Any:
    return value_from_json(value) if isinstance(value, dict) else value


class PartitionIndex:
    """Pruning's view of a snapshot: `size` partitions in catalog order, values per field, lazy files."""

    def __init__(self, snapshot: Snapshot, schema: pa.Schema, fields: Sequence[BoundField]) -> None:
        self.snapshot = snapshot
        self.schema = schema
        self.fields = tuple(fields)
        table = snapshot.table
        self.size = int(table.num_rows)
        self.key_paths: list[str] = table.column("key_path").to_pylist()
        self.rows: npt.NDArray[np.int64] = _int_column(table, "rows")
        keys_text = table.column("key").to_pylist()
        self._raw_keys: list[list[Any]] = json.loads("[" + ",".join(keys_text) + "]") if keys_text else []
        self.values: dict[str, pa.Array] = {}
        for field in self.fields:
            raw = [key[field.position] if field.position < len(key) else None for key in self._raw_keys]
            if any(isinstance(value, dict) for value in raw):
                raw = [_decode_key_value(value) for value in raw]
            try:
                self.values[field.name] = pa.array(raw, type=field.transform.result_type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as err:
                raise CatalogError(
                    f"partition values of field {field.name!r} in catalog version {snapshot.version} do not "
                    f"fit its type {field.transform.result_type}: {err}"
                ) from err
        self._files_text: list[str] | None = None
        self._files: dict[int, tuple[DataFile, ...]] = {}

    @property
    def version(self) -> int:
        return int(self.snapshot.version)

    def key_values(self, partition: int) -> list[Any]:
        """The decoded key of one partition, one value per field of the recorded spec."""
        return [_decode_key_value(value) for value in self._raw_keys[partition]]

    def describe_key(self, partition: int) -> str:
        """`name=value, ...` of one partition, NULL spelled out."""
        names = [info.name for info in self.snapshot.partition_spec.fields]
        parts = []
        for name, value in zip(names, self.key_values(partition), strict=False):
            parts.append(f"{name}={'NULL' if value is None else _show(value)}")
        return ", ".join(parts)

    def entry(self, partition: int) -> PartitionEntry:
        return self.snapshot.partitions[self.key_paths[partition]]

    def files(self, partition: int) -> tuple[DataFile, ...]:
        """The data files of one partition (decoded once, then cached)."""
        return self.files_of([partition])[0]

    def files_of(self, partitions: Sequence[int]) -> list[tuple[DataFile, ...]]:
        """Data files of several partitions, decoding the missing ones in one JSON parse."""
        missing = [p for p in partitions if p not in self._files]
        if missing:
            if self._files_text is None:
                self._files_text = self.snapshot.table.column("files").to_pylist()
            texts = self._files_text
            parsed = json.loads("[" + ",".join(texts[p] for p in missing) + "]")
            for partition, descriptors in zip(missing, parsed, strict=True):
                self._files[partition] = tuple(_data_file(d) for d in descriptors)
        return [self._files[p] for p in partitions]


def _data_file(data: Mapping[str, Any]) -> DataFile:
    return DataFile.from_json(data)


def _int_column(table: pa.Table, name: str) -> npt.NDArray[np.int64]:
    column = table.column(name)
    if column.num_chunks == 0:
        return np.zeros(0, dtype=np.int64)
    return np.asarray(column.to_numpy(), dtype=np.int64)


def _show(value: Any) -> str:
    from airflow_partitions.keys import value_to_text

    return value_to_text(value)


# --- file-level frames ----------------------------------------------------------------------------


class PartitionFrame:
    """Every partition of an index, one row each, judged on partition values alone."""

    def __init__(self, index: PartitionIndex) -> None:
        self.index = index
        self.size = index.size
        self.values = index.values

    def stats(self, column: str) -> ColumnStatsArrays | None:
        del column
        return None


class FileFrame:
    """The files of some partitions, one row each, with their partition's values and lazy statistics."""

    def __init__(self, index: PartitionIndex, partitions: npt.NDArray[np.int64]) -> None:
        self.index = index
        file_lists = index.files_of(partitions.tolist())
        counts = np.fromiter((len(files) for files in file_lists), dtype=np.int64, count=len(file_lists))
        self.partition_of_row: npt.NDArray[np.int64] = np.repeat(partitions, counts)
        self.files: list[DataFile] = [f for files in file_lists for f in files]
        self.size = len(self.files)
        take = pa.array(self.partition_of_row, pa.int64())
        self.values = {name: array.take(take) for name, array in index.values.items()}
        self.rows = np.fromiter((f.rows for f in self.files), dtype=np.int64, count=self.size)
        self._stats: dict[str, ColumnStatsArrays | None] = {}

    def stats(self, column: str) -> ColumnStatsArrays | None:
        """min / max / NULL counts of `column` per file (None when the column has no usable statistics)."""
        if column not in self._stats:
            self._stats[column] = _build_stats(self.files, column, self.index.schema, self.rows)
        return self._stats[column]


@dataclass(frozen=True, slots=True)
class ColumnStatsArrays:
    """Per-file statistics of one column: bounds as Arrow arrays of the column type (NULL = unknown)."""

    minimum: pa.Array
    maximum: pa.Array
    null_count: npt.NDArray[np.int64]  # -1 when unknown
    rows: npt.NDArray[np.int64]


def _build_stats(
    files: Sequence[DataFile], column: str, schema: pa.Schema, rows: npt.NDArray[np.int64]
) -> ColumnStatsArrays | None:
    if column not in schema.names:
        return None
    kind = schema.field(column).type
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    lows: list[Any] = []
    highs: list[Any] = []
    nulls = np.full(len(files), -1, dtype=np.int64)
    for position, file in enumerate(files):
        stats = file.stats.get(column)
        if stats is None:
            lows.append(None)
            highs.append(None)
            continue
        lows.append(stats.min)
        highs.append(stats.max)
        nulls[position] = stats.null_count
    try:
        minimum = pa.array(lows, type=kind)
        maximum = pa.array(highs, type=kind)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError, TypeError):
        # Bounds that do not fit the column type cannot be trusted: keep only the NULL counts.
        minimum = pa.nulls(len(files), kind)
        maximum = pa.nulls(len(files), kind)
    return ColumnStatsArrays(minimum, maximum, nulls, rows)


__all__ = [
    "BoundField",
    "ColumnStatsArrays",
    "FileFrame",
    "PartitionIndex",
    "bind_fields",
]
