"""Writes through the core: append, upsert and delete, each one atomic commit; a full read equals the
source plus the applied writes (row hashes, NULLs and types included) for every engine."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from airflow_partitions.catalog import open_catalog
from airflow_partitions.exceptions import FilterError, WriteError, WriteKeyError, WriteSchemaError
from airflow_partitions.refresh.pipeline import refresh_dataset
from airflow_partitions.table import open_handle
from airflow_partitions.transforms import parse_transform
from airflow_partitions.write import commit as writes
from tests.writes_support import (
    REGIONS,
    Oracle,
    Source,
    assert_same_rows,
    fresh_database,
    hostile_rows,
    read_all,
)

pytestmark = [pytest.mark.postgres]


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    with fresh_database() as url:
        yield url


@pytest.fixture
def source(pg_url: str, tmp_path: Path) -> Source:
    return Source(pg_url, tmp_path)


# Engine x layout pairs (not a cross product): each engine under a different kind of partition field,
# the NULL partition reachable in each (region and ts are NULL in some rows).
# DuckDB cases use fewer regions: each partition is a database file, costly to attach.
FEW_REGIONS = [None, "EU", "a/b", "it's", "🙂"]
CASES = [
    ("parquet", {}, ["region"], REGIONS),
    ("duckdb", {}, ["truncate(500, id)", "region"], FEW_REGIONS),
    ("arrow", {}, ["date_trunc('week', ts)"], REGIONS),
    ("duckdb", {"partition_mode": "tables"}, ["region"], FEW_REGIONS),
]


@pytest.mark.parametrize(("engine", "params", "layout", "regions"), CASES, ids=lambda v: str(v)[:40])
def test_full_read_equals_source_plus_applied_writes(
    source: Source, engine: str, params: dict[str, str], layout: list[str], regions: list[str | None]
) -> None:
    initial = hostile_rows(1, range(1, 301), regions=regions)
    source.create(initial)
    project = source.spec(layout, engine=engine, params=params)
    summary = refresh_dataset(project, "items")
    assert summary.stage_mode == "pushdown"
    oracle = Oracle(source.rows())
    dataset = project.dataset("items")

    appended = hostile_rows(2, range(1000, 1120), regions=regions)
    result = writes.append(open_handle(project, dataset), appended)
    oracle.append(appended)
    assert (result.rows_in, result.rows_added, result.rows_removed) == (120, 120, 0)
    assert_same_rows(read_all(project), oracle.table(), "after append")

    # Existing ids with new values (many change region or week: their rows move), new ids, NULL columns.
    changed = hostile_rows(3, range(1, 301, 7), regions=regions)
    new = hostile_rows(4, range(2000, 2030), regions=regions)
    upserted = pa.concat_tables([changed, new])
    result = writes.upsert(open_handle(project, dataset), upserted)
    oracle.upsert(upserted)
    assert (result.rows_added, result.rows_removed) == (upserted.num_rows, changed.num_rows)
    assert_same_rows(read_all(project), oracle.table(), "after upsert")

    removed = writes.delete(open_handle(project, dataset), "amount < 0 OR region = 'a/b' OR note IS NULL")
    expected_removed = oracle.delete(
        lambda r: (r["amount"] is not None and r["amount"] < 0) or r["region"] == "a/b" or r["note"] is None
    )
    assert removed.rows_removed == expected_removed
    assert removed.rows_added == 0
    assert_same_rows(read_all(project), oracle.table(), "after delete")

    catalog = open_catalog(project, dataset)
    history = catalog.versions()
    assert [v.operation for v in history] == ["refresh", "append", "upsert", "delete"]
    assert history[1].conservation is not None
    assert history[1].conservation["rows_in"] == 120
    assert history[2].conservation is not None
    assert history[2].conservation["removed"] == changed.num_rows
    # Time travel: the append's version still reads as it was.
    after_append = Oracle(source.rows())
    after_append.append(appended)
    assert_same_rows(read_all(project, version=history[1].version), after_append.table(), "version 2")


def test_delete_drops_emptied_partitions_and_reads_only_what_it_must(source: Source) -> None:
    source.create(hostile_rows(5, range(1, 201), regions=[None, "EU", "US"]))
    project = source.spec(["region"])
    refresh_dataset(project, "items")
    dataset = project.dataset("items")
    before = open_catalog(project, dataset).latest()
    assert before is not None
    result = writes.delete(open_handle(project, dataset), "region IS NULL")
    assert result.removed_partitions == ("expr0=%NULL",)
    assert result.partitions == ()
    assert result.rows_removed == before.partitions["expr0=%NULL"].rows
    after = open_catalog(project, dataset).latest()
    assert after is not None
    assert set(after.partitions) == {"expr0=EU", "expr0=US"}
    assert after.partitions["expr0=EU"].files == before.partitions["expr0=EU"].files, "EU is untouched"
    # A filter on a partition expression of another column: DuckDB computes it with our transforms.
    bucket = parse_transform("bucket(4, id)").bind(pa.int64())
    left = read_all(project)
    in_bucket_one = sum(1 for value in bucket.apply(left.column("id")).to_pylist() if value == 1)
    assert writes.delete(open_handle(project, dataset), "bucket(4, id) = 1").rows_removed == in_bucket_one > 0
    assert 1 not in bucket.apply(read_all(project).column("id")).to_pylist()
    assert read_all(project).num_rows == left.num_rows - in_bucket_one
    with pytest.raises(FilterError, match="nope"):
        writes.delete(open_handle(project, dataset), "nope = 1")
    nothing = writes.delete(open_handle(project, dataset), "region = 'nowhere'")
    assert nothing.version is None
    assert nothing.rows_removed == 0


def test_upsert_with_a_key_that_decides_the_partition_rewrites_only_routed_partitions(
    source: Source,
) -> None:
    source.create(hostile_rows(6, range(1, 401)))
    project = source.spec(["truncate(100, id)"])
    refresh_dataset(project, "items")
    dataset = project.dataset("items")
    result = writes.upsert(open_handle(project, dataset), hostile_rows(7, range(150, 153)))
    assert result.partitions == ("expr0=100",), "only the partition the keys route to"
    assert (result.rows_added, result.rows_removed) == (3, 3)
    assert read_all(project).num_rows == 400


def test_writes_to_a_dataset_never_refreshed(source: Source) -> None:
    """An empty catalog: the schema comes from the source; the first write creates the partitions."""
    source.create(hostile_rows(8, range(0)))
    project = source.spec(["region"])
    dataset = project.dataset("items")
    rows = hostile_rows(9, range(1, 51))
    result = writes.append(open_handle(project, dataset), rows.to_batches(max_chunksize=7))
    assert result.version == 1
    assert result.rows_added == 50
    assert_same_rows(read_all(project), rows, "first write")


def test_schema_mismatch_names_the_columns_and_writes_nothing(source: Source) -> None:
    source.create(hostile_rows(10, range(1, 21)))
    project = source.spec(["region"])
    refresh_dataset(project, "items")
    dataset = project.dataset("items")
    catalog = open_catalog(project, dataset)
    head = catalog.head_version()
    bad = pa.table(
        {
            "id": pa.array([1], pa.int64()),
            "region": ["EU"],
            "ts": ["not a time"],
            "amount": pa.array([Decimal("1.00")], pa.decimal128(12, 2)),
            "colour": ["red"],
        }
    )
    with pytest.raises(WriteSchemaError) as caught:
        writes.append(open_handle(project, dataset), bad)
    err = caught.value
    assert err.missing == ("note",)
    assert err.extra == ("colour",)
    assert err.uncastable == ("ts",)
    for name in ("'note'", "'colour'", "'ts'"):
        assert name in str(err), f"the message names {name}"
    lossy = hostile_rows(11, range(900, 901)).set_column(
        3, "amount", pa.array([Decimal("1.234")], pa.decimal128(12, 3))
    )
    with pytest.raises(WriteSchemaError, match="'amount' is decimal128"):
        writes.upsert(open_handle(project, dataset), lossy)
    assert open_catalog(project, dataset).head_version() == head, "nothing was committed"


def test_upsert_without_keys_and_with_repeated_keys_is_refused(source: Source) -> None:
    source.create(hostile_rows(12, range(1, 11)))
    project = source.spec(["region"])
    refresh_dataset(project, "items")
    declared = project.dataset("items")
    # The spec declares primary_key [id]; the same dataset without it needs keys=[...].
    from dataclasses import replace

    keyless = replace(declared, acceleration=replace(declared.acceleration, primary_key=()))
    head = open_catalog(project, keyless).head_version()
    with pytest.raises(WriteKeyError, match="upsert needs key columns"):
        writes.upsert(open_handle(project, keyless), hostile_rows(13, range(1, 3)))
    twice = hostile_rows(14, [5, 5])  # type: ignore[arg-type]
    with pytest.raises(WriteKeyError, match=r"repeat key \['id'\] values, e.g. \[\(5,\)\]"):
        writes.upsert(open_handle(project, keyless), twice, keys=["id"])
    with pytest.raises(WriteKeyError, match=r"\['nope'\] are not columns"):
        writes.upsert(open_handle(project, keyless), hostile_rows(15, range(1, 2)), keys=["nope"])
    with pytest.raises(WriteError, match="delete needs a filter"):
        writes.delete(open_handle(project, keyless), "  ")
    assert open_catalog(project, keyless).head_version() == head


def test_write_result_round_trips_json() -> None:
    result = writes.WriteResult(
        dataset="items",
        operation=writes.WriteOperation.UPSERT,
        version=3,
        base_version=2,
        partitions=("region=EU",),
        removed_partitions=("region=%NULL",),
        rows_in=4,
        rows_added=4,
        rows_removed=1,
        files_written=1,
        elapsed_s=0.5,
        commit_id="upsert-x",
    )
    assert writes.WriteResult.from_json(result.to_json()) == result
    assert "committed version 3" in result.describe()


@pytest.mark.spark
def test_append_and_upsert_a_spark_dataframe(source: Source, spark: Any) -> None:
    source.create(hostile_rows(51, range(1, 41), regions=FEW_REGIONS))
    project = source.spec(["region"])
    refresh_dataset(project, "items")
    dataset = project.dataset("items")
    oracle = Oracle(source.rows())
    appended = hostile_rows(52, range(300, 340), regions=FEW_REGIONS)
    result = writes.append(open_handle(project, dataset), spark.createDataFrame(appended.to_pandas()))
    oracle.append(appended)
    assert result.rows_added == 40
    changed = hostile_rows(53, range(1, 41, 4), regions=FEW_REGIONS)
    writes.upsert(open_handle(project, dataset), spark.createDataFrame(changed.to_pandas()))
    oracle.upsert(changed)
    assert_same_rows(read_all(project), oracle.table(), "after Spark DataFrame writes")


def test_a_change_that_does_not_add_up_publishes_nothing(source: Source) -> None:
    """The commit checks each partition: rows before - removed + added == rows in its files after."""
    from airflow_partitions.exceptions import ConservationError

    source.create(hostile_rows(61, range(1, 41), regions=FEW_REGIONS))
    project = source.spec(["region"])
    refresh_dataset(project, "items")
    target = writes.open_write_target(open_handle(project, project.dataset("items")))
    head = target.catalog.head_version()
    changes = writes.append_changes(target, hostile_rows(62, range(100, 110), regions=["EU"]))
    changes[0].removed = 1  # claims a row went that is still there
    with pytest.raises(ConservationError, match=r"expr0=EU: \d+ rows before - rows removed \+ rows added"):
        writes.commit_changes(target, writes.WriteOperation.APPEND, changes, rows_in=10)
    changes[0].removed = 0
    with pytest.raises(ConservationError, match="rows given to the write"):
        writes.commit_changes(target, writes.WriteOperation.APPEND, changes, rows_in=11)
    assert open_catalog(project, project.dataset("items")).head_version() == head
