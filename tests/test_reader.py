"""PartitionedDatasetReader over real accelerations: read, query, versions, engines, errors, S3."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from test_pruning_support import Acceleration, build_acceleration, sort_rows

from airflow_partitions.catalog import Catalog, PartitionEntry
from airflow_partitions.exceptions import FilterError, UnsafeQueryError, VersionNotFoundError
from airflow_partitions.keys import PartitionKey
from airflow_partitions.objectstore import S3Settings
from airflow_partitions.read import (
    PartitionedDatasetReader,
    needs_partition_functions,
    new_duckdb_connection,
)
from airflow_partitions.storage import get_storage

ROWS = 600


def make_table() -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(ROWS), pa.int64()),
            "user_id": pa.array([None if i % 50 == 0 else i % 97 for i in range(ROWS)], pa.int64()),
            "region": pa.array([["EU", "US", "APAC", None][i % 4] for i in range(ROWS)], pa.string()),
            "ts": pa.array(
                [dt.datetime(2026, 1, 1) + dt.timedelta(hours=7 * i) for i in range(ROWS)], pa.timestamp("us")
            ),
            "amount": pa.array(
                [Decimal(i * 37 % 5000).scaleb(-2) for i in range(ROWS)], pa.decimal128(10, 2)
            ),
            "note": pa.array([f"n{i}" if i % 3 else None for i in range(ROWS)], pa.large_string()),
        }
    )


PARTITION_BY = [("region", "region"), ("user_bucket", "bucket(4, user_id)")]


@pytest.fixture(scope="module")
def accelerations(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Acceleration]:
    base = tmp_path_factory.mktemp("reader")
    table = make_table()
    layouts: dict[str, dict[str, Any]] = {
        "parquet": {"engine": "parquet", "max_rows_per_file": 20},
        "duckdb_files": {"engine": "duckdb"},
        "duckdb_tables": {"engine": "duckdb", "partition_mode": "tables"},
        "arrow": {"engine": "arrow", "max_rows_per_file": 20},
    }
    return {
        name: build_acceleration(base / name, table, PARTITION_BY, **opts) for name, opts in layouts.items()
    }


ENGINES = ["parquet", "duckdb_files", "duckdb_tables", "arrow"]
FILTERS = [
    None,
    "region = 'EU'",
    "user_id = 42",
    "region = 'US' AND ts >= '2026-02-01'",
    "user_id IN (1, 2, 3) OR region IS NULL",
    "bucket(4, user_id) = 3 AND amount > 10",
    "note LIKE 'n1%'",
    "NOT (region = 'EU') AND id % 5 = 0",
]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("where", FILTERS)
def test_read_equals_the_filtered_source(
    accelerations: dict[str, Acceleration], engine: str, where: str | None
) -> None:
    acc = accelerations[engine]
    with acc.reader() as reader:
        result = reader.read(where)
    expected = acc.expected_rows(where)
    assert result.schema == acc.table.schema, "the dataset's exact Arrow types come back, whatever the engine"
    assert sort_rows(result).equals(sort_rows(expected)), f"{engine}: read({where!r}) differs from the source"


def test_read_projects_only_the_asked_columns(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["parquet"]
    with acc.reader() as reader:
        result = reader.read("user_id = 42 AND amount > 1", columns=["note", "id"])
    assert result.column_names == ["note", "id"], "columns come back as asked, residual columns excluded"
    expected = acc.expected_rows("user_id = 42 AND amount > 1", ["note", "id"])
    assert sort_rows(result).equals(sort_rows(expected))


def test_read_takes_column_names_spelt_exactly(accelerations: dict[str, Acceleration]) -> None:
    # One rule with partition_by: names are case-sensitive; a case-only miss names the exact spelling.
    acc = accelerations["parquet"]
    with acc.reader() as reader:
        with pytest.raises(FilterError, match=r"'REGION'.*case-sensitive; did you mean 'region'"):
            reader.read("REGION = 'EU'")
        with pytest.raises(FilterError, match="did you mean 'id'"):
            reader.read(columns=["ID"])
        result = reader.read("region = 'EU'", columns=["id"])
    assert result.column_names == ["id"]
    assert result.num_rows == len([r for r in acc.table["region"].to_pylist() if r == "EU"])


def test_read_accepts_dnf_filters(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["parquet"]
    dnf = [[("region", "=", "EU"), ("ts", ">=", dt.datetime(2026, 2, 1))], [("user_id", "in", [5, 6])]]
    with acc.reader() as reader:
        result = reader.read(dnf)
    expected = acc.expected_rows("(region = 'EU' AND ts >= '2026-02-01') OR user_id IN (5, 6)")
    assert sort_rows(result).equals(sort_rows(expected))


def test_read_opens_only_selected_files(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["parquet"]
    with acc.reader() as reader:
        plan = reader.plan("region = 'EU' AND user_id = 42")
        all_files = sum(len(e.files) for e in reader.snapshot().partitions.values())
    assert 0 < len(plan.files) < all_files / 10, "one (region, bucket) partition out of ~32 is read"


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("nope = 1", "unknown column 'nope'"),
        ("region = 5", "quote the value"),
        ("user_id = 'abc'", "not a number"),
        ("region = = 'EU'", "syntax error"),
        ("ts >= '2026-13-45'", "write timestamps"),
        ("region IN (SELECT 1)", "subquer"),
    ],
)
def test_bad_filters_raise_filter_errors(
    accelerations: dict[str, Acceleration], where: str, message: str
) -> None:
    with accelerations["parquet"].reader() as reader, pytest.raises(FilterError, match=message):
        reader.read(where)


def test_bad_columns_raise_filter_errors(accelerations: dict[str, Acceleration]) -> None:
    with accelerations["parquet"].reader() as reader:
        with pytest.raises(FilterError, match=r"unknown column 'regoin'.*did you mean 'region'"):
            reader.read(columns=["regoin"])
        with pytest.raises(FilterError, match="list of names"):
            reader.read(columns="region")  # type: ignore[arg-type]


# --- versions ---------------------------------------------------------------------------------------


def test_each_call_reads_one_pinned_version(tmp_path: Path) -> None:
    table = make_table()
    acc = build_acceleration(tmp_path, table, [("region", "region")])
    storage = get_storage("parquet")
    snapshot = acc.snapshot()
    spec = snapshot.partition_spec
    eu_key = PartitionKey(("EU",))
    replacement = table.filter(pa.compute.equal(table["region"], "EU")).slice(0, 3)
    files = storage.write(replacement, acc.root / acc.dataset, eu_key.path(spec.names))
    version = acc.catalog.commit(
        base_version=snapshot.version,
        upserts=[PartitionEntry.from_files(eu_key, spec, files)],
        partition_spec=spec,
    )
    with acc.reader() as reader:
        old = reader.read("region = 'EU'", version=1)
        new = reader.read("region = 'EU'")
        assert reader.plan("region = 'EU'").version == version
        with pytest.raises(VersionNotFoundError):
            reader.read(version=99)
    assert old.num_rows == ROWS // 4, "version 1 still shows the original EU partition"
    assert new.num_rows == 3, "the newest version shows the replaced EU partition"


def test_a_repeated_read_reuses_its_relation_until_its_files_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same read again reuses the DuckDB relation the first one built (no parse, no bind); a new
    version names new files, so it builds a new one; a file gone under a kept relation is an error, never
    rows from anywhere else. (A residual makes it a DuckDB scan: exact files alone are read by pyarrow.)"""
    from airflow_partitions.exceptions import StorageError
    from airflow_partitions.read import scan

    built: list[str] = []
    original = scan._execute

    def counting(cursor: Any, sql: str) -> tuple[pa.Table, Any]:
        built.append(sql)
        return original(cursor, sql)

    monkeypatch.setattr(scan, "_execute", counting)
    where = "region = 'EU' AND id % 2 = 0"  # EU ids are multiples of 4: a residual all EU rows pass
    table = make_table()
    acc = build_acceleration(tmp_path, table, [("region", "region")])
    with acc.reader() as reader:
        first = reader.read(where)
        again = reader.read(where)
        assert len(built) == 1, "the second read reused the relation"
        assert sort_rows(first) == sort_rows(again) == sort_rows(acc.expected_rows(where))
        snapshot = acc.snapshot()
        spec = snapshot.partition_spec
        eu_key = PartitionKey(("EU",))
        replacement = table.filter(pa.compute.equal(table["region"], "EU")).slice(0, 3)
        files = get_storage("parquet").write(replacement, acc.root / acc.dataset, eu_key.path(spec.names))
        acc.catalog.commit(
            base_version=snapshot.version,
            upserts=[PartitionEntry.from_files(eu_key, spec, files)],
            partition_spec=spec,
        )
        new = reader.read(where)
        assert len(built) == 2, "new files, a new relation"
        assert sort_rows(new) == sort_rows(replacement)
        (acc.root / acc.dataset / files[0].path).unlink()
        with pytest.raises(StorageError, match="reading the selected partitions failed"):
            reader.read(where)


class CountingCatalog(Catalog):
    """The real catalog, counting how often a read resolves a version."""

    calls = 0

    def snapshot(self, version: int | None = None) -> Any:
        CountingCatalog.calls += 1
        return super().snapshot(version)


def test_a_read_resolves_the_version_once(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["parquet"]
    catalog = CountingCatalog(acc.catalog.store, acc.dataset, data_root=acc.catalog.data_root)
    with acc.reader(catalog=catalog) as reader:
        CountingCatalog.calls = 0
        reader.read("region = 'EU'")
        assert CountingCatalog.calls == 1, "plan and scan must use the same snapshot"
        CountingCatalog.calls = 0
        reader.query("SELECT count(*) FROM events WHERE region = 'EU'")
        assert CountingCatalog.calls == 1


# --- query ------------------------------------------------------------------------------------------


def duckdb_over_source(acc: Acceleration, sql: str) -> pa.Table:
    from airflow_partitions.pruning import executable_sql

    statement = executable_sql(sql, acc.table.schema)
    connection = new_duckdb_connection(functions=needs_partition_functions(statement))
    try:
        connection.register(acc.dataset, acc.table)
        return connection.sql(statement).to_arrow_table()
    finally:
        connection.close()


QUERIES = [
    "SELECT region, count(*) AS n, sum(amount) AS total FROM events WHERE user_id = 42 GROUP BY region",
    "SELECT bucket(4, user_id) AS b, count(*) AS n FROM events WHERE region = 'EU' GROUP BY 1",
    "WITH eu AS (SELECT * FROM events WHERE region = 'EU') SELECT count(*) AS n FROM eu WHERE user_id < 10",
    "SELECT e.id FROM events e JOIN events f ON e.id = f.id + 1 WHERE e.region = 'US' AND f.region = 'EU'",
    "SELECT id FROM events WHERE region = 'EU' UNION ALL SELECT id FROM events WHERE user_id IS NULL",
    "SELECT count(*) AS n FROM events e LEFT JOIN (SELECT 1 AS k) z ON e.id = z.k WHERE e.region = 'APAC'",
    "SELECT count(*) AS n FROM (SELECT 1 AS k) z LEFT JOIN events e ON e.id = z.k WHERE e.region IS NULL",
    "FROM events SELECT max(ts) AS latest WHERE truncate(1000, amount) >= 20",
]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("sql", QUERIES)
def test_query_equals_duckdb_over_the_source(
    accelerations: dict[str, Acceleration], engine: str, sql: str
) -> None:
    acc = accelerations[engine]
    with acc.reader() as reader:
        result = reader.query(sql)
    expected = duckdb_over_source(acc, sql)
    assert sort_rows(result).equals(sort_rows(expected)), f"{engine}: {sql}"


def test_query_opens_only_the_partitions_its_where_allows(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["parquet"]
    with acc.reader() as reader:
        plan = reader.plan_query("SELECT count(*) FROM events WHERE region = 'EU' AND user_id = 42")
        assert {p.key_path.split("/")[0] for p in plan.selected} == {"region=EU"}
        assert len(plan.selected) == 1, "one bucket of one region"
        union = reader.plan_query(
            "SELECT id FROM events WHERE region = 'EU' UNION ALL SELECT id FROM events WHERE region = 'US'"
        )
        assert {p.key_path.split("/")[0] for p in union.selected} == {"region=EU", "region=US"}
        outer = reader.plan_query(
            "SELECT count(*) FROM (SELECT 1 AS k) z LEFT JOIN events e ON e.id = z.k WHERE e.region IS NULL"
        )
        assert len(outer.selected) == outer.total, "a null-supplying outer join side cannot be pruned"
        untouched = reader.plan_query("SELECT 42 AS answer")
        assert not untouched.selected, "a query that never reads the dataset opens no file"


@pytest.mark.parametrize(
    "sql",
    [
        "DELETE FROM events",
        "INSERT INTO events SELECT * FROM events",
        "CREATE TABLE x AS SELECT 1",
        "SELECT 1; SELECT 2",
        "COPY (SELECT 1) TO '/tmp/out.csv'",
        "ATTACH '/tmp/other.duckdb' AS other",
        "PRAGMA version",
        "SET threads = 1",
        "DROP VIEW events",
        "",
    ],
)
def test_query_refuses_anything_but_one_select(accelerations: dict[str, Acceleration], sql: str) -> None:
    with accelerations["parquet"].reader() as reader, pytest.raises(UnsafeQueryError):
        reader.query(sql)


def test_query_cannot_read_other_files(accelerations: dict[str, Acceleration], tmp_path: Path) -> None:
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n1\n")
    with accelerations["parquet"].reader() as reader:
        with pytest.raises(FilterError, match=r"disabled|Permission"):
            reader.query(f"SELECT * FROM read_csv('{secret}')")
        sandbox = reader.query("SELECT current_setting('enable_external_access') AS external")
        assert sandbox.column("external")[0].as_py() is False, "queries run with external access off"
        assert reader.query("SELECT count(*) AS n FROM events").column("n")[0].as_py() == ROWS


def test_query_dataset_name_is_case_insensitive(accelerations: dict[str, Acceleration]) -> None:
    with accelerations["parquet"].reader() as reader:
        result = reader.query("SELECT count(*) AS n FROM EVENTS WHERE region = 'EU'")
    assert result.column("n")[0].as_py() == ROWS // 4


# --- S3 ---------------------------------------------------------------------------------------------


@pytest.mark.s3
@pytest.mark.parametrize("engine", ["parquet", "arrow", "duckdb_files"])
def test_reads_files_stored_on_s3(
    accelerations: dict[str, Acceleration],
    engine: str,
    s3_server: dict[str, str],
    s3_bucket: str,
    tmp_path: Path,
) -> None:
    import boto3

    acc = accelerations[engine]
    client = boto3.client("s3", **s3_server)
    dataset_root = acc.root / acc.dataset
    for path in dataset_root.rglob("*"):
        if path.is_file() and "_catalog" not in path.parts:
            client.upload_file(
                str(path), s3_bucket, f"accel/{acc.dataset}/{path.relative_to(dataset_root).as_posix()}"
            )
    filesystem = S3Settings.from_mapping(s3_server).arrow_filesystem()
    reader = PartitionedDatasetReader(
        acc.spec_path,
        acc.dataset,
        catalog=acc.catalog,
        data_root=f"s3://{s3_bucket}/accel/{acc.dataset}",
        filesystem=filesystem,
        cache_dir=tmp_path / "cache",
    )
    with reader:
        where = "region = 'US' AND user_id BETWEEN 10 AND 20"
        result = reader.read(where, columns=["id", "amount"])
        counted = reader.query("SELECT count(*) AS n FROM events WHERE region = 'EU'")
    assert sort_rows(result).equals(sort_rows(acc.expected_rows(where, ["id", "amount"])))
    assert counted.column("n")[0].as_py() == ROWS // 4


# --- Spark ------------------------------------------------------------------------------------------


@pytest.mark.spark
def test_to_spark_returns_the_pruned_rows(accelerations: dict[str, Acceleration], spark: Any) -> None:
    acc = accelerations["parquet"]
    where = "(region = 'EU' OR user_id = 42) AND bucket(4, user_id) IN (1, 2, 3) AND amount > 5"
    with acc.reader() as reader:
        frame = reader.to_spark(spark, where, columns=["id", "region", "amount"])
        arrow_frame = accelerations["arrow"].reader().to_spark(spark, where, columns=["id"])
    rows = sorted(row["id"] for row in frame.collect())
    expected = sorted(acc.expected_rows(where)["id"].to_pylist())
    assert rows == expected, "Spark sees exactly the filtered rows of the pruned partitions"
    assert frame.columns == ["id", "region", "amount"]
    assert sorted(row["id"] for row in arrow_frame.collect()) == expected, (
        "non-parquet engines go through Arrow"
    )


def test_a_file_gone_under_an_exact_read_is_an_error(tmp_path: Path) -> None:
    """Exact files are read by pyarrow; a missing one still fails the read (through the DuckDB scan's
    message), never returns rows from anywhere else."""
    from airflow_partitions.exceptions import StorageError

    acc = build_acceleration(tmp_path, make_table(), [("region", "region")])
    with acc.reader() as reader:
        (file,) = reader.plan("region = 'EU'").files
        assert sort_rows(reader.read("region = 'EU'")) == sort_rows(acc.expected_rows("region = 'EU'"))
        (acc.root / acc.dataset / file.path).unlink()
        with pytest.raises(StorageError, match="reading the selected partitions failed"):
            reader.read("region = 'EU'")
