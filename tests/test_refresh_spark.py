"""The Spark refresh pipeline end to end on real files: every format, every engine, row for row.

One shared local SparkSession (the `spark` fixture); data stays small. Also: NULL and hostile partition
values, a failing partition leaving the catalog untouched, the CLI, and the spark-submit entry point.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from airflow_partitions.catalog import open_catalog
from airflow_partitions.cli.main import main as cli_main
from airflow_partitions.exceptions import PartitionsFailedError, RefreshError
from airflow_partitions.keys import PartitionKey
from airflow_partitions.refresh import (
    Reason,
    StageMode,
    commit_refresh,
    finalize_partition,
    plan_refresh,
    refresh_dataset,
    stage_refresh,
)
from airflow_partitions.refresh.plan import PartitionResult, RefreshPlan, StageResult
from airflow_partitions.refresh.stage_layout import StageManifest, staged_item_directory
from airflow_partitions.sources import open_source
from airflow_partitions.sources.files import filter_to_key
from airflow_partitions.spec import load_spec
from airflow_partitions.spec.model import DatasetSpec, ProjectSpec
from airflow_partitions.storage import get_storage
from airflow_partitions.table import open_handle

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parent.parent
# Values that break naive path building or quoting: separators, escapes, the NULL marker, dots, unicode,
# quotes, spaces, an empty string, and a value long enough to be shortened in its path component.
HOSTILE = [None, "EU", "a/b", "..", "%NULL", "x=y", "ü ñ", "it's", " pad ", "", "k" * 200]


def source_rows(count: int = 66, offset: int = 0) -> pa.Table:
    ids = list(range(offset, offset + count))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "region": pa.array([HOSTILE[i % len(HOSTILE)] for i in ids], pa.string()),
            "fare": pa.array([round(i * 0.75, 2) for i in ids], pa.float64()),
            "pickup": pa.array(
                [None if i % 13 == 5 else dt.datetime(2026, 1, 1 + i % 3, i % 24, 15) for i in ids],
                pa.timestamp("us"),
            ),
        }
    )


def write_source(directory: Path, file_format: str, tables: list[pa.Table]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for index, table in enumerate(tables):
        if file_format == "parquet":
            pq.write_table(table, directory / f"part-{index}.parquet")
        elif file_format == "csv":
            pacsv.write_csv(table, directory / f"part-{index}.csv")
        else:
            with (directory / f"part-{index}.jsonl").open("w") as handle:
                for row in table.to_pylist():
                    if row["pickup"] is not None:
                        row["pickup"] = row["pickup"].isoformat(sep=" ")
                    handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def write_spec(
    tmp_path: Path,
    *,
    file_format: str,
    engine: str = "parquet",
    partition_mode: str | None = None,
    partition_by: tuple[str, ...] = ('{region: "region"}', "{year: \"date_trunc('year', pickup)\"}"),
) -> ProjectSpec:
    params = f"      params: {{partition_mode: {partition_mode}}}\n" if partition_mode else ""
    fields = "".join(f"        - {entry}\n" for entry in partition_by)
    text = (
        "accelerator_dir: acc\n"
        "datasets:\n"
        "  - name: trips\n"
        "    from: file:src\n"
        f"    params: {{file_format: {file_format}}}\n"
        "    acceleration:\n"
        f"      engine: {engine}\n"
        f"{params}"
        "      partition_by:\n"
        f"{fields}"
    )
    (tmp_path / "spec.yaml").write_text(text)
    return load_spec(tmp_path / "spec.yaml")


def read_acceleration(project: ProjectSpec, dataset: DatasetSpec) -> tuple[Any, pa.Table]:
    catalog = open_catalog(project, dataset)
    snapshot = catalog.latest()
    assert snapshot is not None
    storage = get_storage(dataset.acceleration)
    files = [f for entry in snapshot.partitions.values() for f in entry.files]
    assert catalog.data_root is not None
    return snapshot, storage.read(catalog.data_root, files)


def by_id(table: pa.Table) -> list[dict[str, Any]]:
    return sorted(table.to_pylist(), key=lambda row: row["id"])


def assert_partitions_hold_their_rows(project: ProjectSpec, dataset: DatasetSpec, snapshot: Any) -> None:
    source = open_source(dataset.source)
    bound = dataset.bind(source.schema())
    transforms = [f.transform for f in bound.acceleration.partition_by]
    storage = get_storage(dataset.acceleration)
    root = open_catalog(project, dataset).data_root
    assert root is not None
    for entry in snapshot.partitions.values():
        if not entry.files:
            continue
        table = storage.read(root, entry.files)
        assert filter_to_key(table, transforms, entry.key.values).num_rows == table.num_rows == entry.rows, (
            f"partition {entry.key_path} holds rows of another partition"
        )


@pytest.mark.parametrize(
    ("file_format", "engine", "partition_mode"),
    [
        ("parquet", "parquet", None),
        ("csv", "duckdb", "files"),
        ("json", "arrow", None),
        ("parquet", "duckdb", "tables"),
    ],
)
def test_refresh_equals_source_row_for_row(
    spark: Any, tmp_path: Path, file_format: str, engine: str, partition_mode: str | None
) -> None:
    write_source(tmp_path / "src", file_format, [source_rows(40), source_rows(26, offset=40)])
    project = write_spec(tmp_path, file_format=file_format, engine=engine, partition_mode=partition_mode)
    dataset = project.dataset("trips")
    summary = refresh_dataset(project, dataset, spark=spark)
    # The executors write the final files, but for duckdb tables (one shared database file).
    assert summary.stage_mode == ("spark" if partition_mode == "tables" else "written")
    assert summary.failed == {}
    snapshot, accelerated = read_acceleration(project, dataset)
    expected = open_source(dataset.source).read_all()
    assert accelerated.num_rows == expected.num_rows == 66
    assert by_id(accelerated.select(expected.schema.names).cast(expected.schema)) == by_id(expected)
    assert summary.rows == 66
    keys = {entry.key.values for entry in snapshot.partitions.values()}
    assert (None, dt.datetime(2026, 1, 1)) in keys, "NULL region is its own partition"
    assert any(year is None for _, year in keys), "NULL timestamps land in the NULL year partition"
    regions = {region for region, _ in keys}
    assert regions == set(expected.column("region").to_pylist())
    # CSV cannot tell an empty string from NULL (both read as NULL, as Spark reads them).
    assert regions == (set(HOSTILE) - {""} if file_format == "csv" else set(HOSTILE))
    assert_partitions_hold_their_rows(project, dataset, snapshot)
    # Nothing changed: the next plan refreshes nothing and rewrites nothing.
    assert plan_refresh(project, dataset).items == ()


def test_failing_partition_leaves_catalog_untouched_until_commit(spark: Any, tmp_path: Path) -> None:
    write_source(tmp_path / "src", "parquet", [source_rows(30)])
    project = write_spec(tmp_path, file_format="parquet", partition_by=('{b: "bucket(4, id)"}',))
    dataset = project.dataset("trips")
    refresh_dataset(project, dataset, spark=spark)
    before = open_catalog(project, dataset).latest()
    assert before is not None

    plan = plan_refresh(project, dataset, full=True)
    stage = stage_refresh(open_handle(project, dataset), plan, spark=spark, write_files=False)
    assert stage.mode is StageMode.SPARK
    broken = plan.items[1]
    manifest = StageManifest.load(stage.location or "")
    directory = staged_item_directory(stage.location or "", int(manifest.items[broken.key_path]["index"]))
    for file in directory.glob("*.parquet"):
        file.write_bytes(b"this is not parquet")

    results = []
    for item in plan.items:
        if item is broken:
            with pytest.raises(RefreshError, match="cannot read the staged rows"):
                finalize_partition(open_handle(project, dataset), stage, item)
        else:
            results.append(finalize_partition(open_handle(project, dataset), stage, item))
    assert len(results) == 4, "4 buckets and the NULL partition, one of them broken"
    latest = open_catalog(project, dataset).latest()
    assert latest is not None
    assert latest.version == before.version, "finalized files are invisible before commit"

    with pytest.raises(RefreshError, match="1 of 5 planned partition"):
        commit_refresh(open_handle(project, dataset), plan, results, stage=stage, cleanup=False)
    latest = open_catalog(project, dataset).latest()
    assert latest is not None
    assert latest.version == before.version, "a refused commit changes nothing"

    commit = commit_refresh(open_handle(project, dataset), plan, results, stage=stage, require_all=False)
    after = open_catalog(project, dataset).latest()
    assert after is not None
    assert after.version == before.version + 1
    assert commit.missing == (broken.key_path,)
    assert after.partitions[broken.key_path].files == before.partitions[broken.key_path].files, (
        "the failed partition keeps its previous version"
    )
    for item in plan.items:
        if item is not broken:
            old, new = before.partitions[item.key_path], after.partitions[item.key_path]
            if old.files:
                assert new.files != old.files
            else:  # the empty NULL partition has no file to replace: its entry is re-committed
                assert new.refreshed_at > old.refreshed_at
    assert not Path(stage.location or "").exists(), "the stage is removed after the commit"


def test_stage_less_commit_retry_is_idempotent_and_a_new_plan_commits_again(
    spark: Any, tmp_path: Path
) -> None:
    # Each partition stages itself (as the stage-less DAG's tasks do): the commit gets no stage.
    write_source(tmp_path / "src", "parquet", [source_rows(24)])
    project = write_spec(tmp_path, file_format="parquet", partition_by=('{b: "bucket(3, id)"}',))
    dataset = project.dataset("trips")
    plan = plan_refresh(project, dataset)
    results = []
    for item in plan.items:
        own = stage_refresh(open_handle(project, dataset), replace(plan, items=(item,)), spark=spark)
        # As a commit task gets them: through XCom.
        results.append(
            PartitionResult.from_json(finalize_partition(open_handle(project, dataset), own, item).to_json())
        )
    first = commit_refresh(open_handle(project, dataset), plan, results)
    assert first.version == 1
    retried = commit_refresh(open_handle(project, dataset), RefreshPlan.from_json(plan.to_json()), results)
    assert retried.version == 1, "a retried commit of the same plan lands no second version"
    assert open_catalog(project, dataset).head_version() == 1

    again = plan_refresh(project, dataset, full=True)
    results = []
    for item in again.items:
        own = stage_refresh(open_handle(project, dataset), replace(again, items=(item,)), spark=spark)
        results.append(finalize_partition(open_handle(project, dataset), own, item))
    assert commit_refresh(open_handle(project, dataset), again, results).version == 2, (
        "a new discovery commits anew"
    )


def test_one_shot_refresh_commits_nothing_when_a_partition_fails(spark: Any, tmp_path: Path) -> None:
    write_source(tmp_path / "src", "parquet", [source_rows(20)])
    project = write_spec(tmp_path, file_format="parquet", partition_by=('{b: "bucket(2, id)"}',))
    dataset = project.dataset("trips")
    # A file where the partition directory must go makes exactly that partition's write fail.
    data_root = tmp_path / "acc" / "trips"
    data_root.mkdir(parents=True)
    (data_root / "b=1").write_text("in the way")
    with pytest.raises(PartitionsFailedError, match="1 of 3 partition") as raised:
        refresh_dataset(project, dataset, spark=spark)
    assert list(raised.value.failed) == ["b=1"]
    assert open_catalog(project, dataset).latest() is None, "nothing was committed"


def test_cli_refresh_prints_progress_and_json(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_source(tmp_path / "src", "parquet", [source_rows(24)])
    write_spec(tmp_path, file_format="parquet", partition_by=('{b: "bucket(3, id)"}',))
    spec = str(tmp_path / "spec.yaml")
    assert cli_main(["refresh", spec, "trips", "--json", "--shuffle-stage"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["version"] == 1
    assert summary["refreshed"] == 4, "3 buckets and the (empty) NULL partition"
    assert summary["rows"] == 24
    assert "4/4 partitions" in captured.err
    assert "24 rows" in captured.err

    assert cli_main(["refresh", spec, "trips", "--partitions", "b=2", "--json"]) == 0
    forced = json.loads(capsys.readouterr().out)
    assert forced["plan"]["forced"] == 1
    assert forced["refreshed"] == 1
    assert forced["version"] == 2

    assert cli_main(["refresh", spec, "trips", "--where", "bucket(3, id) = 0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["refreshed"] == 1

    assert cli_main(["refresh", spec, "trips", "--partitions", "b=9"]) == 2
    assert "no partition 'b=9'" in capsys.readouterr().err


def load_spark_job() -> ModuleType:
    path = REPO / "airflow_partitions" / "spark_jobs" / "refresh_partitions.py"
    spec = importlib.util.spec_from_file_location("refresh_partitions_job", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_spark_job_entry_point_stages_and_finalizes(spark: Any, tmp_path: Path) -> None:
    write_source(tmp_path / "src", "parquet", [source_rows(18)])
    project = write_spec(tmp_path, file_format="parquet", partition_by=('{b: "bucket(3, id)"}',))
    dataset = project.dataset("trips")
    plan = plan_refresh(project, dataset)
    (tmp_path / "plan.json").write_text(plan.dumps())
    job = load_spark_job()
    args = [
        "stage",
        "--spec",
        str(tmp_path / "spec.yaml"),
        "--dataset",
        "trips",
        "--plan",
        str(tmp_path / "plan.json"),
        "--location",
        str(tmp_path / "stage-1"),
        "--output",
        str(tmp_path / "out.json"),
        "--master",
        "local[2]",
        "--finalize",
    ]
    assert job.main(args) == 0
    output = json.loads((tmp_path / "out.json").read_text())
    assert output["mode"] == "written", "the executors wrote the final files"
    assert output["location"] == str(tmp_path / "stage-1")
    assert len(output["results"]) == 4, "3 buckets and the NULL partition"
    results = [PartitionResult.from_json(r) for r in output["results"]]
    commit = commit_refresh(open_handle(project, dataset), plan, results, stage=StageResult.from_json(output))
    assert commit.version == 1
    assert commit.rows == 18

    # Bad input is an exit code and a message, not a traceback.
    wrong_dataset = [*args[:4], "nope", *args[5:]]
    assert job.main(wrong_dataset) == 2


def test_refresh_of_removed_source_partition_removes_it(spark: Any, tmp_path: Path) -> None:
    write_source(tmp_path / "src", "parquet", [source_rows(22)])
    project = write_spec(tmp_path, file_format="parquet", partition_by=('{region: "region"}',))
    dataset = project.dataset("trips")
    refresh_dataset(project, dataset, spark=spark)
    original = source_rows(22)
    shrunk = original.filter(pa.array([r != "a/b" for r in original.column("region").to_pylist()]))
    write_source(tmp_path / "src", "parquet", [shrunk])
    plan = plan_refresh(project, dataset)
    gone = PartitionKey(("a/b",)).path(["region"])
    assert plan.removed == (gone,)
    assert {i.reason for i in plan.items} == {Reason.CHANGED}, (
        "flat files: any change touches every partition"
    )
    refresh_dataset(project, dataset, spark=spark)
    snapshot, accelerated = read_acceleration(project, dataset)
    assert gone not in snapshot.partitions
    assert "a/b" not in accelerated.column("region").to_pylist()
    assert accelerated.num_rows == shrunk.num_rows


@pytest.mark.s3
def test_s3_source_refreshes_through_spark_and_pushdown(
    spark: Any, tmp_path: Path, s3_server: dict[str, str], s3_bucket: str
) -> None:
    import boto3

    client: Any = boto3.client("s3", **s3_server)  # type: ignore[call-overload]
    table = source_rows(30)
    local = tmp_path / "part.parquet"
    pq.write_table(table, local)
    client.upload_file(str(local), s3_bucket, "flat/part-0.parquet")
    for region in ("EU", "a/b"):
        pq.write_table(
            table.filter(pa.array([r == region for r in table.column("region").to_pylist()])).drop_columns(
                ["region"]
            ),
            local,
        )
        escaped = region.replace("/", "%2F")
        client.upload_file(str(local), s3_bucket, f"hive/region={escaped}/part-0.parquet")
    endpoint = s3_server["endpoint_url"]
    (tmp_path / "spec.yaml").write_text(
        "accelerator_dir: acc\n"
        "datasets:\n"
        f"  - name: flat\n    from: s3://{s3_bucket}/flat\n    params: {{endpoint_url: '{endpoint}'}}\n"
        "    acceleration:\n      partition_by: [{b: 'bucket(3, id)'}]\n"
        f"  - name: hive\n    from: s3://{s3_bucket}/hive\n    params: {{endpoint_url: '{endpoint}'}}\n"
        "    acceleration:\n      partition_by: [{region: region}]\n"
    )
    project = load_spec(tmp_path / "spec.yaml")
    flat = refresh_dataset(project, "flat", spark=spark)
    assert flat.stage_mode == "written", "Spark reads S3 objects copied next to the stage (no s3a here)"
    _, accelerated = read_acceleration(project, project.dataset("flat"))
    assert by_id(accelerated) == by_id(table)

    hive = refresh_dataset(project, "hive", spark=spark)
    assert hive.stage_mode == "pushdown", "each region is read straight from its S3 objects"
    snapshot, accelerated = read_acceleration(project, project.dataset("hive"))
    assert set(snapshot.partitions) == {"region=EU", "region=a%2Fb"}
    expected = table.filter(pa.array([r in ("EU", "a/b") for r in table.column("region").to_pylist()]))
    assert by_id(accelerated.select(expected.schema.names)) == by_id(expected)
