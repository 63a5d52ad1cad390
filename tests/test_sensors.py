"""Sensors on real files and a real catalog: poke, defer to their trigger, resume from its event."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from airflow_e2e.sample import append_sales, sample_spec, write_sales

from airflow_partitions.exceptions import OrchestrationError

pytestmark = [pytest.mark.airflow, pytest.mark.spark]


@dataclass
class Refreshed:
    spec: Path
    sales: Path
    refreshed_at: dt.datetime  # a moment between the refresh's start and its commit


@pytest.fixture(scope="module")
def refreshed(tmp_path_factory: pytest.TempPathFactory) -> Refreshed:
    from airflow_partitions.refresh import refresh_dataset

    root = tmp_path_factory.mktemp("sensors")
    write_sales(root / "sales", rows=60, days=2)
    spec = root / "spec.yaml"
    spec.write_text(sample_spec(accelerator_dir=root / "acc", sales_dir=root / "sales"))
    before = dt.datetime.now(dt.UTC)
    refresh_dataset(str(spec), "sales")
    return Refreshed(spec, root / "sales", before)


def context() -> dict[str, Any]:
    return {"params": {}}


def test_source_change_sensor_pokes_false_until_the_source_changes(
    tmp_path: Path, refreshed: Refreshed
) -> None:
    from airflow_partitions.sensors import SourceChangeSensor

    sensor = SourceChangeSensor(task_id="wait", spec_path=refreshed.spec, dataset="sales")
    assert sensor.poke(context()).is_done is False, "nothing changed since the refresh"

    fresh_root = tmp_path / "never_refreshed"
    write_sales(fresh_root / "sales", rows=30, days=1)
    (fresh_root / "spec.yaml").write_text(
        sample_spec(accelerator_dir=fresh_root / "acc", sales_dir=fresh_root / "sales")
    )
    result = SourceChangeSensor(task_id="wait", spec_path=fresh_root / "spec.yaml", dataset="sales").poke(
        context()
    )
    assert result.is_done is True
    assert result.xcom_value["changed_count"] == 3, "every partition of a never-refreshed dataset is new"


def test_deferrable_sensors_poke_once_then_defer(refreshed: Refreshed) -> None:
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_partitions.sensors import PartitionFreshnessSensor, SourceChangeSensor
    from airflow_partitions.triggers import PartitionFreshnessTrigger, SourceChangeTrigger

    sensor = SourceChangeSensor(
        task_id="wait",
        spec_path=refreshed.spec,
        dataset="sales",
        deferrable=True,
        poke_interval=5,
        timeout=600,
    )
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(context())
    trigger = deferred.value.trigger
    assert isinstance(trigger, SourceChangeTrigger)
    assert trigger.serialize()[1] == {
        "spec_path": str(refreshed.spec.resolve()),
        "dataset": "sales",
        "where": None,
        "poll_interval": 5.0,
    }
    assert deferred.value.method_name == "execute_complete"
    assert deferred.value.timeout == dt.timedelta(seconds=600)

    future = (dt.datetime.now(dt.UTC) + dt.timedelta(days=1)).isoformat()
    freshness = PartitionFreshnessSensor(
        task_id="fresh",
        spec_path=refreshed.spec,
        dataset="sales",
        refreshed_after=future,
        deferrable=True,
        where="region = 'EU'",
    )
    with pytest.raises(TaskDeferred) as deferred:
        freshness.execute(context())
    assert isinstance(deferred.value.trigger, PartitionFreshnessTrigger)
    assert deferred.value.trigger.serialize()[1]["where"] == "region = 'EU'"

    # Already fresh: no deferral, the result comes back at once.
    done = PartitionFreshnessSensor(
        task_id="fresh",
        spec_path=refreshed.spec,
        dataset="sales",
        refreshed_after=refreshed.refreshed_at,
        deferrable=True,
    ).execute(context())
    assert done["fresh"] is True
    assert done["selected"] == 6


def test_execute_complete_raises_on_a_trigger_error(refreshed: Refreshed) -> None:
    from airflow_partitions.sensors import SourceChangeSensor

    sensor = SourceChangeSensor(task_id="wait", spec_path=refreshed.spec, dataset="sales")
    event = {"status": "error", "error_type": "SourceError", "message": "bucket gone"}
    with pytest.raises(OrchestrationError, match="SourceError while waiting: bucket gone"):
        sensor.execute_complete(context(), event)
    assert sensor.execute_complete(context(), {"status": "success", "changed_count": 2})["changed_count"] == 2


def test_freshness_sensor_compares_refresh_times_of_the_selected_partitions(refreshed: Refreshed) -> None:
    from airflow_partitions.sensors import PartitionFreshnessSensor

    def poke(**kwargs: Any) -> Any:
        return PartitionFreshnessSensor(
            task_id="fresh", spec_path=refreshed.spec, dataset="sales", **kwargs
        ).poke(context())

    fresh = poke(refreshed_after=refreshed.refreshed_at, where="region = 'EU'")
    assert fresh.is_done is True
    assert fresh.xcom_value["selected"] == 2, "region=EU over 2 days"
    later = poke(refreshed_after=dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5), where="region = 'EU'")
    assert later.is_done is False
    assert later.xcom_value["stale_count"] == 2
    nothing = poke(refreshed_after="2000-01-01T00:00:00", where="region = 'MARS'")
    assert nothing.is_done is False, "a filter that selects no partition is not fresh (min_partitions=1)"
    assert poke(refreshed_after="2000-01-01T00:00:00", where="region = 'MARS'", min_partitions=0).is_done
    with pytest.raises(OrchestrationError, match="ISO 8601"):
        poke(refreshed_after="yesterday")


def test_sensors_see_a_change_after_new_rows(refreshed: Refreshed) -> None:
    from airflow_partitions.sensors import SourceChangeSensor

    append_sales(refreshed.sales, rows=6, days=1, regions=("EU", "NEW"), name="late.parquet")
    result = SourceChangeSensor(task_id="wait", spec_path=refreshed.spec, dataset="sales").poke(context())
    assert result.is_done is True
    assert "region=NEW/day=2026-01-01T00%3A00%3A00" in result.xcom_value["changed"]


@pytest.mark.slow
def test_deferred_sensor_resumes_when_its_trigger_fires(tmp_path: Path, refreshed: Refreshed) -> None:
    """Defer, run the trigger (dag.test runs it inline), resume: the whole deferral cycle in Airflow."""
    import textwrap
    import threading

    from airflow.dag_processing.dagbag import DagBag
    from airflow_e2e.metadata_db import in_process_metadata_db

    from airflow_partitions.refresh import refresh_dataset

    dags = tmp_path / "dags"
    dags.mkdir()
    moment = dt.datetime.now(dt.UTC).isoformat()
    (dags / "wait_for_fresh_eu.py").write_text(
        textwrap.dedent(
            f"""\
            from airflow.sdk import DAG
            from airflow_partitions.sensors import PartitionFreshnessSensor

            with DAG("wait_for_fresh_eu", schedule=None):
                PartitionFreshnessSensor(
                    task_id="eu_fresh",
                    spec_path={str(refreshed.spec)!r},
                    dataset="sales",
                    where="region = 'EU'",
                    refreshed_after={moment!r},
                    deferrable=True,
                    poke_interval=0.5,
                    timeout=300,
                )
            """
        )
    )
    seen: dict[str, bool] = {}

    def refresh_once_deferred(database: Any) -> None:
        # Refresh only while the sensor's trigger runs, so the trigger (not a poke) sees the new partitions.
        # dag.test() runs the trigger inline with the task back in `queued` after it has started.
        deadline = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=3)
        while dt.datetime.now(dt.UTC) < deadline:
            with database.connect() as conn:
                waiting = conn.execute(
                    "SELECT count(*) FROM task_instance WHERE task_id = 'eu_fresh' AND state = 'queued' "
                    "AND start_date IS NOT NULL"
                ).fetchone()[0]
            if waiting:
                seen["deferred"] = True
                break
            threading.Event().wait(0.1)
        # Refresh even after the deadline, so a broken deferral fails the assertion instead of hanging.
        refresh_dataset(str(refreshed.spec), "sales", where="region = 'EU'", full=True)

    with in_process_metadata_db(str(dags)) as database:
        dag = DagBag(dag_folder=str(dags)).dags["wait_for_fresh_eu"]
        refresher = threading.Thread(target=refresh_once_deferred, args=(database,))
        refresher.start()
        run = dag.test()
        refresher.join()
        with database.connect() as conn:
            (value,) = conn.execute(
                "SELECT value FROM xcom WHERE run_id = %s AND task_id = 'eu_fresh'", (run.run_id,)
            ).fetchone()
    assert seen.get("deferred"), "the sensor deferred to its trigger"
    assert str(run.state) == "success"
    assert value["fresh"] is True
    assert value["stale"] == []
    # The refresh ran only once the task was deferred: the trigger saw it and the task resumed.
    assert value["refreshed_after"] == moment
    assert value["selected"] == 2
