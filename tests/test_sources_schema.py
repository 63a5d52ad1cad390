"""Source schemas never lose a row: declared `schema:` types win, timestamps with offsets parse, values that
cannot be parsed fail loudly, and files whose types drift are unified losslessly (or refused) so every
version of an acceleration has one schema.

Real files, the shared local Spark session, DuckDB as an independent oracle for sums.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_partitions.catalog import open_catalog
from airflow_partitions.exceptions import (
    PartitionsFailedError,
    SchemaDriftError,
    SchemaMixedRefreshError,
    SourceError,
)
from airflow_partitions.read import PartitionedDatasetReader
from airflow_partitions.refresh import plan_refresh, refresh_dataset
from airflow_partitions.sample_data import write_events
from airflow_partitions.sources import open_dataset_source, open_source
from airflow_partitions.sources.files import FileSource, unify_types
from airflow_partitions.spec import load_spec
from airflow_partitions.spec.model import ProjectSpec
from airflow_partitions.storage import get_storage

REPO = Path(__file__).resolve().parent.parent
UTC = dt.UTC

# Timestamps as JSON sources write them: offsets of every kind, none, fractions, NULL.
TIMESTAMP_TEXTS = [
    "2025-02-06T16:11:51+00:00",
    "2025-02-06T16:11:51+05:30",
    "2025-02-06T16:11:51Z",
    "2025-02-06T16:11:51",
    "2025-02-06T16:11:51.123456+00:00",
    "2025-12-31T23:59:59.5-08:00",
    None,
]


def expected_instant(text: str | None) -> dt.datetime | None:
    """The UTC instant a timestamp text means (no offset = UTC), parsed by Python, not by the source."""
    if text is None:
        return None
    parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).astimezone(UTC)


def hostile_events(directory: Path, name: str = "events-001.jsonl") -> list[dict[str, Any]]:
    """Events with every kind of timestamp text and hostile regions, written as JSON lines."""
    regions = ["EU", "a/b", "x=y", "50%", "it's", "", None, "Zürich"]
    records = [
        {
            "event_id": f"h{i}",
            "user_id": None if i % 5 == 4 else i,
            "region": regions[i % len(regions)],
            "event_type": "view",
            "ts": TIMESTAMP_TEXTS[i % len(TIMESTAMP_TEXTS)],
        }
        for i in range(3 * len(TIMESTAMP_TEXTS))
    ]
    with (directory / name).open("w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    return records


def example_events_project(tmp_path: Path, source_dir: Path) -> ProjectSpec:
    """dags/datasets.yaml as shipped, its `events` dataset pointed at `source_dir`, accelerations in tmp."""
    project = load_spec(REPO / "dags" / "datasets.yaml")
    events = project.dataset("events")
    moved = replace(events, source=replace(events.source, location=str(source_dir / "*.jsonl")))
    return replace(project, accelerator_dir=tmp_path / "acc", datasets=(moved,))


def read_all_partitions(project: ProjectSpec, name: str) -> pa.Table:
    dataset = project.dataset(name)
    catalog = open_catalog(project, dataset)
    snapshot = catalog.latest()
    assert snapshot is not None
    files = [f for entry in snapshot.partitions.values() for f in entry.files]
    assert catalog.data_root is not None
    return get_storage(dataset.acceleration).read(catalog.data_root, files)


def row_multiset(rows: list[dict[str, Any]], columns: list[str]) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(row[c] for c in columns) for row in rows)


# --- item 2: declared timestamps with offsets -----------------------------------------------------


@pytest.mark.spark
def test_example_events_dataset_keeps_every_row_with_offset_timestamps(spark: Any, tmp_path: Path) -> None:
    source_dir = tmp_path / "events"
    write_events(source_dir, 300)
    records = [json.loads(line) for line in (source_dir / "events-000.jsonl").read_text().splitlines()]
    records += hostile_events(source_dir)
    project = example_events_project(tmp_path, source_dir)
    dataset = project.dataset("events")
    assert dict(dataset.declared_columns)["ts"] == "timestamp[us, UTC]"

    summary = refresh_dataset(project, dataset, spark=spark)

    accelerated = read_all_partitions(project, "events")
    assert accelerated.schema.field("ts").type == pa.timestamp("us", "UTC"), "the declared type wins"
    columns = ["event_id", "user_id", "region", "event_type", "ts"]
    expected = row_multiset([{**record, "ts": expected_instant(record["ts"])} for record in records], columns)
    got = row_multiset(accelerated.to_pylist(), columns)
    assert got == expected, "every source row, with its instant, is in the acceleration"
    assert summary.rows == len(records)
    assert plan_refresh(project, dataset).items == (), "nothing changed: nothing to refresh"


@pytest.mark.spark
def test_unparsable_declared_timestamp_fails_the_refresh_naming_file_and_value(
    spark: Any, tmp_path: Path
) -> None:
    source_dir = tmp_path / "events"
    source_dir.mkdir()
    hostile_events(source_dir)
    bad = source_dir / "events-009.jsonl"
    bad.write_text(
        json.dumps({"event_id": "z", "user_id": 1, "region": "EU", "event_type": "x", "ts": "not-a-time"})
        + "\n"
    )
    project = example_events_project(tmp_path, source_dir)
    dataset = project.dataset("events")
    with pytest.raises(SourceError) as raised:
        refresh_dataset(project, dataset, spark=spark)
    message = str(raised.value)
    assert "events-009.jsonl" in message
    assert "not-a-time" in message
    assert "schema:" in message, "says how to fix it"
    assert open_catalog(project, dataset).latest() is None, "nothing committed"

    # The Arrow side (pushdown reads, read_all) refuses the same value instead of reading NULL.
    with pytest.raises(SourceError) as arrow_raised:
        open_dataset_source(dataset).read_all()
    assert "events-009.jsonl" in str(arrow_raised.value)
    assert "not-a-time" in str(arrow_raised.value)


def json_dates_project(tmp_path: Path, lines: list[str]) -> ProjectSpec:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "part.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    (tmp_path / "spec.yaml").write_text(
        "accelerator_dir: acc\n"
        "datasets:\n"
        "  - name: visits\n"
        "    from: file:src\n"
        "    params: {file_format: json}\n"
        "    schema: {id: int64, day: date32, note: string}\n"
        "    acceleration:\n"
        "      partition_by: [{month: \"date_trunc('month', day)\"}]\n"
    )
    return load_spec(tmp_path / "spec.yaml")


@pytest.mark.spark
def test_declared_json_dates_are_read_on_every_path(spark: Any, tmp_path: Path) -> None:
    """pyarrow's JSON parser takes a declared date32 only as a number: ISO date strings failed to read."""
    rows = [
        {"id": 1, "day": "2027-01-01", "note": "a/b=c"},
        {"id": 2, "day": None, "note": None},
        {"id": 3, "day": "1969-12-31", "note": "it's"},
        {"id": 4, "day": "2027-02-28", "note": ""},
    ]
    project = json_dates_project(tmp_path, [json.dumps(row) for row in rows])
    source = open_dataset_source(project.dataset("visits"))
    expected = Counter(
        (r["id"], None if r["day"] is None else dt.date.fromisoformat(r["day"]), r["note"]) for r in rows
    )
    assert row_multiset(source.read_all().to_pylist(), ["id", "day", "note"]) == expected
    summary = refresh_dataset(project, "visits", spark=spark)
    assert summary.plan["new"] == 4  # 2027-01, 2027-02, 1969-12 and the NULL month
    stored = read_all_partitions(project, "visits").to_pylist()
    assert row_multiset(stored, ["id", "day", "note"]) == expected


def test_a_json_value_that_is_not_a_date_is_refused_with_file_and_value(tmp_path: Path) -> None:
    project = json_dates_project(tmp_path, ['{"id": 1, "day": "2027-01-01T05:00:00", "note": "x"}'])
    source = open_dataset_source(project.dataset("visits"))
    with pytest.raises(SourceError) as raised:
        source.read_all()
    message = str(raised.value)
    assert "part.jsonl" in message
    assert "2027-01-01T05:00:00" in message


def test_declared_schema_wins_over_inference_on_arrow_reads(tmp_path: Path) -> None:
    source_dir = tmp_path / "events"
    source_dir.mkdir()
    records = hostile_events(source_dir)
    project = example_events_project(tmp_path, source_dir)
    source = open_dataset_source(project.dataset("events"))
    assert source.schema().field("ts").type == pa.timestamp("us", "UTC")
    assert source.schema().field("user_id").type == pa.int64()
    table = source.read_all()
    assert Counter(table.column("ts").to_pylist()) == Counter(expected_instant(r["ts"]) for r in records)


@pytest.mark.spark
@pytest.mark.parametrize("file_format", ["json", "csv"])
def test_inferred_offset_timestamps_keep_instants_and_fractions(
    spark: Any, tmp_path: Path, file_format: str
) -> None:
    """No `schema:`: inferred timestamps are microseconds, and no offset value turns into NULL in Spark."""
    source_dir = tmp_path / "src"
    source_dir.mkdir()
    texts = [
        "2025-02-06T16:11:51+00:00",
        "2025-02-06T16:11:51+05:30",
        "2025-02-06T23:30:00-02:00",
        "2025-02-07T00:00:01Z",
    ]
    rows = [{"id": i, "k": "a" if i % 2 else "b", "ts": texts[i % len(texts)]} for i in range(12)]
    if file_format == "json":
        (source_dir / "part.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        (source_dir / "part.csv").write_text(
            "id,k,ts\n" + "".join(f"{r['id']},{r['k']},{r['ts']}\n" for r in rows)
        )
    (tmp_path / "spec.yaml").write_text(
        "accelerator_dir: acc\n"
        "datasets:\n"
        "  - name: ev\n"
        "    from: file:src\n"
        f"    params: {{file_format: {file_format}}}\n"
        "    acceleration:\n"
        "      engine: parquet\n"
        "      partition_by:\n"
        "        - k\n"
        "        - {day: \"date_trunc('day', ts)\"}\n"
    )
    project = load_spec(tmp_path / "spec.yaml")
    dataset = project.dataset("ev")
    schema = open_source(dataset.source).schema()
    assert schema.field("ts").type.unit == "us", "inferred seconds widen to microseconds"
    refresh_dataset(project, dataset, spark=spark)
    accelerated = read_all_partitions(project, "ev")
    got = sorted(
        (row["id"], row["ts"].replace(tzinfo=UTC) if row["ts"].tzinfo is None else row["ts"].astimezone(UTC))
        for row in accelerated.to_pylist()
    )
    assert got == sorted((r["id"], expected_instant(r["ts"])) for r in rows), "no NULL, same instants"


def test_inferred_json_timestamps_with_fractions_are_not_truncated(tmp_path: Path) -> None:
    """One file infers timestamps, another (with fractions) strings: text kept, never cut to seconds."""
    (tmp_path / "a.jsonl").write_text('{"ts": "2025-02-06T16:11:51+00:00"}\n')
    (tmp_path / "b.jsonl").write_text('{"ts": "2025-02-06T16:11:51.250000+00:00"}\n')
    source = FileSource(str(tmp_path), params={"file_format": "json"})
    values = source.read_all().column("ts").to_pylist()
    assert sorted(expected_instant(v) if isinstance(v, str) else v.replace(tzinfo=UTC) for v in values) == [
        dt.datetime(2025, 2, 6, 16, 11, 51, tzinfo=UTC),
        dt.datetime(2025, 2, 6, 16, 11, 51, 250000, tzinfo=UTC),
    ]


# --- item 4: schema drift between files --------------------------------------------------------------


def write_hive_amounts(root: Path, region: str, amounts: list[Any], amount_type: pa.DataType) -> None:
    directory = root / f"region={region}"
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.parquet"):
        old.unlink()
    table = pa.table(
        {
            "id": pa.array(range(len(amounts)), pa.int64()),
            "amount": pa.array(amounts, amount_type),
            "note": pa.array([None if i % 3 == 0 else f"n/{i}=%'" for i in range(len(amounts))]),
        }
    )
    pq.write_table(table, directory / "part-0.parquet")


def hive_project(tmp_path: Path) -> ProjectSpec:
    (tmp_path / "spec.yaml").write_text(
        "accelerator_dir: acc\n"
        "datasets:\n"
        "  - name: sales\n"
        "    from: file:src\n"
        "    params: {file_format: parquet}\n"
        "    acceleration:\n"
        "      engine: parquet\n"
        "      partition_by:\n"
        "        - {region: region}\n"
    )
    return load_spec(tmp_path / "spec.yaml")


def duckdb_exact_sum(source_root: Path, region: str) -> Decimal:
    """The source's own sum, computed by DuckDB over the files (union_by_name), as an exact decimal."""
    connection = duckdb.connect()
    try:
        value = connection.execute(
            "SELECT sum(CAST(amount AS DECIMAL(38, 6))) FROM read_parquet(?, hive_partitioning = true, "
            "union_by_name = true) WHERE region = ?",
            [str(source_root / "**" / "*.parquet"), region],
        ).fetchone()
    finally:
        connection.close()
    assert value is not None
    return Decimal(value[0])


def partition_types(project: ProjectSpec) -> dict[str, pa.DataType]:
    dataset = project.dataset("sales")
    catalog = open_catalog(project, dataset)
    snapshot = catalog.latest()
    assert snapshot is not None
    assert catalog.data_root is not None
    storage = get_storage(dataset.acceleration)
    out = {}
    for entry in snapshot.partitions.values():
        for file in entry.files:
            out[entry.key_path] = storage.read(catalog.data_root, [file]).schema.field("amount").type
    return out


@pytest.mark.spark
@pytest.mark.parametrize("strategy", ["auto", "spark"])
@pytest.mark.parametrize("switch_to", ["int64", "double"])
def test_type_drift_in_one_partition_leaves_one_schema_and_exact_sums(
    spark: Any, tmp_path: Path, strategy: str, switch_to: str
) -> None:
    """One partition's files switch type (double -> int64 as in the issue, or int64 -> double)."""
    source = tmp_path / "src"
    regions = ("r01", "r02", "r03")
    if switch_to == "int64":
        for i, region in enumerate(regions, start=1):
            write_hive_amounts(
                source, region, [round(1000.0 * i + j * 0.37, 2) for j in range(40)], pa.float64()
            )
    else:
        for i, region in enumerate(regions, start=1):
            write_hive_amounts(source, region, [1000 * i + j for j in range(40)] + [None], pa.int64())
    project = hive_project(tmp_path)
    dataset = project.dataset("sales")
    refresh_dataset(project, dataset, spark=spark, strategy=strategy)

    if switch_to == "int64":
        write_hive_amounts(source, "r02", [7, -3, 2**53, None, 12], pa.int64())
    else:
        write_hive_amounts(source, "r02", [0.25, -3.5, None, 1e15 + 0.5], pa.float64())
    plan = plan_refresh(project, dataset)
    if switch_to == "double":
        assert {item.key_path for item in plan.items} == {f"region={r}" for r in regions}, (
            "int64 -> double changes the source schema: every partition is rewritten under it"
        )
    else:
        assert {item.key_path for item in plan.items} == {"region=r02"}, "the unified schema is still double"
    refresh_dataset(project, dataset, spark=spark, strategy=strategy)

    types = partition_types(project)
    assert set(types.values()) == {pa.float64()}, f"one schema per version, got {types}"
    reader = PartitionedDatasetReader(project, "sales")
    untouched = reader.read("region = 'r01'")
    assert untouched.num_rows == (40 if switch_to == "int64" else 41)
    for region in regions:
        got = reader.query(
            f"SELECT sum(CAST(amount AS DECIMAL(38, 6))) AS s FROM sales WHERE region='{region}'"
        )
        assert Decimal(got.column("s")[0].as_py()) == duckdb_exact_sum(source, region), region
    assert plan_refresh(project, dataset).items == ()


@pytest.mark.spark
def test_partial_refresh_across_a_schema_change_is_refused(spark: Any, tmp_path: Path) -> None:
    source = tmp_path / "src"
    for region in ("r01", "r02"):
        write_hive_amounts(source, region, [1, 2], pa.int64())
    project = hive_project(tmp_path)
    dataset = project.dataset("sales")
    refresh_dataset(project, dataset, spark=spark)
    before = open_catalog(project, dataset).latest()
    assert before is not None
    write_hive_amounts(source, "r02", [4.5, 5.25], pa.float64())
    for options in ({"partitions": ["region=r02"]}, {"where": "region = 'r02'"}):
        with pytest.raises(SchemaMixedRefreshError) as raised:
            refresh_dataset(project, dataset, spark=spark, **options)
        assert "full" in str(raised.value) or "plain" in str(raised.value)
        after = open_catalog(project, dataset).latest()
        assert after is not None
        assert after.version == before.version, "catalog unchanged"
    refresh_dataset(project, dataset, spark=spark)
    assert set(partition_types(project).values()) == {pa.float64()}


@pytest.mark.spark
@pytest.mark.parametrize("strategy", ["auto", "spark"])
def test_int_to_double_that_would_round_is_refused(spark: Any, tmp_path: Path, strategy: str) -> None:
    source = tmp_path / "src"
    write_hive_amounts(source, "r01", [1.5], pa.float64())
    write_hive_amounts(source, "r02", [1, 2**53 + 1], pa.int64())
    project = hive_project(tmp_path)
    dataset = project.dataset("sales")
    with pytest.raises((SourceError, PartitionsFailedError)) as raised:
        refresh_dataset(project, dataset, spark=spark, strategy=strategy)
    message = str(raised.value)
    assert str(2**53 + 1) in message
    assert "amount" in message
    assert open_catalog(project, dataset).latest() is None


def test_incompatible_types_raise_schema_drift_error(tmp_path: Path) -> None:
    source = tmp_path / "src"
    write_hive_amounts(source, "r01", [1, 2], pa.int64())
    write_hive_amounts(source, "r02", ["x", "y"], pa.string())
    with pytest.raises(SchemaDriftError) as raised:
        FileSource(str(source), params={"file_format": "parquet"}).schema()
    message = str(raised.value)
    assert "'amount'" in message
    assert "int64" in message
    assert "string" in message
    assert "region=r01" in message
    assert "region=r02" in message
    assert "schema:" in message


def test_declared_schema_wins_over_drifting_files(tmp_path: Path) -> None:
    source = tmp_path / "src"
    write_hive_amounts(source, "r01", [1, 2], pa.int64())
    write_hive_amounts(source, "r02", ["3", "4"], pa.string())
    opened = FileSource(
        str(source), params={"file_format": "parquet"}, declared_schema=pa.schema([("amount", pa.string())])
    )
    assert opened.schema().field("amount").type == pa.string()
    assert sorted(opened.read_all().column("amount").to_pylist()) == ["1", "2", "3", "4"]


@pytest.mark.parametrize(
    ("left", "right", "unified"),
    [
        (pa.int32(), pa.int64(), pa.int64()),
        (pa.int8(), pa.uint8(), pa.int16()),
        (pa.float32(), pa.float64(), pa.float64()),
        (pa.int64(), pa.float64(), pa.float64()),
        (pa.timestamp("ms"), pa.timestamp("us"), pa.timestamp("us")),
        (pa.timestamp("s", "UTC"), pa.timestamp("ns", "UTC"), pa.timestamp("ns", "UTC")),
        (pa.string(), pa.large_string(), pa.large_string()),
        (pa.null(), pa.date32(), pa.date32()),
        (pa.decimal128(10, 2), pa.decimal128(8, 4), pa.decimal128(12, 4)),
        (pa.string(), pa.int64(), None),
        (pa.timestamp("us"), pa.timestamp("us", "UTC"), None),
        (pa.uint64(), pa.int64(), None),
        (pa.date32(), pa.timestamp("us"), None),
    ],
)
def test_unify_types_widens_only_losslessly(
    left: pa.DataType, right: pa.DataType, unified: pa.DataType | None
) -> None:
    assert unify_types(left, right) == unified
    assert unify_types(right, left) == unified


@pytest.mark.spark
def test_csv_files_with_different_column_orders_keep_each_value_in_its_column(
    spark: Any, tmp_path: Path
) -> None:
    """Spark maps CSV fields by position: two header orders must not swap values between columns."""
    source_dir = tmp_path / "src"
    source_dir.mkdir()
    first = [{"a": f"a{i}", "b": f"b{i}", "k": "x" if i % 2 else "y"} for i in range(6)]
    second = [{"a": f"A{i}", "b": f"B/{i}=%", "k": "x" if i % 2 else "y"} for i in range(5)]
    (source_dir / "one.csv").write_text("a,b,k\n" + "".join(f"{r['a']},{r['b']},{r['k']}\n" for r in first))
    (source_dir / "two.csv").write_text("k,b,a\n" + "".join(f"{r['k']},{r['b']},{r['a']}\n" for r in second))
    (tmp_path / "spec.yaml").write_text(
        "accelerator_dir: acc\n"
        "datasets:\n"
        "  - name: t\n"
        "    from: file:src\n"
        "    params: {file_format: csv}\n"
        "    acceleration:\n"
        "      engine: parquet\n"
        "      partition_by:\n"
        "        - {k: k}\n"
    )
    project = load_spec(tmp_path / "spec.yaml")
    refresh_dataset(project, project.dataset("t"), spark=spark, strategy="spark")
    got = row_multiset(read_all_partitions(project, "t").to_pylist(), ["a", "b", "k"])
    assert got == row_multiset(first + second, ["a", "b", "k"])


@pytest.mark.s3
def test_s3_files_are_unified_from_every_footer(
    s3_server: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    import boto3

    client: Any = boto3.client("s3", **s3_server)  # type: ignore[call-overload]
    write_hive_amounts(tmp_path / "src", "r01", [1.5, None], pa.float64())
    write_hive_amounts(tmp_path / "src", "r02", [2**53, -4], pa.int64())
    for local in sorted((tmp_path / "src").rglob("*.parquet")):
        client.upload_file(str(local), s3_bucket, f"sales/{local.relative_to(tmp_path / 'src').as_posix()}")
    params = {"file_format": "parquet", "endpoint_url": s3_server["endpoint_url"]}
    source = FileSource(f"{s3_bucket}/sales", params=params, scheme="s3")
    assert source.schema().field("amount").type == pa.float64(), "the second file's int64 is seen too"
    assert Counter(source.read_all().column("amount").to_pylist()) == Counter([1.5, None, 2.0**53, -4.0])

    write_hive_amounts(tmp_path / "src", "r03", ["text"], pa.string())
    client.upload_file(
        str(tmp_path / "src" / "region=r03" / "part-0.parquet"), s3_bucket, "sales/region=r03/part-0.parquet"
    )
    with pytest.raises(SchemaDriftError) as raised:
        FileSource(f"{s3_bucket}/sales", params=params, scheme="s3").schema()
    assert "region=r03/part-0.parquet" in str(raised.value)


@pytest.mark.postgres
def test_postgres_declared_schema_must_match_the_table(pg_database: str) -> None:
    """A `schema:` type the table does not have is refused, never silently ignored."""
    import psycopg

    from airflow_partitions.sources.postgres import PostgresSource

    with psycopg.connect(pg_database, autocommit=True) as connection:
        connection.execute("CREATE TABLE sales (id bigint, amount double precision)")
    matching = pa.schema([("amount", pa.float64())])
    assert PostgresSource("public", "sales", url=pg_database, declared_schema=matching).schema().names == [
        "id",
        "amount",
    ]
    with pytest.raises(SourceError) as raised:
        PostgresSource(
            "public", "sales", url=pg_database, declared_schema=pa.schema([("amount", pa.int64())])
        ).schema()
    assert "amount: declared int64, the table has double" in str(raised.value)
