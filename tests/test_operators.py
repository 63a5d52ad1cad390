"""Each operator run on its own: `execute()` with a task context, on real Spark, S3 (moto) and files.

The discovery operator pushes XCom, so it runs in a one-task DAG through `dag.test()`; the others take
their inputs as arguments and are called directly with a context holding the run's params and outlet
events. Spark runs in-process, and through spark-submit on a `spark` connection with master `local[2]`.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow_e2e.metadata_db import MetadataDatabase, in_process_metadata_db
from airflow_e2e.sample import append_sales, sample_spec, write_sales

from airflow_partitions.exceptions import DiscoveryError, OrchestrationError, RefreshError

pytestmark = [pytest.mark.airflow, pytest.mark.spark]


def context(**params: Any) -> dict[str, Any]:
    """What these operators read from a task context: the run's params and the outlet event accessors."""
    from airflow.sdk.execution_time.context import OutletEventAccessors

    return {"params": params, "outlet_events": OutletEventAccessors()}


def make_spec(root: Path, *, snapshot_location: str | None = None, rows: int = 90, days: int = 2) -> Path:
    """Sales in 3 regions x `days` days (6 partitions by default), and their spec."""
    write_sales(root / "sales", rows=rows, days=days)
    spec = root / "spec.yaml"
    spec.write_text(
        sample_spec(
            accelerator_dir=root / "acc", sales_dir=root / "sales", snapshot_location=snapshot_location
        )
    )
    return spec


def discovered(spec: Path, **options: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """What a discovery task hands on: the plan without items (XCom `plan`) and the work items."""
    from airflow_partitions.refresh import plan_refresh

    plan = plan_refresh(str(spec), "sales", **options)
    return plan.without_items().to_json(), plan.items_json()


@dataclass
class Refreshed:
    plan: dict[str, Any]
    items: list[dict[str, Any]]
    stage: dict[str, Any] | None
    results: list[dict[str, Any]] | None


def stage_and_refresh(spec: Path, **discover_options: Any) -> Refreshed:
    """Stage once and refresh every planned partition with the operators (in-process Spark)."""
    from airflow_partitions.operators import SparkPartitionRefreshOperator, SparkStageOperator

    plan, items = discovered(spec, **discover_options)
    stage = SparkStageOperator(
        task_id="stage", spec_path=spec, dataset="sales", plan=plan, work_items=items
    ).execute(context())
    results = [
        SparkPartitionRefreshOperator(
            task_id="refresh", spec_path=spec, dataset="sales", work_item=item, stage=stage
        ).execute(context())
        for item in items
    ]
    return Refreshed(plan, items, stage, results)


def commit(spec: Path, refreshed: Refreshed, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    from airflow_partitions.operators import PartitionCommitOperator

    operator = PartitionCommitOperator(
        task_id="commit",
        spec_path=spec,
        dataset="sales",
        plan=refreshed.plan,
        work_items=refreshed.items,
        results=refreshed.results,
        stage=refreshed.stage,
        **kwargs,
    )
    ctx = context()
    return operator.execute(ctx), ctx


def latest(spec: Path) -> Any:
    from airflow_partitions.spec import load_spec
    from airflow_partitions.table import open_handle

    project = load_spec(spec)
    return open_handle(project, project.dataset("sales")).catalog.latest()


# --- discovery ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dags_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, MetadataDatabase]]:
    dags = tmp_path_factory.mktemp("operator_dags")
    with in_process_metadata_db(str(dags)) as database:
        yield dags, database


def test_discovery_returns_work_items_and_pushes_the_plan(
    tmp_path: Path, dags_folder: tuple[Path, MetadataDatabase]
) -> None:
    from airflow.dag_processing.dagbag import DagBag

    dags, database = dags_folder
    spec = make_spec(tmp_path)
    (dags / "discover_only.py").write_text(
        textwrap.dedent(
            f"""\
            from airflow.sdk import DAG
            from airflow_partitions.dag_factory import run_params
            from airflow_partitions.operators import PartitionDiscoveryOperator

            with DAG("discover_only", schedule=None, params=run_params()):
                PartitionDiscoveryOperator(
                    task_id="discover", spec_path={str(spec)!r}, dataset="sales", where="region = 'EU'"
                )
            """
        )
    )
    dag = DagBag(dag_folder=str(dags)).dags["discover_only"]
    # The run asks for US, but the operator's explicit `where` wins; full_refresh comes from the run.
    run = dag.test(
        run_conf={"partitions": None, "where": "region = 'US'", "full_refresh": True, "snapshot": True}
    )
    assert str(run.state) == "success"
    with database.connect() as conn:
        rows = dict(
            conn.execute(
                "SELECT key, value FROM xcom WHERE run_id = %s AND task_id = 'discover'", (run.run_id,)
            ).fetchall()
        )
    items = rows["return_value"]
    assert sorted(item["key_path"] for item in items) == [
        "region=EU/day=2026-01-01T00%3A00%3A00",
        "region=EU/day=2026-01-02T00%3A00%3A00",
    ], "explicit where= wins over the run's params"
    assert {item["reason"] for item in items} == {"new"}
    plan = rows["plan"]
    assert plan["items"] == []
    assert plan["dataset"] == "sales"
    assert plan["discovered"] == 6
    assert plan["base_version"] is None


def _discover_in_run(spec: Path, **ctx: Any) -> list[dict[str, Any]]:
    """The work items a discovery task returns in a run whose context holds `ctx` (run's partition_key)."""
    from airflow_partitions.operators import PartitionDiscoveryOperator

    pushed: dict[str, Any] = {}
    task_context = {
        **context(),
        "ti": SimpleNamespace(xcom_push=lambda key, value: pushed.update({key: value})),
    }
    task_context.update(ctx)
    items = PartitionDiscoveryOperator(task_id="discover", spec_path=spec, dataset="sales").execute(
        task_context  # type: ignore[arg-type]
    )
    assert pushed["plan"]["dataset"] == "sales"
    return items


def test_a_run_with_a_partition_key_refreshes_exactly_that_partition(tmp_path: Path) -> None:
    from airflow_partitions.exceptions import RunConfError

    spec = make_spec(tmp_path)
    eu_day_2 = "region=EU/day=2026-01-02T00%3A00%3A00"
    for key in ("EU|2026-01-02T00:00:00", "region=EU/day=2026-01-02T00:00:00", eu_day_2):
        items = _discover_in_run(spec, partition_key=key)
        assert [item["key_path"] for item in items] == [eu_day_2], key
    # The run's key also comes from the dag_run when the context has no `partition_key` of its own.
    items = _discover_in_run(spec, dag_run=SimpleNamespace(partition_key="US|2026-01-01T00:00:00"))
    assert [item["key_path"] for item in items] == ["region=US/day=2026-01-01T00%3A00%3A00"]
    with pytest.raises(RunConfError, match=re.escape("partition_key 'EU|2026-01-02T00:00:00' and also")):
        _discover_in_run(spec, partition_key="EU|2026-01-02T00:00:00", params={"where": "region = 'US'"})
    with pytest.raises(DiscoveryError, match=re.escape("no partition 'EU|2031")):
        _discover_in_run(spec, partition_key="EU|2031-01-01T00:00:00")


def test_a_bad_where_fails_the_task_with_its_message_alone(tmp_path: Path) -> None:
    """No retry and no chained traceback into the pruning internals: the message says what to fix."""
    from airflow.exceptions import AirflowFailException

    spec = make_spec(tmp_path)
    with pytest.raises(AirflowFailException, match=re.escape("where 'no_such_column = 1': ")) as raised:
        _discover_in_run(spec, params={"where": "no_such_column = 1"})
    assert raised.value.__cause__ is None
    assert raised.value.__suppress_context__
    assert "no_such_column" in str(raised.value).split(": ", 2)[-1]


def test_mapped_refresh_label_is_the_readable_key() -> None:
    from airflow_partitions.keys import PartitionKey
    from airflow_partitions.operators import SparkPartitionRefreshOperator

    key = PartitionKey(("Zürich/Ost", dt.datetime(2026, 1, 1)))
    item = {"key": key.to_json(), "key_path": key.path(["region", "day"]), "reason": "new", "fp": "x"}
    operator = SparkPartitionRefreshOperator(
        task_id="refresh", spec_path="unused.yaml", dataset="sales", work_item=item, stage=None
    )
    assert operator.partition_label == "region=Zürich%2FOst/day=2026-01-01T00:00:00"
    assert operator.map_index_template == "{{ task.partition_label }}"


# --- stage, refresh, commit -----------------------------------------------------------------------


def test_stage_refresh_commit_and_asset_events(tmp_path: Path) -> None:
    from airflow.sdk import Asset

    spec = make_spec(tmp_path)
    refreshed = stage_and_refresh(spec)
    assert refreshed.stage["mode"] == "written"
    assert refreshed.stage["partitions"] == 6
    assert refreshed.results is not None
    assert all(r["rows"] == 15 and r["files"] for r in refreshed.results)
    assert latest(spec) is None, "nothing is visible before the commit"

    asset = Asset(name="sales", uri=(tmp_path / "acc" / "sales").as_uri())
    result, ctx = commit(spec, refreshed, outlets=[asset])
    assert result["version"] == 1
    assert result["upserted"] == 6
    assert result["rows"] == 90
    snapshot = latest(spec)
    assert {snapshot.partitions[p].rows for p in snapshot.partitions} == {15}
    accessor = ctx["outlet_events"][asset]
    from airflow_partitions.keys import PartitionKey, composite_key

    assert accessor.partition_keys == {
        composite_key(PartitionKey.from_json(r["key"])) for r in refreshed.results
    }, "one event per partition, keyed in Airflow's composite convention"
    assert "EU|2026-01-01T00:00:00" in accessor.partition_keys
    assert accessor.extra["version"] == 1
    assert accessor.extra["partitions_refreshed"] == 6
    assert not Path(refreshed.stage["location"]).exists(), "the stage is removed once committed"

    again, _ = commit(spec, refreshed, outlets=[asset])
    assert again["version"] == 1, "a retried commit (same stage) returns the version it made"
    assert latest(spec).version == 1


def test_commit_of_a_single_partition_run_takes_the_lone_descriptor(tmp_path: Path) -> None:
    """A mapped group of one instance hands the commit its descriptor alone, not a list of one."""
    spec = make_spec(tmp_path, days=1)
    refreshed = stage_and_refresh(spec, partitions=["US|2026-01-01T00:00:00"])
    assert refreshed.results is not None
    assert len(refreshed.results) == 1
    refreshed.results = refreshed.results[0]  # type: ignore[assignment]
    result, _ = commit(spec, refreshed)
    assert result["upserted"] == 1
    assert set(latest(spec).partitions) == {"region=US/day=2026-01-01T00%3A00%3A00"}


def test_discovery_sets_the_freshness_overdue_gauge(tmp_path: Path, statsd: StatsdListener) -> None:
    """`freshness:` in the spec: discovery reports how many partitions of the newest version are past it."""
    spec = make_spec(tmp_path, days=1)
    refreshed = stage_and_refresh(spec, partitions=["US|2026-01-01T00:00:00"])
    refreshed.results = refreshed.results[0]  # type: ignore[index]
    commit(spec, refreshed)
    # An SLA of a millisecond: the partition committed above is past it by the time discovery runs.
    spec.write_text(spec.read_text().replace("  - name: sales\n", "  - name: sales\n    freshness: 0.001s\n"))
    _discover_in_run(spec)
    assert statsd.wait_for("airflow.dataset_acceleration_freshness_overdue.sales", 1) == [(1.0, "g")]
    assert statsd.wait_for("airflow.dataset_acceleration_stale_partitions.sales", 1) == [(0.0, "g")]


def test_refresh_without_a_stage_task_stages_its_own_partition(tmp_path: Path) -> None:
    from airflow_partitions.operators import SparkPartitionRefreshOperator

    spec = make_spec(tmp_path)
    plan, items = discovered(spec, where="region = 'APAC'")
    results = [
        SparkPartitionRefreshOperator(
            task_id="refresh", spec_path=spec, dataset="sales", work_item=item, plan=plan
        ).execute(context())
        for item in items
    ]
    assert [r["rows"] for r in results] == [15, 15]
    staging = tmp_path / "acc"
    assert not list(staging.rglob("_stage.json")), "each partition's own stage is removed"
    result, _ = commit(spec, Refreshed(plan, items, None, results))
    assert result["upserted"] == 2


def test_commit_without_changes_skips_and_removal_only_commits(tmp_path: Path) -> None:
    from airflow.sdk.exceptions import AirflowSkipException

    from airflow_partitions.operators import SparkStageOperator

    spec = make_spec(tmp_path, days=1)
    commit(spec, stage_and_refresh(spec))
    plan, items = discovered(spec)
    assert items == []
    with pytest.raises(AirflowSkipException, match="nothing changed"):
        commit(spec, Refreshed(plan, items, None, None))

    # Rows of APAC vanish from the source: its partition is removed, nothing is refreshed.
    write_sales(tmp_path / "sales", rows=90, days=1, regions=("EU", "US"))
    plan, items = discovered(spec, where="region = 'APAC'")
    assert items == []
    assert plan["removed"] == ["region=APAC/day=2026-01-01T00%3A00%3A00"]
    stage = SparkStageOperator(
        task_id="stage", spec_path=spec, dataset="sales", plan=plan, work_items=items
    ).execute(context())
    assert stage["mode"] == "empty", "no Spark job for an empty plan"
    assert stage["location"] is None
    result, _ = commit(spec, Refreshed(plan, items, stage, []))
    assert result["removed"] == 1
    assert result["upserted"] == 0
    assert "region=APAC/day=2026-01-01T00%3A00%3A00" not in latest(spec).partitions


def previous_version_result(result: dict[str, Any]) -> dict[str, Any]:
    """A refresh task's XCom as the previous version wrote it: `fp`, and times in milliseconds with `Z`."""
    moment = dt.datetime.fromisoformat(result["refreshed_at"])
    return {
        "key": result["key"],
        "key_path": result["key_path"],
        "spec_id": result["spec_id"],
        "files": result["files"],
        "rows": result["rows"],
        "bytes": result["bytes"],
        "fp": result["source_fingerprint"],
        "refreshed_at": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "elapsed_s": result["elapsed_s"],
        "routed": result["routed"],
    }


def test_commit_accepts_results_in_flight_from_the_previous_version(tmp_path: Path) -> None:
    from airflow_partitions.catalog.model import parse_time

    spec = make_spec(tmp_path)
    refreshed = stage_and_refresh(spec)
    assert refreshed.results is not None
    old = [previous_version_result(r) for r in refreshed.results]
    refreshed.results = old
    result, _ = commit(spec, refreshed)
    assert result["version"] == 1
    assert result["upserted"] == 6
    snapshot = latest(spec)
    for sent in old:
        entry = snapshot.partitions[sent["key_path"]]
        assert entry.source_fingerprint == sent["fp"], "the old `fp` becomes the entry's fingerprint"
        assert entry.refreshed_at == parse_time(sent["refreshed_at"]), "a `Z` time reads as UTC"
        assert entry.refreshed_at.tzinfo is not None


def test_refresh_rejects_input_that_is_not_a_work_item(tmp_path: Path) -> None:
    from airflow_partitions.operators import SparkPartitionRefreshOperator

    spec = make_spec(tmp_path)
    with pytest.raises(OrchestrationError, match="one discovery work item"):
        SparkPartitionRefreshOperator(
            task_id="refresh", spec_path=spec, dataset="sales", work_item=["region=EU"], stage={}
        ).execute(context())
    with pytest.raises(OrchestrationError, match="needs plan="):
        SparkPartitionRefreshOperator(
            task_id="refresh",
            spec_path=spec,
            dataset="sales",
            work_item={"key": [], "key_path": "", "reason": "new", "fp": ""},
        ).execute(context())
    with pytest.raises(RefreshError):
        SparkPartitionRefreshOperator(
            task_id="refresh",
            spec_path=spec,
            dataset="sales",
            work_item={"key": ["EU", None], "key_path": "region=EU/day=%NULL", "reason": "new", "fp": "x"},
            stage={"dataset": "sales", "location": str(tmp_path / "missing"), "mode": "spark"},
        ).execute(context())


# --- spark-submit ---------------------------------------------------------------------------------


@pytest.fixture
def spark_submit_connection(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    return "spark_local"


@pytest.mark.slow
def test_stage_through_spark_submit(tmp_path: Path, spark_submit_connection: str) -> None:
    from airflow_partitions.operators import SparkPartitionRefreshOperator, SparkStageOperator

    spec = make_spec(tmp_path)
    plan, items = discovered(spec)
    operator = SparkStageOperator(
        task_id="stage",
        spec_path=spec,
        dataset="sales",
        plan=plan,
        work_items=items,
        spark_conn_id=spark_submit_connection,
    )
    stage = operator.execute(context())
    assert operator.spark_hook.mode == "spark"
    assert stage["mode"] == "written"
    assert stage["partitions"] == 6
    assert Path(stage["location"], "_stage.json").exists()
    result = SparkPartitionRefreshOperator(
        task_id="refresh", spec_path=spec, dataset="sales", work_item=items[0], stage=stage
    ).execute(context())
    assert result["rows"] == 15
    assert result["key_path"] == items[0]["key_path"]


@pytest.mark.slow
def test_on_kill_stops_the_spark_submit_job(tmp_path: Path, spark_submit_connection: str) -> None:
    from airflow_partitions.operators import SparkStageOperator

    spec = make_spec(tmp_path)
    plan, items = discovered(spec)
    operator = SparkStageOperator(
        task_id="stage",
        spec_path=spec,
        dataset="sales",
        plan=plan,
        work_items=items,
        spark_conn_id=spark_submit_connection,
    )
    outcome: dict[str, BaseException | dict[str, Any]] = {}

    def run() -> None:
        try:
            outcome["result"] = operator.execute(context())
        except BaseException as err:
            outcome["error"] = err

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.monotonic() + 60
    process = None
    while time.monotonic() < deadline and process is None:
        submit = operator.spark_hook._submit_hook
        process = getattr(submit, "_submit_sp", None) if submit is not None else None
        time.sleep(0.05)
    assert process is not None, "spark-submit never started"
    operator.on_kill()
    worker.join(timeout=60)
    assert not worker.is_alive()
    assert process.poll() is not None, "the spark-submit process is gone"
    assert isinstance(outcome.get("error"), OrchestrationError), outcome
    assert not list((tmp_path / "acc").rglob("_stage.json")), "a killed stage leaves no finished stage"


# --- snapshots ------------------------------------------------------------------------------------


@pytest.fixture
def aws_connection(s3_server: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(
        "AIRFLOW_CONN_SNAPSHOTS_S3",
        json.dumps(
            {
                "conn_type": "aws",
                "login": s3_server["aws_access_key_id"],
                "password": s3_server["aws_secret_access_key"],
                "extra": {"endpoint_url": s3_server["endpoint_url"], "region_name": s3_server["region_name"]},
            }
        ),
    )
    return "snapshots_s3"


@pytest.mark.s3
def test_snapshot_upload_publish_and_bootstrap(
    tmp_path: Path, s3_server: dict[str, str], s3_bucket: str, aws_connection: str
) -> None:
    import boto3
    from airflow.sdk.exceptions import AirflowSkipException

    from airflow_partitions.operators import (
        SnapshotBootstrapOperator,
        SnapshotPublishOperator,
        SnapshotUploadOperator,
        SnapshotVacuumOperator,
    )

    location = f"s3://{s3_bucket}/accel"
    spec = make_spec(tmp_path / "writer", snapshot_location=location)
    refreshed = stage_and_refresh(spec)
    common = {"spec_path": spec, "dataset": "sales", "aws_conn_id": aws_connection}
    uploads = [
        SnapshotUploadOperator(task_id="upload", partition_result=r, **common).execute(context())
        for r in refreshed.results
    ]
    assert all(u["uploaded"] == 1 and u["skipped"] == 0 for u in uploads)
    again = SnapshotUploadOperator(task_id="upload", partition_result=refreshed.results[0], **common)
    assert again.execute(context())["skipped"] == 1, "the same content is not uploaded twice"
    with pytest.raises(AirflowSkipException, match="switched off"):
        again.execute(context(snapshot=False))

    committed, _ = commit(spec, refreshed)
    published = SnapshotPublishOperator(task_id="publish", commit=committed, **common).execute(context())
    assert published["version"] == 1
    assert published["created"] is True
    assert published["files_uploaded"] == 0
    keys = [o["Key"] for o in boto3.client("s3", **s3_server).list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert sum(1 for k in keys if "/data/" in k) == 6

    # A second machine (empty accelerator_dir, same spec otherwise) hydrates only EU from the snapshot.
    reader_root = tmp_path / "replica"
    reader_spec = reader_root / "spec.yaml"
    reader_root.mkdir()
    reader_spec.write_text(
        spec.read_text().replace(str(tmp_path / "writer" / "acc"), str(reader_root / "acc"))
    )
    bootstrap = SnapshotBootstrapOperator(
        task_id="bootstrap",
        spec_path=reader_spec,
        dataset="sales",
        aws_conn_id=aws_connection,
        where="region = 'EU'",
    )
    hydrated = bootstrap.execute(context())
    assert hydrated["version"] == 1
    assert hydrated["files_downloaded"] == 2
    assert sorted(hydrated["partitions_committed"]) == sorted(
        r["key_path"] for r in refreshed.results if r["key_path"].startswith("region=EU/")
    )
    assert set(latest(reader_spec).partitions) == set(hydrated["partitions_committed"])
    with pytest.raises(AirflowSkipException, match="already has a local catalog"):
        bootstrap.execute(context())

    # The owner vacuums: an object no published version names (an abandoned upload) goes, nothing else.
    client = boto3.client("s3", **s3_server)
    client.put_object(Bucket=s3_bucket, Key="accel/sales/data/region=EU/abandoned.parquet", Body=b"x" * 10)
    vacuum = SnapshotVacuumOperator(
        task_id="vacuum", retain_versions=1, grace=dt.timedelta(0), report_only=True, **common
    )
    report = vacuum.execute(context())
    assert (report["latest_version"], report["retained_versions"], report["deleted_objects"]) == (1, [1], 1)
    vacuum.report_only = False
    assert vacuum.execute(context())["deleted_bytes"] == 10
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert sum(1 for k in keys if "/data/" in k) == 6, "every file of the published version stays"
    replica_spec = reader_root / "replica.yaml"
    replica_spec.write_text(reader_spec.read_text().replace("mode: enabled", "mode: bootstrap_only"))
    assert "bootstrap_only" in replica_spec.read_text()
    with pytest.raises(AirflowSkipException, match="only the dataset's owner"):
        SnapshotVacuumOperator(task_id="v", **{**common, "spec_path": replica_spec}).execute(context())


@pytest.mark.s3
def test_snapshot_operators_open_a_catalog_on_s3_with_their_aws_connection(
    tmp_path: Path,
    s3_server: dict[str, str],
    s3_bucket: str,
    aws_connection: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow.sdk.exceptions import AirflowSkipException

    from airflow_partitions.catalog import PartitionEntry, PartitionSpecInfo, open_catalog
    from airflow_partitions.keys import PartitionKey
    from airflow_partitions.operators import (
        PartitionDiscoveryOperator,
        SnapshotBootstrapOperator,
        VacuumOperator,
    )
    from airflow_partitions.operators.discovery import PLAN_XCOM_KEY
    from airflow_partitions.spec import load_spec
    from airflow_partitions.storage import DataFile

    spec = make_spec(tmp_path, snapshot_location=f"s3://{s3_bucket}/snap")
    monkeypatch.setenv("AIRFLOW_PARTITIONS_CATALOG_URL", f"s3://{s3_bucket}/team")
    project = load_spec(spec)
    catalog = open_catalog(project, project.dataset("sales"), s3_settings=s3_server)
    partition_spec = PartitionSpecInfo.from_fields([("region", "region", "string")])
    key = PartitionKey(("EU",))
    data_file = DataFile(
        f"{key.path(partition_spec.names)}/part-0.parquet", "parquet", 1, 5, checksum="0" * 64
    )
    entry = PartitionEntry.from_files(key, partition_spec, [data_file], source_fingerprint="fp")
    # A commit publishes only files that exist (the data directory stays local here).
    assert catalog.data_root is not None
    (catalog.data_root / data_file.path).parent.mkdir(parents=True)
    (catalog.data_root / data_file.path).write_bytes(b"12345")
    assert catalog.commit(base_version=None, upserts=[entry], partition_spec=partition_spec) == 1

    # The environment names an endpoint where nothing listens: only the connection reaches the store.
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    bootstrap = SnapshotBootstrapOperator(
        task_id="b", spec_path=spec, dataset="sales", aws_conn_id=aws_connection
    )
    with pytest.raises(AirflowSkipException, match="already has a local catalog"):
        bootstrap.execute(context())
    vacuum = VacuumOperator(
        task_id="v", spec_path=spec, dataset="sales", aws_conn_id=aws_connection, report_only=True
    )
    assert vacuum.execute(context())["latest_version"] == 1
    # Discovery diffs against the same catalog, reached the same way.
    pushed: dict[str, Any] = {}
    discovery_context = context()
    discovery_context["ti"] = SimpleNamespace(xcom_push=lambda key, value: pushed.__setitem__(key, value))
    discover = PartitionDiscoveryOperator(
        task_id="d", spec_path=spec, dataset="sales", aws_conn_id=aws_connection
    )
    discover.execute(discovery_context)
    assert pushed[PLAN_XCOM_KEY]["base_version"] == 1


@pytest.mark.s3
def test_snapshot_operators_skip_when_the_mode_does_not_allow(tmp_path: Path, aws_connection: str) -> None:
    from airflow.sdk.exceptions import AirflowSkipException

    from airflow_partitions.operators import SnapshotBootstrapOperator, SnapshotUploadOperator

    spec = make_spec(tmp_path)  # snapshots disabled
    common = {"spec_path": spec, "dataset": "sales", "aws_conn_id": aws_connection}
    with pytest.raises(AirflowSkipException, match="disabled: no upload"):
        SnapshotUploadOperator(task_id="u", partition_result={}, **common).execute(context())
    with pytest.raises(AirflowSkipException, match="disabled: no bootstrap"):
        SnapshotBootstrapOperator(task_id="b", **common).execute(context())
    with pytest.raises(OrchestrationError, match="where= or partitions="):
        SnapshotBootstrapOperator(task_id="b", where="x = 1", partitions=["x=1"], **common)


# --- vacuum ---------------------------------------------------------------------------------------


def test_vacuum_reports_then_removes_unreferenced_files(tmp_path: Path) -> None:
    from airflow_partitions.operators import VacuumOperator

    spec = make_spec(tmp_path, days=1)
    commit(spec, stage_and_refresh(spec))
    append_sales(tmp_path / "sales", rows=9, days=1, regions=("EU", "US", "APAC"), name="sales-1.parquet")
    commit(spec, stage_and_refresh(spec))
    files_before = sorted(p for p in (tmp_path / "acc").rglob("*.parquet"))
    # The stage of a killed run (manifest and staged rows), left in the staging root.
    abandoned = tmp_path / "acc" / "_staging" / "sales" / "20260101T000000-0123456789"
    (abandoned / "data" / "__ap_item=0").mkdir(parents=True)
    (abandoned / "data" / "__ap_item=0" / "rows.bin").write_bytes(b"\0" * 100)
    (abandoned / "_stage.json").write_text("{}")
    common = {"spec_path": spec, "dataset": "sales", "retain_versions": 1, "grace": dt.timedelta(0)}
    report = VacuumOperator(task_id="v", report_only=True, older_than=dt.timedelta(0), **common).execute(
        context()
    )
    assert report["dry_run"] is True
    assert report["staging"]["removed"] == [abandoned.name]
    assert report["staging"]["bytes_before"] - report["staging"]["bytes_after"] == 102
    assert abandoned.exists(), "a report deletes no stage"
    assert report["removed_files"] == 3
    assert sorted(p for p in (tmp_path / "acc").rglob("*.parquet")) == files_before, (
        "a report deletes nothing"
    )
    done = VacuumOperator(task_id="v", older_than=dt.timedelta(0), **common).execute(context())
    assert done["removed_files"] == 3
    assert done["staging"]["removed"] == [abandoned.name]
    assert not abandoned.exists()
    assert done["removed_versions"] == [1]
    assert len(list((tmp_path / "acc").rglob("*.parquet"))) == len(files_before) - 3
    with pytest.raises(OrchestrationError, match="retain_versions"):
        VacuumOperator(task_id="v", spec_path=spec, dataset="sales", retain_versions=0)


# --- metrics through Airflow's Stats --------------------------------------------------------------


class StatsdListener:
    """A real StatsD endpoint: a UDP socket on loopback and a thread collecting every metric line."""

    def __init__(self) -> None:
        import socket

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            self.lines.extend(data.decode("utf-8").splitlines())

    def metrics(self, name: str) -> list[tuple[float, str]]:
        """(value, type) of every line sent for `name` (`<name>:<value>|<type>`)."""
        found = []
        for line in list(self.lines):
            metric, _, rest = line.partition(":")
            if metric == name:
                value, _, kind = rest.partition("|")
                found.append((float(value), kind.split("|")[0]))
        return found

    def wait_for(self, name: str, count: int, timeout: float = 10.0) -> list[tuple[float, str]]:
        deadline = time.monotonic() + timeout
        while len(self.metrics(name)) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.metrics(name)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture
def statsd(monkeypatch: pytest.MonkeyPatch) -> Iterator[StatsdListener]:
    """Airflow configured to send StatsD metrics to a listener on loopback, Stats not yet initialised
    (as in `dag.test()`, where no task runner initialises it)."""
    from airflow.sdk._shared.observability.metrics import stats as shared

    listener = StatsdListener()
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_ON", "True")
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_HOST", "127.0.0.1")
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_PORT", str(listener.port))
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_PREFIX", "airflow")
    monkeypatch.setattr(shared, "_factory", None)
    monkeypatch.setattr(shared, "_backend", None)
    try:
        yield listener
    finally:
        listener.close()


def test_refresh_metrics_reach_a_statsd_listener(
    tmp_path: Path, dags_folder: tuple[Path, MetadataDatabase], statsd: StatsdListener
) -> None:
    from airflow.dag_processing.dagbag import DagBag

    from airflow_partitions.operators.run_conf import RefreshRunConf

    dags, _ = dags_folder
    spec = make_spec(tmp_path, rows=30, days=1)
    (dags / "metrics_sales.py").write_text(
        textwrap.dedent(
            f"""\
            from airflow_partitions.dag_factory import build_refresh_dag
            from airflow_partitions.spec import load_spec

            project = load_spec({str(spec)!r}, check_types=False)
            dag = build_refresh_dag(project, "sales", dag_id="metrics_sales")
            """
        )
    )
    run = DagBag(dag_folder=str(dags)).dags["metrics_sales"].test(run_conf=RefreshRunConf().to_conf())
    assert str(run.state) == "success"
    snapshot = latest(spec)
    assert len(snapshot.partitions) == 3

    entries = [snapshot.partitions[path] for path in snapshot.partitions]
    # Discovery's gauges: three new partitions to refresh, none stale (the spec declares no freshness SLA).
    assert statsd.wait_for("airflow.dataset_acceleration_partitions_to_refresh.sales", 1) == [(3.0, "g")]
    assert statsd.wait_for("airflow.dataset_acceleration_stale_partitions.sales", 1) == [(0.0, "g")]
    rows = statsd.wait_for("airflow.dataset_acceleration_refresh_rows.sales", 3)
    assert sorted(rows) == sorted((float(e.rows), "c") for e in entries), "rows: one count per partition"
    assert sum(value for value, _ in rows) == 30
    sizes = statsd.wait_for("airflow.dataset_acceleration_refresh_bytes.sales", 3)
    assert sorted(sizes) == sorted((float(e.bytes), "c") for e in entries)
    assert (
        statsd.wait_for("airflow.dataset_acceleration_refresh_partitions.sales.success", 3)
        == [(1.0, "c")] * 3
    )
    durations = statsd.wait_for("airflow.dataset_acceleration_refresh_duration.sales", 3)
    assert len(durations) == 3
    assert all(kind == "ms" and value > 0 for value, kind in durations)
    assert statsd.wait_for("airflow.dataset_acceleration_refresh_stage_rows.sales", 1) == [(30.0, "c")]
    assert statsd.metrics("airflow.dataset_acceleration_refresh_partitions.sales.failed") == []


def test_watermark_audit_gauges_reach_a_statsd_listener(statsd: StatsdListener) -> None:
    """What a watermark mode could not see is a gauge per dataset (0 when it saw everything), late rows
    counted by absolute value (a deleted row is as much drift as a late one); full mode sends nothing."""
    from airflow_partitions.operators.metrics import record_watermark_audit

    record_watermark_audit("sales", late_rows={"day=1": 2, "day=2": -1}, future_rows={"day=9": 4})
    assert statsd.wait_for("airflow.dataset_acceleration_refresh_late_rows.sales", 1) == [(3.0, "g")]
    assert statsd.wait_for("airflow.dataset_acceleration_refresh_future_rows.sales", 1) == [(4.0, "g")]
    record_watermark_audit("sales", late_rows={}, future_rows={})
    assert statsd.wait_for("airflow.dataset_acceleration_refresh_late_rows.sales", 2)[-1] == (0.0, "g")
    record_watermark_audit("full_mode", late_rows=None, future_rows=None)
    record_watermark_audit("after", late_rows={}, future_rows=None)  # a marker sent after it
    statsd.wait_for("airflow.dataset_acceleration_refresh_late_rows.after", 1)
    assert not [line for line in statsd.lines if "full_mode" in line]


def test_commit_decodes_the_lone_descriptor_of_a_one_partition_run() -> None:
    """Airflow hands the commit a single refresh task's XCom as the value itself, not a list of one; the
    descriptor's writer (the task instance) survives the round trip."""
    import datetime as dt

    from airflow_partitions.catalog import PartitionEntry, WrittenBy
    from airflow_partitions.keys import PartitionKey
    from airflow_partitions.operators.xcom import partition_results_from_xcom
    from airflow_partitions.refresh.plan import PartitionResult

    writer = WrittenBy(dag_id="refresh_sales", run_id="manual__1", task_id="partition.refresh", map_index=0)
    entry = PartitionEntry(
        key=PartitionKey(("a/b",)),
        key_path="region=a%2Fb",
        spec_id="s1",
        files=(),
        rows=0,
        bytes=0,
        source_fingerprint="fp",
        refreshed_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        written_by=writer,
    )
    descriptor = json.loads(json.dumps(PartitionResult(entry=entry, routed=0).to_json()))
    lone = partition_results_from_xcom(descriptor)
    assert lone == partition_results_from_xcom([descriptor, None])
    assert [r.entry.written_by for r in lone] == [writer]
