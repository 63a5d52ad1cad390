"""The refresh DAG on a real Spark standalone cluster (a master and two workers on loopback).

Every run is `airflow dags test` (the DAG's `dag.test()`) in a new process on a fresh, migrated Postgres
metadata database, with the example DAG file users deploy; only connections and configuration differ:

* a `spark` connection whose master is the cluster's `spark://` URL (spark-submit, client deploy mode),
  with a worker killed (with its executor) while the stage job's task runs on it: nothing half
  published, and the data is exactly the source's whether Spark finished the job on the other worker or
  the run failed and a rerun did it;
* a `spark_connect` connection to a Spark Connect server whose master is the cluster;
* a master nobody listens on: a typed error naming it and saying how to fix it, nothing published.

The source holds NULLs in every column (the partition column too), unicode, `/ = %`, quotes and empty
strings. Each run must commit every partition, and a full read must equal the source row by row (hashes).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from airflow_e2e.sample import EXAMPLE_DAG_FILE
from airflow_e2e.spark_cluster import REPO_ROOT, SparkCluster
from airflow_e2e.stack import AirflowStack, airflow_executable

pytestmark = [
    pytest.mark.airflow,
    pytest.mark.spark,
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.scale,
    # A hung Spark job must fail the test, not the whole run.
    pytest.mark.timeout(600),
]

# Few partitions (3 regions x 2 buckets): every run's partition tasks are most of its time.
REGIONS: tuple[str | None, ...] = ("a/b=c 50% O'Brien Zürich", "", None)
NOTES: tuple[str | None, ...] = ("x=1/y", "ünï", "", None, "'quoted'", "%41")
BUCKETS = 2
ROWS = 120
SUBMIT_CONN_ID = "spark_cluster"
CONNECT_CONN_ID = "spark_cluster_connect"
UNREACHABLE_CONN_ID = "spark_nowhere"
DATASETS = ("events_submit", "events_connect", "events_unreachable")
SLOW_DAG_ID = "refresh_events_submit_slow_start"

# A PySpark daemon (`spark.python.daemon.module`) whose first start anywhere in the cluster waits: the
# stage job's first Python task is then certainly running on a known executor when the test kills it.
SLOW_DAEMON = '''"""PySpark's daemon: the first one started waits (5 min at most; until its executor dies)."""
import os
import time

CLAIM = {claim!r}
try:
    fd = os.open(CLAIM + ".tmp-" + str(os.getpid()), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    os.link(CLAIM + ".tmp-" + str(os.getpid()), CLAIM)
except FileExistsError:
    pass
else:
    parent = os.getppid()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and os.getppid() == parent:
        time.sleep(0.2)

from pyspark.daemon import manager

if __name__ == "__main__":
    manager()
'''

SLOW_DAG = '''"""events_submit whose first Python task waits: a test kills the worker running it."""

from airflow_partitions.dag_factory import build_refresh_dag, default_spec_path
from airflow_partitions.spec import load_spec

project = load_spec(default_spec_path(__file__), check_types=False)
dag = build_refresh_dag(
    project,
    "events_submit",
    dag_id={dag_id!r},
    spark_conf={{
        "spark.python.daemon.module": "slow_first_daemon",
        "spark.executorEnv.PYTHONPATH": {python_path!r},
    }},
)
'''


@dataclass
class Deployment:
    stack: AirflowStack
    spec_path: Path
    source: Path
    gate_dir: Path

    def run(self, dag_id: str, env: dict[str, str], conf: dict[str, Any] | None = None) -> str:
        """`airflow dags test` of `dag_id`; its output (whatever the run's outcome)."""
        result = subprocess.run(
            [airflow_executable(), "dags", "test", dag_id, "--conf", json.dumps(conf or {})],
            env={**self.stack.environment(), **env},
            cwd=self.stack.home,
            capture_output=True,
            text=True,
            timeout=540,
            check=False,
        )
        return result.stdout + result.stderr

    def run_state(self, dag_id: str) -> str:
        ((state,),) = self.stack.query(
            "SELECT state FROM dag_run WHERE dag_id = %s ORDER BY id DESC LIMIT 1", (dag_id,)
        )
        return str(state)

    def task_states(self, dag_id: str) -> dict[str, list[str]]:
        """task_id -> states of its instances in the newest run of `dag_id`."""
        states: dict[str, list[str]] = {}
        for task_id, state in self.stack.query(
            "SELECT task_id, state FROM task_instance WHERE run_id = (SELECT run_id FROM dag_run WHERE "
            "dag_id = %s ORDER BY id DESC LIMIT 1) AND dag_id = %s ORDER BY task_id, map_index",
            (dag_id, dag_id),
        ):
            states.setdefault(task_id, []).append(str(state))
        return states

    def stage_result(self, dag_id: str) -> dict[str, Any]:
        ((value,),) = self.stack.query(
            "SELECT value FROM xcom WHERE dag_id = %s AND task_id = 'stage' AND key = 'return_value' "
            "ORDER BY run_id DESC LIMIT 1",
            (dag_id,),
        )
        return dict(value if not isinstance(value, str) else json.loads(value))

    def catalog_version(self, dataset: str) -> int | None:
        from airflow_partitions.spec import load_spec
        from airflow_partitions.table import open_handle

        project = load_spec(self.spec_path)
        snapshot = open_handle(project, project.dataset(dataset)).catalog.latest()
        return None if snapshot is None else snapshot.version


def write_source(directory: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True)
    ids = list(range(ROWS))
    table = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "region": pa.array([REGIONS[i % len(REGIONS)] for i in ids], pa.string()),
            "amount": pa.array([None if i % 7 == 0 else i * 0.25 - 3 for i in ids], pa.float64()),
            "note": pa.array([NOTES[i % len(NOTES)] for i in ids], pa.string()),
        }
    )
    # Two files: the stage job reads them as more than one task.
    pq.write_table(table.slice(0, ROWS // 2), directory / "events-0.parquet")
    pq.write_table(table.slice(ROWS // 2), directory / "events-1.parquet")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    import shutil

    root = tmp_path_factory.mktemp("spark-cluster-dags")
    write_source(root / "events")
    gate_dir = root / "gate"
    gate_dir.mkdir()
    (gate_dir / "slow_first_daemon.py").write_text(SLOW_DAEMON.format(claim=str(gate_dir / "claimed")))
    dags = root / "dags"
    dags.mkdir()
    shutil.copy(EXAMPLE_DAG_FILE, dags / EXAMPLE_DAG_FILE.name)
    (dags / "refresh_events_submit_slow.py").write_text(
        SLOW_DAG.format(dag_id=SLOW_DAG_ID, python_path=os.pathsep.join([str(gate_dir), str(REPO_ROOT)]))
    )
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
        f"accelerator_dir: {root / 'acc'}\ndatasets:\n"
        + "".join(f"  - name: {d}\n{dataset}" for d in DATASETS)
    )
    stack = AirflowStack(home=root / "airflow", dags_folder=dags)
    stack.prepare()
    try:
        yield Deployment(stack, spec_path, root / "events", gate_dir)
    finally:
        stack.stop()


def cluster_env(conn_id: str, connection: dict[str, Any]) -> dict[str, str]:
    """What a deployment sets to send every refresh DAG to a Spark connection, kept on loopback."""
    return {
        f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps(connection),
        "AIRFLOW__AIRFLOW_PARTITIONS__SPARK_CONN_ID": conn_id,
        # The driver's address executors call back on: loopback, like the cluster's nodes.
        "SPARK_LOCAL_IP": "127.0.0.1",
    }


def submit_connection(master_url: str) -> dict[str, Any]:
    host, _, port = master_url.rpartition(":")
    return {"conn_type": "spark", "host": host, "port": int(port), "extra": {"deploy-mode": "client"}}


def assert_source_committed(deployment: Deployment, dataset: str) -> None:
    """Every partition is in the newest version, and a full read equals the source by row hash."""
    import pyarrow.parquet as pq
    from matrix_support import multiset_difference

    from airflow_partitions.hooks.partitioned_dataset import PartitionedDatasetHook

    source = pq.read_table(deployment.source)
    hook = PartitionedDatasetHook(dataset=dataset, spec_path=str(deployment.spec_path))
    try:
        plan = hook.plan()
        assert plan.total == len(REGIONS) * BUCKETS, "every (region, bucket) partition committed"
        got = hook.read(columns=source.column_names)
        missing, extra = multiset_difference(got.select(source.column_names), source)
        assert (missing, extra) == ([], []), f"rows missing: {missing[:5]}; rows too many: {extra[:5]}"
        assert got.num_rows == ROWS
        # A pruned read of the NULL region opens only its partitions and returns exactly its rows.
        nulls = hook.read("region IS NULL", columns=["id", "region"])
        assert sorted(nulls["id"].to_pylist()) == [
            i for i in range(ROWS) if REGIONS[i % len(REGIONS)] is None
        ]
        assert len(hook.plan("region IS NULL").selected) == BUCKETS
    finally:
        hook.close()


def app_named(cluster: SparkCluster, name: str, known: set[str]) -> dict[str, Any]:
    """The one application called `name` the master registered that is not in `known`."""
    apps = [a for a in cluster.apps() if a["name"] == name and a["id"] not in known]
    assert len(apps) == 1, f"expected one new {name!r} application at the master, got {apps}"
    return apps[0]


def test_refresh_dag_on_cluster_through_spark_connect(
    deployment: Deployment, spark_cluster: SparkCluster, tmp_path: Path
) -> None:
    from airflow_e2e.spark_connect import running_connect_server

    known = {a["id"] for a in spark_cluster.apps()}
    # The server is an application of the cluster holding its executors while it runs: this test's own.
    with running_connect_server(
        tmp_path / "connect.log", master=spark_cluster.master_url, extra_env={"SPARK_LOCAL_IP": "127.0.0.1"}
    ) as (host, port):
        env = cluster_env(CONNECT_CONN_ID, {"conn_type": "spark_connect", "host": host, "port": port})
        output = deployment.run("refresh_events_connect", env)
        (server,) = [a for a in spark_cluster.apps() if a["id"] not in known]
        assert server["state"] == "RUNNING"

    states = deployment.task_states("refresh_events_connect")
    assert deployment.run_state("refresh_events_connect") == "success", (states, output[-4000:])
    assert states["stage"] == ["success"]
    assert states["partition.refresh"] == ["success"] * (len(REGIONS) * BUCKETS)
    assert deployment.stage_result("refresh_events_connect")["spark"] == "spark_connect"
    assert_source_committed(deployment, "events_connect")
    assert spark_cluster.tasks_run_by(server["id"]) > 0, "the Connect server's work ran on the workers"


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port bound but not listening: connections to it are refused, and no one can take it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


def test_unreachable_master_fails_with_its_url_and_publishes_nothing(
    deployment: Deployment, closed_port: int
) -> None:
    master = f"spark://127.0.0.1:{closed_port}"
    env = cluster_env(UNREACHABLE_CONN_ID, submit_connection(master))
    output = deployment.run("refresh_events_unreachable", env)

    states = deployment.task_states("refresh_events_unreachable")
    assert deployment.run_state("refresh_events_unreachable") == "failed", states
    assert states["stage"] == ["failed"]
    assert "commit" not in states or states["commit"] != ["success"]
    assert "SparkUnreachableError" in output, output[-4000:]
    assert f"cannot reach the Spark master {master} (from connection {UNREACHABLE_CONN_ID!r})" in output
    assert "spark-class org.apache.spark.deploy.master.Master" in output, "says how to fix it"
    assert "spark_master_timeout" in output
    assert deployment.catalog_version("events_unreachable") is None, "nothing was published"


def _ancestors(pid: int) -> list[int]:
    """`pid`, its parent, its parent's parent... (Linux /proc)."""
    chain = []
    while pid > 1:
        chain.append(pid)
        stat = Path(f"/proc/{pid}/stat").read_text()
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return chain


def test_refresh_dag_on_cluster_through_spark_submit_losing_a_worker_mid_stage(
    deployment: Deployment, spark_cluster: SparkCluster
) -> None:
    """spark-submit (client mode) to the cluster's master; while the stage job's first Python task runs,
    the worker running it is killed with its executor. Spark may run the task again on the other worker
    (the run succeeds) or the run fails and publishes nothing, and a rerun succeeds: either way every
    partition ends up committed once, with exactly the source's rows. One run covers both the plain
    spark-submit path and the lost worker (each DAG run costs a driver JVM and every partition task)."""
    master = spark_cluster.master_url
    known = {a["id"] for a in spark_cluster.apps()}
    env = cluster_env(SUBMIT_CONN_ID, submit_connection(master))
    claim = deployment.gate_dir / "claimed"
    before = deployment.catalog_version("events_submit")
    outputs: list[str] = []
    run = threading.Thread(target=lambda: outputs.append(deployment.run(SLOW_DAG_ID, env)))
    run.start()
    try:
        deadline = time.monotonic() + 300
        while not claim.exists():
            assert run.is_alive(), f"the run ended before its first task started: {''.join(outputs)[-4000:]}"
            assert time.monotonic() < deadline, "the stage job's first Python task never started"
            time.sleep(0.2)
        chain = _ancestors(int(claim.read_text()))
        workers = {w.process.pid: w for w in spark_cluster.workers}
        (killed,) = [workers[pid] for pid in chain if pid in workers]
        # The waiting daemon, its executor JVM and the worker JVM that launched it; then a new worker.
        for pid in chain[: chain.index(killed.process.pid) + 1]:
            os.kill(pid, signal.SIGKILL)
        killed.process.wait(timeout=30)
        spark_cluster.start_worker(killed.index)
    finally:
        run.join(timeout=540)
    assert not run.is_alive(), "the run did not end after its worker was lost"
    spark_cluster.wait_for_workers(2)
    output = "".join(outputs)

    dag_id = SLOW_DAG_ID
    if deployment.run_state(SLOW_DAG_ID) != "success":
        assert deployment.run_state(SLOW_DAG_ID) == "failed", output[-4000:]
        assert deployment.catalog_version("events_submit") == before, "nothing of the lost run published"
        dag_id = "refresh_events_submit"
        output = deployment.run(dag_id, env)
    else:
        stage_app = app_named(spark_cluster, "airflow-partitions-stage-events_submit", known)
        logs = "".join(p.read_text(errors="replace") for p in spark_cluster.executor_logs(stage_app["id"]))
        assert re.search(r"Running task \d+\.1 in stage", logs), "the lost task ran again elsewhere"

    states = deployment.task_states(dag_id)
    assert deployment.run_state(dag_id) == "success", (states, output[-4000:])
    assert states["stage"] == ["success"]
    assert states["partition.refresh"] == ["success"] * (len(REGIONS) * BUCKETS)
    assert states["commit"] == ["success"]
    stage = deployment.stage_result(dag_id)
    assert stage["spark"] == master, "the stage job's master is the cluster"
    assert "/submit-" in stage["location"], "written by the spark-submit job"
    assert deployment.catalog_version("events_submit") == (before or 0) + 1, "one version, published once"
    assert_source_committed(deployment, "events_submit")
    # The master ran the job as an application, and the workers' executors ran its tasks.
    apps = [a for a in spark_cluster.apps() if a["name"] == "airflow-partitions-stage-events_submit"]
    assert sum(spark_cluster.tasks_run_by(a["id"]) for a in apps if a["id"] not in known) > 0
