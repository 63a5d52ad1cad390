"""NULL is a partition like any other value, through every transform, discovery kind and read path.

A row whose partition column is NULL lands in the partition whose key is NULL (`name=%NULL`): static
discovery (every field `bucket(N, col)`) plans it next to buckets 0..N-1, the Spark stage routes it with
its NULL-safe join, finalize verifies it, pushdown reads find it (Hive `__HIVE_DEFAULT_PARTITION__`
directories, Postgres `IS NULL`), and pruning selects it for `col IS NULL` and never for a predicate
that cannot be TRUE on NULL. Every refresh here runs on real Spark and is read back through the real
reader or hook.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_partitions.catalog import open_catalog
from airflow_partitions.hooks.partitioned_dataset import PartitionedDatasetHook
from airflow_partitions.keys import PartitionKey
from airflow_partitions.read import PartitionedDatasetReader
from airflow_partitions.refresh import plan_refresh, refresh_dataset
from airflow_partitions.refresh.discovery import static_keys
from airflow_partitions.spec import load_spec
from airflow_partitions.spec.model import ProjectSpec

pytestmark = pytest.mark.spark


def write_spec(
    tmp_path: Path,
    partition_by: list[str],
    *,
    source: str = "file:src",
    source_params: str = "{file_format: parquet}",
    refresh: str = "",
) -> ProjectSpec:
    """A one-dataset spec `events`; a `name: expression` entry becomes the `{name: expression}` form."""
    fields = []
    for entry in partition_by:
        name, sep, expression = entry.partition(": ")
        fields.append(f"{{{name}: {json.dumps(expression)}}}" if sep else json.dumps(entry))
    lines = [
        "accelerator_dir: acc",
        "datasets:",
        "  - name: events",
        f"    from: {source}",
        f"    params: {source_params}",
        "    acceleration:",
        "      engine: parquet",
        "      partition_by:",
        *[f"        - {field}" for field in fields],
    ]
    if refresh:
        lines.append(f"      refresh: {refresh}")
    path = tmp_path / "spec.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return load_spec(path)


def canonical(table: pa.Table) -> list[tuple[Any, ...]]:
    """The rows of `table` as sorted tuples (NULLs sort first), for row-for-row comparisons."""
    names = sorted(table.column_names)
    rows = [tuple(row[name] for name in names) for row in table.to_pylist()]
    return sorted(rows, key=lambda row: tuple((value is not None, repr(value)) for value in row))


def null_key_paths(project: ProjectSpec, field: str) -> set[str]:
    """Catalogued key paths holding rows whose value of `field` is NULL (empty partitions are never read)."""
    dataset = project.dataset("events")
    snapshot = open_catalog(project, dataset).latest()
    assert snapshot is not None
    position = dataset.acceleration.partition_names.index(field)
    return {
        path
        for path, key in snapshot.keys().items()
        if key.values[position] is None and snapshot.partitions[path].rows > 0
    }


# --- the reported case ------------------------------------------------------------------------------


def test_bucket_only_layout_keeps_the_null_rows(spark: Any, tmp_path: Path) -> None:
    """The reported shape: 60,000 rows, user_id NULL in about a third, bucket(16, user_id), parquet."""
    count = 60_000
    source = pa.table(
        {
            "event_id": pa.array(range(count), pa.int64()),
            "user_id": pa.array([None if i % 3 == 0 else i * 7 for i in range(count)], pa.int64()),
            "kind": pa.array([["click", "view", "", "ü/=%"][i % 4] for i in range(count)], pa.string()),
        }
    )
    nulls = source.column("user_id").null_count
    assert nulls == 20_000
    (tmp_path / "src").mkdir()
    pq.write_table(source, tmp_path / "src" / "part-0.parquet")
    project = write_spec(tmp_path, ["bucket(16, user_id)"])

    plan = plan_refresh(project, "events")
    assert plan.discovery == "static"
    assert plan.discovered == 17, "buckets 0..15 plus the NULL partition"
    assert "expr0=%NULL" in {item.key_path for item in plan.items}

    refresh_dataset(project, "events", spark=spark)
    hook = PartitionedDatasetHook(dataset="events", spec_path=str(tmp_path / "spec.yaml"))
    try:
        read = hook.read()
        assert read.num_rows == count, f"{count - read.num_rows} source rows were never written"
        assert canonical(read) == canonical(source)
        null_plan = hook.plan("user_id IS NULL")
        assert [p.key_path for p in null_plan.selected] == ["expr0=%NULL"], (
            "Should read only the NULL partition: a bucket of a non-NULL value is never NULL"
        )
        assert null_plan.total == 17
        assert hook.read("user_id IS NULL").num_rows == nulls
        assert hook.read("user_id IS NOT NULL").num_rows == count - nulls
    finally:
        hook.close()


def test_a_layout_without_its_null_partition_heals_with_a_plain_refresh(spark: Any, tmp_path: Path) -> None:
    """A catalog of buckets 0..N-1 only (as before NULL was planned) gains the NULL rows, nothing else."""
    source = pa.table(
        {
            "user_id": pa.array([None if i % 3 == 0 else i for i in range(300)], pa.int64()),
            "v": pa.array(range(300), pa.int64()),
        }
    )
    (tmp_path / "src").mkdir()
    pq.write_table(source, tmp_path / "src" / "part-0.parquet")
    project = write_spec(tmp_path, ["b: bucket(4, user_id)"])
    refresh_dataset(project, "events", spark=spark, partitions=[f"b={i}" for i in range(4)])
    reader = PartitionedDatasetReader(tmp_path / "spec.yaml", "events")
    try:
        assert reader.read().num_rows == 200, "the old layout: NULL rows missing"
    finally:
        reader.close()

    plan = plan_refresh(project, "events")
    assert [(item.key_path, str(item.reason)) for item in plan.items] == [("b=%NULL", "new")], (
        "only the NULL partition is missing; the buckets are unchanged"
    )
    refresh_dataset(project, "events", spark=spark)
    reader = PartitionedDatasetReader(tmp_path / "spec.yaml", "events")
    try:
        assert canonical(reader.read()) == canonical(source)
    finally:
        reader.close()


# --- static keys --------------------------------------------------------------------------------------


def test_static_keys_include_null_for_every_bucket_field() -> None:
    keys = static_keys([2, 3], 100)
    assert len(keys) == 3 * 4, "each field has N buckets plus NULL"
    assert {(None, None), (1, None), (None, 2)} <= set(keys)
    assert len(set(keys)) == len(keys)


def test_static_cap_counts_the_null_partitions() -> None:
    assert len(static_keys([3, 3], 16)) == 16, "(3 + 1) x (3 + 1) fits exactly"
    with pytest.raises(Exception, match=r"make 16 partitions.*max_partitions \(15\)"):
        static_keys([3, 3], 15)


# --- every transform kind, end to end on Spark ---------------------------------------------------


def hostile_rows(count: int = 240) -> pa.Table:
    """NULL in every column every 5th row (offset per column), hostile strings, tz-aware timestamps."""
    strings = ["EU", "a/b", "x=y", "%NULL", "it's", "", "ü ñ"]
    start = dt.datetime(2025, 12, 30, tzinfo=dt.UTC)
    first_day = dt.date(2026, 1, 1)

    def value(i: int, offset: int, make: Any) -> Any:
        return None if i % 5 == offset else make(i)

    return pa.table(
        {
            "id": pa.array(range(count), pa.int64()),
            "user_id": pa.array([value(i, 0, lambda i: i * 13 - 700) for i in range(count)], pa.int64()),
            "region": pa.array([value(i, 1, lambda i: strings[i % 7]) for i in range(count)], pa.string()),
            "price": pa.array(
                [value(i, 2, lambda i: decimal.Decimal(i * 37 - 3000) / 100) for i in range(count)],
                pa.decimal128(12, 2),
            ),
            "ts": pa.array(
                [value(i, 3, lambda i: start + dt.timedelta(hours=7 * i)) for i in range(count)],
                pa.timestamp("us", tz="UTC"),
            ),
            "day": pa.array(
                [value(i, 4, lambda i: first_day + dt.timedelta(days=i % 40)) for i in range(count)],
                pa.date32(),
            ),
        }
    )


@pytest.mark.parametrize(
    ("partition_by", "null_column"),
    [
        (["user_id"], "user_id"),
        (["bucket(8, user_id)"], "user_id"),
        (["bucket(4, region)", "bucket(3, user_id)"], "region"),
        (["truncate(100, user_id)"], "user_id"),
        (["truncate(2, region)"], "region"),
        (["truncate(5, price)"], "price"),
        (["date_trunc('month', ts)"], "ts"),
        (["date_part('year', day)"], "day"),
        (["user_id % 4"], "user_id"),
        (["region", "bucket(4, user_id)", "date_trunc('week', ts)"], "user_id"),
    ],
    ids=[
        "identity",
        "bucket",
        "bucket-composite-static",
        "truncate-int",
        "truncate-string",
        "truncate-decimal",
        "date_trunc",
        "date_part",
        "mod",
        "composite-dynamic",
    ],
)
def test_null_rows_survive_every_transform(
    spark: Any, tmp_path: Path, partition_by: list[str], null_column: str
) -> None:
    source = hostile_rows()
    (tmp_path / "src").mkdir()
    pq.write_table(source, tmp_path / "src" / "part-0.parquet")
    project = write_spec(tmp_path, partition_by)
    summary = refresh_dataset(project, "events", spark=spark)
    assert summary.stage_mode == "written", "the Spark executors write the final files"

    dataset = project.dataset("events")
    field = next(
        f.name for f in dataset.acceleration.partition_by if f.transform.source_column == null_column
    )
    reader = PartitionedDatasetReader(tmp_path / "spec.yaml", "events")
    try:
        read = reader.read()
        assert canonical(read) == canonical(source), "every source row, the NULL ones included"
        null_plan = reader.plan(f"{null_column} IS NULL")
        expected = null_key_paths(project, field)
        assert expected, f"a NULL {null_column} makes a partition whose {field} is NULL"
        assert {p.key_path for p in null_plan.selected} == expected, (
            f"Should read exactly the partitions whose {field} is NULL"
        )
        nulls = source.column(null_column).null_count
        assert reader.read(f"{null_column} IS NULL").num_rows == nulls
        not_null = reader.plan(f"{null_column} IS NOT NULL")
        assert not expected & {p.key_path for p in not_null.selected}, (
            f"Should not read a partition whose {field} is NULL for IS NOT NULL"
        )
        assert reader.read(f"{null_column} IS NOT NULL").num_rows == source.num_rows - nulls
    finally:
        reader.close()


# --- pruning never selects the NULL partition for a predicate that cannot be TRUE on NULL --------


@pytest.fixture(scope="module")
def bucket_acceleration(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp_path = tmp_path_factory.mktemp("null-bucket")
    (tmp_path / "src").mkdir()
    table = pa.table(
        {
            "user_id": pa.array([None if i % 4 == 0 else i for i in range(400)], pa.int64()),
            "v": pa.array(range(400), pa.int64()),
        }
    )
    pq.write_table(table, tmp_path / "src" / "part-0.parquet")
    project = write_spec(tmp_path, ["b: bucket(16, user_id)"])
    refresh_dataset(project, "events", spark=spark)
    return tmp_path / "spec.yaml"


@pytest.mark.parametrize(
    ("where", "reads_null", "why"),
    [
        ("user_id IS NULL", True, "the NULL partition holds exactly the NULL rows"),
        ("user_id = 5", False, "user_id = 5 is NULL, not TRUE, on a NULL user_id"),
        ("user_id IN (5, 6)", False, "IN is NULL on a NULL user_id"),
        ("NOT (user_id = 5)", False, "NOT NULL is NULL: a NULL user_id never satisfies it"),
        ("user_id != 5", False, "!= is NULL on a NULL user_id"),
        ("user_id IS NOT NULL", False, "the NULL partition holds no non-NULL user_id"),
        ("user_id > 0", False, "a range is NULL on a NULL user_id"),
        ("user_id IS NULL OR user_id = 5", True, "the IS NULL branch holds there"),
        ("v = 3", True, "a predicate on another column cannot rule out the NULL partition by key"),
    ],
)
def test_pruning_of_the_null_bucket(
    bucket_acceleration: Path, where: str, reads_null: bool, why: str
) -> None:
    reader = PartitionedDatasetReader(bucket_acceleration, "events")
    try:
        plan = reader.plan(where)
        selected = {p.key_path for p in plan.selected}
        state = "read" if reads_null else "not read"
        assert ("b=%NULL" in selected) is reads_null, f"Should {state} b=%NULL for {where!r}: {why}"
        assert all(d.key_path != "b=%NULL" or d.selected is reads_null for d in plan.decisions)
    finally:
        reader.close()


# --- pushdown reads ------------------------------------------------------------------------------


def test_hive_default_partition_directory_is_the_null_bucket(spark: Any, tmp_path: Path) -> None:
    """Hive writes NULL as `__HIVE_DEFAULT_PARTITION__`; a static bucket layout must read it."""
    regions = {"EU": 5, "US": 4, "__HIVE_DEFAULT_PARTITION__": 3}
    start = 0
    for directory, count in regions.items():
        (tmp_path / "src" / f"region={directory}").mkdir(parents=True)
        pq.write_table(
            pa.table({"id": pa.array(range(start, start + count), pa.int64())}),
            tmp_path / "src" / f"region={directory}" / "part-0.parquet",
        )
        start += count
    project = write_spec(tmp_path, ["b: bucket(4, region)"])
    summary = refresh_dataset(project, "events", spark=spark)
    assert summary.stage_mode == "pushdown", "every field is decided by a Hive directory"
    reader = PartitionedDatasetReader(tmp_path / "spec.yaml", "events")
    try:
        read = reader.read()
        assert read.num_rows == 12
        assert read.filter(pa.compute.is_null(read.column("region"))).num_rows == 3
        assert [p.key_path for p in reader.plan("region IS NULL").selected] == ["b=%NULL"]
    finally:
        reader.close()


def test_postgres_pushdown_reads_the_null_partition(spark: Any, tmp_path: Path, pg_database: str) -> None:
    import psycopg

    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE events (id bigint primary key, user_id bigint, note text)")
        conn.execute("CREATE INDEX ON events (user_id)")
        conn.execute(
            "INSERT INTO events SELECT i, CASE WHEN i % 3 = 0 THEN NULL ELSE i % 50 END, 'n' || i "
            "FROM generate_series(1, 300) AS i"
        )
    project = write_spec(
        tmp_path,
        ["t: truncate(10, user_id)"],
        source="postgres:public.events",
        source_params=json.dumps({"url": pg_database, "pushdown": "always"}),
    )
    summary = refresh_dataset(project, "events", spark=spark)
    assert summary.stage_mode == "pushdown"
    assert "t=%NULL" in null_key_paths(project, "t")
    reader = PartitionedDatasetReader(tmp_path / "spec.yaml", "events")
    try:
        assert reader.read().num_rows == 300
        assert reader.read("user_id IS NULL").num_rows == 100
        assert [p.key_path for p in reader.plan("user_id IS NULL").selected] == ["t=%NULL"]
    finally:
        reader.close()


def test_postgres_static_bucket_layout_keeps_the_null_rows(
    spark: Any, tmp_path: Path, pg_database: str
) -> None:
    import psycopg

    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE events (id bigint primary key, user_id bigint)")
        conn.execute(
            "INSERT INTO events SELECT i, CASE WHEN i % 3 = 0 THEN NULL ELSE i END "
            "FROM generate_series(1, 300) AS i"
        )
    project = write_spec(
        tmp_path,
        ["b: bucket(4, user_id)"],
        source="postgres:public.events",
        source_params=json.dumps({"url": pg_database}),
    )
    refresh_dataset(project, "events", spark=spark)
    reader = PartitionedDatasetReader(tmp_path / "spec.yaml", "events")
    try:
        assert reader.read().num_rows == 300
        assert reader.read("user_id IS NULL").num_rows == 100
    finally:
        reader.close()
    again = plan_refresh(project, "events")
    assert again.is_empty, "an unchanged table (NULL partition included) plans nothing"


def test_null_partition_key_path_round_trips() -> None:
    assert PartitionKey((None,)).path(["b"]) == "b=%NULL"
    assert PartitionKey((None, 3)).path(["a", "b"]) == "a=%NULL/b=3"
