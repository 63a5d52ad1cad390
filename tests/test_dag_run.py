"""The example DAG file run with `dag.test()`: real local Spark, a moto S3 server, files and Postgres.

One metadata database (Postgres) and one copy of the example DAG file serve the module; the scenario
test runs the refresh DAG repeatedly and checks what each run left behind: catalog versions, uploaded
snapshots with their checksums, asset events with partition keys, and pruned reads.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from airflow_e2e.metadata_db import MetadataDatabase, create_database, drop_database, in_process_metadata_db
from airflow_e2e.sample import append_sales, create_orders, install_example_dag, sample_spec, write_sales

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.s3, pytest.mark.postgres, pytest.mark.slow]

AWS_CONN_ENV = "AIRFLOW_CONN_AWS_DEFAULT"
ORDERS_CONN_ID = "orders_pg"


@dataclass
class Deployment:
    """What the module's DAG runs work on."""

    root: Path
    dags_dir: Path
    spec_path: Path
    sales_dir: Path
    bucket: str
    s3: dict[str, str]
    metadata: MetadataDatabase
    dags: dict[str, Any]

    def run(self, dag_id: str, conf: dict[str, Any] | None = None) -> Any:
        """One `dag.test()` run with a full conf, as the UI's trigger form sends it.

        Every key is sent: `dag.test()` runs tasks in this process on the same DAG object, and a key left
        out could otherwise keep the value an earlier run's conf gave it.
        """
        from airflow_partitions.operators.run_conf import RefreshRunConf

        full = {**RefreshRunConf().to_conf(), **(conf or {})}
        return self.dags[dag_id].test(run_conf=full)

    def catalog(self, dataset: str) -> Any:
        from airflow_partitions.spec import load_spec
        from airflow_partitions.table import open_handle

        project = load_spec(self.spec_path)
        return open_handle(project, project.dataset(dataset)).catalog

    def asset_events(self, asset_name: str) -> list[tuple[str | None, dict[str, Any]]]:
        with self.metadata.connect() as conn:
            rows = conn.execute(
                "SELECT e.partition_key, e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id "
                "WHERE a.name = %s ORDER BY e.id",
                (asset_name,),
            ).fetchall()
        return [(key, extra if isinstance(extra, dict) else json.loads(extra or "{}")) for key, extra in rows]


def readable(key_path: str) -> str:
    """The readable label of a canonical key string (what a mapped refresh task shows)."""
    from airflow_partitions.keys import NULL_MARKER, unescape_component

    parts = (part.partition("=") for part in key_path.split("/"))
    return "/".join(
        f"{name}={value if value == NULL_MARKER else unescape_component(value)}" for name, _, value in parts
    )


def airflow_key(key_path: str) -> str:
    """The Airflow partition key (composite convention) of a canonical key string of plain values."""
    from airflow_partitions.keys import unescape_component

    return "|".join(unescape_component(part.partition("=")[2]) for part in key_path.split("/"))


def task_states(run: Any) -> dict[tuple[str, int], tuple[str | None, str | None]]:
    """(task_id, map_index) -> (state, rendered map index) of a finished run."""
    return {
        (ti.task_id, ti.map_index): (str(ti.state) if ti.state else None, ti.rendered_map_index)
        for ti in run.get_task_instances()
    }


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory, s3_server: dict[str, str]) -> Iterator[Deployment]:
    import boto3

    root = tmp_path_factory.mktemp("dagrun")
    sales_dir = root / "sales"
    write_sales(sales_dir, rows=180, days=3)
    source_db = create_database("ap_orders")
    create_orders(source_db.libpq_url, rows=120)
    bucket = "ap-dagrun-snapshots"
    boto3.client("s3", **s3_server).create_bucket(Bucket=bucket)
    spec_path = install_example_dag(
        root / "dags",
        sample_spec(
            accelerator_dir=root / "acc",
            sales_dir=sales_dir,
            orders_connection_id=ORDERS_CONN_ID,
            snapshot_location=f"s3://{bucket}/accel",
        ),
    )
    saved = {key: os.environ.get(key) for key in (AWS_CONN_ENV, f"AIRFLOW_CONN_{ORDERS_CONN_ID.upper()}")}
    os.environ[AWS_CONN_ENV] = json.dumps(
        {
            "conn_type": "aws",
            "login": s3_server["aws_access_key_id"],
            "password": s3_server["aws_secret_access_key"],
            "extra": {"endpoint_url": s3_server["endpoint_url"], "region_name": s3_server["region_name"]},
        }
    )
    os.environ[f"AIRFLOW_CONN_{ORDERS_CONN_ID.upper()}"] = source_db.libpq_url
    try:
        with in_process_metadata_db(str(root / "dags")) as metadata:
            from airflow.dag_processing.dagbag import DagBag

            bag = DagBag(dag_folder=str(root / "dags"))
            assert bag.import_errors == {}, bag.import_errors
            yield Deployment(root, root / "dags", spec_path, sales_dir, bucket, s3_server, metadata, bag.dags)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        drop_database(source_db)


def test_refresh_dag_end_to_end(deployment: Deployment) -> None:
    import boto3

    from airflow_partitions.hooks.partitioned_dataset import PartitionedDatasetHook
    from airflow_partitions.snapshots.layout import SHA256_METADATA_KEY, SnapshotLayout
    from airflow_partitions.snapshots.manifest import read_snapshot_manifest

    # --- first run: every partition is new ---------------------------------------------------------
    run = deployment.run("refresh_sales")
    states = task_states(run)
    assert str(run.state) == "success", states
    assert states[("bootstrap_snapshot", -1)][0] == "skipped", "no snapshot published yet: nothing to hydrate"
    refreshed = {k[1]: v for k, v in states.items() if k[0] == "partition.refresh"}
    assert len(refreshed) == 9, "3 regions x 3 days"
    assert all(state == "success" for state, _ in refreshed.values())
    catalog = deployment.catalog("sales")
    snapshot = catalog.latest()
    assert snapshot is not None
    assert snapshot.version == 1
    key_paths = set(snapshot.partitions)
    labels = {path: readable(path) for path in key_paths}
    assert {label for _, label in refreshed.values()} == set(labels.values()), "labelled by readable key"
    assert labels["region=EU/day=2026-01-01T00%3A00%3A00"] == "region=EU/day=2026-01-01T00:00:00"
    assert sum(snapshot.partitions[p].rows for p in key_paths) == 180
    assert all(snapshot.partitions[p].rows == 20 for p in key_paths)
    assert states[("commit", -1)][0] == "success"
    assert states[("publish_snapshot", -1)][0] == "success"

    # --- snapshots: every file uploaded with its checksum, the version's manifest published ---------
    client = boto3.client("s3", **deployment.s3)
    layout = SnapshotLayout.of(f"s3://{deployment.bucket}/accel", "sales")
    for key_path in key_paths:
        for data_file in snapshot.partitions[key_path].files:
            obj = client.get_object(Bucket=deployment.bucket, Key=layout.data_key(data_file.path))
            body = obj["Body"].read()
            assert hashlib.sha256(body).hexdigest() == data_file.checksum, f"{data_file.path} content"
            assert obj["Metadata"][SHA256_METADATA_KEY] == data_file.checksum
    manifest = read_snapshot_manifest(deployment.s3, f"s3://{deployment.bucket}/accel", "sales")
    assert manifest is not None
    assert manifest.version == 1
    assert {e.key_path for e in manifest.entries} == key_paths

    # --- asset events: one per refreshed partition, keyed by the partition -------------------------
    events = deployment.asset_events("sales")
    assert {key for key, _ in events} == {airflow_key(path) for path in key_paths}
    assert "EU|2026-01-01T00:00:00" in {key for key, _ in events}, "Airflow's composite-key convention"
    assert all(extra["version"] == 1 and extra["dataset"] == "sales" for _, extra in events)

    # --- a pruned read through the hook afterwards opens only the EU partitions ----------------------
    hook = PartitionedDatasetHook(spec_path=str(deployment.spec_path), dataset="sales")
    plan = hook.plan("region = 'EU'")
    assert plan.total == 9
    assert len(plan.selected) == 3, "Should read only region=EU (3 of 9 partitions)"
    table = hook.read("region = 'EU'")
    assert table.num_rows == 60
    assert set(table.column("region").to_pylist()) == {"EU"}

    # --- nothing changed: the run succeeds, skips its work, commits nothing ------------------------
    run = deployment.run("refresh_sales")
    states = task_states(run)
    assert str(run.state) == "success", states
    assert states[("commit", -1)][0] == "skipped"
    assert states[("publish_snapshot", -1)][0] == "skipped"
    assert all(
        state == "skipped" for (task, _), (state, _) in states.items() if task.startswith("partition.")
    )
    assert catalog.latest().version == 1, "no new catalog version"
    assert len(deployment.asset_events("sales")) == len(events), "no asset event without a commit"

    # --- params as the trigger form sends them: a where filter, forced, without snapshots ----------
    run = deployment.run("refresh_sales", {"where": "region = 'EU'", "full_refresh": True, "snapshot": False})
    states = task_states(run)
    assert str(run.state) == "success", states
    eu = {label for (task, _), (_, label) in states.items() if task == "partition.refresh"}
    assert eu == {labels[p] for p in key_paths if p.startswith("region=EU/")}
    assert all(
        state == "skipped" for (task, _), (state, _) in states.items() if task == "partition.upload_snapshot"
    ), "param snapshot=false skips uploads"
    assert states[("publish_snapshot", -1)][0] == "skipped"
    after = catalog.latest()
    assert after.version == 2
    changed = {
        p for p in key_paths if after.partitions[p].refreshed_at != snapshot.partitions[p].refreshed_at
    }
    assert {labels[p] for p in changed} == eu, "only the filtered partitions were rewritten"
    new_events = deployment.asset_events("sales")[len(events) :]
    assert {key for key, _ in new_events} == {airflow_key(p) for p in changed}
    assert read_snapshot_manifest(deployment.s3, f"s3://{deployment.bucket}/accel", "sales").version == 1

    # --- new source rows: the changed partitions are refreshed, the snapshot catches up ------------
    append_sales(deployment.sales_dir, rows=30, days=1, regions=("US", "NEW"), name="sales-1.parquet")
    run = deployment.run("refresh_sales")
    states = task_states(run)
    assert str(run.state) == "success", states
    latest = catalog.latest()
    assert latest.version == 3
    assert "region=NEW/day=2026-01-01T00%3A00%3A00" in latest.partitions
    assert sum(latest.partitions[p].rows for p in latest.partitions) == 210
    manifest = read_snapshot_manifest(deployment.s3, f"s3://{deployment.bucket}/accel", "sales")
    assert manifest is not None
    assert manifest.version == 3, "publish uploads files a snapshot=false run skipped"


def test_postgres_source_dag(deployment: Deployment) -> None:
    from airflow_partitions.hooks.partitioned_dataset import PartitionedDatasetHook

    run = deployment.run("refresh_orders")
    states = task_states(run)
    assert str(run.state) == "success", states
    labels = {label for (task, _), (_, label) in states.items() if task == "partition.refresh"}
    assert labels == {f"amount_band={band}" for band in (0, 1000, 2000, 3000)}
    snapshot = deployment.catalog("orders").latest()
    assert snapshot is not None
    assert sum(e.rows for e in (snapshot.partitions[p] for p in snapshot.partitions)) == 120
    assert {key for key, _ in deployment.asset_events("orders")} == {
        label.removeprefix("amount_band=") for label in labels
    }, "a one-field key is the value alone"
    hook = PartitionedDatasetHook(spec_path=str(deployment.spec_path), dataset="orders")
    plan = hook.plan("amount >= 1000 AND amount < 2000")
    assert [s.key_path for s in plan.selected] == ["amount_band=1000"], "Should read only the 1000 band"
    rows = hook.read("amount >= 1000 AND amount < 2000").column("amount").to_pylist()
    counted = hook.query("SELECT count(*) AS n FROM orders WHERE amount >= 1000 AND amount < 2000")
    assert counted.column("n").to_pylist() == [len(rows)]
    assert rows
    assert all(1000 <= amount < 2000 for amount in rows)
