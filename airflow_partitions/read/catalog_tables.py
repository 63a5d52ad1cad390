"""The catalog as tables inside `query`: `ap_partitions('ds')`, `ap_files('ds')`, `ap_versions('ds')`.

Each call names a dataset of the spec by a string literal and may pin a version (`version := 7`); without
one, the query's own dataset is described at the version the query reads (its `version` / `tag`) and any
other dataset at its newest version. The reader finds the calls in DuckDB's parse of the statement before
it runs (`catalog_calls`), builds one Arrow table per call from that catalog version, and registers it in
the query's sandboxed connection under a name no statement can spell (`__ap_<md5>`), behind a temporary
table macro per function (`register_catalog_tables`). The sandbox check lets these three table functions
through; their tables hold only what the catalog records, never a local path beyond the file's place in
the dataset.

- `ap_partitions`: one row per partition: its key values as typed columns (one per partition field, typed
  by the field's transform), `key_path`, `rows`, `bytes`, `files`, `refreshed_at`, `written_by`
  (struct of dag_id, run_id, task_id, map_index; NULL when not written by an Airflow task),
  `source_fingerprint`, `spec_id`, `commit_id` (of the commit that last wrote the partition; NULL for a
  partition last written by a commit without an id, or read from a checkpoint older than the column),
  `version`.
- `ap_files`: one row per data file: the key columns, `key_path`, `path` (relative to the dataset),
  `format`, `rows`, `bytes`, `checksum`, and structs `min`, `max`, `null_count` with one typed field per
  column the catalog records statistics for (`min.amount`); bounds are inclusive and may be looser than
  the data (long strings keep a prefix), NULL where unknown.
- `ap_versions`: one row per retained version up to the one read: `version`, `committed_at`,
  `operation`, `partitions_changed`, `partitions_removed`, `rows`, `bytes`, `total_partitions`,
  `total_rows`, `total_bytes`, `replace_all`, `spec_id`, `commit_id`, `tags` (list of tag names).

A partition field named like one of the fixed columns (`rows`, `bytes`, ...) is shown as `key_<name>`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import UnsafeQueryError
from airflow_partitions.pruning.expressions import quote_string
from airflow_partitions.pruning.index import PartitionIndex, _decode_key_value
from airflow_partitions.storage.datafile import DataFile, _has_order

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.catalog import Catalog, Snapshot
    from airflow_partitions.spec.renames import ColumnRenames

CATALOG_TABLE_FUNCTIONS = ("ap_partitions", "ap_files", "ap_versions")
# A cheap test before parsing: statements that cannot call a catalog table function skip the parse.
_MENTION = re.compile(r"\bap_(?:partitions|files|versions)\b", re.IGNORECASE)


def mentions_catalog_tables(sql: str) -> bool:
    """Whether `sql` may call a catalog table function (its text names one)."""
    return isinstance(sql, str) and _MENTION.search(sql) is not None


_PARTITION_COLUMNS = (
    "key_path",
    "rows",
    "bytes",
    "files",
    "refreshed_at",
    "written_by",
    "source_fingerprint",
    "spec_id",
    "commit_id",
    "version",
)
_FILE_COLUMNS = ("key_path", "path", "format", "rows", "bytes", "checksum", "min", "max", "null_count")


@dataclass(frozen=True, slots=True)
class CatalogCall:
    """One call of a catalog table function in a statement: which function, dataset and version."""

    function: str
    dataset: str
    version: int | None

    @property
    def table_name(self) -> str:
        return table_name(self.function, self.dataset, self.version)


def table_name(function: str, dataset: str, version: int | None) -> str:
    """The registered name of a call's table; the macro computes the same from its arguments."""
    text = f"{function}:{dataset.lower()}:{'' if version is None else version}"
    return "__ap_" + hashlib.md5(text.encode("utf-8")).hexdigest()


def _macro(function: str) -> str:
    # DuckDB inlines the macro with the call's constant arguments, so query_table sees a constant name.
    return (
        f"CREATE OR REPLACE TEMP MACRO {function}(dataset, version := NULL) AS TABLE "
        f"FROM query_table('__ap_' || md5({quote_string(function + ':')} || lower(dataset) || ':' || "
        "coalesce(CAST(version AS VARCHAR), '')))"
    )


def catalog_calls(tree: Mapping[str, Any]) -> list[CatalogCall]:
    """The catalog table function calls of DuckDB's parse (`json_serialize_sql`) of one statement.

    Arguments must be literals (a dataset name string, an integer `version`), else `UnsafeQueryError`:
    the tables are built before the statement runs.
    """
    calls: dict[CatalogCall, None] = {}
    for node in _nodes(tree):
        if node.get("type") != "TABLE_FUNCTION":
            continue
        function = node.get("function") or {}
        name = str(function.get("function_name", "")).lower()
        if name not in CATALOG_TABLE_FUNCTIONS:
            continue
        calls[_call(name, function.get("arguments") or function.get("children") or [])] = None
    return list(calls)


def _call(name: str, arguments: Sequence[Any]) -> CatalogCall:
    usage = f"{name}('<dataset>') or {name}('<dataset>', version := <n>), with literal arguments"
    dataset: str | None = None
    version: int | None = None
    for position, argument in enumerate(arguments):
        label = str(argument.get("name") or "") if isinstance(argument, dict) else ""
        expression = argument.get("expression", argument) if isinstance(argument, dict) else None
        if not label and isinstance(expression, dict):
            label = str(expression.get("alias") or "") if position > 0 else ""
        literal = (expression or {}).get("literal") if isinstance(expression, dict) else None
        constant = isinstance(expression, dict) and expression.get("class") == "CONSTANT"
        text = literal.get("text") if constant and isinstance(literal, dict) else None
        kind = literal.get("kind") if constant and isinstance(literal, dict) else None
        if position == 0 and not label:
            if kind != "STRING" or not isinstance(text, str):
                raise UnsafeQueryError(f"{name}() takes the dataset name as a string literal: {usage}")
            dataset = text
        elif label.lower() == "version" or (position == 1 and not label):
            if kind not in ("INTEGER", "BIGINT", "HUGEINT") or not isinstance(text, str) or int(text) < 1:
                raise UnsafeQueryError(f"{name}(): version must be a positive integer literal: {usage}")
            version = int(text)
        else:
            raise UnsafeQueryError(f"{name}() got an unexpected argument: {usage}")
    if dataset is None:
        raise UnsafeQueryError(f"{name}() needs a dataset: {usage}")
    return CatalogCall(name, dataset, version)


def _nodes(tree: Any) -> Iterator[dict[str, Any]]:
    stack = [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            yield item
            stack.extend(item.values())


def register_catalog_tables(connection: Any, tables: Mapping[str, pa.Table]) -> None:
    """Register each call's table (by `table_name`) and the three macros on a query's connection."""
    if not tables:
        return
    for name, table in tables.items():
        connection.register(name, table)
    for function in CATALOG_TABLE_FUNCTIONS:
        connection.execute(_macro(function))


# --- building the tables ----------------------------------------------------------------------------


def build_catalog_table(
    call: CatalogCall,
    catalog: Catalog,
    snapshot: Snapshot,
    schema: pa.Schema,
    index: Any = None,
    *,
    renames: ColumnRenames | None = None,
) -> pa.Table:
    """The table of `call` over `snapshot` (a version of `catalog`; `schema`: the dataset's stored
    schema; `renames`: its `renamed_columns`, whose current names the statistics are shown under)."""
    builders: dict[str, Callable[[], pa.Table]] = {
        "ap_partitions": lambda: partitions_table(snapshot, schema, index),
        "ap_files": lambda: files_table(snapshot, schema, index, renames),
        "ap_versions": lambda: versions_table(catalog, snapshot.version),
    }
    return builders[call.function]()


def _key_columns(
    snapshot: Snapshot, schema: pa.Schema, index: Any, taken: Sequence[str]
) -> list[tuple[str, pa.ChunkedArray | pa.Array]]:
    """One typed column of partition values per partition field, in the spec's order."""
    import pyarrow as pa

    if index is None:
        index = PartitionIndex.from_snapshot(snapshot, schema)
    lowered = {name.lower() for name in taken}
    columns: list[tuple[str, Any]] = []
    keys: list[list[Any]] | None = None
    for position, name in enumerate(snapshot.partition_spec.names):
        values = index.values.get(name)
        if values is None:  # a field over a column the schema no longer has: values as recorded
            if keys is None:
                keys = [index.key_values(i) for i in range(index.size)]
            raw = [key[position] if position < len(key) else None for key in keys]
            try:
                values = pa.array(raw)
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                values = pa.array(
                    [None if v is None else json.dumps(_decode_key_value(v), default=str) for v in raw]
                )
        columns.append((f"key_{name}" if name.lower() in lowered else name, values))
    return columns


def partitions_table(snapshot: Snapshot, schema: pa.Schema, index: Any = None) -> pa.Table:
    import pyarrow as pa
    import pyarrow.compute as pc

    table = snapshot.table
    files = pa.array([len(json.loads(text)) for text in table.column("files").to_pylist()], pa.int64())
    writer_type = pa.struct(
        [
            ("dag_id", pa.string()),
            ("run_id", pa.string()),
            ("task_id", pa.string()),
            ("map_index", pa.int64()),
        ]
    )
    writers = pa.array(
        [json.loads(text) if text else None for text in table.column("written_by").to_pylist()],
        writer_type,
    )
    refreshed = table.column("refreshed_at")
    if not pa.types.is_timestamp(refreshed.type) or refreshed.type.tz is None:
        refreshed = pc.cast(refreshed.cast(pa.int64()), pa.timestamp("us", tz="UTC"))
    fixed: list[tuple[str, Any]] = [
        ("key_path", table.column("key_path")),
        ("rows", table.column("rows").cast(pa.int64())),
        ("bytes", table.column("bytes").cast(pa.int64())),
        ("files", files),
        ("refreshed_at", refreshed),
        ("written_by", writers),
        ("source_fingerprint", table.column("source_fingerprint")),
        ("spec_id", table.column("spec_id")),
        ("commit_id", table.column("commit_id")),
        ("version", pa.array([snapshot.version] * table.num_rows, pa.int64())),
    ]
    columns = [*_key_columns(snapshot, schema, index, _PARTITION_COLUMNS), *fixed]
    return pa.table(dict(columns))


def _stat_type(kind: pa.DataType) -> pa.DataType | None:
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if not _has_order(kind):
        return None
    if pa.types.is_large_string(kind):
        return pa.string()
    if pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind):
        return pa.binary()
    return kind


def files_table(
    snapshot: Snapshot, schema: pa.Schema, index: Any = None, renames: ColumnRenames | None = None
) -> pa.Table:
    import pyarrow as pa

    shown = renames.current if renames is not None else (lambda name: name)

    table = snapshot.table
    key_columns = _key_columns(snapshot, schema, index, _FILE_COLUMNS)
    stat_fields = [(f.name, t) for f in schema if (t := _stat_type(f.type)) is not None]
    owners: list[int] = []
    descriptors: list[DataFile] = []
    for row, text in enumerate(table.column("files").to_pylist()):
        for data in json.loads(text):
            owners.append(row)
            descriptors.append(DataFile.from_json(data))
    take = pa.array(owners, pa.int64())
    key_paths = table.column("key_path").take(take)
    columns: dict[str, Any] = {name: values.take(take) for name, values in key_columns}
    columns.update(
        {
            "key_path": key_paths,
            "path": pa.array([f.path for f in descriptors], pa.string()),
            "format": pa.array([f.format for f in descriptors], pa.string()),
            "rows": pa.array([f.rows for f in descriptors], pa.int64()),
            "bytes": pa.array([f.bytes for f in descriptors], pa.int64()),
            "checksum": pa.array([f.checksum for f in descriptors], pa.string()),
            "min": _stats_struct(descriptors, stat_fields, lambda s: s.min, shown),
            "max": _stats_struct(descriptors, stat_fields, lambda s: s.max, shown),
            "null_count": _stats_struct(
                descriptors, [(name, pa.int64()) for name, _ in stat_fields], lambda s: s.null_count, shown
            ),
        }
    )
    return pa.table(columns)


def _stats_struct(
    descriptors: Sequence[Any],
    fields: Sequence[tuple[str, pa.DataType]],
    pick: Callable[[Any], Any],
    shown: Callable[[str], str],
) -> pa.Array:
    """One struct field per stored column `fields` names, under the name `shown` gives it."""
    import pyarrow as pa

    arrays = []
    names = []
    for name, kind in fields:
        values = [pick(stats) if (stats := f.stats.get(name)) is not None else None for f in descriptors]
        try:
            array = pa.array(values, kind)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
            array = pa.array([None if v is None else str(v) for v in values], pa.string())
        arrays.append(array)
        names.append(shown(name))
    if not arrays:
        return pa.nulls(len(descriptors), pa.struct([]))
    return pa.StructArray.from_arrays(arrays, names=names)


def versions_table(catalog: Catalog, upto: int) -> pa.Table:
    import pyarrow as pa

    infos = [info for info in catalog.versions() if info.version <= upto]
    tags: dict[int, list[str]] = {}
    for info in catalog.tags().values():
        tags.setdefault(info.version, []).append(info.name)
    rows = [
        {
            **{
                key: value
                for key, value in info.to_json().items()
                if key not in ("conservation", "committed_at")
            },
            "committed_at": info.committed_at,
            "tags": sorted(tags.get(info.version, [])),
        }
        for info in infos
    ]
    schema = pa.schema(
        [
            ("version", pa.int64()),
            ("committed_at", pa.timestamp("us", tz="UTC")),
            ("operation", pa.string()),
            ("partitions_changed", pa.int64()),
            ("partitions_removed", pa.int64()),
            ("rows", pa.int64()),
            ("bytes", pa.int64()),
            ("total_partitions", pa.int64()),
            ("total_rows", pa.int64()),
            ("total_bytes", pa.int64()),
            ("replace_all", pa.bool_()),
            ("spec_id", pa.string()),
            ("commit_id", pa.string()),
            ("tags", pa.list_(pa.string())),
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema)
