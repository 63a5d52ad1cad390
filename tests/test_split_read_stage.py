"""The Spark stage over Parquet source files the executors read themselves (`refresh/split_read.py`).

Real local Spark (the shared `spark` fixture), real files, hostile data: NULLs in every column (partition
columns included), unicode, '/', '=', '%', quotes, instants with and without a zone, and files that drift
(one holds `n_int` as int32, one lacks `flag`). Each dataset is refreshed twice from the same files, once
with the executors reading the files (row-group splits forced) and once with Spark reading them; both
reads equal the source row hash for row hash. A file that cannot be read fails the stage naming it and
publishes nothing. With a tiny task budget (`AP_SPARK_TASK_BUDGET`) each task writes its partitions after
every batch, so a partition gets several files from each task: the read still equals the source, an
unreadable file still removes every file written before it, and a write that loses a row is refused
naming the partition and both counts.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from matrix_support import hostile_chunks, multiset_difference

from airflow_partitions.catalog import open_catalog
from airflow_partitions.exceptions import ConservationError, RefreshError, SourceError
from airflow_partitions.read import PartitionedDatasetReader
from airflow_partitions.refresh import (
    commit_refresh,
    finalize_partition,
    plan_refresh,
    split_read,
    stage_refresh,
)
from airflow_partitions.refresh.plan import StageMode, StageResult
from airflow_partitions.spec import load_spec
from airflow_partitions.table import open_handle

PARTITION_BYS = [
    "[{b: 'bucket(3, n_int)'}, {s: s}]",
    "[{t: 'truncate(2, s)'}, {d: 'day(ts)'}]",
    "[{n: 'truncate(1000, n_int)'}, {dn: 'day(ts_naive)'}]",
]


def write_drifting_files(directory: Path) -> tuple[pa.Table, list[Path]]:
    """Three Parquet files of hostile rows in 8-row groups: the first holds `n_int` as int32, the last
    has no `flag` column. Returns the rows as the source schema reads them, and the files."""
    chunks = hostile_chunks(seed=41, rows=180)
    directory.mkdir(parents=True)
    narrow = chunks[0].set_column(
        chunks[0].schema.get_field_index("n_int"), "n_int", chunks[0].column("n_int").cast(pa.int32())
    )
    written = [narrow, chunks[1], chunks[2].drop_columns(["flag"])]
    paths = []
    for index, table in enumerate(written):
        path = directory / f"chunk-{index}.parquet"
        pq.write_table(table, path, row_group_size=8)
        paths.append(path)
    flagless = chunks[2].set_column(
        chunks[2].schema.get_field_index("flag"), "flag", pa.nulls(chunks[2].num_rows, pa.bool_())
    )
    return pa.concat_tables([chunks[0], chunks[1], flagless]), paths


def write_spec(root: Path, partition_by: str) -> Path:
    (root / "spec.yaml").write_text(
        "accelerator_dir: acc\n"
        "datasets:\n"
        "  - name: trips\n"
        "    from: file:src\n"
        "    params: {file_format: parquet}\n"
        "    acceleration:\n"
        f"      partition_by: {partition_by}\n"
    )
    return root / "spec.yaml"


def refresh(spec: Path, spark: Any, *, executors_read: bool | None) -> StageResult:
    """Plan, stage, finalize every partition and commit; the stage result."""
    project = load_spec(spec)
    dataset = project.dataset("trips")
    plan = plan_refresh(project, dataset)
    stage = stage_refresh(open_handle(project, dataset), plan, spark=spark, executors_read=executors_read)
    assert stage.mode is StageMode.WRITTEN
    results = [finalize_partition(open_handle(project, dataset), stage, item) for item in plan.items]
    commit_refresh(open_handle(project, dataset), plan, results, stage=stage)
    return stage


NOTE = re.compile(r"pyarrow on the executors: (\d+) parquet file\(s\), (\d+) split\(s\) in (\d+) task\(s\)")


def read_all(spec: Path) -> pa.Table:
    reader = PartitionedDatasetReader(spec, "trips")
    try:
        return reader.read()
    finally:
        reader.close()


def split_session(spark: Any, files: list[Path]) -> Any:
    """A session whose splits cut each file in two runs of row groups (Spark's split size below a file)."""
    session = spark.newSession()
    session.conf.set("spark.sql.files.maxPartitionBytes", str(max(p.stat().st_size for p in files) * 2 // 3))
    session.conf.set("spark.sql.files.openCostInBytes", "1")
    return session


@pytest.mark.spark
@pytest.mark.parametrize("partition_by", PARTITION_BYS)
def test_executors_reading_drifting_hostile_files_equal_the_source_and_spark_s_read(
    spark: Any, tmp_path: Path, partition_by: str
) -> None:
    ours, theirs = tmp_path / "ours", tmp_path / "spark"
    source, files = write_drifting_files(ours / "src")
    write_drifting_files(theirs / "src")

    stage = refresh(write_spec(ours, partition_by), split_session(spark, files), executors_read=None)
    note = stage.source_read or ""
    found = NOTE.fullmatch(note)
    assert found is not None, note
    assert int(found.group(1)) == len(files)
    assert int(found.group(2)) > len(files), "files cut into runs of row groups"
    assert int(found.group(3)) <= int(spark.sparkContext.defaultParallelism), "one task per core at most"
    assert stage.source_rows == stage.routed_rows == source.num_rows

    spark_stage = refresh(write_spec(theirs, partition_by), spark, executors_read=False)
    assert (spark_stage.source_read or "").startswith("Spark reads the source: not asked for")

    read = read_all(ours / "spec.yaml").select(source.column_names)
    assert read.schema.field("n_int").type == pa.int64()
    assert read.column("s").null_count, "NULLs in a partition column"
    assert read.column("n_int").null_count, "NULLs in a partition column"
    assert multiset_difference(read, source) == ([], []), "the acceleration equals the source"
    by_spark = read_all(theirs / "spec.yaml").select(source.column_names)
    assert multiset_difference(read, by_spark) == ([], []), "and equals what Spark's read wrote"


def corrupt_data_pages(path: Path) -> None:
    """Overwrite the start of the first column chunk (its page header): the footer stays readable."""
    data = bytearray(path.read_bytes())
    data[4:200] = b"\xff" * 196
    path.write_bytes(bytes(data))


@pytest.mark.spark
def test_a_file_the_executors_cannot_read_fails_the_stage_naming_it_and_publishes_nothing(
    spark: Any, tmp_path: Path
) -> None:
    _, files = write_drifting_files(tmp_path / "src")
    spec = write_spec(tmp_path, PARTITION_BYS[0])
    project = load_spec(spec)
    dataset = project.dataset("trips")
    plan = plan_refresh(project, dataset)
    corrupt_data_pages(files[1])
    with pytest.raises(SourceError, match=r"(?s)cannot read \S*chunk-1\.parquet.*nothing was published"):
        stage_refresh(open_handle(project, dataset), plan, spark=split_session(spark, files))
    assert open_catalog(project, dataset).latest() is None, "nothing published"
    assert not list((tmp_path / "acc" / "trips").rglob("part-*")), "files other tasks wrote are removed"
    staging = tmp_path / "acc" / "_staging" / "trips"
    assert not staging.exists() or not any(staging.iterdir()), "no stage left"


@pytest.mark.spark
def test_sources_the_executors_cannot_read_keep_spark_s_read_and_say_why(spark: Any, tmp_path: Path) -> None:
    source, _ = write_drifting_files(tmp_path / "src")
    csv = tmp_path / "csv"
    csv.mkdir()
    pacsv.write_csv(source.select(["id", "s"]), csv / "rows.csv")
    (tmp_path / "spec.yaml").write_text(
        "accelerator_dir: acc\n"
        "datasets:\n"
        "  - name: trips\n"
        "    from: file:csv\n"
        "    params: {file_format: csv}\n"
        "    acceleration:\n"
        "      partition_by: [{b: 'bucket(3, id)'}]\n"
    )
    spec = tmp_path / "spec.yaml"
    project = load_spec(spec)
    dataset = project.dataset("trips")
    with pytest.raises(RefreshError, match=r"cannot read csv files at .*: csv files: Spark parses them"):
        stage_refresh(
            open_handle(project, dataset), plan_refresh(project, dataset), spark=spark, executors_read=True
        )
    stage = refresh(spec, spark, executors_read=None)
    assert stage.source_read == "Spark reads the source: csv files: Spark parses them"
    assert read_all(spec).num_rows == source.num_rows


@pytest.mark.s3
@pytest.mark.spark
def test_executors_read_s3_files_with_the_source_s_settings(
    spark: Any, tmp_path: Path, s3_server: dict[str, str], s3_bucket: str
) -> None:
    import boto3

    source, files = write_drifting_files(tmp_path / "local")
    client: Any = boto3.client("s3", **s3_server)  # type: ignore[call-overload]
    for path in files:
        client.upload_file(str(path), s3_bucket, f"src/{path.name}")
    # The credentials are the source's own params: the executors get them with the job, not from their
    # environment.
    params = (
        f"file_format: parquet, endpoint_url: '{s3_server['endpoint_url']}', region: us-east-1, "
        f"aws_access_key_id: {s3_server['aws_access_key_id']}, "
        f"aws_secret_access_key: {s3_server['aws_secret_access_key']}"
    )
    (tmp_path / "spec.yaml").write_text(
        "accelerator_dir: acc\n"
        "datasets:\n"
        "  - name: trips\n"
        f"    from: s3://{s3_bucket}/src\n"
        f"    params: {{{params}}}\n"
        "    acceleration:\n"
        f"      partition_by: {PARTITION_BYS[0]}\n"
    )
    stage = refresh(tmp_path / "spec.yaml", split_session(spark, files), executors_read=True)
    assert (stage.source_read or "").startswith("pyarrow on the executors: 3 parquet file(s)")
    read = read_all(tmp_path / "spec.yaml").select(source.column_names)
    assert multiset_difference(read, source) == ([], [])


def files_per_partition(root: Path) -> dict[Path, int]:
    found: dict[Path, int] = {}
    for path in root.rglob("part-*"):
        found[path.parent] = found.get(path.parent, 0) + 1
    return found


@pytest.mark.spark
@pytest.mark.parametrize("partition_by", PARTITION_BYS[:2])
def test_tasks_past_their_budget_write_several_files_per_partition_and_the_read_equals_the_source(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, partition_by: str
) -> None:
    monkeypatch.setenv(split_read.TASK_BUDGET_ENV, "1")  # every batch passes it: write after each
    source, files = write_drifting_files(tmp_path / "src")
    stage = refresh(write_spec(tmp_path, partition_by), split_session(spark, files), executors_read=True)
    found = NOTE.fullmatch(stage.source_read or "")
    assert found is not None, stage.source_read
    tasks = int(found.group(3))
    assert stage.source_rows == stage.routed_rows == source.num_rows
    per_partition = files_per_partition(tmp_path / "acc" / "trips")
    assert max(per_partition.values()) > tasks, "a task wrote a partition more than once"

    read = read_all(tmp_path / "spec.yaml").select(source.column_names)
    assert read.column("s").null_count, "NULLs in a partition column"
    assert multiset_difference(read, source) == ([], []), "the acceleration equals the source"


@pytest.mark.spark
def test_a_task_that_wrote_before_its_unreadable_file_fails_the_stage_and_its_files_are_removed(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(split_read.TASK_BUDGET_ENV, "1")
    _, files = write_drifting_files(tmp_path / "src")
    spec = write_spec(tmp_path, PARTITION_BYS[0])
    project = load_spec(spec)
    dataset = project.dataset("trips")
    plan = plan_refresh(project, dataset)
    corrupt_data_pages(files[-1])  # read last, by a task that has written files by then
    written: list[dict[str, Any]] = []
    real_task_rows = split_read.task_rows

    def recorded(session: Any, job: Any) -> list[dict[str, Any]]:
        rows = real_task_rows(session, job)
        written.extend(row for row in rows if row["item"] != split_read.SUMMARY_ITEM)
        return rows

    monkeypatch.setattr(split_read, "task_rows", recorded)
    with pytest.raises(SourceError, match=r"(?s)cannot read \S*chunk-2\.parquet.*nothing was published"):
        stage_refresh(open_handle(project, dataset), plan, spark=split_session(spark, files))
    assert written, "files were written before the unreadable file"
    assert open_catalog(project, dataset).latest() is None, "nothing published"
    assert not list((tmp_path / "acc" / "trips").rglob("part-*")), "every written file is removed"
    staging = tmp_path / "acc" / "_staging" / "trips"
    assert not staging.exists() or not any(staging.iterdir()), "no stage left"


@pytest.mark.spark
def test_a_write_that_loses_a_row_in_a_later_flush_is_refused_naming_the_partition(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tasks run in this process (the executors' code, real files and writer) so that one write can
    be made to lose a row; the session, the driver and its checks are the real ones."""
    monkeypatch.setenv(split_read.TASK_BUDGET_ENV, "1")
    source, files = write_drifting_files(tmp_path / "src")
    spec = write_spec(tmp_path, PARTITION_BYS[0])
    project = load_spec(spec)
    dataset = project.dataset("trips")
    plan = plan_refresh(project, dataset)
    real_write = split_read.write_item
    writes: dict[int, int] = {}
    lossy: dict[str, int] = {}

    def write_item(job: Any, schema: pa.Schema, index: int, rows: pa.Table, **options: Any) -> dict[str, Any]:
        writes[index] = writes.get(index, 0) + 1
        if lossy or writes[index] < 2 or rows.num_rows < 2:
            return real_write(job, schema, index, rows, **options)
        lossy[job.key_paths[index]] = index
        return {**real_write(job, schema, index, rows.slice(1), **options), "routed": rows.num_rows}

    def in_process(session: Any, job: Any) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for task in range(len(job.tasks)):
            batch = pa.record_batch([pa.array([task], pa.int64())], names=["id"])
            for out in split_read.read_route_write(job, iter([batch])):
                rows.extend(out.to_pylist())
        return rows

    monkeypatch.setattr(split_read, "write_item", write_item)
    monkeypatch.setattr(split_read, "task_rows", in_process)
    with pytest.raises(ConservationError) as raised:
        stage_refresh(
            open_handle(project, dataset), plan, spark=split_session(spark, files), executors_read=True
        )
    assert list(raised.value.partitions) == list(lossy), "the partition that lost a row is named"
    want, got = next(iter(raised.value.partitions.values()))
    assert want is not None
    assert want - got == 1, raised.value.partitions
    assert f"{want} rows read, {got} rows" in str(raised.value)
    assert open_catalog(project, dataset).latest() is None, "nothing published"
    assert not list((tmp_path / "acc" / "trips").rglob("part-*")), "every written file is removed"
    assert sum(writes.values()) > len(writes), "partitions were written more than once"
    assert want < source.num_rows


@pytest.mark.parametrize(
    ("sizes", "tasks"),
    [([10] * 10, 2), ([100, 1, 1, 1, 1, 1], 3), ([5, 5, 5], 8), ([1, 1, 1, 1, 1, 100], 2), ([7], 4)],
)
def test_splits_are_packed_in_order_into_at_most_one_task_per_core(sizes: list[int], tasks: int) -> None:
    from airflow_partitions.sources.files.splits import Split, group_splits

    splits = [Split(f"f{index}", size) for index, size in enumerate(sizes)]
    grouped = group_splits(splits, tasks, open_cost=1)
    assert [split for task in grouped for split in task] == splits, "every split once, in order"
    assert len(grouped) == min(tasks, len(splits)), "every core gets a task while splits last"
    assert all(grouped), "no empty task"
    share = sum(size + 1 for size in sizes) / len(grouped)
    assert all(sum(s.size + 1 for s in task) <= share + max(sizes) + 1 for task in grouped), "balanced"
