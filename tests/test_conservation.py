"""Row conservation: every refresh counts rows from source to stage to files and refuses to publish a loss.

Real Spark (the shared `spark` fixture, and a Spark Connect server in a subprocess), real files under
tmp_path, hostile data (NULLs in every column, partition columns included). The faulty writers below are
real `ParquetStorage` subclasses that lose a row on purpose, injected through `storage=`.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark import cloudpickle

from airflow_partitions.catalog import open_catalog
from airflow_partitions.cli.main import main as cli_main
from airflow_partitions.exceptions import ConservationError, RefreshError
from airflow_partitions.keys import PartitionKey
from airflow_partitions.refresh import (
    PartitionResult,
    StageMode,
    commit_refresh,
    finalize_partition,
    plan_refresh,
    refresh_dataset,
    stage_refresh,
)
from airflow_partitions.refresh import stage as stage_module
from airflow_partitions.refresh.stage_layout import StageManifest, staged_item_directory
from airflow_partitions.sources import open_source
from airflow_partitions.spec import load_spec
from airflow_partitions.spec.model import ProjectSpec
from airflow_partitions.storage import get_storage
from airflow_partitions.storage.parquet import ParquetStorage
from airflow_partitions.table import open_handle

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parent.parent
REGIONS = [None, "EU", "a/b", "%NULL", "x=y", "ü ñ", "it's", ""]
PLUS_TWO = dt.timezone(dt.timedelta(hours=2))


def hostile_rows(count: int = 48, offset: int = 0) -> pa.Table:
    """NULLs in every column; separators, escapes and quotes in the partition column; naive and tz times."""
    ids = range(offset, offset + count)
    return pa.table(
        {
            "id": pa.array([None if i % 9 == 4 else i for i in ids], pa.int64()),
            "region": pa.array([REGIONS[i % len(REGIONS)] for i in ids], pa.string()),
            "fare": pa.array([None if i % 5 == 3 else i * 0.25 for i in ids], pa.float64()),
            "note": pa.array([None if i % 7 == 2 else f"n'{i}/%=" for i in ids], pa.string()),
            "dropoff": pa.array(
                [None if i % 11 == 6 else dt.datetime(2026, 3, 1 + i % 4, i % 24, 5) for i in ids],
                pa.timestamp("us"),
            ),
            "pickup": pa.array(
                [None if i % 13 == 1 else dt.datetime(2026, 3, 1, i % 24, 30, tzinfo=PLUS_TWO) for i in ids],
                pa.timestamp("us", tz="UTC"),
            ),
        }
    )


def write_project(tmp_path: Path, partition_by: str, tables: list[pa.Table]) -> ProjectSpec:
    (tmp_path / "src").mkdir(exist_ok=True)
    for old in (tmp_path / "src").glob("*.parquet"):
        old.unlink()
    for index, table in enumerate(tables):
        pq.write_table(table, tmp_path / "src" / f"part-{index}.parquet")
    (tmp_path / "spec.yaml").write_text(
        "accelerator_dir: acc\n"
        "datasets:\n"
        "  - name: trips\n"
        "    from: file:src\n"
        "    params: {file_format: parquet}\n"
        "    acceleration:\n"
        f"      partition_by: {partition_by}\n"
    )
    return load_spec(tmp_path / "spec.yaml")


BY_REGION = "[{region: region}]"
BY_BUCKET = "[{b: 'bucket(4, id)'}]"


def region_path(region: str | None) -> str:
    return PartitionKey((region,)).path(["region"])


def rows_of(table: pa.Table, region: str | None) -> int:
    return sum(1 for value in table.column("region").to_pylist() if value == region)


# The faulty writers below run where the rows are written: on the Spark executors (StageMode.WRITTEN).
# Their Python workers cannot import this test module, so Spark ships the classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class HonestlyDroppingStorage(ParquetStorage):
    """Writes one row fewer than it is given for one partition, and records what it wrote."""

    def __init__(self, victim: str) -> None:
        super().__init__()
        self.victim = victim

    def write(self, table: pa.Table, dataset_root: Path, key_path: str, *, sync: bool = True) -> list[Any]:
        if key_path == self.victim:
            table = table.slice(1)
        return super().write(table, dataset_root, key_path, sync=sync)


class SilentlyDroppingStorage(ParquetStorage):
    """Loses one row inside the file of one partition but records the rows it was given."""

    def __init__(self, victim: str) -> None:
        super().__init__()
        self.victim = victim

    def _write_file(self, table: pa.Table, path: Path) -> None:
        if path.parent.name == self.victim:
            table = table.slice(1)
        super()._write_file(table, path)


def refresh_once(spark: Any, project: ProjectSpec) -> int:
    summary = refresh_dataset(project, "trips", spark=spark)
    assert summary.version == 1
    return open_catalog(project, project.dataset("trips")).head_version()


def assert_previous_version_current(project: ProjectSpec, version: int, source: pa.Table) -> None:
    dataset = project.dataset("trips")
    catalog = open_catalog(project, dataset)
    assert catalog.head_version() == version, "a refused commit publishes nothing"
    snapshot = catalog.latest()
    assert snapshot is not None
    assert catalog.data_root is not None
    files = [f for entry in snapshot.partitions.values() for f in entry.files]
    assert get_storage(dataset.acceleration).read(catalog.data_root, files).num_rows == source.num_rows


def no_stage_left(tmp_path: Path) -> bool:
    staging = tmp_path / "acc" / "_staging" / "trips"
    return not staging.exists() or not any(staging.iterdir())


@pytest.mark.parametrize("storage_class", [HonestlyDroppingStorage, SilentlyDroppingStorage])
def test_a_writer_losing_a_row_refuses_the_commit(
    spark: Any, tmp_path: Path, storage_class: type[HonestlyDroppingStorage | SilentlyDroppingStorage]
) -> None:
    source = hostile_rows()
    project = write_project(tmp_path, BY_REGION, [source])
    version = refresh_once(spark, project)
    victim = region_path("a/b")
    expected = rows_of(source, "a/b")

    with pytest.raises(ConservationError) as raised:
        refresh_dataset(project, "trips", full=True, spark=spark, storage=storage_class(victim))
    error = raised.value
    assert error.dataset == "trips"
    assert error.partitions == {victim: (expected, expected - 1)}, "names the partition and both counts"
    message = str(error)
    assert "'trips'" in message
    assert f"{victim}: {expected} rows read, {expected - 1} rows in the written files" in message
    assert "nothing was published" in message
    assert_previous_version_current(project, version, source)
    assert no_stage_left(tmp_path)
    dataset = project.dataset("trips")
    snapshot = open_catalog(project, dataset).latest()
    assert snapshot is not None
    referenced = {f.path for entry in snapshot.partitions.values() for f in entry.files}
    on_disk = {
        p.relative_to(tmp_path / "acc" / "trips").as_posix()
        for p in (tmp_path / "acc" / "trips").rglob("part-*")
    }
    assert on_disk == referenced, "the files the executors wrote for the refused refresh are removed"
    summary: Any = error.summary
    assert summary is not None
    assert summary.conservation["differing"] == {victim: {"expected": expected, "actual": expected - 1}}


def test_a_writer_losing_a_row_is_refused_by_finalize_even_when_it_reports_the_original_count(
    spark: Any, tmp_path: Path
) -> None:
    source = hostile_rows()
    project = write_project(tmp_path, BY_REGION, [source])
    dataset = project.dataset("trips")
    plan = plan_refresh(project, dataset)
    stage = stage_refresh(open_handle(project, dataset), plan, spark=spark, write_files=False)
    victim = next(item for item in plan.items if item.key_path == region_path(None))
    with pytest.raises(ConservationError) as raised:
        finalize_partition(
            open_handle(project, dataset), stage, victim, storage=SilentlyDroppingStorage(victim.key_path)
        )
    count = rows_of(source, None)
    assert raised.value.partitions == {victim.key_path: (count, count - 1)}
    assert "rows in the written files" in str(raised.value)
    assert open_catalog(project, dataset).head_version() == 0


def test_a_deleted_staged_directory_is_an_error_not_an_empty_partition(spark: Any, tmp_path: Path) -> None:
    source = hostile_rows()
    project = write_project(tmp_path, BY_REGION, [source])
    dataset = project.dataset("trips")
    version = refresh_once(spark, project)

    plan = plan_refresh(project, dataset, full=True)
    stage = stage_refresh(open_handle(project, dataset), plan, spark=spark, write_files=False)
    assert stage.mode is StageMode.SPARK
    manifest = StageManifest.load(stage.location or "")
    victim = next(item for item in plan.items if item.key_path == region_path("EU"))
    staged = manifest.items[victim.key_path]
    assert staged["rows"] == rows_of(source, "EU"), "the manifest records each item's staged rows"
    shutil.rmtree(staged_item_directory(stage.location or "", int(staged["index"])))

    results = []
    for item in plan.items:
        if item is victim:
            with pytest.raises(ConservationError) as raised:
                finalize_partition(open_handle(project, dataset), stage, item)
            assert raised.value.partitions == {victim.key_path: (rows_of(source, "EU"), 0)}
            assert "rows read from the staged directory" in str(raised.value)
        else:
            results.append(finalize_partition(open_handle(project, dataset), stage, item))
    with pytest.raises(RefreshError, match="have no result"):
        commit_refresh(open_handle(project, dataset), plan, results, stage=stage)
    assert_previous_version_current(project, version, source)


def test_null_bucket_rows_are_routed_and_the_full_scan_proves_it(spark: Any, tmp_path: Path) -> None:
    # Static discovery used to plan buckets 0..3 only, and rows with a NULL id silently vanished. Now the NULL
    # bucket is planned, and the full-scan check (source rows == rows routed) is what proves none is lost.
    source = hostile_rows()
    null_ids = source.column("id").null_count
    assert null_ids > 0
    project = write_project(tmp_path, BY_BUCKET, [source])
    summary = refresh_dataset(project, "trips", spark=spark)
    assert summary.conservation == {
        "partitions_checked": 5,
        "routed": source.num_rows,
        "written": source.num_rows,
        "source_rows": source.num_rows,
    }
    snapshot = open_catalog(project, project.dataset("trips")).latest()
    assert snapshot is not None
    assert snapshot.partitions[PartitionKey((None,)).path(["b"])].rows == null_ids
    assert snapshot.total_rows == source.num_rows
    assert no_stage_left(tmp_path)


def test_the_cli_refuses_a_refresh_that_loses_a_row(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the real command: exit code 1, the refusal in the JSON summary, nothing committed."""
    source = hostile_rows()
    project = write_project(tmp_path, BY_REGION, [source])
    victim = region_path("a/b")
    expected = rows_of(source, "a/b")
    write_file = ParquetStorage._write_file

    def lose_a_row(self: ParquetStorage, table: pa.Table, path: Path) -> None:
        # Fault injection: the file of one partition silently misses its first row.
        write_file(self, table.slice(1) if path.parent.name == victim else table, path)

    monkeypatch.setattr(ParquetStorage, "_write_file", lose_a_row)
    # The patch lives in this process: finalize writes here on the staged path. (Executors writing the
    # files refuse a lost row too: test_a_writer_losing_a_row_refuses_the_commit.)
    monkeypatch.setattr(stage_module, "choose_written", lambda *args: False)
    capsys.readouterr()
    assert cli_main(["refresh", str(tmp_path / "spec.yaml"), "trips", "--json"]) == 1
    captured = capsys.readouterr()
    refused = json.loads(captured.out)
    assert refused["version"] is None
    assert refused["conservation"]["refused"] is True
    assert refused["conservation"]["differing"] == {victim: {"expected": expected, "actual": expected - 1}}
    assert "nothing was published" in captured.err
    assert open_catalog(project, project.dataset("trips")).head_version() == 0
    assert no_stage_left(tmp_path)


def test_rows_added_to_the_source_during_a_full_refresh_fail_it(spark: Any, tmp_path: Path) -> None:
    source = hostile_rows()
    project = write_project(tmp_path, BY_REGION, [source])
    dataset = project.dataset("trips")
    plan = plan_refresh(project, dataset)
    # After discovery, a file with a region discovery never saw lands in the source.
    late = hostile_rows(5).set_column(1, "region", pa.array(["late/arrival"] * 5, pa.string()))
    pq.write_table(late, tmp_path / "src" / "part-late.parquet")
    with pytest.raises(ConservationError) as raised:
        stage_refresh(open_handle(project, dataset), plan, spark=spark)
    assert raised.value.partitions == {region_path("late/arrival"): (5, 0)}
    assert no_stage_left(tmp_path)


def test_a_discovered_partition_that_stages_no_rows_is_an_error(spark: Any, tmp_path: Path) -> None:
    source = hostile_rows()
    project = write_project(tmp_path, BY_REGION, [source])
    dataset = project.dataset("trips")
    plan = plan_refresh(project, dataset)
    gone = region_path("x=y")
    assert gone in {item.key_path for item in plan.items}
    # The source loses every row of one discovered partition before the stage.
    keep = pa.array([value != "x=y" for value in source.column("region").to_pylist()])
    write_project(tmp_path, BY_REGION, [source.filter(keep)])
    with pytest.raises(ConservationError) as raised:
        stage_refresh(open_handle(project, dataset), plan, spark=spark)
    assert raised.value.partitions == {gone: (None, 0)}
    assert "at least 1 rows (discovery found the partition in the source)" in str(raised.value)
    assert no_stage_left(tmp_path)


def test_a_discovered_partition_read_empty_by_pushdown_is_an_error(tmp_path: Path) -> None:
    # Hive layout: each region is read straight from its directory (no Spark).
    source = hostile_rows().drop_columns(["region"])
    for region in ("EU", "US"):
        (tmp_path / "src" / f"region={region}").mkdir(parents=True)
        pq.write_table(source, tmp_path / "src" / f"region={region}" / "part-0.parquet")
    (tmp_path / "spec.yaml").write_text(
        "accelerator_dir: acc\n"
        "datasets:\n"
        "  - name: trips\n"
        "    from: file:src\n"
        "    params: {file_format: parquet}\n"
        "    acceleration:\n"
        "      partition_by: [{region: region}]\n"
    )
    project = load_spec(tmp_path / "spec.yaml")
    dataset = project.dataset("trips")
    plan = plan_refresh(project, dataset)
    stage = stage_refresh(open_handle(project, dataset), plan)
    assert stage.mode is StageMode.PUSHDOWN
    pq.write_table(source.slice(0, 0), tmp_path / "src" / "region=US" / "part-0.parquet")
    by_path = {item.key_path: item for item in plan.items}
    assert (
        finalize_partition(open_handle(project, dataset), stage, by_path["region=EU"]).routed
        == source.num_rows
    )
    with pytest.raises(ConservationError) as raised:
        finalize_partition(open_handle(project, dataset), stage, by_path["region=US"])
    assert raised.value.partitions == {"region=US": (None, 0)}


def test_commit_refuses_results_whose_files_do_not_hold_the_routed_rows(spark: Any, tmp_path: Path) -> None:
    source = hostile_rows()
    project = write_project(tmp_path, BY_REGION, [source])
    dataset = project.dataset("trips")
    plan = plan_refresh(project, dataset)
    stage = stage_refresh(open_handle(project, dataset), plan, spark=spark)
    results = [
        finalize_partition(open_handle(project, dataset), stage, item).to_json() for item in plan.items
    ]
    victim = next(r for r in results if r["key_path"] == region_path("ü ñ"))
    victim["routed"] += 1
    with pytest.raises(ConservationError) as raised:
        commit_refresh(
            open_handle(project, dataset), plan, [PartitionResult.from_json(r) for r in results], stage=stage
        )
    routed = rows_of(source, "ü ñ")
    assert raised.value.partitions == {victim["key_path"]: (routed + 1, routed)}
    assert open_catalog(project, dataset).head_version() == 0
    victim["routed"] -= 1
    decoded = [PartitionResult.from_json(r) for r in results]
    assert commit_refresh(open_handle(project, dataset), plan, decoded, stage=stage).version == 1


def test_counts_are_recorded_in_the_commit_and_shown_by_refresh_and_status(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = hostile_rows()
    project = write_project(tmp_path, BY_REGION, [source])
    spec = str(tmp_path / "spec.yaml")
    partitions = len(set(source.column("region").to_pylist()))
    assert cli_main(["refresh", spec, "trips", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    counts = {
        "partitions_checked": partitions,
        "routed": source.num_rows,
        "written": source.num_rows,
        "source_rows": source.num_rows,
    }
    assert summary["conservation"] == counts

    dataset = project.dataset("trips")
    catalog = open_catalog(project, dataset)
    assert catalog.versions()[-1].conservation == counts
    record = next((tmp_path / "acc" / "trips" / "_catalog" / "log").rglob("*.json"))
    header = json.loads(record.read_text().splitlines()[0])
    assert header["conservation"] == counts, "the counts live in the commit record's header"

    # A partial refresh scans part of the source: no source total to compare, per-partition counts only.
    eu = region_path("EU")
    assert cli_main(["refresh", spec, "trips", "--partitions", eu, "--json"]) == 0
    partial = json.loads(capsys.readouterr().out)["conservation"]
    assert partial == {
        "partitions_checked": 1,
        "routed": rows_of(source, "EU"),
        "written": rows_of(source, "EU"),
        "source_rows": None,
    }

    assert cli_main(["status", spec, "trips", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)["datasets"][0]
    assert status["conservation"] == {"version": 2, **partial}
    assert status["recent_versions"][0]["conservation"] == counts
    assert cli_main(["status", spec, "trips"]) == 0
    text = capsys.readouterr().out
    assert f"rows conserved: {rows_of(source, 'EU')} routed, {rows_of(source, 'EU')} written" in text


def test_observed_counts_through_spark_connect(spark_connect_server: dict[str, Any], tmp_path: Path) -> None:
    # A Connect client cannot share this process with the classic session: the stage job runs apart.
    source = hostile_rows()
    project = write_project(tmp_path, "[{b: 'bucket(3, id)'}, {region: region}]", [source])
    dataset = project.dataset("trips")
    plan = plan_refresh(project, dataset)
    (tmp_path / "plan.json").write_text(plan.dumps())

    def run_stage(location: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                str(REPO / "spark_jobs" / "refresh_partitions.py"),
                "stage",
                "--spec",
                str(tmp_path / "spec.yaml"),
                "--dataset",
                "trips",
                "--plan",
                str(tmp_path / "plan.json"),
                "--location",
                str(tmp_path / location),
                "--output",
                str(tmp_path / "out.json"),
                "--remote",
                spark_connect_server["url"],
            ],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        )

    completed = run_stage("stage")
    assert completed.returncode == 0, completed.stderr[-3000:]
    output = json.loads((tmp_path / "out.json").read_text())
    assert output["spark"] == "spark_connect"
    assert output["source_rows"] == output["routed_rows"] == source.num_rows
    manifest = StageManifest.load(tmp_path / "stage")
    assert manifest.counted_by == "observed", "Observation metrics arrive through Spark Connect"
    assert sum(int(entry["rows"]) for entry in manifest.items.values()) == source.num_rows

    # The same job refuses a stage that loses rows: a late file with a partition discovery never saw.
    late = hostile_rows(4).set_column(1, "region", pa.array(["late"] * 4, pa.string()))
    pq.write_table(late, tmp_path / "src" / "part-late.parquet")
    refused = run_stage("stage-2")
    assert refused.returncode == 2
    assert "rows in the source" in refused.stderr
    assert not (tmp_path / "stage-2").exists()
    assert open_source(dataset.source).read_all().num_rows == source.num_rows + 4


def test_refusals_of_several_partitions_merge_into_one_error_that_survives_pickling() -> None:
    import pickle

    from airflow_partitions.refresh.stage_layout import merge_conservation_errors

    first = ConservationError(
        "trips", {"region=EU": (5, 4)}, expected="rows read", actual="rows in the written files"
    )
    second = ConservationError(
        "trips", {"region=%NULL": (3, 0)}, expected="rows routed by the stage", actual="rows read"
    )
    merged = merge_conservation_errors("trips", [first, second])
    assert merged.partitions == {"region=EU": (5, 4), "region=%NULL": (3, 0)}
    message = str(merged)
    assert "2 partition(s)" in message
    assert "region=EU: 5 expected rows, 4 rows found" in message
    assert "rows read vs rows in the written files" in message
    assert merge_conservation_errors("trips", [first]) is first
    copy = pickle.loads(pickle.dumps(merged))
    assert isinstance(copy, ConservationError)
    assert (copy.dataset, copy.partitions, str(copy)) == (merged.dataset, merged.partitions, message)
