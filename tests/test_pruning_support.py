"""Builds real accelerations for the pruning, reader, hook and CLI tests, plus a DuckDB oracle.

`build_acceleration` partitions an Arrow table with the real transforms, writes every partition with the
real storage engine, publishes and commits them in one real catalog commit, and writes a spec file that
names the dataset, exactly as a refresh would leave things. `matching_key_paths` asks DuckDB (with the
partition transforms registered as SQL functions) which partitions hold at least one row matching a WHERE
clause: the ground truth pruning must never fall below.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_partitions.catalog import Catalog, LocalStore, PartitionEntry, PartitionSpecInfo
from airflow_partitions.keys import PartitionKey
from airflow_partitions.pruning import PartitionIndex, PrunePlan, executable_sql, plan_partitions
from airflow_partitions.read import (
    PartitionedDatasetReader,
    needs_partition_functions,
    new_duckdb_connection,
)
from airflow_partitions.storage import get_storage
from airflow_partitions.transforms import parse_transform


@dataclass
class Acceleration:
    """A written and committed acceleration of `table`, with its spec file."""

    root: Path
    dataset: str
    spec_path: Path
    catalog: Catalog
    table: pa.Table
    partition_by: tuple[tuple[str, str], ...]
    key_paths: tuple[str, ...]  # key path of every row of `table`, in row order
    version: int

    def snapshot(self, version: int | None = None) -> Any:
        return self.catalog.snapshot(version)

    def plan(self, where: Any = None, **options: Any) -> PrunePlan:
        index = PartitionIndex.from_snapshot(self.snapshot(), self.table.schema)
        return plan_partitions(index, where, dataset=self.dataset, **options)

    def reader(self, **options: Any) -> PartitionedDatasetReader:
        return PartitionedDatasetReader(self.spec_path, self.dataset, **options)

    @property
    def all_key_paths(self) -> set[str]:
        return set(self.key_paths)

    def matching_key_paths(self, where: str) -> set[str]:
        """Partitions holding at least one row where `where` is TRUE, according to DuckDB."""
        rows = duckdb_filter_rows(self.table, where)
        return {self.key_paths[row] for row in rows}

    def expected_rows(self, where: str | None, columns: Sequence[str] | None = None) -> pa.Table:
        """The source rows matching `where` (DuckDB's verdict), as the reader should return them."""
        rows = duckdb_filter_rows(self.table, where)
        selected = self.table.take(pa.array(sorted(rows), pa.int64()))
        return selected.select(list(columns)) if columns is not None else selected


def duckdb_filter_rows(table: pa.Table, where: str | None) -> list[int]:
    """Row positions of `table` where `where` is TRUE, evaluated by DuckDB."""
    condition = where if where is not None else "TRUE"
    # The transforms are SQL functions through the same rewrite `query` uses.
    sql = executable_sql(f"SELECT __row FROM source_rows WHERE {condition}", table.schema)
    connection = new_duckdb_connection(functions=needs_partition_functions(sql))
    try:
        numbered = table.append_column("__row", pa.array(range(table.num_rows), pa.int64()))
        connection.register("source_rows", numbered)
        result = connection.sql(sql).fetchall()
    finally:
        connection.close()
    return [row[0] for row in result]


def partition_rows(
    table: pa.Table, partition_by: Sequence[tuple[str, str]]
) -> tuple[list[str], dict[str, list[int]]]:
    """Key path of every row and the rows of each key path, computed with the real transforms."""
    names = [name for name, _ in partition_by]
    value_columns = []
    for _, expression in partition_by:
        transform = parse_transform(expression)
        bound = transform.bind(table.schema.field(transform.source_column).type)
        value_columns.append(bound.apply(table.column(transform.source_column)).to_pylist())
    key_paths: list[str] = []
    groups: dict[str, list[int]] = {}
    for row, values in enumerate(zip(*value_columns, strict=True)):
        key_path = PartitionKey(tuple(values)).path(names)
        key_paths.append(key_path)
        groups.setdefault(key_path, []).append(row)
    return key_paths, groups


def build_datasets_spec(
    base: Path,
    layouts: Mapping[str, Sequence[Any]],
    name: str,
    engines: Mapping[str, str] | None = None,
) -> Path:
    """One spec (`base / name`) of several datasets, each written and committed as a refresh would:
    `layouts` maps a dataset name to (rows, partition fields[, storage options[, max rows per file]]);
    `engines`: a dataset's engine other than parquet (duckdb: one file per partition)."""
    entries = []
    for dataset, (table, partition_by, *more) in layouts.items():
        engine = (engines or {}).get(dataset, "parquet")
        options = more[0] if more else None
        max_rows = more[1] if len(more) > 1 else None
        build_acceleration(
            base,
            table,
            partition_by,
            dataset=dataset,
            engine=engine,
            storage_options=options,
            max_rows_per_file=max_rows,
        )
        source = base / f"source_{dataset}.parquet"
        (base / "source.parquet").rename(source)
        fields = "\n".join(f'        - {field}: "{expr}"' for field, expr in partition_by)
        entries.append(
            f"  - name: {dataset}\n    from: file:{source}\n    acceleration:\n      engine: {engine}\n"
            f"      mode: file\n      partition_by:\n{fields}\n"
            + ("      params: {partition_mode: files}\n" if engine == "duckdb" else "")
        )
    path = base / name
    path.write_text(f"accelerator_dir: {base / 'accelerations'}\ndatasets:\n" + "".join(entries))
    return path


def build_acceleration(
    directory: Path,
    table: pa.Table,
    partition_by: Sequence[tuple[str, str]],
    *,
    dataset: str = "events",
    engine: str = "parquet",
    partition_mode: str = "files",
    max_rows_per_file: int | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Acceleration:
    """Write `table` partitioned by `partition_by` ((name, expression) pairs) and commit it once;
    `storage_options` go to the engine (e.g. parquet `sort_by`, `row_group_rows`)."""
    directory.mkdir(parents=True, exist_ok=True)
    root = directory / "accelerations"
    source = directory / "source.parquet"
    pq.write_table(table, source)
    storage = get_storage(
        engine, partition_mode, max_rows_per_file=max_rows_per_file, **(storage_options or {})
    )
    catalog = Catalog(LocalStore(root), dataset, storage=storage)
    spec = PartitionSpecInfo.from_fields(
        [(name, parse_transform(expr).canonical) for name, expr in partition_by]
    )
    key_paths, groups = partition_rows(table, partition_by)
    dataset_root = root / dataset
    dataset_root.mkdir(parents=True, exist_ok=True)
    entries = []
    for key_path, rows in groups.items():
        first = rows[0]
        key = _key_of(table, partition_by, first)
        files = storage.write(table.take(pa.array(rows, pa.int64())), dataset_root, key_path)
        files = storage.publish(dataset_root, files)
        entries.append(PartitionEntry.from_files(key, spec, files))
    version = catalog.commit(base_version=None, upserts=entries, partition_spec=spec)
    spec_path = directory / "datasets.yaml"
    mode = "file"
    params = f"\n      params: {{partition_mode: {partition_mode}}}" if engine == "duckdb" else ""
    fields = "\n".join(f"        - {name}: {_yaml_string(expr)}" for name, expr in partition_by)
    spec_path.write_text(
        textwrap.dedent(
            f"""\
            accelerator_dir: {root}
            datasets:
              - name: {dataset}
                from: file:{source}
                acceleration:
                  engine: {engine}
                  mode: {mode}
                  partition_by:
            """
        )
        + fields
        + params
        + "\n",
        encoding="utf-8",
    )
    return Acceleration(
        root, dataset, spec_path, catalog, table, tuple(partition_by), tuple(key_paths), version
    )


def _key_of(table: pa.Table, partition_by: Sequence[tuple[str, str]], row: int) -> PartitionKey:
    values = []
    for _, expression in partition_by:
        transform = parse_transform(expression)
        bound = transform.bind(table.schema.field(transform.source_column).type)
        values.append(bound.apply_scalar(table.column(transform.source_column)[row].as_py()))
    return PartitionKey(tuple(values))


def _yaml_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def sort_rows(table: pa.Table) -> pa.Table:
    """`table` in a canonical row order (every column ascending, NULLs last) for comparisons."""
    if table.num_rows == 0 or table.num_columns == 0:
        return table
    return table.sort_by([(name, "ascending") for name in table.column_names])


def test_builder_routes_every_row_to_the_partition_of_its_key(tmp_path: Path) -> None:
    table = pa.table({"id": pa.array([1, 2, 3, 17, None], pa.int64()), "v": ["a", "b", "c", "d", "e"]})
    acceleration = build_acceleration(tmp_path, table, [("b", "bucket(4, id)")])
    snapshot = acceleration.snapshot()
    storage = get_storage("parquet")
    total = 0
    for key_path, entry in snapshot.partitions.items():
        rows = storage.read(acceleration.root / "events", entry.files)
        total += rows.num_rows
        expected = {
            acceleration.key_paths[i]
            for i in range(table.num_rows)
            if table["v"][i].as_py() in rows["v"].to_pylist()
        }
        assert expected == {key_path}, f"partition {key_path} holds rows of other keys: {expected}"
    assert total == table.num_rows, "every source row is written exactly once"
