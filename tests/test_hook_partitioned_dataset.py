"""PartitionedDatasetHook: a real Airflow hook over the reader; cheap to import, no I/O until used."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from test_pruning_support import Acceleration, build_acceleration, sort_rows

from airflow_partitions.exceptions import OrchestrationError, SpecValidationError, UnsafeQueryError
from airflow_partitions.hooks.partitioned_dataset import PartitionedDatasetHook


@pytest.fixture(scope="module")
def acceleration(tmp_path_factory: pytest.TempPathFactory) -> Acceleration:
    rows = 300
    table = pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "region": pa.array([["EU", "US", None][i % 3] for i in range(rows)], pa.string()),
            "ts": pa.array(
                [dt.datetime(2026, 1, 1) + dt.timedelta(hours=5 * i) for i in range(rows)], pa.timestamp("us")
            ),
        }
    )
    return build_acceleration(
        tmp_path_factory.mktemp("hook"), table, [("region", "region"), ("day", "date_trunc('day', ts)")]
    )


def test_importing_the_hook_loads_no_heavy_module() -> None:
    code = (
        "import sys, airflow_partitions.hooks.partitioned_dataset; "
        "print(sorted(m for m in ('pyarrow', 'duckdb', 'pyspark', 'pandas') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", (
        "DAG files import hooks: heavy modules must load on use"
    )


def test_hook_declares_its_connection_type() -> None:
    assert PartitionedDatasetHook.conn_type == "airflow_partitions"
    assert PartitionedDatasetHook.conn_name_attr == "partitions_conn_id"
    assert PartitionedDatasetHook.default_conn_name == "airflow_partitions_default"
    assert PartitionedDatasetHook.hook_name
    from airflow_partitions.provider_info import PARTITIONS_CONNECTION

    assert "extra" not in PARTITIONS_CONNECTION["ui-field-behaviour"]["hidden-fields"]


def test_building_the_hook_does_no_io(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "datasets.yaml"
    hook = PartitionedDatasetHook(dataset="events", spec_path=str(missing))
    assert "reader" not in hook.__dict__, "the reader is built on first use only"
    with pytest.raises(SpecValidationError, match="spec file not found"):
        hook.read()


def test_hook_delegates_to_the_reader(acceleration: Acceleration) -> None:
    hook = PartitionedDatasetHook(dataset="events", spec_path=str(acceleration.spec_path))
    try:
        where = "region = 'EU' AND ts < '2026-01-10'"
        plan = hook.plan(where)
        assert plan.total == len(acceleration.all_key_paths)
        assert all(p.key_path.startswith("region=EU/") for p in plan.selected)
        assert all(p.exact for p in plan.selected), "whole EU days before the 10th: no residual"
        result = hook.read(where, columns=["id"])
        assert sort_rows(result).equals(sort_rows(acceleration.expected_rows(where, ["id"])))
        counted = hook.query("SELECT count(*) AS n FROM events WHERE region = 'US'")
        assert counted.column("n")[0].as_py() == 100
        with pytest.raises(UnsafeQueryError):
            hook.query("DELETE FROM events")
    finally:
        hook.close()


def test_spec_path_can_come_from_the_connection(
    acceleration: Acceleration, monkeypatch: pytest.MonkeyPatch
) -> None:
    connection = {"conn_type": "airflow_partitions", "extra": {"spec_path": str(acceleration.spec_path)}}
    monkeypatch.setenv("AIRFLOW_CONN_AIRFLOW_PARTITIONS_DEFAULT", json.dumps(connection))
    hook = PartitionedDatasetHook(dataset="events")
    try:
        assert hook.read("region IS NULL", columns=["id"]).num_rows == 100
    finally:
        hook.close()


def test_missing_spec_and_connection_says_how_to_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_AIRFLOW_PARTITIONS_DEFAULT", raising=False)
    hook = PartitionedDatasetHook(dataset="events")
    with pytest.raises(OrchestrationError, match="pass spec_path"):
        hook.plan()


@pytest.mark.s3
def test_files_on_s3_use_the_aws_connection(
    acceleration: Acceleration,
    s3_server: dict[str, str],
    s3_bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import boto3

    client = boto3.client("s3", **s3_server)
    root = acceleration.root / acceleration.dataset
    for path in root.rglob("*.parquet"):
        client.upload_file(str(path), s3_bucket, f"lake/events/{path.relative_to(root).as_posix()}")
    aws: dict[str, Any] = {
        "conn_type": "aws",
        "login": s3_server["aws_access_key_id"],
        "password": s3_server["aws_secret_access_key"],
        "extra": {"endpoint_url": s3_server["endpoint_url"], "region_name": s3_server["region_name"]},
    }
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_S3", json.dumps(aws))
    partitions = {
        "conn_type": "airflow_partitions",
        "extra": {
            "spec_path": str(acceleration.spec_path),
            "data_root": f"s3://{s3_bucket}/lake/events",
            "aws_conn_id": "lake_s3",
        },
    }
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_EVENTS", json.dumps(partitions))
    hook = PartitionedDatasetHook(dataset="events", partitions_conn_id="lake_events")
    try:
        result = hook.read("region = 'EU' AND ts >= '2026-02-01'", columns=["id"])
    finally:
        hook.close()
    expected = acceleration.expected_rows("region = 'EU' AND ts >= '2026-02-01'", ["id"])
    assert sort_rows(result).equals(sort_rows(expected)), "the same rows, read from S3"


@pytest.mark.s3
def test_the_file_cache_is_set_from_the_connection(
    acceleration: Acceleration,
    s3_server: dict[str, str],
    s3_bucket: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    import boto3

    client = boto3.client("s3", **s3_server)
    root = acceleration.root / acceleration.dataset
    for path in root.rglob("*.parquet"):
        client.upload_file(str(path), s3_bucket, f"lake/events/{path.relative_to(root).as_posix()}")
    aws: dict[str, Any] = {
        "conn_type": "aws",
        "login": s3_server["aws_access_key_id"],
        "password": s3_server["aws_secret_access_key"],
        "extra": {"endpoint_url": s3_server["endpoint_url"], "region_name": s3_server["region_name"]},
    }
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_S3", json.dumps(aws))
    extra = {
        "spec_path": str(acceleration.spec_path),
        "data_root": f"s3://{s3_bucket}/lake/events",
        "aws_conn_id": "lake_s3",
        "cache_dir": str(tmp_path / "cache"),
        "cache_max_bytes": 1_000_000,
    }
    monkeypatch.setenv(
        "AIRFLOW_CONN_LAKE_EVENTS", json.dumps({"conn_type": "airflow_partitions", "extra": extra})
    )
    hook = PartitionedDatasetHook(dataset="events", partitions_conn_id="lake_events")
    try:
        result = hook.read("region = 'US'", columns=["id"])
    finally:
        hook.close()
    assert result.num_rows == 100
    assert any(path.suffix == ".parquet" for path in (tmp_path / "cache" / "by-checksum").iterdir())

    extra["cache_max_bytes"] = "2GB"
    monkeypatch.setenv(
        "AIRFLOW_CONN_LAKE_EVENTS", json.dumps({"conn_type": "airflow_partitions", "extra": extra})
    )
    hook = PartitionedDatasetHook(dataset="events", partitions_conn_id="lake_events")
    with pytest.raises(OrchestrationError, match=r"cache_max_bytes .* positive whole number of bytes"):
        hook.read("region = 'US'")


def test_read_partitions_reads_exactly_the_named_partitions_in_any_spelling(
    acceleration: Acceleration,
) -> None:
    from airflow_partitions.exceptions import UnknownPartitionError
    from airflow_partitions.keys import composite_key, partition_label

    snapshot = acceleration.snapshot()
    names = snapshot.partition_spec.names
    entries = sorted(snapshot.partitions.values(), key=lambda e: e.key_path)
    eu = next(e for e in entries if e.key.values[0] == "EU")
    null = next(e for e in entries if e.key.values[0] is None)
    hook = PartitionedDatasetHook(dataset="events", spec_path=str(acceleration.spec_path))
    try:
        for spellings in (
            [partition_label(names, eu.key), composite_key(null.key)],
            [eu.key.describe(names), null.key_path],
        ):
            result = hook.read_partitions(spellings, columns=["id"])
            ids = [
                i
                for i, path in zip(acceleration.table.column("id").to_pylist(), acceleration.key_paths)
                if path in (eu.key_path, null.key_path)
            ]
            assert sorted(result.column("id").to_pylist()) == sorted(ids), spellings
        with pytest.raises(UnknownPartitionError, match="names no partition of events"):
            hook.read_partitions(["region=Nowhere/day=2026-01-01"])
    finally:
        hook.close()


READ_RUN_PARTITION_DAG = """\
import json
from pathlib import Path

import pytest
from airflow.sdk import DAG, task

from airflow_partitions.exceptions import OrchestrationError
from airflow_partitions.hooks.partitioned_dataset import PartitionedDatasetHook

with DAG("read_run_partition", schedule=None):

    @task
    def consume(**context):
        hook = PartitionedDatasetHook(dataset="events", spec_path={spec_path!r})
        try:
            with pytest.raises(OrchestrationError, match="carries no partition key of events"):
                hook.read_run_partitions(context)
            partitioned = {{**context, "partition_key": {key!r}}}
            table = hook.read_run_partitions(partitioned, ["id"])
            Path({out!r}).write_text(json.dumps(
                {{"keys": hook.run_partition_keys(partitioned), "ids": table.column("id").to_pylist()}}
            ))
        finally:
            hook.close()

    consume()
"""


@pytest.mark.airflow
@pytest.mark.postgres
def test_a_task_reads_its_runs_partition_through_dag_test(acceleration: Acceleration, tmp_path: Path) -> None:
    """A real `dag.test()` run: the task reads exactly its run's partition. `dag.test()` cannot start a
    partitioned run in Airflow 3.3, so the task hands the hook its context with the `partition_key` entry
    Airflow sets for one (the composite key of asset events); the run's own context, without a key, gets a
    clear error."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow_e2e.metadata_db import in_process_metadata_db

    from airflow_partitions.keys import composite_key

    snapshot = acceleration.snapshot()
    us = next(
        e for e in sorted(snapshot.partitions.values(), key=lambda e: e.key_path) if e.key.values[0] == "US"
    )
    key = composite_key(us.key)
    dags, out = tmp_path / "dags", tmp_path / "seen.json"
    dags.mkdir()
    (dags / "read_run_partition.py").write_text(
        READ_RUN_PARTITION_DAG.format(spec_path=str(acceleration.spec_path), key=key, out=str(out))
    )
    with in_process_metadata_db(str(dags)):
        bag = DagBag(dag_folder=str(dags))
        assert bag.import_errors == {}, bag.import_errors
        run = bag.dags["read_run_partition"].test()
    assert run.state == "success"
    seen = json.loads(out.read_text())
    expected = [
        i
        for i, path in zip(acceleration.table.column("id").to_pylist(), acceleration.key_paths, strict=True)
        if path == us.key_path
    ]
    assert seen["keys"] == [key]
    assert sorted(seen["ids"]) == sorted(expected)
