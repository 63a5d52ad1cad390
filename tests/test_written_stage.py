"""The Spark executors write the final partition files (`StageMode.WRITTEN`): the refresh DAG's finalize
and commit tasks read no partition data in the Airflow task process, the result equals the source row for
row (hostile values, NULL partitions), and an item split over several executor tasks lists every file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from faulty_storage import OnePartitionFailingStorage, RowLosingStorage
from matrix_support import hostile_chunks, multiset_difference
from support_no_reads import DataReadError, no_data_reads

from airflow_partitions.catalog import open_catalog
from airflow_partitions.exceptions import ConservationError
from airflow_partitions.keys import PartitionKey
from airflow_partitions.read import PartitionedDatasetReader
from airflow_partitions.refresh import commit_refresh, finalize_partition, plan_refresh, stage_refresh
from airflow_partitions.refresh.plan import StageMode
from airflow_partitions.refresh.stage import UNSHUFFLED_MAX_FILES, UNSHUFFLED_MAX_TASKS, shuffle_by_item
from airflow_partitions.refresh.stage_layout import StageManifest
from airflow_partitions.spec import load_spec
from airflow_partitions.table import open_handle

PARTITION_BY = "[{b: 'bucket(3, n_int)'}, {s: s}]"


def write_project(
    tmp_path: Path, engine: str, *, params: str = "", partition_by: str = PARTITION_BY, append: bool = False
) -> tuple[Path, pa.Table]:
    chunks = hostile_chunks(seed=23, rows=240)
    (tmp_path / "src").mkdir()
    for index, chunk in enumerate(chunks):
        pq.write_table(chunk, tmp_path / "src" / f"chunk-{index}.parquet")
    engine_params = "{partition_mode: files" + (f", {params}" if params else "") + "}"
    if engine != "duckdb":
        engine_params = "{" + params + "}"
    (tmp_path / "spec.yaml").write_text(
        "accelerator_dir: acc\n"
        "datasets:\n"
        "  - name: trips\n"
        "    from: file:src\n"
        "    params: {file_format: parquet}\n"
        "    acceleration:\n"
        f"      engine: {engine}\n"
        f"      params: {engine_params}\n"
        f"      partition_by: {partition_by}\n"
        # The executors' own watermark filter is under test: late rows are reported, not rewritten.
        + (
            "      refresh_mode: append\n      refresh: {watermark_column: id, late_rows: report}\n"
            if append
            else ""
        )
    )
    return tmp_path / "spec.yaml", pa.concat_tables(chunks)


def read_all(spec: Path) -> pa.Table:
    reader = PartitionedDatasetReader(spec, "trips")
    try:
        return reader.read()
    finally:
        reader.close()


def assert_equals_source(spec: Path, source: pa.Table) -> None:
    read = read_all(spec).select(source.column_names)
    missing, extra = multiset_difference(read, source)
    assert (missing, extra) == ([], []), "the acceleration equals the source, row hash for row hash"


@pytest.mark.airflow
@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("engine", ["parquet", "duckdb"])
def test_refresh_dag_reads_no_partition_data_in_the_task_process(
    spark: Any, tmp_path: Path, engine: str
) -> None:
    from airflow_e2e.metadata_db import in_process_metadata_db

    from airflow_partitions.operators.run_conf import RefreshRunConf

    # Four partitions (NULL n_int included) keep the mapped fan-out short; hostile values ride along.
    spec, source = write_project(tmp_path, engine, partition_by="[{b: 'bucket(3, n_int)'}]")
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "refresh_trips.py").write_text(
        "from airflow_partitions.dag_factory import build_refresh_dags\n"
        f"globals().update(build_refresh_dags({str(spec)!r}))\n"
    )
    data_root = tmp_path / "acc" / "trips"
    staging = tmp_path / "acc" / "_staging"
    with in_process_metadata_db(str(dags)):
        from airflow.dag_processing.dagbag import DagBag

        bag = DagBag(dag_folder=str(dags))
        assert bag.import_errors == {}, bag.import_errors
        dag = bag.dags["refresh_trips"]
        # Every task of the run (discover, stage driver, partition.refresh[i], commit) runs in this
        # process; Spark's Python workers, which write the files, are separate processes.
        with no_data_reads([data_root, staging]) as guard:
            run = dag.test(run_conf=RefreshRunConf().to_conf())
        guard.check()
        assert str(run.state) == "success"
    project = load_spec(spec)
    snapshot = open_catalog(project, project.dataset("trips")).latest()
    assert snapshot is not None
    assert snapshot.total_rows == source.num_rows
    assert "b=%NULL" in snapshot.partitions, "rows with a NULL n_int have their partition"
    assert_equals_source(spec, source)


@pytest.mark.spark
def test_the_guard_catches_finalize_reading_staged_rows(spark: Any, tmp_path: Path) -> None:
    """The guard is not blind: finalize of a stage of staged rows (the older path) is caught."""
    spec, _ = write_project(tmp_path, "parquet")
    project = load_spec(spec)
    dataset = project.dataset("trips")
    plan = plan_refresh(project, dataset)
    stage = stage_refresh(open_handle(project, dataset), plan, spark=spark, write_files=False)
    assert stage.mode is StageMode.SPARK
    item = next(i for i in plan.items if StageManifest.load(stage.location or "").items[i.key_path]["rows"])
    roots = [tmp_path / "acc" / "trips", tmp_path / "acc" / "_staging"]
    with no_data_reads(roots) as guard, pytest.raises(DataReadError):
        finalize_partition(open_handle(project, dataset), stage, item)
    assert guard.reads, "the read of the staged rows was recorded"


@pytest.mark.spark
def test_an_item_split_over_several_executor_tasks_lists_every_file(spark: Any, tmp_path: Path) -> None:
    spec, source = write_project(tmp_path, "parquet", params="max_rows_per_file: 7")
    project = load_spec(spec)
    dataset = project.dataset("trips")
    plan = plan_refresh(project, dataset)
    # No shuffle by item, and one Spark task per source file: each task writes the items it read.
    session = spark.newSession()
    session.conf.set("spark.sql.files.maxPartitionBytes", "1024")
    stage = stage_refresh(open_handle(project, dataset), plan, spark=session, shuffle_items=False)
    assert stage.mode is StageMode.WRITTEN
    manifest = StageManifest.load(stage.location or "")
    results = [finalize_partition(open_handle(project, dataset), stage, item) for item in plan.items]
    assert any(len(r.entry.files) > 1 for r in results), "several files for one partition"
    for result in results:
        listed = manifest.items[result.entry.key_path]
        assert [f.path for f in result.entry.files] == [f["path"] for f in listed["files"]]
        assert result.entry.rows == listed["rows"] == sum(f.rows for f in result.entry.files)
    commit = commit_refresh(open_handle(project, dataset), plan, results, stage=stage)
    assert commit.rows == source.num_rows
    assert_equals_source(spec, source)


def test_a_stage_manifest_is_parsed_once_per_process_until_it_is_rewritten(tmp_path: Path) -> None:
    """A batch of partition tasks finalizes many items of one stage: the manifest is parsed once."""
    import dataclasses

    manifest = StageManifest(
        dataset="trips",
        spec_id="s1",
        mode=StageMode.WRITTEN,
        source={"kind": "files"},
        schema=pa.schema([("id", pa.int64())]),
        items={f"k={i}": {"index": i, "rows": 1, "written": 1, "files": []} for i in range(3)},
        created_at="2026-11-25T00:00:00+00:00",
    )
    manifest.write(tmp_path)
    first = StageManifest.load(tmp_path)
    assert StageManifest.load(tmp_path) is first
    assert first == manifest
    rewritten = dataclasses.replace(
        manifest, items={"k=0": {"index": 0, "rows": 2, "written": 2, "files": []}}
    )
    rewritten.write(tmp_path)
    again = StageManifest.load(tmp_path)
    assert again is not first
    assert again.items == rewritten.items


@pytest.mark.spark
def test_a_partition_the_executor_could_not_write_is_written_by_a_retry_once_fixed(
    spark: Any, tmp_path: Path
) -> None:
    """Clearing a failed partition task after fixing the cause works with a written stage too: the retry
    reads that partition's rows from the source, checks them against the stage's count and writes them."""
    from airflow_partitions.exceptions import ConservationError, RefreshError

    spec, source = write_project(tmp_path, "parquet")
    project = load_spec(spec)
    dataset = project.dataset("trips")
    plan = plan_refresh(project, dataset)
    blocked = next(item for item in plan.items if "%NULL" not in item.key_path)
    blocker = tmp_path / "acc" / "trips" / blocked.key_path
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("not a directory")
    stage = stage_refresh(open_handle(project, dataset), plan, spark=spark)
    assert stage.mode is StageMode.WRITTEN
    others = [
        finalize_partition(open_handle(project, dataset), stage, item)
        for item in plan.items
        if item is not blocked
    ]
    with pytest.raises(RefreshError, match="could not write"):
        finalize_partition(open_handle(project, dataset), stage, blocked)
    blocker.unlink()
    retried = finalize_partition(open_handle(project, dataset), stage, blocked)
    commit = commit_refresh(open_handle(project, dataset), plan, [*others, retried], stage=stage)
    assert commit.rows == source.num_rows
    assert_equals_source(spec, source)

    # A retry refuses when the source no longer holds what the stage routed to the partition.
    plan = plan_refresh(project, dataset, full=True)
    blocked = next(item for item in plan.items if item.key_path == blocked.key_path)
    blocker = tmp_path / "acc" / "trips" / blocked.key_path
    for existing in blocker.iterdir():
        existing.unlink()
    blocker.rmdir()
    blocker.write_text("not a directory")
    stage = stage_refresh(open_handle(project, dataset), plan, spark=spark)
    blocker.unlink()
    for chunk in (tmp_path / "src").iterdir():
        chunk.unlink()
    pq.write_table(source.slice(0, 5), tmp_path / "src" / "smaller.parquet")
    with pytest.raises((ConservationError, RefreshError)):
        finalize_partition(open_handle(project, dataset), stage, blocked)


def appended_rows(source: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Rows for an append: new hostile rows past every watermark (ids above the source's), and late rows
    (copies of committed rows with ids below every watermark) that an append must not read."""
    new = pa.concat_tables(hostile_chunks(seed=31, rows=60, chunks=1))
    top = max(source.column("id").to_pylist())
    new = new.set_column(0, "id", pa.array([top + 1 + i for i in range(new.num_rows)], type=pa.int64()))
    late = source.slice(3, 4)
    late = late.set_column(0, "id", pa.array([-1 - i for i in range(late.num_rows)], type=pa.int64()))
    return new, late


@pytest.mark.airflow
@pytest.mark.spark
@pytest.mark.slow
def test_an_append_through_the_refresh_dag_has_the_executors_write_the_new_files(
    spark: Any, tmp_path: Path
) -> None:
    """refresh_mode append on the written stage: the executors write only the rows past each partition's
    watermark as new files, the task process reads no partition data, and the commit adds the new files
    to the committed ones."""
    from airflow_e2e.metadata_db import in_process_metadata_db

    from airflow_partitions.operators.run_conf import RefreshRunConf
    from airflow_partitions.refresh import refresh_dataset

    spec, source = write_project(tmp_path, "parquet", partition_by="[{b: 'bucket(3, n_int)'}]", append=True)
    project = load_spec(spec)
    dataset = project.dataset("trips")
    first = refresh_dataset(project, dataset, spark=spark)
    assert first.refresh_mode == "full"
    assert first.stage_mode == "written"
    before = open_catalog(project, dataset).latest()
    assert before is not None
    new, late = appended_rows(source)
    pq.write_table(new, tmp_path / "src" / "chunk-new.parquet")
    pq.write_table(late, tmp_path / "src" / "chunk-late.parquet")
    plan = plan_refresh(project, dataset)
    assert plan.refresh_mode == "append"
    assert all(item.append for item in plan.items), "every partition is committed: each appends"
    assert plan.late_rows is not None
    assert sum(plan.late_rows.values()) == late.num_rows, "the late rows are reported"
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "refresh_trips.py").write_text(
        "from airflow_partitions.dag_factory import build_refresh_dags\n"
        f"globals().update(build_refresh_dags({str(spec)!r}))\n"
    )
    with in_process_metadata_db(str(dags)):
        from airflow.dag_processing.dagbag import DagBag

        bag = DagBag(dag_folder=str(dags))
        assert bag.import_errors == {}, bag.import_errors
        with no_data_reads([tmp_path / "acc" / "trips", tmp_path / "acc" / "_staging"]) as guard:
            run = bag.dags["refresh_trips"].test(run_conf=RefreshRunConf().to_conf())
        guard.check()
        assert str(run.state) == "success"
    catalog = open_catalog(project, dataset)
    after = catalog.latest()
    assert after is not None
    assert after.total_rows == source.num_rows + new.num_rows, "the late rows are not appended"
    for key_path, entry in before.partitions.items():
        assert set(entry.files) <= set(after.partitions[key_path].files), f"{key_path} kept its files"
    header = catalog.versions()[-1]
    assert header.conservation is not None
    assert header.conservation["routed"] == header.conservation["written"] == new.num_rows
    assert_equals_source(spec, pa.concat_tables([source, new]))


def test_an_executor_refuses_appended_rows_at_or_below_the_watermark(tmp_path: Path) -> None:
    """The executors' own check: rows routed to an appended partition that are not past its watermark
    would duplicate committed rows; the item fails with nothing written, the other items are written."""
    from airflow_partitions.refresh.written import ItemWriteJob, write_item
    from airflow_partitions.sources.base import RowsSince
    from airflow_partitions.storage import get_storage
    from airflow_partitions.transforms import parse_transform

    spec, source = write_project(tmp_path, "parquet", append=True)
    acceleration = load_spec(spec).dataset("trips").acceleration
    transform = parse_transform("bucket(3, n_int)")
    rows = source.filter(pa.compute.is_null(source.column("n_int")))
    assert rows.num_rows > 1
    mark = sorted(rows.column("id").to_pylist())[1]
    job = ItemWriteJob(
        dataset="trips",
        schema=source.schema.serialize().to_pybytes(),
        transforms=(transform,),
        keys=((None,), (None,)),
        key_paths=("b=%NULL", "b=%NULL"),
        storage=get_storage(acceleration),
        data_root=str(tmp_path / "out"),
        sinces=(RowsSince("id", mark), RowsSince("id", -1)),
    )
    refused = write_item(job, source.schema, 0, rows)
    assert refused["written"] == 0
    assert refused["files"] == "[]"
    assert "not past the watermark" in (refused["error"] or "")
    assert "2 of" in (refused["error"] or ""), "the two rows at or below id " + str(mark)
    written = write_item(job, source.schema, 1, rows)
    assert written["error"] is None
    assert written["written"] == written["routed"] == rows.num_rows


@pytest.mark.spark
def test_a_retried_append_partition_writes_only_the_rows_past_its_watermark(
    spark: Any, tmp_path: Path
) -> None:
    """An appended partition whose executor write failed is written by its task's retry from the source:
    only its rows past the watermark, as the stage routed them; the commit adds them to its files."""
    from airflow_partitions.refresh import refresh_dataset

    spec, source = write_project(tmp_path, "parquet", partition_by="[{b: 'bucket(3, n_int)'}]", append=True)
    project = load_spec(spec)
    dataset = project.dataset("trips")
    refresh_dataset(project, dataset, spark=spark)
    new, late = appended_rows(source)
    pq.write_table(new, tmp_path / "src" / "chunk-new.parquet")
    pq.write_table(late, tmp_path / "src" / "chunk-late.parquet")
    plan = plan_refresh(project, dataset)
    victim = next(item for item in plan.items if "%NULL" not in item.key_path)
    assert victim.append
    stage = stage_refresh(
        open_handle(project, dataset), plan, spark=spark, storage=OnePartitionFailingStorage(victim.key_path)
    )
    assert stage.mode is StageMode.WRITTEN
    assert "No space left" in StageManifest.load(stage.location or "").items[victim.key_path]["error"]
    results = [finalize_partition(open_handle(project, dataset), stage, item) for item in plan.items]
    retried = next(r for r in results if r.entry.key_path == victim.key_path)
    assert retried.appended
    expected_new = sum(
        1
        for row in new.to_pylist()
        if PartitionKey.from_json(victim.key).values == (bucket_of(row["n_int"]),)
    )
    assert retried.routed == expected_new > 0
    commit = commit_refresh(open_handle(project, dataset), plan, results, stage=stage)
    assert commit.rows == source.num_rows + new.num_rows
    assert_equals_source(spec, pa.concat_tables([source, new]))


def bucket_of(value: Any) -> Any:
    from airflow_partitions.transforms import parse_transform

    return parse_transform("bucket(3, n_int)").apply(pa.array([value], type=pa.int64()))[0].as_py()


def test_duckdb_tables_keeps_the_staged_path_and_asking_for_executor_writes_says_why(tmp_path: Path) -> None:
    """DuckDB `tables` is the one layout executors do not write (one shared database file only the
    committing task may change); asking for it anyway is a clear error, not a silent fallback."""
    from airflow_partitions.exceptions import RefreshError
    from airflow_partitions.refresh.stage import choose_written

    spec, _ = write_project(tmp_path, "duckdb")
    files = load_spec(spec).dataset("trips")
    assert choose_written(files, None) is True
    assert choose_written(files, False) is False
    tables_spec = spec.read_text().replace("partition_mode: files", "partition_mode: tables")
    spec.write_text(tables_spec)
    tables = load_spec(spec).dataset("trips")
    assert choose_written(tables, None) is False
    with pytest.raises(
        RefreshError, match=r"partition_mode 'tables' publishes into one shared database file"
    ):
        choose_written(tables, True)


def test_the_shuffle_by_item_is_skipped_only_for_a_few_scan_tasks_and_files() -> None:
    assert shuffle_by_item(3, 50) is False, "the plain job's shape: each scan task writes what it read"
    assert shuffle_by_item(None, 3) is True, "Spark Connect does not say how many tasks scan"
    assert shuffle_by_item(UNSHUFFLED_MAX_TASKS + 1, 1) is True, "a large scan: one task per partition"
    many = UNSHUFFLED_MAX_FILES // UNSHUFFLED_MAX_TASKS + 1
    assert shuffle_by_item(UNSHUFFLED_MAX_TASKS, many) is True, (
        "many partitions: not tasks x partitions files"
    )
    assert shuffle_by_item(3, 50, requested=True) is True
    assert shuffle_by_item(100, 5000, requested=False) is False


def _three_scan_tasks(spark: Any) -> Any:
    """A session whose scan of the three small chunk files is three tasks (one per file)."""
    session = spark.newSession()
    session.conf.set("spark.sql.files.maxPartitionBytes", "1048576")
    session.conf.set("spark.sql.files.openCostInBytes", "1048576")
    return session


@pytest.mark.spark
def test_scan_tasks_write_hostile_partitions_without_the_shuffle_row_for_row(
    spark: Any, tmp_path: Path
) -> None:
    import duckdb

    spec, source = write_project(tmp_path, "parquet", params="row_group_rows: 16")
    project = load_spec(spec)
    dataset = project.dataset("trips")
    plan = plan_refresh(project, dataset)
    stage = stage_refresh(open_handle(project, dataset), plan, spark=_three_scan_tasks(spark))
    assert stage.mode is StageMode.WRITTEN
    manifest = StageManifest.load(stage.location or "")
    assert any(len(entry["files"]) > 1 for entry in manifest.items.values()), "no shuffle: several files"
    assert any(PartitionKey.from_json(i.key).values[1] is None for i in plan.items), "a NULL partition"
    results = [finalize_partition(open_handle(project, dataset), stage, item) for item in plan.items]
    assert commit_refresh(open_handle(project, dataset), plan, results, stage=stage).rows == source.num_rows
    assert_equals_source(spec, source)
    where = "s = 'a/b=c' OR s = '50%' OR s = 'it''s' OR s = '日本語' OR s IS NULL OR n_int > 0"
    over_source = f"SELECT * FROM read_parquet('{tmp_path}/src/*.parquet') WHERE {where}"
    expected = duckdb.sql(over_source).to_arrow_table()
    reader = PartitionedDatasetReader(spec, "trips")
    try:
        read = reader.read(where).select(source.column_names)
    finally:
        reader.close()
    assert read.num_rows == expected.num_rows > 0
    assert multiset_difference(read, expected.cast(source.schema)) == ([], [])


@pytest.mark.spark
def test_a_scan_task_writer_losing_a_row_publishes_nothing(spark: Any, tmp_path: Path) -> None:
    spec, _ = write_project(tmp_path, "parquet")
    project = load_spec(spec)
    dataset = project.dataset("trips")
    plan = plan_refresh(project, dataset)
    victim = max(plan.items, key=lambda item: len(item.key_path)).key_path
    with pytest.raises(ConservationError) as raised:
        stage_refresh(
            open_handle(project, dataset),
            plan,
            spark=_three_scan_tasks(spark),
            storage=RowLosingStorage(victim),
        )
    assert list(raised.value.partitions) == [victim]
    routed, written = raised.value.partitions[victim]
    assert written is not None
    assert routed is not None
    assert written < routed, "the rows counted back from the files"
    assert open_catalog(project, dataset).latest() is None, "nothing published"
    assert not list((tmp_path / "acc" / "trips").rglob("part-*")), "the written files are removed"
    staging = tmp_path / "acc" / "_staging" / "trips"
    assert not staging.exists() or not any(staging.iterdir()), "no stage left"
