"""A columnar view of partitions for pruning: partition values per field, files and statistics.

Built once per catalog version (versions are immutable, so a reader caches it per version) from the
snapshot's own columnar partition table, without decoding every `PartitionEntry`: keys are parsed in bulk
into one Arrow array per partition field, and file descriptors (with their per-column min / max / NULL
counts) are decoded only for the partitions that survive pruning on the keys. The same view is built from
a published manifest's entries, or from bare partition keys (a refresh's discovered partitions), so every
selection of partitions by a filter goes through one planner.

Partition fields come from the recorded partition spec, not from today's YAML: an old version is pruned
with the expressions that wrote it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from airflow_partitions.exceptions import CatalogError, PartitionExpressionError
from airflow_partitions.keys import PartitionKey, value_from_json, value_to_text
from airflow_partitions.storage.arrow_values import int64_array, to_numpy, typed_array
from airflow_partitions.storage.datafile import DataFile
from airflow_partitions.transforms import parse_transform
from airflow_partitions.transforms.identity import IdentityTransform

if TYPE_CHECKING:
    from airflow_partitions.catalog import PartitionEntry, PartitionSpecInfo, Snapshot
    from airflow_partitions.transforms import Transform


@dataclass(frozen=True, slots=True)
class BoundField:
    """One partition field of a snapshot: its name, position in the key, and transform bound to the schema."""

    name: str
    position: int
    transform: Transform

    @property
    def column(self) -> str:
        """The one column of the field (a `multi_bucket` field raises: see `columns`)."""
        return self.transform.source_column

    @property
    def columns(self) -> tuple[str, ...]:
        """Every column the field reads (several only for `multi_bucket`)."""
        return tuple(self.transform.source_columns)

    @property
    def canonical(self) -> str:
        return str(self.transform.canonical)


def bind_fields(canonicals: Sequence[tuple[str, str]], schema: pa.Schema) -> tuple[BoundField, ...]:
    """Fields `(name, canonical expression)` bound to `schema`; a field over a missing column is left out.

    Leaving a field out only loses pruning on it (its partitions are then judged by the other fields and
    statistics), never correctness.
    """
    bound: list[BoundField] = []
    for position, (name, canonical) in enumerate(canonicals):
        try:
            transform = parse_transform(canonical)
        except PartitionExpressionError as err:
            raise CatalogError(
                f"partition field {name!r}: cannot parse recorded expression {canonical!r}: {err}"
            ) from err
        columns = transform.source_columns
        if not all(column in schema.names for column in columns):
            continue
        try:
            types = [schema.field(column).type for column in columns]
            bound.append(BoundField(name, position, transform.bind_columns(types)))
        except PartitionExpressionError:
            continue
    return tuple(bound)


def _recorded(partition_spec: PartitionSpecInfo) -> list[tuple[str, str]]:
    return [(info.name, info.canonical) for info in partition_spec.fields]


def _with_field_columns(
    fields: tuple[BoundField, ...], schema: pa.Schema
) -> tuple[tuple[BoundField, ...], pa.Schema]:
    """`fields` plus each field's name as a column of its partition values, and `schema` with those columns.

    A name is a column only where it resolves to nothing else (no column of that name in any case), so a
    filter the plain schema binds binds the same way. The field-name column is the identity of the
    partition value and shares the field's values, so conditions on it are judged exactly.
    """
    taken = {name.lower() for name in schema.names}
    extra: list[BoundField] = []
    columns: list[pa.Field] = []
    for field in fields:
        if field.name.lower() in taken:
            continue
        kind = field.transform.result_type
        try:
            identity = IdentityTransform(field.name).bind(kind)
        except PartitionExpressionError:
            continue
        taken.add(field.name.lower())
        extra.append(BoundField(field.name, field.position, identity))
        columns.append(pa.field(field.name, kind))
    if not extra:
        return fields, schema
    return (*fields, *extra), pa.schema([*schema, *columns])


def _decode_key_value(value: Any) -> Any:
    return value_from_json(value) if isinstance(value, dict) else value


# JSON tags of partition values Arrow can parse from their text in one vectorised cast.
_CASTABLE_TAGS = frozenset({"$ts", "$date", "$dec"})
# Survivor counts above this share of all partitions read their files from the cached full file table.
FULL_TABLE_SHARE = 0.2


def _key_array(raw: list[Any], kind: pa.DataType) -> pa.Array:
    """Partition values of one field as an Arrow array, parsing tagged JSON texts in bulk when possible."""
    tagged = [value for value in raw if isinstance(value, dict)]
    if not tagged:
        return typed_array(raw, kind)
    tags = {next(iter(value)) for value in tagged if len(value) == 1}
    if len(tags) == 1 and len(tagged) == sum(1 for v in raw if v is not None) and tags <= _CASTABLE_TAGS:
        (tag,) = tags
        texts = typed_array([None if value is None else value[tag] for value in raw], pa.string())
        try:
            return texts.cast(kind)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            pass  # e.g. naive texts for a zoned type: the exact Python decoding below decides
    return typed_array([_decode_key_value(value) for value in raw], kind)


@dataclass(frozen=True, slots=True)
class Layout:
    """The partitions of one spec in an index of several: the spec's id, field names and bound fields."""

    spec_id: str
    names: tuple[str, ...]
    fields: tuple[BoundField, ...]


class PartitionIndex:
    """Pruning's view of some partitions: `size` partitions in order, values per field, lazy files.

    Built from a catalog version (`from_snapshot`), from partition entries such as a published manifest's
    (`from_entries`), or from partition keys alone (`from_keys`, e.g. the keys a refresh discovered): such
    an index has no files, so only the partition values can rule a partition out. Indexes for selecting
    partitions (`from_entries`, `from_keys`) also accept conditions on partition field names
    (`day >= '2026-01-02'`), judged on the partition values; a read's index does not, since its residual
    filter runs on data files, which hold no such column.
    """

    def __init__(
        self,
        *,
        schema: pa.Schema,
        fields: Sequence[BoundField],
        names: Sequence[str],
        key_paths: list[str],
        keys: list[Sequence[Any]],
        rows: npt.NDArray[np.int64],
        version: int | None,
        origin: str,
        file_texts: Callable[[], list[str]] | None = None,
        files: Sequence[tuple[DataFile, ...]] | None = None,
        field_columns: bool = False,
        layouts: Sequence[Layout] | None = None,
        layout_of: npt.NDArray[np.int64] | None = None,
    ) -> None:
        self.schema = schema
        self.names = tuple(names)
        self.key_paths = key_paths
        self.rows = rows
        self.size = len(key_paths)
        self.version = version  # of the catalog or published snapshot; None for keys alone
        self.origin = origin  # what the partitions are, for messages: "catalog version 7"
        self._raw_keys = keys
        # Several partition specs (a re-partitioning in progress): each partition is judged by the fields
        # of its own layout; `layout_of[p]` is the position of partition p's layout in `layouts`.
        self.layouts: tuple[Layout, ...] | None = tuple(layouts) if layouts else None
        self.layout_of = layout_of
        self.values: dict[str, pa.Array] = {}
        owner: dict[str, int] = {}
        if self.layouts is not None:
            fields = [f for layout in self.layouts for f in layout.fields]
            owner = {f.name: number for number, layout in enumerate(self.layouts) for f in layout.fields}
        for field in fields:
            if field.name in owner:
                assert layout_of is not None
                mine = (layout_of == owner[field.name]).tolist()
                raw = [
                    key[field.position] if own and field.position < len(key) else None
                    for key, own in zip(keys, mine, strict=True)
                ]
            else:
                raw = [key[field.position] if field.position < len(key) else None for key in keys]
            try:
                self.values[field.name] = _key_array(raw, field.transform.result_type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError) as err:
                raise CatalogError(
                    f"partition values of field {field.name!r} in {origin} do not fit its type "
                    f"{field.transform.result_type}: {err}"
                ) from err
        self.fields = tuple(fields)
        self.filter_schema = schema
        if field_columns:
            self.fields, self.filter_schema = _with_field_columns(self.fields, schema)
        self.has_files = file_texts is not None or files is not None
        self._file_texts = file_texts
        self._files_text: list[str] | None = None
        self._files: dict[int, tuple[DataFile, ...]] = dict(enumerate(files)) if files is not None else {}
        self._full: FileFrame | None = None

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot, schema: pa.Schema) -> PartitionIndex:
        """The index of a catalog version, with its recorded partition fields bound to `schema`.

        A version holding partitions of several specs (a re-partitioning in progress) gets one `Layout`
        per spec: each partition is pruned with the expressions it was written under.
        """
        table = snapshot.table
        keys_text = table.column("key").to_pylist()
        layouts: list[Layout] = []
        layout_of: npt.NDArray[np.int64] | None = None
        specs = snapshot.specs
        in_use = snapshot.spec_ids_in_use()
        # Layouts as soon as a partition is under a spec other than the current one, even when every
        # partition is (right after a partition_by change, or once the last new partition is removed):
        # judged by the current fields, an old partition's key would be read as a key of the new spec.
        if len(specs) > 1 and in_use - {snapshot.partition_spec.spec_id}:
            spec_ids = table.column("spec_id").to_pylist()
            order = [spec_id for spec_id in specs if spec_id in in_use]
            missing = in_use - set(order)
            if missing:
                raise CatalogError(
                    f"catalog version {snapshot.version} holds partitions of spec(s) {sorted(missing)} it "
                    "records no fields for"
                )
            number = {spec_id: n for n, spec_id in enumerate(order)}
            layout_of = np.fromiter((number[s] for s in spec_ids), dtype=np.int64, count=len(spec_ids))
            for spec_id in order:
                spec = specs[spec_id]
                bound = bind_fields(_recorded(spec), schema)
                if spec_id != snapshot.partition_spec.spec_id:
                    # Field names of two specs may coincide (`expr0`): their value arrays are kept apart.
                    bound = tuple(BoundField(f"{f.name}@{spec_id}", f.position, f.transform) for f in bound)
                layouts.append(Layout(spec_id, spec.names, bound))
        return cls(
            schema=schema,
            fields=bind_fields(_recorded(snapshot.partition_spec), schema),
            names=snapshot.partition_spec.names,
            layouts=layouts,
            layout_of=layout_of,
            key_paths=table.column("key_path").to_pylist(),
            keys=json.loads("[" + ",".join(keys_text) + "]") if keys_text else [],
            rows=_int_column(table, "rows"),
            version=int(snapshot.version),
            origin=f"catalog version {snapshot.version}",
            file_texts=lambda: table.column("files").to_pylist(),
        )

    @classmethod
    def from_entries(
        cls,
        partition_spec: PartitionSpecInfo,
        entries: Sequence[PartitionEntry],
        schema: pa.Schema,
        *,
        version: int | None,
        origin: str,
    ) -> PartitionIndex:
        """The index of partition entries written with `partition_spec` (e.g. a published manifest's)."""
        return cls(
            schema=schema,
            fields=bind_fields(_recorded(partition_spec), schema),
            names=partition_spec.names,
            key_paths=[entry.key_path for entry in entries],
            keys=[entry.key.values for entry in entries],
            rows=np.fromiter((entry.rows for entry in entries), dtype=np.int64, count=len(entries)),
            version=version,
            origin=origin,
            files=[entry.files for entry in entries],
            field_columns=True,
        )

    @classmethod
    def from_keys(
        cls, fields: Sequence[tuple[str, str]], schema: pa.Schema, keys: Sequence[Sequence[Any]]
    ) -> PartitionIndex:
        """The index of partition keys alone: `fields` are `(name, canonical expression)` over `schema`.

        Each key is one value per field, as the transforms compute them. There are no files, statistics
        or row counts: a plan over it selects the keys whose partitions may hold matching rows, with
        empty `files`.
        """
        names = [name for name, _ in fields]
        return cls(
            schema=schema,
            fields=bind_fields(fields, schema),
            names=names,
            key_paths=[PartitionKey(tuple(key)).path(names) for key in keys],
            keys=list(keys),
            rows=np.full(len(keys), -1, dtype=np.int64),  # unknown, never 0: no key is empty
            version=None,
            origin="the partition keys",
            field_columns=True,
        )

    def spec_id(self, partition: int) -> str | None:
        """The spec a partition was written under, when the index holds several (else None)."""
        if self.layouts is None or self.layout_of is None:
            return None
        return self.layouts[int(self.layout_of[partition])].spec_id

    def key_values(self, partition: int) -> list[Any]:
        """The decoded key of one partition, one value per partition field."""
        return [_decode_key_value(value) for value in self._raw_keys[partition]]

    def describe_key(self, partition: int) -> str:
        """`name=value, ...` of one partition, NULL spelled out."""
        parts = []
        names = self.names
        if self.layouts is not None and self.layout_of is not None:
            names = self.layouts[int(self.layout_of[partition])].names
        for name, value in zip(names, self.key_values(partition), strict=False):
            parts.append(f"{name}={'NULL' if value is None else _show(value)}")
        return ", ".join(parts)

    def files(self, partition: int) -> tuple[DataFile, ...]:
        """The data files of one partition (decoded once, then cached)."""
        return self.files_of([partition])[0]

    def files_of(self, partitions: Sequence[int]) -> list[tuple[DataFile, ...]]:
        """Data files of several partitions, decoding the missing ones in one JSON parse."""
        missing = [p for p in partitions if p not in self._files]
        if missing and self._file_texts is not None:
            if self._files_text is None:
                self._files_text = self._file_texts()
            texts = self._files_text
            parsed = json.loads("[" + ",".join(texts[p] for p in missing) + "]")
            for partition, descriptors in zip(missing, parsed, strict=True):
                self._files[partition] = tuple(_data_file(d) for d in descriptors)
        return [self._files.get(p, ()) for p in partitions]

    def file_frame(self, partitions: npt.NDArray[np.int64]) -> FileFrame:
        """The files of `partitions` (ascending positions) as one frame.

        A small selection decodes just its partitions' files; a large one is cut out of the version's
        full file table, built once, whose statistics arrays are then shared by every plan.
        """
        if self.size and len(partitions) > FULL_TABLE_SHARE * self.size:
            if self._full is None:
                self._full = FileFrame(self, np.arange(self.size, dtype=np.int64))
            if len(partitions) == self.size:
                return self._full
            return self._full.subset(partitions)
        return FileFrame(self, partitions)


def _data_file(data: Mapping[str, Any]) -> DataFile:
    return DataFile.from_json(data)


def _int_column(table: pa.Table, name: str) -> npt.NDArray[np.int64]:
    column = table.column(name)
    if column.num_chunks == 0:
        return np.zeros(0, dtype=np.int64)
    return np.asarray(to_numpy(column), dtype=np.int64)


def _show(value: Any) -> str:
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

    def __init__(
        self,
        index: PartitionIndex,
        partitions: npt.NDArray[np.int64],
        *,
        parent: FileFrame | None = None,
        rows_of_parent: npt.NDArray[np.int64] | None = None,
    ) -> None:
        self.index = index
        self._parent = parent
        self._rows_of_parent = rows_of_parent
        if parent is not None and rows_of_parent is not None:
            self.partition_of_row: npt.NDArray[np.int64] = parent.partition_of_row[rows_of_parent]
            self.files: list[DataFile] = [parent.files[row] for row in rows_of_parent.tolist()]
            self.rows: npt.NDArray[np.int64] = parent.rows[rows_of_parent]
            take = int64_array(rows_of_parent)
            self.values: dict[str, pa.Array] = {
                name: array.take(take) for name, array in parent.values.items()
            }
        else:
            file_lists = index.files_of(partitions.tolist())
            counts = np.fromiter((len(files) for files in file_lists), dtype=np.int64, count=len(file_lists))
            self.partition_of_row = np.repeat(partitions, counts)
            self.files = [f for files in file_lists for f in files]
            self.rows = np.fromiter((f.rows for f in self.files), dtype=np.int64, count=len(self.files))
            take = int64_array(self.partition_of_row)
            self.values = {name: array.take(take) for name, array in index.values.items()}
        self.size = len(self.files)
        self._stats: dict[str, ColumnStatsArrays | None] = {}

    def subset(self, partitions: npt.NDArray[np.int64]) -> FileFrame:
        """The rows of this frame that belong to `partitions`."""
        wanted = np.zeros(self.index.size, dtype=bool)
        wanted[partitions] = True
        rows = np.flatnonzero(wanted[self.partition_of_row]).astype(np.int64)
        return FileFrame(self.index, partitions, parent=self, rows_of_parent=rows)

    def stats(self, column: str) -> ColumnStatsArrays | None:
        """min / max / NULL counts of `column` per file (None when the column has no usable statistics)."""
        if column not in self._stats:
            if self._parent is not None and self._rows_of_parent is not None:
                whole = self._parent.stats(column)
                self._stats[column] = None if whole is None else whole.take(self._rows_of_parent)
            else:
                self._stats[column] = _build_stats(self.files, column, self.index.schema, self.rows)
        return self._stats[column]


@dataclass(frozen=True, slots=True)
class ColumnStatsArrays:
    """Per-file statistics of one column: bounds as Arrow arrays of the column type (NULL = unknown)."""

    minimum: pa.Array
    maximum: pa.Array
    null_count: npt.NDArray[np.int64]  # -1 when unknown
    rows: npt.NDArray[np.int64]

    def take(self, rows: npt.NDArray[np.int64]) -> ColumnStatsArrays:
        indices = int64_array(rows)
        return ColumnStatsArrays(
            self.minimum.take(indices), self.maximum.take(indices), self.null_count[rows], self.rows[rows]
        )


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
        minimum = typed_array(lows, kind)
        maximum = typed_array(highs, kind)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError, TypeError):
        # Bounds that do not fit the column type cannot be trusted: keep only the NULL counts.
        minimum = pa.nulls(len(files), kind)
        maximum = pa.nulls(len(files), kind)
    return ColumnStatsArrays(minimum, maximum, nulls, rows)


__all__ = [
    "BoundField",
    "ColumnStatsArrays",
    "FileFrame",
    "Layout",
    "PartitionFrame",
    "PartitionIndex",
    "bind_fields",
]
