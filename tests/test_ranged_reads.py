"""Ranged first reads of large Parquet partition files on S3 (`read.ranged`).

The first filtered read of a large file that is not cached fetches the footer and only the row groups
whose statistics may hold a matching row; the rows returned must be exactly DuckDB's answer over the
source, on hostile data (NULLs in every column, offsets, NaN, unicode, `/ = %`, quotes, empty strings).
A second read of the same file fetches it whole into the cache.
"""

from __future__ import annotations

import datetime as dt
import decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from matrix_support import multiset_difference
from test_pruning_support import Acceleration, build_acceleration, duckdb_filter_rows

from airflow_partitions.objectstore import S3Settings
from airflow_partitions.read import PartitionedDatasetReader
from airflow_partitions.read.ranged import row_groups_to_read

ROWS = 3_000
UTC = dt.UTC
TEXTS = ["é/=%", "", "a'b\"c", "zone 7", None, "日本", "x=1/y"]


def _table() -> pa.Table:
    ids = list(range(ROWS))
    base = dt.datetime(2024, 3, 1, tzinfo=UTC)
    return pa.table(
        {
            "id": pa.array([None if i % 97 == 5 else i for i in ids], pa.int64()),
            "zone": pa.array([None if i % 53 == 0 else i % 7 for i in ids], pa.int32()),
            "ts": pa.array(
                [None if i % 41 == 0 else base + dt.timedelta(minutes=37 * i) for i in ids],
                pa.timestamp("us", tz="UTC"),
            ),
            "local": pa.array(
                [None if i % 43 == 0 else dt.datetime(2024, 1, 1) + dt.timedelta(hours=i) for i in ids],
                pa.timestamp("ns"),
            ),
            "day": pa.array(
                [None if i % 47 == 0 else dt.date(2023, 1, 1) + dt.timedelta(days=i) for i in ids]
            ),
            "text": pa.array([TEXTS[i % len(TEXTS)] for i in ids]),
            "amount": pa.array(
                [None if i % 31 == 0 else float("nan") if i % 29 == 0 else i * 0.25 for i in ids],
                pa.float64(),
            ),
            "price": pa.array(
                [None if i % 37 == 0 else decimal.Decimal(i) / 4 for i in ids], pa.decimal128(12, 2)
            ),
            "flag": pa.array([None if i % 19 == 0 else i % 3 == 0 for i in ids], pa.bool_()),
        }
    )


FILTERS = [
    "id = 1234",
    "id BETWEEN 100 AND 180",
    "id IS NULL",
    "id > 2990 OR id < 3",
    "ts >= TIMESTAMPTZ '2024-03-10 00:00:00+00' AND ts < TIMESTAMPTZ '2024-03-11 00:00:00+00'",
    "ts IS NULL AND zone = 3",
    "local = TIMESTAMP '2024-01-05 05:00:00'",
    "day = DATE '2025-06-01'",
    "text = 'é/=%' AND id < 400",
    "text = '' AND id > 2500",
    "amount > 700 AND id < 2900",
    "amount != 1.5 AND id < 60",
    "price = 250.25",
    "flag AND id BETWEEN 1000 AND 1100",
    "NOT (id >= 50) AND zone IS NOT NULL",
    "zone IN (2, 5) AND id < 300",
]


@pytest.fixture(scope="module")
def acceleration(tmp_path_factory: pytest.TempPathFactory) -> Acceleration:
    return build_acceleration(
        tmp_path_factory.mktemp("ranged"),
        _table(),
        [("zone_bucket", "bucket(2, zone)")],
        engine="parquet",
        storage_options={"row_group_rows": 64, "sort_by": ["id"]},
    )


@pytest.fixture(scope="module")
def s3_root(acceleration: Acceleration, s3_server: dict[str, str]) -> str:
    import uuid

    import boto3

    client = boto3.client("s3", **s3_server)
    s3_bucket = f"ap-ranged-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=s3_bucket)
    dataset_root = acceleration.root / acceleration.dataset
    prefix = "ranged-reads"
    for path in dataset_root.rglob("*"):
        if path.is_file() and "_catalog" not in path.parts:
            key = f"{prefix}/{acceleration.dataset}/{path.relative_to(dataset_root).as_posix()}"
            client.upload_file(str(path), s3_bucket, key)
    return f"s3://{s3_bucket}/{prefix}/{acceleration.dataset}"


def _assert_same_rows(got: pa.Table, expected: pa.Table, where: str) -> None:
    """Same schema, same rows as a multiset (row digests: NULLs, NaN, instants and decimals exact)."""
    assert got.schema.equals(expected.schema), where
    missing, extra = multiset_difference(got, expected)
    assert (missing, extra) == ([], []), where
    assert got.num_rows == expected.num_rows


def _reader(acc: Acceleration, root: str, server: dict[str, str], cache: Path, **kwargs: Any) -> Any:
    return PartitionedDatasetReader(
        acc.spec_path,
        acc.dataset,
        catalog=acc.catalog,
        data_root=root,
        filesystem=S3Settings.from_mapping(server).arrow_filesystem(),
        cache_dir=cache,
        **kwargs,
    )


@pytest.mark.s3
@pytest.mark.parametrize("where", FILTERS)
def test_a_first_ranged_read_returns_exactly_the_source_rows(
    acceleration: Acceleration, s3_root: str, s3_server: dict[str, str], tmp_path: Path, where: str
) -> None:
    with _reader(acceleration, s3_root, s3_server, tmp_path / "cache", ranged_read_min_bytes=0) as reader:
        got = reader.read(where)
        ranged = list(reader._remote.ranged_reads)
        cache = reader._remote
    _assert_same_rows(got, acceleration.expected_rows(where), where)
    # The point of the exercise: files were read by ranges, nothing fetched whole into the cache.
    assert ranged, "a first filtered read of files over the threshold reads by ranges"
    assert not list((tmp_path / "cache").rglob("*.parquet"))
    assert cache.ranged_read_min_bytes == 0


@pytest.mark.s3
def test_a_selective_read_fetches_few_row_groups_and_a_repeat_read_caches_the_file(
    acceleration: Acceleration, s3_root: str, s3_server: dict[str, str], tmp_path: Path
) -> None:
    where = "id = 1234"
    with _reader(acceleration, s3_root, s3_server, tmp_path / "cache", ranged_read_min_bytes=0) as reader:
        first = reader.read(where)
        ranged = list(reader._remote.ranged_reads)
        second = reader.read(where)
        third = reader.read(where)
        assert len(reader._remote.ranged_reads) == len(ranged), "a file is read by ranges once"
    for got in (first, second, third):
        _assert_same_rows(got, acceleration.expected_rows(where), where)
    assert ranged
    assert max(r.row_groups for r in ranged) > 10
    assert sum(r.row_groups_read for r in ranged) <= len(ranged), "sorted ids: a row group per file at most"
    assert list((tmp_path / "cache").rglob("*.parquet")), "the second read fetched the file whole"
    assert not [r.path for r in ranged if Path(r.path).exists()], "per-call files are removed"


@pytest.mark.s3
def test_small_files_and_unfiltered_reads_are_fetched_whole(
    acceleration: Acceleration, s3_root: str, s3_server: dict[str, str], tmp_path: Path
) -> None:
    with _reader(acceleration, s3_root, s3_server, tmp_path / "small") as reader:  # default threshold
        got = reader.read("id = 1234")
        assert not reader._remote.ranged_reads
    _assert_same_rows(got, acceleration.expected_rows("id = 1234"), "id = 1234")
    with _reader(acceleration, s3_root, s3_server, tmp_path / "all", ranged_read_min_bytes=0) as reader:
        everything = reader.read()
        assert not reader._remote.ranged_reads, "a read without a filter needs every row group"
    _assert_same_rows(everything, acceleration.table, "no filter")


def test_row_group_statistics_keep_every_row_group_that_may_match(acceleration: Acceleration) -> None:
    """Against the rows themselves: a row group left out holds no row DuckDB says matches."""
    reader = PartitionedDatasetReader(
        acceleration.spec_path, acceleration.dataset, catalog=acceleration.catalog
    )
    with reader:
        for where in FILTERS:
            plan = reader.plan(where)
            for file in plan.inexact_files:
                path = acceleration.root / acceleration.dataset / file.path
                parquet = pq.ParquetFile(path)
                kept = set(row_groups_to_read(parquet.metadata, plan.index.schema, plan.prepared))
                for group in range(parquet.metadata.num_row_groups):
                    if group in kept:
                        continue
                    rows = parquet.read_row_group(group)
                    rows = rows.cast(acceleration.table.select(rows.column_names).schema)
                    assert not duckdb_filter_rows(rows, where), (where, file.path, group)
