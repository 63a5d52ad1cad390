"""Write-through to a Postgres source: source transaction first, then the acceleration; when the
acceleration fails, the source keeps the rows and a refresh of the named partitions catches up."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from airflow_partitions.catalog import open_catalog
from airflow_partitions.exceptions import WriteError, WriteThroughError
from airflow_partitions.refresh.pipeline import refresh_dataset
from airflow_partitions.table import open_handle
from airflow_partitions.write.write_through import write_through
from tests.writes_support import Oracle, Source, assert_same_rows, fresh_database, hostile_rows, read_all

pytestmark = [pytest.mark.postgres]


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    with fresh_database() as url:
        yield url


@pytest.fixture
def source(pg_url: str, tmp_path: Path) -> Source:
    return Source(pg_url, tmp_path)


REGIONS: list[str | None] = [None, "EU", "a/b", "it's"]


def test_write_through_reaches_source_then_acceleration(source: Source) -> None:
    source.create(hostile_rows(21, range(1, 121), regions=REGIONS))
    project = source.spec(["region"])
    refresh_dataset(project, "items")
    dataset = project.dataset("items")
    oracle = Oracle(source.rows())
    rows = pa.concat_tables(
        [
            hostile_rows(22, range(1, 121, 5), regions=REGIONS),
            hostile_rows(23, range(500, 520), regions=REGIONS),
        ]
    )
    result = write_through(open_handle(project, dataset), rows, operation="upsert")
    oracle.upsert(rows)
    assert result.rows_added == rows.num_rows
    assert_same_rows(source.rows(), oracle.table(), "the source")
    assert_same_rows(read_all(project), oracle.table(), "the acceleration")
    latest = open_catalog(project, dataset).latest()
    assert latest is not None
    assert all(latest.partitions[p].source_fingerprint is None for p in result.partitions), (
        "written-through partitions are rebuilt by the next refresh"
    )
    refresh_dataset(project, "items")
    assert_same_rows(read_all(project), oracle.table(), "after the next refresh")


def test_acceleration_failure_keeps_the_source_rows_and_a_refresh_catches_up(source: Source) -> None:
    source.create(hostile_rows(24, range(1, 61), regions=REGIONS))
    project = source.spec(["region"])
    refresh_dataset(project, "items")
    dataset = project.dataset("items")
    catalog = open_catalog(project, dataset)
    head = catalog.head_version()
    before = read_all(project)
    # A file where the new partition's directory must go: the acceleration write fails, for real.
    blocker = Path(project.accelerator_dir) / "items" / "expr0=ZZ"
    blocker.write_text("in the way", encoding="utf-8")
    rows = pa.concat_tables(
        [hostile_rows(25, range(100, 110), regions=["EU"]), hostile_rows(26, range(200, 205), regions=["ZZ"])]
    )
    with pytest.raises(WriteThroughError) as caught:
        write_through(open_handle(project, dataset), rows, operation="append")
    err = caught.value
    assert err.source_rows == 15
    assert set(err.partitions) == {"expr0=EU", "expr0=ZZ"}
    assert "refresh SPEC items --partitions 'expr0=EU' 'expr0=ZZ'" in str(err)
    assert open_catalog(project, dataset).head_version() == head, "the acceleration is untouched"
    assert_same_rows(read_all(project), before, "the acceleration before catching up")
    expected = Oracle(before)
    expected.append(rows)
    assert_same_rows(source.rows(), expected.table(), "the source kept the committed rows")

    blocker.unlink()
    refresh_dataset(project, "items", partitions=list(err.partitions))
    assert_same_rows(read_all(project), source.rows(), "after refreshing the named partitions")


def test_refused_by_the_source_writes_nowhere(source: Source, tmp_path: Path) -> None:
    source.create(hostile_rows(27, range(1, 31), regions=REGIONS))
    project = source.spec(["region"])
    refresh_dataset(project, "items")
    dataset = project.dataset("items")
    head = open_catalog(project, dataset).head_version()
    before = source.rows()
    duplicate = hostile_rows(28, range(1, 3), regions=REGIONS)  # ids 1, 2 exist: the primary key refuses
    with pytest.raises(WriteError, match=r"refused the rows: duplicate key value.*rolled back"):
        write_through(open_handle(project, dataset), duplicate, operation="append")
    assert_same_rows(source.rows(), before, "the source")
    assert open_catalog(project, dataset).head_version() == head
    with pytest.raises(WriteError, match="write-through covers append and upsert"):
        write_through(open_handle(project, dataset), duplicate, operation="delete")
