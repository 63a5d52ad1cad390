"""Accelerations on S3 (`accelerator_dir: s3://bucket/prefix`) through the real refresh DAG (`dag.test()`).

Data files, catalog and stage live on the moto server. Discovery and the stage run in one worker
directory, the partition tasks and the commit in another, and the first is deleted before the second
starts: a task that read a file another task left on its local disk would fail. Reads then go through
the hook to S3 and must return the source's rows exactly (hostile values: NULL and empty partition
values, unicode, `/`, `=`, `%`, quotes).
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from airflow_e2e.metadata_db import in_process_metadata_db
from airflow_e2e.sample import install_example_dag
from fault_proxy import Fault

from airflow_partitions.exceptions import SpecValidationError
from airflow_partitions.spec import load_spec
from airflow_partitions.spec.loader import SCRATCH_DIR_ENV
from tests.writes_support import Oracle, assert_same_rows, hostile_rows

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.s3, pytest.mark.postgres]

CONN_ID = "accel_s3"
FIRST_WORKER_TASKS = ("discover", "stage")
WORKERS_ENV = "AP_TEST_WORKERS"
FEW_REGIONS: list[str | None] = [None, "a/b", "k=v%"]


@dataclass
class Site:
    """One deployment: the spec, the source, the bucket, the two worker directories and the DAGs."""

    spec_path: Path
    source: pa.Table
    source_file: Path
    few: pa.Table
    bucket: str
    s3: dict[str, str]
    workers: tuple[Path, Path]
    log: Path
    dags: dict[str, Any]

    @property
    def started(self) -> list[str]:
        return self.log.read_text(encoding="utf-8").split()

    def objects(self, prefix: str) -> list[str]:
        import boto3

        client = boto3.client("s3", **self.s3)
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]


# The test's DAG file: the refresh DAG staged and stage-less, every task on the worker the test assigns.
# `on_execute_callback` runs in the task before `execute`: it points the task's scratch at its worker's
# directory and deletes the first worker's directory when the first task of the second one starts.
DAG_FILE = """
import os
import shutil
from pathlib import Path

from airflow_partitions.dag_factory import build_refresh_dag
from airflow_partitions.spec import load_spec

SPEC = Path(__file__).with_name("datasets.yaml")


def on_worker(context):
    first, second, log = os.environ["AP_TEST_WORKERS"].split(os.pathsep)
    task_id = context["ti"].task_id
    with open(log, "a", encoding="utf-8") as handle:
        handle.write(task_id + "\\n")
    if task_id in ("discover", "stage"):
        os.environ["AIRFLOW_PARTITIONS_SCRATCH_DIR"] = first
    else:
        shutil.rmtree(first, ignore_errors=True)
        os.environ["AIRFLOW_PARTITIONS_SCRATCH_DIR"] = second


project = load_spec(SPEC)
for dag_id, dataset, stage, spark_conn_id in (
    ("refresh_items_s3", "items", True, None),
    ("refresh_few_s3_each", "few", False, None),
    ("refresh_items_s3_submit", "items", True, "spark_submit_local"),
):
    globals()[dag_id] = build_refresh_dag(
        project,
        dataset,
        aws_conn_id="accel_s3",
        spark_conn_id=spark_conn_id,
        stage=stage,
        dag_id=dag_id,
        default_args={"on_execute_callback": on_worker},
    )
"""
SUBMIT_CONN_ID = "spark_submit_local"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, s3_server: dict[str, str]) -> Iterator[Site]:
    import boto3

    root = tmp_path_factory.mktemp("s3accel")
    bucket = "ap-s3-accel"
    boto3.client("s3", **s3_server).create_bucket(Bucket=bucket)
    source = hostile_rows(41, range(1, 401))
    source_file = root / "src" / "items" / "items.parquet"
    source_file.parent.mkdir(parents=True)
    pq.write_table(source, source_file)
    # Few partitions for the stage-less DAG, whose every partition task runs its own Spark job.
    few = hostile_rows(42, range(1, 121), regions=FEW_REGIONS)
    few_file = root / "src" / "few" / "few.parquet"
    few_file.parent.mkdir(parents=True)
    pq.write_table(few, few_file)
    spec_path = install_example_dag(
        root / "dags",
        f"accelerator_dir: s3://{bucket}/accel\n"
        "datasets:\n"
        "  - name: items\n"
        f"    from: file:{source_file.parent}/\n"
        "    params: {file_format: parquet}\n"
        "    acceleration:\n"
        "      engine: parquet\n"
        "      partition_by:\n"
        "        - region: region\n"
        "  - name: few\n"
        f"    from: file:{few_file.parent}/\n"
        "    params: {file_format: parquet}\n"
        "    acceleration:\n"
        "      engine: arrow\n"
        "      partition_by:\n"
        "        - region: region\n",
    )
    (root / "dags" / "refresh_items_s3.py").write_text(DAG_FILE, encoding="utf-8")
    names = (
        f"AIRFLOW_CONN_{CONN_ID.upper()}",
        f"AIRFLOW_CONN_{SUBMIT_CONN_ID.upper()}",
        "AWS_ENDPOINT_URL",
        SCRATCH_DIR_ENV,
        WORKERS_ENV,
    )
    saved = {k: os.environ.get(k) for k in names}
    os.environ["AWS_ENDPOINT_URL"] = s3_server["endpoint_url"]  # the checks below read without a connection
    workers = (root / "worker-a", root / "worker-b")
    log = root / "started.txt"
    os.environ[WORKERS_ENV] = os.pathsep.join(str(p) for p in (*workers, log))
    try:
        with in_process_metadata_db(str(root / "dags")):
            from airflow.dag_processing.dagbag import DagBag

            bag = DagBag(dag_folder=str(root / "dags"))
            assert bag.import_errors == {}, bag.import_errors
            yield Site(spec_path, source, source_file, few, bucket, s3_server, workers, log, bag.dags)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def use_connection(settings: dict[str, str]) -> None:
    os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = json.dumps(
        {
            "conn_type": "aws",
            "login": settings["aws_access_key_id"],
            "password": settings["aws_secret_access_key"],
            "extra": {"endpoint_url": settings["endpoint_url"], "region_name": settings["region_name"]},
        }
    )


def run_dag(site: Site, dag_id: str) -> Any:
    from airflow_partitions.operators.run_conf import RefreshRunConf

    for worker in site.workers:
        worker.mkdir(exist_ok=True)
    site.log.write_text("", encoding="utf-8")
    return site.dags[dag_id].test(run_conf={**RefreshRunConf().to_conf(), "full_refresh": True})


def read_through_hook(site: Site, where: Any = None, dataset: str = "items") -> pa.Table:
    from airflow_partitions.hooks.partitioned_dataset import PartitionedDatasetHook

    hook = PartitionedDatasetHook(
        dataset=dataset, spec_path=str(site.spec_path), aws_conn_id=CONN_ID, cache_dir=str(site.workers[1])
    )
    try:
        return hook.read(where) if where is not None else hook.read()
    finally:
        hook.close()


def states(run: Any) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for ti in run.get_task_instances():
        found.setdefault(ti.task_id, []).append(str(ti.state))
    return found


def test_accelerator_dir_on_s3_is_validated(tmp_path: Path) -> None:
    spec = tmp_path / "datasets.yaml"
    body = "datasets:\n  - name: t\n    from: file:/tmp/x/\n    acceleration: {partition_by: [a]}\n"
    for url, said in [
        ("s3://Bad_Bucket/x", "bucket name 'Bad_Bucket'"),
        ("s3a://bucket/x", "s3a:// and s3n:// are Hadoop spellings"),
        ("s3://bucket/a//b", "empty, '.' or '..' segment"),
    ]:
        spec.write_text(f"accelerator_dir: {url}\n{body}")
        with pytest.raises(SpecValidationError, match="line 1") as raised:
            load_spec(spec)
        assert said in str(raised.value)
    spec.write_text(f"accelerator_dir: s3://bucket/acc/\nlocal_scratch_dir: scratch\n{body}")
    project = load_spec(spec)
    assert (project.accelerator_url, project.accelerator_dir) == ("s3://bucket/acc", tmp_path / "scratch")
    tables = body.replace(
        "{partition_by: [a]}", "{engine: duckdb, partition_by: [a], params: {partition_mode: tables}}"
    )
    spec.write_text(f"accelerator_dir: s3://bucket/acc\n{tables}")
    with pytest.raises(
        SpecValidationError, match="partition_mode tables keeps every partition in one shared"
    ):
        load_spec(spec)
    spec.write_text(f"accelerator_dir: acc\nlocal_scratch_dir: scratch\n{body}")
    with pytest.raises(SpecValidationError, match="local_scratch_dir applies only"):
        load_spec(spec)


def test_staged_dag_on_two_workers_reads_back_the_source(site: Site, spark: Any) -> None:
    del spark  # the session the tasks' in-process Spark hook reuses
    use_connection(site.s3)
    run = run_dag(site, "refresh_items_s3")
    assert str(run.state) == "success", states(run)
    assert site.started[:2] == list(FIRST_WORKER_TASKS)
    assert "commit" in site.started
    assert not site.workers[0].exists(), "the partition tasks ran after the first worker's disk was gone"
    data = [k for k in site.objects("accel/items/") if "/_catalog" not in k]
    assert data
    assert all(k.rsplit("/", 1)[-1].startswith("part-") for k in data), data
    assert site.objects("accel/items/_catalog/"), "the catalog lives next to the data on S3"
    assert site.objects("accel/_staging/") == [], "the commit removed the stage from S3"
    assert_same_rows(read_through_hook(site), site.source, "full read through the hook")

    import duckdb

    where = "region IN ('a/b', 'k=v', '100%', '日本') OR region IS NULL"
    expected = duckdb.sql(f"SELECT * FROM read_parquet('{site.source_file}') WHERE {where}").to_arrow_table()
    assert expected.num_rows > 0
    assert_same_rows(read_through_hook(site, where), expected.cast(site.source.schema), "filtered read")


def test_spark_submit_executors_write_the_files_to_s3_and_tasks_read_no_data(site: Site) -> None:
    """The same DAG through spark-submit (a `spark` connection, its own driver process): the job gets the
    S3 settings in its environment, its executors upload the partition files, and no Airflow task
    process (all of them run here, under the guard) opens partition or stage data."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from support_no_reads import no_data_reads

    use_connection(site.s3)
    submit = {"conn_type": "spark", "host": "local[2]"}
    os.environ[f"AIRFLOW_CONN_{SUBMIT_CONN_ID.upper()}"] = json.dumps(submit)
    with no_data_reads(list(site.workers)) as guard:
        run = run_dag(site, "refresh_items_s3_submit")
    guard.check()
    assert str(run.state) == "success", states(run)
    with create_session() as session:
        found = session.scalars(
            XComModel.get_many(
                key="return_value", run_id=run.run_id, dag_ids="refresh_items_s3_submit", task_ids="stage"
            )
        ).first()
        assert found is not None
        stage = XComModel.deserialize_value(found)
    assert stage["mode"] == "written", "the submitted job's executors wrote the partition files"
    assert stage["location"].startswith(f"s3://{site.bucket}/accel/_staging/"), stage["location"]
    assert site.objects("accel/_staging/") == [], "the commit removed the stage from S3"
    assert_same_rows(read_through_hook(site), site.source, "full read after the spark-submit refresh")
    import duckdb

    where = "region IN ('a/b', 'k=v', '100%', '日本') OR region IS NULL"
    expected = duckdb.sql(f"SELECT * FROM read_parquet('{site.source_file}') WHERE {where}").to_arrow_table()
    assert expected.num_rows > 0
    assert_same_rows(read_through_hook(site, where), expected.cast(site.source.schema), "filtered read")


def test_failed_upload_publishes_nothing_and_a_rerun_completes(
    site: Site, spark: Any, s3_fault_proxy: Any
) -> None:
    """Stage-less DAG (arrow IPC files): every partition task stages its own partition; the upload of
    one partition's file fails (more HTTP 500s than the client retries), so the run commits nothing."""
    from airflow_partitions.refresh.commit import open_dataset_catalog

    project = load_spec(site.spec_path)
    use_connection(s3_fault_proxy.through(site.s3))
    s3_fault_proxy.inject_next(Fault.ERROR_500, method="PUT", path_contains="b/part-", times=10)
    failed = run_dag(site, "refresh_few_s3_each")
    assert str(failed.state) == "failed", states(failed)
    assert s3_fault_proxy.injected[Fault.ERROR_500] >= 5
    assert "success" not in states(failed)["commit"]
    assert site.objects("accel/few/_catalog/") == [], "a failed run commits nothing"
    s3_fault_proxy.clear()
    rerun = run_dag(site, "refresh_few_s3_each")
    assert str(rerun.state) == "success", states(rerun)
    assert_same_rows(read_through_hook(site, dataset="few"), site.few, "read after the rerun")
    first = {k for k in site.objects("accel/few/") if "/_catalog" not in k}
    assert all(k.endswith(".arrow") for k in first), first

    # A second full refresh of the same rows: the first version's files are no longer referenced.
    assert str(run_dag(site, "refresh_few_s3_each").state) == "success"
    catalog = open_dataset_catalog(project, project.dataset("few"))
    referenced = {f"accel/few/{f.path}" for e in catalog.snapshot().partitions.values() for f in e.files}
    data = {k for k in site.objects("accel/few/") if "/_catalog" not in k}
    assert first <= data
    assert referenced == data - first
    report = catalog.vacuum(retain_versions=1, now=dt.datetime.now(dt.UTC) + dt.timedelta(hours=2))
    assert {f"accel/few/{f.path}" for f in report.removed_files} == first
    assert {k for k in site.objects("accel/few/") if "/_catalog" not in k} == referenced
    assert_same_rows(read_through_hook(site, dataset="few"), site.few, "read after vacuum")

    # Writes through the hook: written in local scratch, uploaded write-once, committed to the S3 catalog.
    from airflow_partitions.hooks.partitioned_dataset import PartitionedDatasetHook

    oracle = Oracle(site.few)
    appended = hostile_rows(43, range(500, 530), regions=[*FEW_REGIONS, "new=part%/"])
    changed = hostile_rows(44, range(1, 60, 3), regions=FEW_REGIONS)
    hook = PartitionedDatasetHook(dataset="few", spec_path=str(site.spec_path), aws_conn_id=CONN_ID)
    try:
        assert hook.append(appended).rows_added == appended.num_rows
        oracle.append(appended)
        hook.upsert(changed, keys=["id"])
        oracle.upsert(changed)
        hook.delete("region = 'k=v%' AND id < 100")
        oracle.delete(lambda row: row["region"] == "k=v%" and row["id"] < 100)
    finally:
        hook.close()
    assert_same_rows(read_through_hook(site, dataset="few"), oracle.table(), "read after the writes")
    remaining = {k for k in site.objects("accel/few/") if "/_catalog" not in k}
    catalog = open_dataset_catalog(project, project.dataset("few"))
    assert {
        f"accel/few/{f.path}" for e in catalog.snapshot().partitions.values() for f in e.files
    } <= remaining

    # The in-process refresh (`airflow-partitions refresh`) on the same S3 layout: back to the source.
    from airflow_partitions.refresh.pipeline import refresh_dataset

    refresh_dataset(load_spec(site.spec_path), "few", full=True, spark=spark)
    assert_same_rows(read_through_hook(site, dataset="few"), site.few, "read after an in-process refresh")


def test_upload_refuses_an_existing_name_and_old_remote_stages_are_swept(
    tmp_path: Path, s3_server: dict[str, str], s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_partitions.exceptions import RefreshError, StorageError
    from airflow_partitions.refresh import remote
    from airflow_partitions.storage import get_storage

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server["endpoint_url"])
    spec = tmp_path / "datasets.yaml"
    spec.write_text(
        f"accelerator_dir: s3://{s3_bucket}/acc\nlocal_scratch_dir: scratch\n"
        "datasets:\n  - name: t\n    from: file:/tmp/x/\n    acceleration: {partition_by: [a]}\n"
    )
    project = load_spec(spec)
    dataset = project.dataset("t")
    root = tmp_path / "local"
    files = get_storage(dataset.acceleration).write(pa.table({"a": [1, None]}), root, "a=1")
    store = remote.data_store(project, dataset)
    remote.upload_partition_files(store, root, files)
    assert store.get(files[0].path) == (root / files[0].path).read_bytes()
    with pytest.raises(StorageError, match="already exists"):
        remote.upload_partition_files(store, root, files)

    stage = tmp_path / "stage"
    (stage / "data" / "__ap_item=0").mkdir(parents=True)
    (stage / "data" / "__ap_item=0" / "part-0.parquet").write_bytes(b"rows")
    (stage / "data" / "__ap_item=0" / "_SUCCESS").write_bytes(b"")
    (stage / "_stage.json").write_text("{}")
    url = remote.stage_url(project, dataset, "old")
    remote.upload_stage(stage, url)
    assert not stage.exists()
    fetched = remote.fetch_stage(url, 0, tmp_path / "fetched")
    assert sorted(p.relative_to(fetched).as_posix() for p in fetched.rglob("*") if p.is_file()) == [
        "_stage.json",
        "data/__ap_item=0/part-0.parquet",
    ]
    assert remote.sweep_remote_stages(project, dataset, grace=dt.timedelta(hours=1)) == []
    assert remote.sweep_remote_stages(project, dataset, grace=dt.timedelta(0)) == [url]
    assert list(store.list("")) != []  # partition files are not stages
    with pytest.raises(RefreshError, match="no finished stage"):
        remote.fetch_stage(url, 0, tmp_path / "again")

    from dataclasses import replace

    from airflow_partitions.refresh.stage import staging_root

    assert staging_root(project, dataset) == tmp_path / "scratch" / "_staging" / "t"
    on_s3a = replace(dataset, acceleration=replace(dataset.acceleration, params={"staging_dir": "s3a://b/s"}))
    with pytest.raises(RefreshError, match="is a URL; give a directory path"):
        staging_root(project, on_s3a)


def test_vacuum_sweeps_stages_left_on_s3(
    tmp_path: Path, s3_server: dict[str, str], s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stage a killed run left on S3 is reported by a dry run, kept within the grace period, and
    deleted by vacuum after it; partition files beside it are not stages and stay."""
    from airflow_partitions.refresh import remote
    from airflow_partitions.refresh.leftovers import sweep_dataset_staging

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server["endpoint_url"])
    spec = tmp_path / "datasets.yaml"
    spec.write_text(
        f"accelerator_dir: s3://{s3_bucket}/vac\nlocal_scratch_dir: scratch\n"
        "datasets:\n  - name: t\n    from: file:/tmp/x/\n    acceleration: {partition_by: [a]}\n"
    )
    project = load_spec(spec)
    dataset = project.dataset("t")
    stage = tmp_path / "stage"
    (stage / "data" / "__ap_item=0").mkdir(parents=True)
    (stage / "data" / "__ap_item=0" / "part-0.parquet").write_bytes(b"rows" * 10)
    (stage / "_stage.json").write_text("{}")
    url = remote.stage_url(project, dataset, "killed-run")
    remote.upload_stage(stage, url)

    young = sweep_dataset_staging(project, dataset, grace=dt.timedelta(hours=1))
    assert young.removed == (), "within the grace period a stage may be in use"
    assert young.kept_young == 1
    dry = sweep_dataset_staging(project, dataset, grace=dt.timedelta(0), dry_run=True)
    assert dry.removed == (url,)
    assert dry.bytes_freed == 42
    assert dry.bytes_after == 0
    assert remote.read_stage_manifest(url) is not None, "a dry run deletes nothing"
    swept = sweep_dataset_staging(project, dataset, grace=dt.timedelta(0))
    assert swept.removed == (url,)
    assert swept.root == remote.stage_url(project, dataset, "")
    assert remote.read_stage_manifest(url) is None
