"""End to end through a real Airflow: scheduler, api-server, dag-processor and triggerer (LocalExecutor)
on a fresh Postgres metadata database, with the example DAG file and local Spark.

1. Trigger the refresh DAG over the REST API with a conf, as the UI's trigger form does; check the
   catalog, the mapped tasks' partition labels, the partitioned asset events, and that a downstream DAG
   scheduled on the dataset's asset (`PartitionedAssetTimetable`) runs once per refreshed partition.
2. `airflow-partitions backfill --where ... --airflow-url ...` while one selected partition cannot be
   written: the run fails on that partition alone; clearing just that task instance (as the UI's Clear
   button does) re-runs it and the commit. Only the selected partitions are rewritten.
3. A stage-less refresh DAG on a real Spark Connect server: every mapped partition task, a process of
   its own, runs its Spark job through the `spark_connect` connection.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from airflow_e2e.sample import write_sales
from airflow_e2e.shared import (
    CONNECT_DAG_ID,
    CONNECT_REGIONS,
    DAG_ID,
    DOWNSTREAM_DAG_ID,
)
from airflow_e2e.stack import AirflowStack

from airflow_partitions.cli.backfill import AirflowApiClient

pytestmark = [
    pytest.mark.airflow,
    pytest.mark.slow,
    pytest.mark.spark,
    pytest.mark.postgres,
    pytest.mark.timeout(600),
]

FULL_CONF = {"partitions": None, "where": None, "full_refresh": False, "snapshot": True}


def key(region: str, day: int) -> str:
    """A partition's canonical key string (the catalog's)."""
    return f"region={region}/day=2026-01-0{day}T00%3A00%3A00"


def label(region: str, day: int) -> str:
    """A partition's readable key: its mapped refresh task's label."""
    return f"region={region}/day=2026-01-0{day}T00:00:00"


def airflow_key(region: str, day: int) -> str:
    """A partition's key in Airflow's composite convention: asset events, partitioned runs."""
    return f"{region}|2026-01-0{day}T00:00:00"


def catalog(stack: AirflowStack, dataset: str = "sales") -> Any:
    from airflow_partitions.spec import load_spec
    from airflow_partitions.table import open_handle

    project = load_spec(stack.dags_folder / "datasets.yaml")
    return open_handle(project, project.dataset(dataset)).catalog.latest()


def wait(client: AirflowApiClient, stack: AirflowStack, run_id: str) -> dict[str, Any]:
    try:
        return client.wait_for_dag_run(DAG_ID, run_id, timeout=300, poll_interval=1)
    except Exception as err:
        raise AssertionError(f"{err}\n{stack.logs_tail()}") from err


def instances(client: AirflowApiClient, run_id: str, task_id: str) -> dict[str, dict[str, Any]]:
    """Mapped task instances of a run by their rendered label (the partition key)."""
    return {
        str(ti["rendered_map_index"]): ti
        for ti in client.task_instances(DAG_ID, run_id)
        if ti["task_id"] == task_id
    }


def test_trigger_with_conf_like_the_ui(stack: AirflowStack, client: AirflowApiClient) -> None:
    run = client.trigger_dag_run(DAG_ID, FULL_CONF, note="triggered from the test, as the UI does")
    finished = wait(client, stack, run["dag_run_id"])
    assert finished["state"] == "success", stack.logs_tail()
    assert finished["conf"] == FULL_CONF
    refreshed = instances(client, run["dag_run_id"], "partition.refresh")
    assert set(refreshed) == {label("EU", 1), label("US", 1)}, "each mapped instance shows its readable key"
    assert all(ti["state"] == "success" for ti in refreshed.values())
    snapshot = catalog(stack)
    assert snapshot.version == 1
    assert set(snapshot.partitions) == {key("EU", 1), key("US", 1)}
    events = stack.query(
        "SELECT e.partition_key FROM asset_event e JOIN asset a ON a.id = e.asset_id WHERE a.name = 'sales'"
    )
    expected = {airflow_key("EU", 1), airflow_key("US", 1)}
    assert {row[0] for row in events} == expected, "one asset event per partition, Airflow's composite key"

    # The partition-aware downstream DAG runs once per refreshed partition, with that partition's key.
    deadline = time.monotonic() + 180
    while True:
        runs = stack.query("SELECT partition_key, state FROM dag_run WHERE dag_id = %s", (DOWNSTREAM_DAG_ID,))
        if {key for key, state in runs if state == "success"} == expected or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert sorted(runs) == sorted((path, "success") for path in expected), stack.logs_tail()


def test_backfill_cli_refreshes_only_the_filtered_partitions(
    stack: AirflowStack, client: AirflowApiClient
) -> None:
    before = catalog(stack)
    sales = stack.dags_folder.parent / "sales"
    # New source rows: a new day 3 for both regions.
    _append_day_three(sales)
    # The new EU/day 3 partition cannot be written: its directory path is taken by a plain file.
    blocker = stack.dags_folder.parent / "acc" / "sales" / "region=EU" / "day=2026-01-03T00%3A00%3A00"
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("not a directory")

    command = [
        str(Path(sys.executable).with_name("airflow-partitions")),
        "backfill",
        str(stack.dags_folder / "datasets.yaml"),
        "sales",
        "--where",
        "region = 'EU'",
        "--airflow-url",
        stack.api_url,
        "--username",
        "admin",
        "--json",
        "--wait",
        "--timeout",
        "300",
    ]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
        env={**os.environ, "AIRFLOW_PARTITIONS_API_PASSWORD": stack.password},
    )
    report = _json_document(result.stdout)
    assert result.returncode == 1, f"the run fails on the blocked partition\n{result.stderr[-2000:]}"
    selected = [p["key_path"] for p in report["partitions"]]
    assert selected == [key("EU", 1), key("EU", 3)], "the filter resolves to the EU partitions"
    assert report["conf"]["partitions"] == selected
    assert report["state"] == "failed"
    run_id = report["dag_run_id"]
    refreshed = instances(client, run_id, "partition.refresh")
    assert {shown: ti["state"] for shown, ti in refreshed.items()} == {
        label("EU", 1): "success",
        label("EU", 3): "failed",
    }
    assert catalog(stack).version == before.version, "nothing is committed while a partition failed"

    # Fix the cause and clear only the failed partition: it re-runs alone, then the commit does.
    blocker.unlink()
    failed = refreshed[label("EU", 3)]
    cleared = client.clear_task_instances(DAG_ID, run_id, [("partition.refresh", int(failed["map_index"]))])
    assert {(ti["task_id"], ti.get("map_index")) for ti in cleared} >= {
        ("partition.refresh", failed["map_index"]),
        ("commit", -1),
    }
    finished = wait(client, stack, run_id)
    assert finished["state"] == "success", stack.logs_tail()
    rerun = instances(client, run_id, "partition.refresh")
    assert rerun[label("EU", 3)]["try_number"] == 2
    assert rerun[label("EU", 1)]["try_number"] == 1, "the partition that succeeded did not run again"

    after = catalog(stack)
    assert after.version == before.version + 1
    assert key("US", 3) not in after.partitions, "US was not selected: its new partition waits"
    untouched, rewritten = key("US", 1), key("EU", 1)
    assert after.partitions[untouched].refreshed_at == before.partitions[untouched].refreshed_at
    assert after.partitions[rewritten].refreshed_at > before.partitions[rewritten].refreshed_at
    assert after.partitions[key("EU", 3)].rows > 0


DAILY_DAG_ID = "sales_per_region_day"
# Airflow's own mappers read the composite key: the region as is, the day cut to a date.
DAILY_DAG = f'''\
"""Runs once per refreshed (region, day) partition of `sales`, keyed `<region>|<YYYY-MM-DD>` (airflow dag)."""

from airflow.sdk import DAG, Asset, IdentityMapper, PartitionedAssetTimetable, ProductMapper
from airflow.sdk import StartOfDayMapper, task

with DAG(
    "{DAILY_DAG_ID}",
    schedule=PartitionedAssetTimetable(
        assets=Asset.ref(name="sales"),
        default_partition_mapper=ProductMapper(IdentityMapper(), StartOfDayMapper()),
    ),
    catchup=False,
):

    @task
    def consume(dag_run=None):
        return dag_run.partition_key

    consume()
'''


MONTHLY_DAG_ID = "sales_per_region_month"
# A consumer whose runs are keyed by month (`US|2026-01`), a key that names no partition of `sales`: its
# task reads the partitions its triggering asset events name, through the hook.
MONTHLY_DAG = f'''\
"""Reads the (region, day) partitions of `sales` each of its (region, month) runs was triggered by."""

import json
from pathlib import Path

from airflow.sdk import DAG, Asset, IdentityMapper, PartitionedAssetTimetable, ProductMapper
from airflow.sdk import StartOfMonthMapper, task

from airflow_partitions.hooks.partitioned_dataset import PartitionedDatasetHook

with DAG(
    "{MONTHLY_DAG_ID}",
    schedule=PartitionedAssetTimetable(
        assets=Asset.ref(name="sales"),
        default_partition_mapper=ProductMapper(IdentityMapper(), StartOfMonthMapper()),
    ),
    catchup=False,
):

    @task
    def read_run_partitions(**context):
        spec_path = str(Path(__file__).with_name("datasets.yaml"))
        hook = PartitionedDatasetHook(dataset="sales", spec_path=spec_path)
        try:
            table = hook.read_run_partitions(context, ["id"])
            keys = hook.run_partition_keys(context)
        finally:
            hook.close()
        out = Path(__file__).parent.parent / "monthly_reads" / (context["run_id"].replace(":", "_") + ".json")
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps({{
            "run_key": context["dag_run"].partition_key,
            "keys": keys,
            "ids": sorted(table.column("id").to_pylist()),
        }}))

    read_run_partitions()
'''


def source_ids(stack: AirflowStack, region: str, day: int) -> list[int]:
    """Ids of the source rows of one (region, day) partition, read from the source files with DuckDB."""
    import duckdb

    rows = duckdb.sql(
        f"SELECT id FROM read_parquet('{stack.dags_folder.parent / 'sales'}/*.parquet') "
        f"WHERE region = '{region}' AND date_trunc('day', ts) = TIMESTAMP '2026-01-0{day}'"
    ).fetchall()
    return sorted(row[0] for row in rows)


def test_a_run_triggered_with_a_partition_key_refreshes_only_that_partition(
    stack: AirflowStack, client: AirflowApiClient
) -> None:
    """And a downstream DAG on the asset reads exactly the partition the triggering event names."""
    (stack.dags_folder / "sales_per_region_day.py").write_text(DAILY_DAG)
    (stack.dags_folder / "sales_per_region_month.py").write_text(MONTHLY_DAG)
    for dag_id in (DAILY_DAG_ID, MONTHLY_DAG_ID):
        stack.wait_for_dag(client, dag_id, poll=2)
        client.set_paused(dag_id, paused=False)
    before = catalog(stack)
    target = airflow_key("US", 1)

    # As the UI's trigger dialog of a partitioned DAG sends it: a partition key and no conf.
    run = client.trigger_dag_run(DAG_ID, {}, partition_key=target)
    finished = wait(client, stack, run["dag_run_id"])
    assert finished["state"] == "success", stack.logs_tail()
    assert finished["partition_key"] == target, "the run carries its partition key (Partition Key column)"
    refreshed = instances(client, run["dag_run_id"], "partition.refresh")
    assert set(refreshed) == {label("US", 1)}, "exactly the partition the key names"

    after = catalog(stack)
    assert after.version == before.version + 1
    changed = {
        path
        for path in after.partitions
        if path not in before.partitions
        or after.partitions[path].refreshed_at != before.partitions[path].refreshed_at
    }
    assert changed == {key("US", 1)}, "no other partition was rewritten"
    events = stack.query(
        "SELECT e.partition_key FROM asset_event e JOIN asset a ON a.id = e.asset_id "
        "WHERE a.name = 'sales' AND e.source_run_id = %s",
        (run["dag_run_id"],),
    )
    assert [row[0] for row in events] == [target], "one event, keyed in Airflow's composite convention"

    # Airflow's ProductMapper(IdentityMapper(), StartOfDayMapper()) reads that key as (region, day).
    deadline = time.monotonic() + 180
    while True:
        runs = stack.query(
            "SELECT partition_key, state FROM dag_run WHERE dag_id = %s AND partition_key = %s",
            (DAILY_DAG_ID, "US|2026-01-01"),
        )
        if any(state == "success" for _, state in runs) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert ("US|2026-01-01", "success") in runs, stack.logs_tail()

    # The monthly consumer's run is keyed `US|2026-01`; its task read the partition of the event.
    deadline = time.monotonic() + 180
    while True:
        runs = stack.query(
            "SELECT run_id, state FROM dag_run WHERE dag_id = %s AND partition_key = %s",
            (MONTHLY_DAG_ID, "US|2026-01"),
        )
        if any(state in ("success", "failed") for _, state in runs) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert [state for _, state in runs] == ["success"], stack.logs_tail()
    read = json.loads(
        (stack.dags_folder.parent / "monthly_reads" / (runs[0][0].replace(":", "_") + ".json")).read_text()
    )
    assert read["run_key"] == "US|2026-01", "the run's own key names a month, no partition of sales"
    assert read["keys"] == [target], "the partition keys of the triggering asset event"
    expected = source_ids(stack, "US", 1)
    assert expected, "the partition has rows"
    assert read["ids"] == expected, "exactly the rows of that partition, no other"


DAILY_REFRESH_DAG_ID = "refresh_sales_daily"
DAILY_REFRESH_DAG = f'''\
"""A day-partitioned refresh on Airflow's cron partition timetable: one run, and one key, per day."""

from airflow.sdk import CronPartitionTimetable

from airflow_partitions.dag_factory import build_refresh_dag
from airflow_partitions.spec import load_spec

project = load_spec({{spec!r}}, check_types=False)
dag = build_refresh_dag(
    project,
    "sales_daily",
    dag_id="{DAILY_REFRESH_DAG_ID}",
    dag_kwargs={{{{"schedule": CronPartitionTimetable("0 0 * * *", timezone="UTC")}}}},
    # What is tested is Airflow's backfill (one run, one key, one partition each): its stage tasks write
    # with the in-process Arrow path rather than start a Spark JVM each, one after another (the Spark
    # stage in a task process is test_trigger_with_conf_like_the_ui's).
    strategy="arrow",
)
'''


def test_airflow_backfill_over_days_refreshes_one_partition_per_run(
    stack: AirflowStack, client: AirflowApiClient
) -> None:
    """Airflow's own partition-aware backfill (the Backfill dialog's API) on a day-partitioned dataset."""
    root = stack.dags_folder.parent / "daily"
    write_sales(root / "src", rows=30, days=3, regions=("EU", "US"))
    spec = root / "datasets.yaml"
    spec.write_text(
        f"accelerator_dir: {root / 'acc'}\n"
        "datasets:\n"
        "  - name: sales_daily\n"
        f"    from: file:{root / 'src'}/\n"
        "    params: {file_format: parquet}\n"
        "    acceleration:\n"
        "      engine: parquet\n"
        "      partition_by:\n"
        "        - day: \"date_trunc('day', ts)\"\n"
    )
    (stack.dags_folder / "sales_daily.py").write_text(DAILY_REFRESH_DAG.format(spec=str(spec)))
    stack.wait_for_dag(client, DAILY_REFRESH_DAG_ID, poll=2)
    client.set_paused(DAILY_REFRESH_DAG_ID, paused=False)

    client._send(
        "POST",
        "/api/v2/backfills",
        json_body={
            "dag_id": DAILY_REFRESH_DAG_ID,
            "from_date": "2026-01-01T00:00:00Z",
            "to_date": "2026-01-03T00:00:00Z",
            "max_active_runs": 1,
        },
    )
    days = {f"2026-01-0{day}T00:00:00" for day in (1, 2, 3)}
    deadline = time.monotonic() + 400
    while True:
        # Backfill runs only: the timetable may also schedule today's tick, a day with no source rows.
        runs = stack.query(
            "SELECT run_id, partition_key, state FROM dag_run WHERE dag_id = %s AND run_type = 'backfill'",
            (DAILY_REFRESH_DAG_ID,),
        )
        if {key for _, key, state in runs if state in ("success", "failed")} == days:
            break
        assert time.monotonic() < deadline, f"{runs}\n{stack.logs_tail()}"
        time.sleep(0.5)
    assert sorted((key, state) for _, key, state in runs) == [(day, "success") for day in sorted(days)]
    for run_id, key, _ in runs:
        refreshed = [
            ti["rendered_map_index"]
            for ti in client.task_instances(DAILY_REFRESH_DAG_ID, run_id)
            if ti["task_id"] == "partition.refresh"
        ]
        assert refreshed == [f"day={key}"], "each backfill run refreshes the day its partition key names"

    from airflow_partitions.spec import load_spec
    from airflow_partitions.table import open_handle

    project = load_spec(spec)
    snapshot = open_handle(project, project.dataset("sales_daily")).catalog.latest()
    assert snapshot.version == 3, "one commit per backfill run"
    assert sum(snapshot.partitions[path].rows for path in snapshot.partitions) == 30


def test_stage_less_dag_runs_each_partition_task_on_spark_connect(
    stack: AirflowStack, client: AirflowApiClient
) -> None:
    stack.wait_for_dag(client, CONNECT_DAG_ID, poll=2)
    run = client.trigger_dag_run(CONNECT_DAG_ID, FULL_CONF)
    try:
        finished = client.wait_for_dag_run(CONNECT_DAG_ID, run["dag_run_id"], timeout=300, poll_interval=1)
    except Exception as err:
        raise AssertionError(f"{err}\n{stack.logs_tail()}") from err
    assert finished["state"] == "success", stack.logs_tail()
    tasks = client.task_instances(CONNECT_DAG_ID, run["dag_run_id"])
    assert "stage" not in {ti["task_id"] for ti in tasks}
    refreshed = [ti for ti in tasks if ti["task_id"] == "partition.refresh"]
    assert len(refreshed) == len(CONNECT_REGIONS)
    assert all(ti["state"] == "success" for ti in refreshed)
    assert len({ti["pid"] for ti in refreshed}) == len(CONNECT_REGIONS), "one process per partition task"

    logs = [
        path.read_text(errors="replace")
        for path in (stack.logs_dir / "tasks").rglob("*.log")
        if f"dag_id={CONNECT_DAG_ID}" in str(path) and "task_id=partition.refresh" in str(path)
    ]
    assert len(logs) == len(CONNECT_REGIONS)
    assert all("of sales_connect with Spark (spark_connect)" in text for text in logs)

    snapshot = catalog(stack, "sales_connect")
    assert snapshot.version == 1
    assert len(snapshot.partitions) == len(CONNECT_REGIONS)
    from airflow_partitions.hooks.partitioned_dataset import PartitionedDatasetHook

    hook = PartitionedDatasetHook(dataset="sales_connect", spec_path=str(stack.dags_folder / "datasets.yaml"))
    try:
        for region in CONNECT_REGIONS:
            rows = hook.read([[("region", "=", region)]], columns=["region"])
            assert rows.num_rows == 10, region
            assert set(rows["region"].to_pylist()) == {region}
    finally:
        hook.close()


def _append_day_three(sales: Path) -> None:
    import datetime as dt

    import pyarrow as pa
    import pyarrow.parquet as pq

    day = dt.datetime(2026, 1, 3, 12, 0)
    pq.write_table(
        pa.table(
            {
                "id": pa.array([900_001, 900_002, 900_003, 900_004], pa.int64()),
                "region": pa.array(["EU", "US", "EU", "US"]),
                "amount": pa.array([1.0, 2.0, 3.0, 4.0]),
                "ts": pa.array([day] * 4, pa.timestamp("us")),
            }
        ),
        sales / "day3.parquet",
    )


def _json_document(out: str) -> dict[str, Any]:
    start = 0 if out.startswith("{") else out.index("\n{") + 1
    document, _ = json.JSONDecoder().raw_decode(out[start:])
    return dict(document)
