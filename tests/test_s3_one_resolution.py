"""One resolution of S3 settings serves every byte of an acceleration on S3 (`accelerator_dir: s3://...`).

The catalog (boto3), the partition files a read opens (pyarrow), compaction's fetch, write and upload, a
changes stage's manifest and the Partitions page's status all reach the same endpoint, whether it is
given only by the standard AWS environment (`AWS_ENDPOINT_URL`, no Airflow connection) or only by an
Airflow `aws` connection. Every full read must equal the source row hash for row hash, and a filtered read
DuckDB's answer over the source. The acceleration is built by three appends through the write path, so
every partition holds three small files on the moto server.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from matrix_support import row_digests

from airflow_partitions.spec import load_spec
from airflow_partitions.spec.model import ProjectSpec
from airflow_partitions.table import open_handle
from tests.writes_support import hostile_rows

pytestmark = [pytest.mark.s3]

CONN_ID = "accel_only_conn"
WHERE = "region = 'k=v' OR region IS NULL OR amount IS NULL OR note = ''"
ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")


@dataclass
class S3Acceleration:
    spec_path: Path
    source: pa.Table
    bucket: str
    s3: dict[str, str]

    @property
    def project(self) -> ProjectSpec:
        return load_spec(self.spec_path)

    def objects(self, prefix: str) -> list[str]:
        import boto3

        client = boto3.client("s3", **self.s3)
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]


def endpoint_only_in_environment(monkeypatch: pytest.MonkeyPatch, s3: dict[str, str]) -> None:
    """The endpoint from `AWS_ENDPOINT_URL` alone: no Airflow AWS connection exists."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3["endpoint_url"])
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_AWS_DEFAULT", raising=False)


def endpoint_only_in_connection(monkeypatch: pytest.MonkeyPatch, s3: dict[str, str]) -> None:
    """The endpoint from the Airflow connection `CONN_ID` alone: no AWS endpoint variable is set."""
    for name in ENDPOINT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{CONN_ID.upper()}",
        json.dumps(
            {
                "conn_type": "aws",
                "login": s3["aws_access_key_id"],
                "password": s3["aws_secret_access_key"],
                "extra": {"endpoint_url": s3["endpoint_url"], "region_name": s3["region_name"]},
            }
        ),
    )


@pytest.fixture
def s3_acceleration(tmp_path: Path, s3_server: dict[str, str], s3_bucket: str) -> S3Acceleration:
    """Hostile rows (NULLs everywhere, `/ = %`, quotes, unicode, empty strings) in an acceleration on S3
    partitioned by `region` (NULL and empty partitions included), each partition in three files."""
    from airflow_partitions.write.commit import append

    source = hostile_rows(61, range(1, 301))
    source_dir = tmp_path / "src"
    source_dir.mkdir()
    pq.write_table(source, source_dir / "items.parquet")
    spec_path = tmp_path / "datasets.yaml"
    spec_path.write_text(
        f"accelerator_dir: s3://{s3_bucket}/accel\n"
        "local_scratch_dir: scratch\n"
        "datasets:\n"
        "  - name: items\n"
        f"    from: file:{source_dir}/\n"
        "    params: {file_format: parquet}\n"
        "    acceleration:\n"
        "      engine: parquet\n"
        "      partition_by:\n"
        "        - region: region\n",
        encoding="utf-8",
    )
    project = load_spec(spec_path)
    dataset = project.dataset("items")
    for offset in range(0, source.num_rows, 100):
        append(open_handle(project, dataset, s3_settings=dict(s3_server)), source.slice(offset, 100))
    return S3Acceleration(spec_path, source, s3_bucket, s3_server)


def assert_reads_equal_source(acc: S3Acceleration, read: Any, what: str) -> None:
    """`read(where)` returns the source's rows (by row hash), and DuckDB's answer over it when filtered."""
    import duckdb

    full = read(None)
    assert Counter(row_digests(full)) == Counter(row_digests(acc.source)), f"{what}: full read != source"
    oracle = duckdb.connect().from_arrow(acc.source).filter(WHERE).to_arrow_table()
    assert oracle.num_rows > 0
    filtered = read(WHERE)
    assert Counter(row_digests(filtered)) == Counter(row_digests(oracle)), f"{what}: filtered read != DuckDB"


def hook_read(acc: S3Acceleration, aws_conn_id: str | None = None) -> Any:
    from airflow_partitions.hooks.partitioned_dataset import PartitionedDatasetHook

    def read(where: str | None) -> pa.Table:
        hook = PartitionedDatasetHook(dataset="items", spec_path=str(acc.spec_path), aws_conn_id=aws_conn_id)
        try:
            return hook.read(where) if where is not None else hook.read()
        finally:
            hook.close()

    return read


def file_count(acc: S3Acceleration) -> int:
    from airflow_partitions.catalog import open_catalog

    project = acc.project
    snapshot = open_catalog(project, project.dataset("items"), s3_settings=dict(acc.s3)).latest()
    assert snapshot is not None
    return sum(len(snapshot.partitions[p].files) for p in snapshot.partitions)


# --- 1. a hook with the endpoint only in the environment ------------------------------------------


@pytest.mark.airflow
def test_hook_reads_files_and_catalog_from_the_endpoint_in_the_environment(
    s3_acceleration: S3Acceleration, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`AWS_ENDPOINT_URL` and no Airflow connection: the catalog (boto3) and the files (pyarrow, which
    ignores that variable by itself) both come from the endpoint. (Before, the files were fetched from
    real AWS: `OSError: Could not resolve host ...`.)"""
    endpoint_only_in_environment(monkeypatch, s3_acceleration.s3)
    assert_reads_equal_source(s3_acceleration, hook_read(s3_acceleration), "hook, endpoint from env")


def test_arrow_filesystem_and_boto3_client_resolve_the_same_endpoint(
    s3_server: dict[str, str], s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Settings without an endpoint take the environment's, for the boto3 client and the pyarrow
    filesystem alike; settings that name one keep it."""
    from airflow_partitions.objectstore import S3Settings

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server["endpoint_url"])
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    settings = S3Settings()
    settings.create_client().put_object(Bucket=s3_bucket, Key="k/é=1%.bin", Body=b"same bytes")
    with settings.arrow_filesystem().open_input_stream(f"{s3_bucket}/k/é=1%.bin") as stream:
        assert stream.read() == b"same bytes"
    assert settings.resolved().endpoint_url == s3_server["endpoint_url"]
    named = S3Settings(endpoint_url="http://127.0.0.1:1")
    assert named.resolved().endpoint_url == "http://127.0.0.1:1", "an explicit endpoint wins"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:2")
    assert S3Settings().resolved().endpoint_url == "http://127.0.0.1:2", "the S3-specific variable first"


# --- 2. compaction of an acceleration on S3 -------------------------------------------------------


def test_compaction_of_an_s3_acceleration_fetches_writes_and_uploads(
    s3_acceleration: S3Acceleration, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`compact` on an `s3://` accelerator_dir (endpoint from the environment, as the CLI runs): the
    small files are fetched, merged, counted back, uploaded write-once and committed; reads before =
    after = the source, and fewer files. (Before, it looked for the files in local scratch.)"""
    from airflow_partitions.catalog import open_catalog
    from airflow_partitions.cli.main import main

    endpoint_only_in_environment(monkeypatch, s3_acceleration.s3)
    acc = s3_acceleration
    before_files = file_count(acc)
    before_objects = set(acc.objects("accel/items/"))
    assert_reads_equal_source(acc, hook_read(acc), "before compaction")
    assert main(["compact", str(acc.spec_path), "items", "--json"]) == 0
    project = acc.project
    catalog = open_catalog(project, project.dataset("items"))
    head = catalog.versions()[-1]
    assert head.operation == "compact"
    assert file_count(acc) < before_files
    snapshot = catalog.latest()
    assert snapshot is not None
    assert all(len(snapshot.partitions[p].files) == 1 for p in snapshot.partitions)
    new_objects = set(acc.objects("accel/items/")) - before_objects
    referenced = {f"accel/items/{f.path}" for p in snapshot.partitions for f in snapshot.partitions[p].files}
    assert referenced <= new_objects, "every compacted file is a new object on S3"
    assert not list((acc.spec_path.parent / "scratch").rglob("*.parquet")), "no scratch file left behind"
    assert_reads_equal_source(acc, hook_read(acc), "after compaction")


# --- 3. the changed-rows check of a changes stage on S3 -------------------------------------------


def test_changed_rows_of_a_changes_stage_on_s3_are_checked(
    tmp_path: Path, s3_server: dict[str, str], s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The changed-rows conservation check reads the manifest of a stage on S3 as it does a local one:
    a stage that read 3 changed rows and partitions that upserted 2 refuse the commit; 3 pass."""
    from airflow_partitions.catalog import PartitionEntry
    from airflow_partitions.exceptions import ConservationError
    from airflow_partitions.refresh import remote
    from airflow_partitions.refresh.commit import check_conservation
    from airflow_partitions.refresh.plan import DiscoveryKind, PartitionResult, RefreshPlan
    from airflow_partitions.table import open_handle

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server["endpoint_url"])
    spec = tmp_path / "datasets.yaml"
    spec.write_text(
        f"accelerator_dir: s3://{s3_bucket}/acc\nlocal_scratch_dir: scratch\n"
        "datasets:\n  - name: t\n    from: file:/tmp/x/\n    acceleration: {partition_by: [a]}\n"
    )
    project = load_spec(spec)
    dataset = project.dataset("t")
    local = tmp_path / "changes-stage"
    local.mkdir()
    pq.write_table(pa.table({"a": [1, None, 1]}), local / "changes.parquet")
    (local / "_stage.json").write_text(json.dumps({"mode": "changes", "source_rows": 3}))
    url = open_handle(project, dataset).stage_location("changes")
    remote.upload_stage(local, url)

    plan = RefreshPlan(
        dataset="t",
        spec_id=dataset.acceleration.partition_spec_id,
        partition_names=("a",),
        base_version=None,
        items=(),
        removed=(),
        unchanged=0,
        discovered=2,
        discovery=DiscoveryKind.DYNAMIC,
        fingerprint_granularity="partition",
        refresh_mode="changes",
    )

    def result(key_path: str, changed: int) -> PartitionResult:
        entry = PartitionEntry(
            key=(None,),
            key_path=key_path,
            spec_id=plan.spec_id,
            files=(),
            rows=0,
            bytes=0,
            source_fingerprint=None,
            refreshed_at=dt.datetime.now(dt.UTC),
        )
        return PartitionResult(entry=entry, changed_rows=changed)

    short = [result("a=1", 1), result("a=__HIVE_DEFAULT_PARTITION__", 1)]
    with pytest.raises(ConservationError, match=r"changed rows.*3.*2|3.*2"):
        check_conservation("t", plan, short, url, [], dict(s3_server))
    counts = check_conservation("t", plan, [result("a=1", 2), short[1]], url, [], dict(s3_server))
    assert counts.partitions_checked == 2


# --- 4. the Partitions page and compaction with the endpoint only in an Airflow connection ---------


@pytest.mark.airflow
def test_partitions_page_status_reaches_s3_through_the_dags_connection(
    s3_acceleration: S3Acceleration, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page's dataset document (what its JSON API serves) opens the catalog with the AWS connection
    the refresh DAG's tasks use, as the operators do. (Before, it opened it with no settings at all.)"""
    from airflow_partitions.plugins.page_data import RefreshDag, dataset_report

    endpoint_only_in_connection(monkeypatch, s3_acceleration.s3)
    report = dataset_report(RefreshDag("refresh_items", str(s3_acceleration.spec_path), "items", CONN_ID))
    assert report["rows"] == s3_acceleration.source.num_rows
    assert report["latest_version"] == 3
    regions = {r["region"] for r in s3_acceleration.source.to_pylist()}
    assert len(report["partitions"]) == len(regions)


@pytest.mark.airflow
def test_compact_operator_on_s3_uses_the_connection_for_catalog_and_files(
    s3_acceleration: S3Acceleration, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`CompactOperator(aws_conn_id=...)` with the endpoint only in that connection: the files are
    fetched and uploaded through it too; reads before = after = the source, fewer files."""
    from airflow_partitions.operators import CompactOperator

    endpoint_only_in_connection(monkeypatch, s3_acceleration.s3)
    acc = s3_acceleration
    before_files = file_count(acc)
    assert_reads_equal_source(acc, hook_read(acc, CONN_ID), "before compaction")
    operator = CompactOperator(
        task_id="compact", spec_path=acc.spec_path, dataset="items", aws_conn_id=CONN_ID
    )
    summary = operator.execute({})  # type: ignore[arg-type]
    assert summary["version"] == 4
    assert summary["partitions"] > 0
    assert file_count(acc) < before_files
    assert_reads_equal_source(acc, hook_read(acc, CONN_ID), "after compaction")


@pytest.mark.airflow
def test_the_serialized_refresh_dag_keeps_its_aws_connection_for_the_page(tmp_path: Path) -> None:
    """The page finds a DAG's connection in the serialized DAG (what the API server has), so the task
    attribute must survive serialization."""
    from airflow.serialization.serialized_objects import DagSerialization

    from airflow_partitions.dag_factory import DISCOVER_TASK, build_refresh_dag

    spec = tmp_path / "datasets.yaml"
    spec.write_text(
        "accelerator_dir: acc\ndatasets:\n  - name: t\n    from: file:/tmp/x/\n"
        "    params: {file_format: parquet}\n    acceleration: {partition_by: [a]}\n"
    )
    for conn_id in (CONN_ID, None):
        dag = build_refresh_dag(load_spec(spec), "t", aws_conn_id=conn_id, dag_id="refresh_t")
        task = DagSerialization.from_dict(DagSerialization.to_dict(dag)).get_task(DISCOVER_TASK)
        assert getattr(task, "aws_conn_id", "missing") == conn_id
