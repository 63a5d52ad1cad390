"""The refresh DAGs run end to end on each Spark deployment mode, selected by configuration only.

Every run is `airflow dags test` in a new process on a fresh, migrated Postgres metadata database, with
the example DAG file users deploy. Only the environment differs, as in a deployment:

* Spark Connect: a real Connect server (its own JVM, `local[2]`) and a `spark_connect` connection. The
  runs have `SPARK_HOME` pointing at an empty directory, so a classic in-process JVM could not start: the
  Spark work can only have gone through the server.
* spark-submit: a `spark` connection whose master is `local[2]`. The runs have `AP_SPARK_MASTER` set to a
  master Spark rejects, so an in-process session could not start either.

The source has partition values that are hard to carry through paths, URLs and JSON (`/`, `=`, `%`, a
quote, unicode, an empty string, NULL); every run must commit every row to exactly its partition.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from airflow_e2e.sample import EXAMPLE_DAG_FILE
from airflow_e2e.stack import AirflowStack

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.postgres, pytest.mark.slow]

REGIONS: tuple[str | None, ...] = ("a/b=c", "50% off", "O'Brien", "Zürich", "", None)
BUCKETS = 2
ROWS = 240
CONNECT_CONN_ID = "spark_connect_test"
SUBMIT_CONN_ID = "spark_local2"

PER_PARTITION_DAG = '''"""events_connect without a shared stage: each partition task stages itself."""

from airflow_partitions.dag_factory import build_refresh_dag, default_spec_path
from airflow_partitions.spec import load_spec

project = load_spec(default_spec_path(__file__), check_types=False)
dag = build_refresh_dag(project, "events_connect", stage=False, dag_id="refresh_events_connect_per_partition")
'''


@dataclass
class Deployment:
    stack: AirflowStack
    spec_path: Path

    def xcom(self, dag_id: str, task_id: str) -> list[Any]:
        rows = self.stack.query(
            "SELECT value FROM xcom WHERE dag_id = %s AND task_id = %s AND key = 'return_value' "
            "ORDER BY map_index",
            (dag_id, task_id),
        )
        return [value if not isinstance(value, str) else json.loads(value) for (value,) in rows]

    def task_states(self, dag_id: str) -> dict[str, list[str]]:
        """task_id -> states of its instances (one per mapped partition) in the DAG's runs."""
        states: dict[str, list[str]] = {}
        for task_id, state in self.stack.query(
            "SELECT task_id, state FROM task_instance WHERE dag_id = %s ORDER BY task_id, map_index",
            (dag_id,),
        ):
            states.setdefault(task_id, []).append(state)
        return states

    def hook(self, dataset: str) -> Any:
        from airflow_partitions.hooks.partitioned_dataset import PartitionedDatasetHook

        return PartitionedDatasetHook(dataset=dataset, spec_path=str(self.spec_path))


def write_events(directory: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True)
    ids = list(range(ROWS))
    pq.write_table(
        pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "region": pa.array([REGIONS[i % len(REGIONS)] for i in ids], pa.string()),
                "amount": pa.array([float(i % 50) for i in ids], pa.float64()),
            }
        ),
        directory / "events-0.parquet",
    )


def expected_rows() -> list[tuple[int, str | None]]:
    return [(i, REGIONS[i % len(REGIONS)]) for i in range(ROWS)]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    import shutil

    root = tmp_path_factory.mktemp("spark-modes")
    write_events(root / "events")
    dags = root / "dags"
    dags.mkdir()
    shutil.copy(EXAMPLE_DAG_FILE, dags / EXAMPLE_DAG_FILE.name)
    (dags / "refresh_events_per_partition.py").write_text(PER_PARTITION_DAG)
    dataset = (
        "    from: file:{src}/\n"
        "    params: {{file_format: parquet}}\n"
        "    acceleration:\n"
        "      engine: parquet\n"
        "      partition_by:\n"
        "        - region: region\n"
        f"        - b: 'bucket({BUCKETS}, id)'\n"
    ).format(src=root / "events")
    spec_path = dags / "datasets.yaml"
    spec_path.write_text(
        f"accelerator_dir: {root / 'acc'}\n"
        "datasets:\n"
        f"  - name: events_connect\n{dataset}"
        f"  - name: events_submit\n{dataset}"
    )
    stack = AirflowStack(home=root / "airflow", dags_folder=dags)
    stack.prepare()
    try:
        yield Deployment(stack, spec_path)
    finally:
        stack.stop()


def assert_every_row_in_its_partition(deployment: Deployment, dataset: str) -> None:
    hook = deployment.hook(dataset)
    try:
        table = hook.read(columns=["id", "region"])
        got = sorted(zip(table["id"].to_pylist(), table["region"].to_pylist(), strict=True))
        assert got == expected_rows(), "every source row, once, with its region unchanged"
        assert hook.plan().total == len(REGIONS) * BUCKETS
        # A pruned read of each hard value opens only that region's partitions and returns only its rows.
        for region in REGIONS:
            where = "region IS NULL" if region is None else [[("region", "=", region)]]
            plan = hook.plan(where)
            assert len(plan.selected) == BUCKETS, (region, plan.explain())
            rows = hook.read(where, columns=["id", "region"])
            assert set(rows["region"].to_pylist()) == {region}
            assert rows.num_rows == sum(1 for _, r in expected_rows() if r == region)
    finally:
        hook.close()


def test_refresh_dags_through_spark_connect(
    deployment: Deployment, spark_connect_server: dict[str, Any], tmp_path: Path
) -> None:
    no_spark_home = tmp_path / "no-spark-home"
    no_spark_home.mkdir()
    env = {
        f"AIRFLOW_CONN_{CONNECT_CONN_ID.upper()}": json.dumps(
            {
                "conn_type": "spark_connect",
                "host": spark_connect_server["host"],
                "port": spark_connect_server["port"],
            }
        ),
        "AIRFLOW__AIRFLOW_PARTITIONS__SPARK_CONN_ID": CONNECT_CONN_ID,
        "SPARK_HOME": str(no_spark_home),
    }

    # The example DAG file, unchanged: one Connect stage, then one finalize task per partition.
    deployment.stack.dags_test("refresh_events_connect", env=env)
    states = deployment.task_states("refresh_events_connect")
    assert states["partition.refresh"] == ["success"] * (len(REGIONS) * BUCKETS)
    assert states["stage"] == ["success"]
    assert states["commit"] == ["success"]
    (stage,) = deployment.xcom("refresh_events_connect", "stage")
    assert stage["spark"] == "spark_connect"
    assert stage["partitions"] == len(REGIONS) * BUCKETS
    assert_every_row_in_its_partition(deployment, "events_connect")

    # Without a shared stage every mapped partition task runs its own Spark job on the Connect server.
    run = deployment.stack.dags_test("refresh_events_connect_per_partition", {"full_refresh": True}, env=env)
    states = deployment.task_states("refresh_events_connect_per_partition")
    assert "stage" not in states
    assert states["partition.refresh"] == ["success"] * (len(REGIONS) * BUCKETS)
    output = run.stdout + run.stderr
    assert output.count("of events_connect with Spark (spark_connect)") == len(REGIONS) * BUCKETS, output[
        -3000:
    ]
    from airflow_partitions.spec import load_spec
    from airflow_partitions.table import open_handle

    project = load_spec(deployment.spec_path)
    snapshot = open_handle(project, project.dataset("events_connect")).catalog.snapshot()
    assert snapshot.version == 2, "the full refresh committed a second version"
    assert_every_row_in_its_partition(deployment, "events_connect")


def test_refresh_dag_through_spark_submit(deployment: Deployment) -> None:
    env = {
        f"AIRFLOW_CONN_{SUBMIT_CONN_ID.upper()}": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "AIRFLOW__AIRFLOW_PARTITIONS__SPARK_CONN_ID": SUBMIT_CONN_ID,
        # An in-process session would start with this master and fail; spark-submit's job ignores it.
        "AP_SPARK_MASTER": "no-such-master://in-process-spark-must-not-start",
    }
    deployment.stack.dags_test("refresh_events_submit", env=env)
    states = deployment.task_states("refresh_events_submit")
    assert states["stage"] == ["success"]
    assert states["commit"] == ["success"]
    assert states["partition.refresh"] == ["success"] * (len(REGIONS) * BUCKETS)
    (stage,) = deployment.xcom("refresh_events_submit", "stage")
    assert stage["spark"] == "local[2]", "the submitted job ran on the connection's master"
    assert "/submit-" in stage["location"], "the stage was written by the spark-submit job"
    assert_every_row_in_its_partition(deployment, "events_submit")
