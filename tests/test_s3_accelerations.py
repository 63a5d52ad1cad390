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
    events_file: Path
    pg_url: str
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
    ("refresh_events_s3", "events", True, None),
    ("refresh_accounts_s3", "accounts", True, None),
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
def site(
    tmp_path_factory: pytest.TempPathFactory, s3_server: dict[str, str], pg_module_database: str
) -> Iterator[Site]:
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
    events_file = root / "src" / "events" / "events-1.parquet"
    events_file.parent.mkdir(parents=True)
    pq.write_table(hostile_rows(45, range(1, 201), regions=FEW_REGIONS), events_file)
    create_accounts(pg_module_database)
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
        "        - region: region\n"
        "  - name: events\n"
        f"    from: file:{events_file.parent}/\n"
        "    params: {file_format: parquet}\n"
        "    acceleration:\n"
        "      refresh_mode: append\n"
        # The executors' own watermark filter is under test: late rows are reported, not rewritten.
        "      refresh: {watermark_column: id, late_rows: report}\n"
        "      partition_by:\n"
        "        - region: region\n"
        "  - name: accounts\n"
        "    from: postgres:public.accounts\n"
        f"    params: {{url: '{pg_module_database}', pushdown: always}}\n"
        "    acceleration:\n"
        "      refresh_mode: changes\n"
        "      primary_key: [id]\n"
        "      refresh: {watermark_column: updated_at}\n"
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
            yield Site(
                spec_path,
                source,
                source_file,
                few,
                events_file,
                pg_module_database,
                bucket,
                s3_server,
                workers,
                log,
                bag.dags,
            )
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


ACCOUNTS_START = dt.datetime(2026, 5, 1, 8, tzinfo=dt.UTC)


def create_accounts(url: str) -> None:
    """A Postgres table of hostile rows (NULL and unicode regions, `/ = %` and quotes, NULL amounts)
    with an `updated_at` that each change moves forward."""
    import psycopg

    rows = hostile_rows(48, range(1, 121), regions=FEW_REGIONS)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE public.accounts (id bigint PRIMARY KEY, region text, amount numeric(12, 2), "
            "note text, updated_at timestamptz NOT NULL)"
        )
        conn.execute("CREATE INDEX accounts_updated ON public.accounts (updated_at)")
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO public.accounts VALUES (%s, %s, %s, %s, %s)",
                [
                    (
                        r["id"],
                        r["region"],
                        r["amount"],
                        r["note"],
                        ACCOUNTS_START + dt.timedelta(minutes=r["id"]),
                    )
                    for r in rows.to_pylist()
                ],
            )


ACCOUNTS_SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("region", pa.string()),
        ("amount", pa.decimal128(12, 2)),
        ("note", pa.string()),
        ("updated_at", pa.timestamp("us", "UTC")),
    ]
)


def assert_accounts_match_postgres(site: Site, what: str) -> None:
    """A full read through the hook = what Postgres holds (read with psycopg, not the package's own
    reader), row hash for row hash, with the Postgres types mapped to Arrow; a filtered read = DuckDB's
    answer over those rows."""
    import duckdb
    import psycopg
    from matrix_support import multiset_difference

    with psycopg.connect(site.pg_url) as conn:
        cur = conn.execute("SELECT id, region, amount, note, updated_at FROM public.accounts")
        names = [column.name for column in cur.description or ()]
        rows = [dict(zip(names, values, strict=True)) for values in cur.fetchall()]
    expected = pa.Table.from_pylist(rows, schema=ACCOUNTS_SCHEMA)
    read = read_through_hook(site, dataset="accounts")
    assert read.schema.equals(ACCOUNTS_SCHEMA), f"{what}: types changed: {read.schema}"
    missing, extra = multiset_difference(read, expected)
    assert (missing[:3], extra[:3]) == ([], []), f"{what}: rows missing / extra"
    where = "region = 'k=v%' OR region IS NULL OR amount IS NULL"
    oracle = duckdb.sql(f"SELECT * FROM expected WHERE {where}").to_arrow_table()
    assert oracle.num_rows > 0
    missing, extra = multiset_difference(read_through_hook(site, where, dataset="accounts"), oracle)
    assert (missing[:3], extra[:3]) == ([], []), f"{what}: filtered read ({where}) missing / extra"


def use_connection(settings: dict[str, str]) -> None:
    os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = json.dumps(
        {
            "conn_type": "aws",
            "login": settings["aws_access_key_id"],
            "password": settings["aws_secret_access_key"],
            "extra": {"endpoint_url": settings["endpoint_url"], "region_name": settings["region_name"]},
        }
    )


def run_dag(site: Site, dag_id: str, *, full: bool = True) -> Any:
    from airflow_partitions.operators.run_conf import RefreshRunConf

    for worker in site.workers:
        worker.mkdir(exist_ok=True)
    site.log.write_text("", encoding="utf-8")
    return site.dags[dag_id].test(run_conf={**RefreshRunConf().to_conf(), "full_refresh": full})


def stage_xcom(run: Any, dag_id: str) -> dict[str, Any]:
    """What the run's stage task returned (mode, location)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        found = session.scalars(
            XComModel.get_many(key="return_value", run_id=run.run_id, dag_ids=dag_id, task_ids="stage")
        ).first()
        assert found is not None
        stage: dict[str, Any] = XComModel.deserialize_value(found)
    return stage


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
    from support_no_reads import no_data_reads

    use_connection(site.s3)
    submit = {"conn_type": "spark", "host": "local[2]"}
    os.environ[f"AIRFLOW_CONN_{SUBMIT_CONN_ID.upper()}"] = json.dumps(submit)
    with no_data_reads(list(site.workers)) as guard:
        run = run_dag(site, "refresh_items_s3_submit")
    guard.check()
    assert str(run.state) == "success", states(run)
    stage = stage_xcom(run, "refresh_items_s3_submit")
    assert stage["mode"] == "written", "the submitted job's executors wrote the partition files"
    assert stage["location"].startswith(f"s3://{site.bucket}/accel/_staging/"), stage["location"]
    assert site.objects("accel/_staging/") == [], "the commit removed the stage from S3"
    assert_same_rows(read_through_hook(site), site.source, "full read after the spark-submit refresh")
    import duckdb

    where = "region IN ('a/b', 'k=v', '100%', '日本') OR region IS NULL"
    expected = duckdb.sql(f"SELECT * FROM read_parquet('{site.source_file}') WHERE {where}").to_arrow_table()
    assert expected.num_rows > 0
    assert_same_rows(read_through_hook(site, where), expected.cast(site.source.schema), "filtered read")


def test_an_append_on_s3_uploads_only_new_files_from_the_executors(site: Site, spark: Any) -> None:
    """refresh_mode append on an `s3://` accelerator_dir: the executors upload the rows past each
    partition's watermark as new objects, the committed objects stay, no task process reads partition
    data, and a read through the hook equals the source without the late rows (at or below a watermark:
    under `late_rows: report` an append reports them and does not read them)."""
    from support_no_reads import no_data_reads

    del spark  # the session the tasks' in-process Spark hook reuses
    use_connection(site.s3)
    first = pq.read_table(site.events_file)
    run = run_dag(site, "refresh_events_s3")
    assert str(run.state) == "success", states(run)
    committed = set(site.objects("accel/events/"))
    new = hostile_rows(46, range(1001, 1041), regions=[*FEW_REGIONS, "new/é=%"])
    late = hostile_rows(47, range(-3, 0), regions=FEW_REGIONS)  # ids below every watermark
    pq.write_table(new, site.events_file.with_name("events-2.parquet"))
    pq.write_table(late, site.events_file.with_name("events-late.parquet"))
    with no_data_reads(list(site.workers)) as guard:
        run = run_dag(site, "refresh_events_s3", full=False)
    guard.check()
    assert str(run.state) == "success", states(run)
    assert stage_xcom(run, "refresh_events_s3")["mode"] == "written"
    assert committed < set(site.objects("accel/events/")), "committed objects stay, new ones join them"
    expected = pa.concat_tables([first, new])
    assert_same_rows(read_through_hook(site, dataset="events"), expected, "full read after the append")
    where = "region = 'new/é=%' OR region IS NULL"
    import duckdb

    oracle = duckdb.sql(f"SELECT * FROM expected WHERE {where}").to_arrow_table()
    assert oracle.num_rows > 0
    assert_same_rows(
        read_through_hook(site, where, dataset="events"), oracle, "filtered read after the append"
    )


def test_changes_on_s3_are_merged_by_the_executors(site: Site, spark: Any) -> None:
    """refresh_mode changes on an `s3://` accelerator_dir through the DAG: the executors fetch each
    changed partition's committed objects, merge the changed rows (a row moving between partitions, a
    new NULL-region row, an update in place) and upload the new objects; no task process reads
    partition data, untouched partitions keep their objects, and the hook reads what Postgres holds."""
    import psycopg
    from support_no_reads import no_data_reads

    del spark  # the session the tasks' in-process Spark hook reuses
    use_connection(site.s3)
    run = run_dag(site, "refresh_accounts_s3")
    assert str(run.state) == "success", states(run)
    assert_accounts_match_postgres(site, "after the full refresh")
    before = set(site.objects("accel/accounts/"))
    later = ACCOUNTS_START + dt.timedelta(days=1)
    with psycopg.connect(site.pg_url, autocommit=True) as conn:
        moving = conn.execute("SELECT id FROM public.accounts WHERE region = 'a/b' LIMIT 1").fetchone()
        assert moving is not None
        conn.execute(
            "UPDATE public.accounts SET region = 'k=v%%', updated_at = %s WHERE id = %s", (later, moving[0])
        )
        conn.execute(
            "UPDATE public.accounts SET amount = NULL, note = 'it''s \"new\"', updated_at = %s "
            "WHERE region = 'k=v%%' AND id <> %s AND id = (SELECT min(id) FROM public.accounts "
            "WHERE region = 'k=v%%')",
            (later, moving[0]),
        )
        conn.execute("INSERT INTO public.accounts VALUES (999, NULL, -0.01, '', %s)", (later,))
    with no_data_reads(list(site.workers)) as guard:
        run = run_dag(site, "refresh_accounts_s3", full=False)
    guard.check()
    assert str(run.state) == "success", states(run)
    assert stage_xcom(run, "refresh_accounts_s3")["mode"] == "written", "the executors merged"
    after = set(site.objects("accel/accounts/"))
    assert before - after == set(), "no object is deleted by a commit (vacuum removes old ones)"
    assert len(after - before) > 1, "new objects for the changed partitions and the catalog"
    assert_accounts_match_postgres(site, "after the changes refresh")


def test_changes_on_s3_are_merged_by_the_cli_refresh_without_spark(
    site: Site, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a Spark session (`airflow-partitions refresh`), the refresh process merges each changed
    partition itself: it fetches the committed objects, merges, uploads; a full read = Postgres. (Before,
    it looked for the committed files on its local scratch and failed every partition.)"""
    import psycopg

    from airflow_partitions.cli.main import main

    use_connection(site.s3)  # for the hook's reads below
    for name, key in (
        ("AWS_ACCESS_KEY_ID", "aws_access_key_id"),
        ("AWS_SECRET_ACCESS_KEY", "aws_secret_access_key"),
    ):
        monkeypatch.setenv(name, site.s3[key])
    monkeypatch.setenv("AWS_DEFAULT_REGION", site.s3["region_name"])
    monkeypatch.setenv(SCRATCH_DIR_ENV, str(site.workers[1] / "cli"))
    spec = str(site.spec_path)
    assert main(["refresh", spec, "accounts", "--json"]) == 0  # a full one first, if none is committed
    later = ACCOUNTS_START + dt.timedelta(days=2)
    with psycopg.connect(site.pg_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE public.accounts SET region = 'a/b', updated_at = %s "
            "WHERE id = (SELECT min(id) FROM public.accounts WHERE region IS NULL)",
            (later,),
        )
        conn.execute("INSERT INTO public.accounts VALUES (1001, 'é/中', 12.5, 'x=y%%', %s)", (later,))
    capsys.readouterr()
    assert main(["refresh", spec, "accounts", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["refresh_mode"] == "changes"
    assert summary["stage_mode"] == "changes", "merged by this process: no Spark session"
    assert summary["changed_rows"] >= 2, "the two changed rows (and rows at the watermark, read again)"
    assert_accounts_match_postgres(site, "after the CLI changes refresh")


def test_failed_upload_publishes_nothing_and_a_rerun_completes(
    site: Site, spark: Any, s3_fault_proxy: Any
) -> None:
    """Stage-less DAG (arrow IPC files): every partition task stages its own partition; the upload of
    one partition's file fails (more HTTP 500s than the client retries), so the run commits nothing."""
    from airflow_partitions.table import open_handle

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
    catalog = open_handle(project, project.dataset("few")).catalog
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
    catalog = open_handle(project, project.dataset("few")).catalog
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
    from airflow_partitions.refresh.stage_layout import remove_stage
    from airflow_partitions.storage import get_storage
    from airflow_partitions.table import open_handle

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
    store = open_handle(project, dataset).data_store
    remote.upload_partition_files(store, root, files)
    assert store.get(files[0].path) == (root / files[0].path).read_bytes()
    with pytest.raises(StorageError, match="already exists"):
        remote.upload_partition_files(store, root, files)

    stage = tmp_path / "stage"
    (stage / "data" / "__ap_item=0").mkdir(parents=True)
    (stage / "data" / "__ap_item=0" / "part-0.parquet").write_bytes(b"rows")
    (stage / "data" / "__ap_item=0" / "_SUCCESS").write_bytes(b"")
    (stage / "_stage.json").write_text("{}")
    url = open_handle(project, dataset).stage_location("old")
    remote.upload_stage(stage, url)
    assert not stage.exists()
    fetched = remote.fetch_stage(url, 0, tmp_path / "fetched")
    assert sorted(p.relative_to(fetched).as_posix() for p in fetched.rglob("*") if p.is_file()) == [
        "_stage.json",
        "data/__ap_item=0/part-0.parquet",
    ]
    changes = tmp_path / "changes-stage"
    changes.mkdir()
    pq.write_table(pa.table({"a": [1, None]}), changes / "changes.parquet")
    (changes / "_stage.json").write_text('{"mode": "changes"}')
    changes_url = open_handle(project, dataset).stage_location("changes")
    remote.upload_stage(changes, changes_url)
    fetched = remote.fetch_stage(changes_url, None, tmp_path / "fetched-changes")
    assert pq.read_table(fetched / "changes.parquet").column("a").to_pylist() == [1, None], (
        "a changes stage's changed rows come with its manifest: every partition task merges them"
    )
    remove_stage(changes_url)
    assert remote.sweep_remote_stages(open_handle(project, dataset), grace=dt.timedelta(hours=1)) == []
    assert remote.sweep_remote_stages(open_handle(project, dataset), grace=dt.timedelta(0)) == [url]
    assert list(store.list("")) != []  # partition files are not stages
    with pytest.raises(RefreshError, match="no finished stage"):
        remote.fetch_stage(url, 0, tmp_path / "again")

    from dataclasses import replace

    from airflow_partitions.refresh.stage_layout import staging_root

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
    from airflow_partitions.table import open_handle

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
    url = open_handle(project, dataset).stage_location("killed-run")
    remote.upload_stage(stage, url)

    young = sweep_dataset_staging(open_handle(project, dataset), grace=dt.timedelta(hours=1))
    assert young.removed == (), "within the grace period a stage may be in use"
    assert young.kept_young == 1
    dry = sweep_dataset_staging(open_handle(project, dataset), grace=dt.timedelta(0), dry_run=True)
    assert dry.removed == (url,)
    assert dry.bytes_freed == 42
    assert dry.bytes_after == 0
    assert remote.read_stage_manifest(url) is not None, "a dry run deletes nothing"
    swept = sweep_dataset_staging(open_handle(project, dataset), grace=dt.timedelta(0))
    assert swept.removed == (url,)
    assert swept.root == open_handle(project, dataset).stage_location("")
    assert remote.read_stage_manifest(url) is None
