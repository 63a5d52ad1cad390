"""A query naming other datasets of the spec, or describing them (`ap_partitions('other')`), reads them
with the S3 settings of the reader it went through: the endpoint is given in the settings alone (the AWS
environment names a dead one), so a sibling opened without them reaches no acceleration."""

from __future__ import annotations

import socket
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_partitions.read import PartitionedDatasetReader
from airflow_partitions.read.reader import datasets_query
from airflow_partitions.spec import load_spec
from airflow_partitions.spec.model import ProjectSpec
from airflow_partitions.table import open_handle

pytestmark = [pytest.mark.s3]

ORDERS = pa.table(
    {
        "id": pa.array([1, 2, 3, 4, 5], pa.int64()),
        "region": pa.array(["eu", "k=v/%", None, "", "ü'"], pa.string()),
        "customer": pa.array([10, 11, None, 10, 12], pa.int64()),
    }
)
CUSTOMERS = pa.table(
    {
        "customer": pa.array([10, 11, 12, None], pa.int64()),
        "name": pa.array(["a", "b/=", None, "z"], pa.string()),
    }
)
JOIN = "SELECT o.id, c.name FROM orders o JOIN customers c ON o.customer = c.customer ORDER BY o.id"
EXPECTED_JOIN = [(1, "a"), (2, "b/="), (4, "a"), (5, None)]


def dead_endpoint() -> str:
    """A local port nothing listens on: a client that falls back to the environment fails at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def two_datasets(
    tmp_path: Path, s3_server: dict[str, str], s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> ProjectSpec:
    from airflow_partitions.write.commit import append

    lines = [f"accelerator_dir: s3://{s3_bucket}/accel", "local_scratch_dir: scratch", "datasets:"]
    for name, table, key in (("orders", ORDERS, "region"), ("customers", CUSTOMERS, "customer")):
        source = tmp_path / name
        source.mkdir()
        pq.write_table(table, source / "part.parquet")
        lines += [
            f"  - name: {name}",
            f"    from: file:{source}/",
            "    params: {file_format: parquet}",
            "    acceleration:",
            "      engine: parquet",
            f"      partition_by: [{key}]",
        ]
    spec_path = tmp_path / "datasets.yaml"
    spec_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    project = load_spec(spec_path)
    for name, table in (("orders", ORDERS), ("customers", CUSTOMERS)):
        append(open_handle(project, project.dataset(name), s3_settings=dict(s3_server)), table)
    monkeypatch.setenv("AWS_ENDPOINT_URL", dead_endpoint())
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    return project


def check_queries(query: object) -> None:
    joined = query("SELECT * FROM (" + JOIN + ")")  # type: ignore[operator]
    assert list(zip(*joined.to_pydict().values(), strict=True)) == EXPECTED_JOIN
    described = query("SELECT sum(rows) AS n, count(*) AS partitions FROM ap_partitions('customers')")  # type: ignore[operator]
    # Every row of the other dataset, in 4 partitions: customers 10, 11, 12 and the NULL one.
    assert described.to_pylist() == [{"n": CUSTOMERS.num_rows, "partitions": 4}]


def test_a_reader_opens_its_sibling_datasets_with_its_settings(
    two_datasets: ProjectSpec, s3_server: dict[str, str]
) -> None:
    handle = open_handle(two_datasets, "orders", s3_settings=dict(s3_server))
    reader = PartitionedDatasetReader.from_handle(handle)
    try:
        assert Counter(reader.read().column("id").to_pylist()) == Counter(ORDERS.column("id").to_pylist())
        check_queries(reader.query)
    finally:
        reader.close()


def test_a_datasets_query_opens_every_dataset_with_the_given_settings(
    two_datasets: ProjectSpec, s3_server: dict[str, str]
) -> None:
    with datasets_query(two_datasets, s3_settings=dict(s3_server)) as query:
        check_queries(query.query)
