"""Writes through Airflow and the command line: the operator in a real `dag.test()` run (catalog on the
moto S3 server, reached with the task's AWS connection), and `airflow-partitions write` with `--json`."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from airflow_e2e.metadata_db import MetadataDatabase, in_process_metadata_db

from airflow_partitions.cli.main import main
from airflow_partitions.exceptions import OrchestrationError
from airflow_partitions.refresh.pipeline import refresh_dataset
from tests.writes_support import Oracle, Source, assert_same_rows, fresh_database, hostile_rows, read_all

pytestmark = [pytest.mark.airflow, pytest.mark.postgres]

REGIONS: list[str | None] = [None, "EU", "a/b", "it's"]


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    with fresh_database() as url:
        yield url


@pytest.fixture
def source(pg_url: str, tmp_path: Path) -> Source:
    return Source(pg_url, tmp_path)


@pytest.fixture(scope="module")
def dags_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, MetadataDatabase]]:
    dags = tmp_path_factory.mktemp("write_dags")
    with in_process_metadata_db(str(dags)) as database:
        yield dags, database


@pytest.mark.s3
def test_operator_appends_upserts_through_and_deletes_in_a_dag_run(
    source: Source,
    tmp_path: Path,
    dags_folder: tuple[Path, MetadataDatabase],
    s3_server: dict[str, str],
    s3_bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv(
        "AIRFLOW_CONN_WRITES_S3",
        json.dumps(
            {
                "conn_type": "aws",
                "login": s3_server["aws_access_key_id"],
                "password": s3_server["aws_secret_access_key"],
                "extra": {"endpoint_url": s3_server["endpoint_url"], "region_name": s3_server["region_name"]},
            }
        ),
    )
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server["endpoint_url"])  # the refresh and the checks below
    source.create(hostile_rows(31, range(1, 81), regions=REGIONS))
    project = source.spec(["region"], params={"catalog_location": f"s3://{s3_bucket}/catalogs"})
    refresh_dataset(project, "items")
    oracle = Oracle(source.rows())
    appended = hostile_rows(32, range(100, 140), regions=REGIONS)
    pq.write_table(appended, tmp_path / "new.parquet")
    written = hostile_rows(33, range(1, 80, 4), regions=REGIONS)
    pcsv.write_csv(written, tmp_path / "changed.csv")
    # CSV's rule (sources and writes alike): an empty field is NULL, quoted or not, so the empty strings
    # pyarrow writes as "" read back as NULL. Every other value, 'NULL' and '%NULL' included, is kept.
    upserted = pa.Table.from_pylist(
        [{k: None if v == "" else v for k, v in row.items()} for row in written.to_pylist()],
        schema=written.schema,
    )
    nulls = sum(c.null_count for c in upserted.columns)
    assert nulls > sum(c.null_count for c in written.columns), "test data: empty strings"
    dags, database = dags_folder
    (dags / "writes.py").write_text(
        textwrap.dedent(
            f"""\
            from airflow.sdk import DAG, Param
            from airflow_partitions.operators import PartitionedDatasetWriteOperator

            common = dict(spec_path={str(tmp_path / "spec.yaml")!r}, dataset="items", aws_conn_id="writes_s3")
            with DAG("writes", schedule=None, params={{"cutoff": Param(10, type="integer")}}):
                append = PartitionedDatasetWriteOperator(
                    task_id="append", mode="append", source_path={str(tmp_path / "new.parquet")!r}, **common
                )
                upsert = PartitionedDatasetWriteOperator(
                    task_id="upsert",
                    mode="upsert",
                    source_path={str(tmp_path / "changed.csv")!r},
                    keys=["id"],
                    write_through=True,
                    **common,
                )
                delete = PartitionedDatasetWriteOperator(
                    task_id="delete", mode="delete", where="id < {{{{ params.cutoff }}}}", **common
                )
                append >> upsert >> delete
            """
        )
    )
    dag = DagBag(dag_folder=str(dags)).dags["writes"]
    run = dag.test()
    assert str(run.state) == "success"
    oracle.append(appended)
    oracle.upsert(upserted)
    removed = oracle.delete(lambda r: r["id"] < 10)
    assert_same_rows(read_all(project), oracle.table(), "after the run")
    source_oracle = Oracle(source.rows())
    assert {r["id"]: r for r in upserted.to_pylist()}.items() <= source_oracle.rows.items(), (
        "the upsert went through to the source"
    )
    with database.connect() as conn:
        results = dict(
            conn.execute(
                "SELECT task_id, value FROM xcom WHERE run_id = %s AND key = 'return_value'", (run.run_id,)
            ).fetchall()
        )
    assert results["append"]["rows_added"] == 40
    assert results["upsert"]["rows_removed"] == upserted.num_rows
    assert results["delete"]["rows_removed"] == removed
    assert [results[t]["version"] for t in ("append", "upsert", "delete")] == [2, 3, 4]


def test_operator_refuses_arguments_that_do_not_fit_its_mode() -> None:
    from airflow_partitions.operators import PartitionedDatasetWriteOperator

    with pytest.raises(OrchestrationError, match="mode must be one of append, upsert, delete"):
        PartitionedDatasetWriteOperator(task_id="w", dataset="d", mode="merge", source_path="x.parquet")
    with pytest.raises(OrchestrationError, match="mode delete takes where"):
        PartitionedDatasetWriteOperator(task_id="w", dataset="d", mode="delete", source_path="x.parquet")
    with pytest.raises(OrchestrationError, match="mode append takes source_path"):
        PartitionedDatasetWriteOperator(task_id="w", dataset="d", mode="append", where="id = 1")
    with pytest.raises(OrchestrationError, match="keys apply to mode upsert only"):
        PartitionedDatasetWriteOperator(task_id="w", dataset="d", mode="append", source_path="x", keys=["id"])


def json_line(row: dict[str, Any]) -> str:
    """A row as JSON: instants in ISO 8601 with their offset, decimals as exact strings."""
    ts, amount = row["ts"], row["amount"]
    return json.dumps({**row, "ts": ts and ts.isoformat(), "amount": amount and str(amount)})


def test_cli_write_appends_upserts_and_deletes_with_json(
    source: Source, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source.create(hostile_rows(41, range(1, 61), regions=REGIONS))
    project = source.spec(["region"])
    refresh_dataset(project, "items")
    spec = str(tmp_path / "spec.yaml")
    oracle = Oracle(source.rows())
    appended = hostile_rows(42, range(200, 230), regions=REGIONS)
    pq.write_table(appended, tmp_path / "rows.parquet")
    assert main(["write", spec, "items", "--append", str(tmp_path / "rows.parquet"), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert (document["operation"], document["rows_added"], document["version"]) == ("append", 30, 2)
    oracle.append(appended)

    upserted = hostile_rows(43, range(1, 61, 3), regions=REGIONS)
    lines = [json_line(row) for row in upserted.to_pylist()]
    (tmp_path / "rows.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["write", spec, "items", "--upsert", str(tmp_path / "rows.jsonl"), "--key", "id"]) == 0
    assert "upsert committed version 3" in capsys.readouterr().err
    oracle.upsert(upserted)

    assert main(["write", spec, "items", "--delete-where", "region IS NULL", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows_removed"] == oracle.delete(lambda r: r["region"] is None)
    assert_same_rows(read_all(project), oracle.table(), "after the CLI writes")

    pa_bad = pa.table({"id": [1], "colour": ["red"]})
    pq.write_table(pa_bad, tmp_path / "bad.parquet")
    assert main(["write", spec, "items", "--append", str(tmp_path / "bad.parquet")]) == 2
    err = capsys.readouterr().err
    assert "missing column(s) ['region', 'ts', 'amount', 'note']" in err
    assert "['colour'] the dataset does not have" in err
    assert main(["write", spec, "items", "--append", str(tmp_path / "bad.parquet"), "--key", "id"]) == 2
    assert "--key applies to --upsert only" in capsys.readouterr().err


def test_hook_writes_and_its_next_read_sees_them(source: Source, tmp_path: Path) -> None:
    from airflow_partitions.exceptions import WriteKeyError
    from airflow_partitions.hooks.partitioned_dataset import PartitionedDatasetHook

    source.create(hostile_rows(44, range(1, 31), regions=REGIONS))
    project = source.spec(["region"])
    refresh_dataset(project, "items")
    hook = PartitionedDatasetHook(dataset="items", spec_path=str(tmp_path / "spec.yaml"))
    try:
        assert hook.read().num_rows == 30
        batches = hostile_rows(45, range(100, 110), regions=REGIONS).to_batches(max_chunksize=3)
        assert hook.append(pa.RecordBatchReader.from_batches(batches[0].schema, batches)).rows_added == 10
        assert hook.read().num_rows == 40, "the hook's reader moved to the new version"
        assert hook.upsert(hostile_rows(46, range(1, 6), regions=REGIONS)).rows_removed == 5
        with pytest.raises(WriteKeyError, match="nope"):
            hook.upsert(hostile_rows(47, range(1, 2), regions=REGIONS), keys=["nope"])
        assert hook.delete([("id", "<", 3)]).rows_removed == 2
        assert hook.read().num_rows == 38
    finally:
        hook.close()


def test_a_task_retry_after_a_lost_commit_response_publishes_the_write_once(
    source: Source,
    tmp_path: Path,
    dags_folder: tuple[Path, MetadataDatabase],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first try's commit record lands, but the store's answer is lost and reading it back fails too
    (`CommitOutcomeUnknownError`): Airflow retries the task. The retry derives the same commit id from the
    task instance, finds that commit in the newest version and writes nothing again.

    The lost response is injected (a network failure cannot be provoked on a local disk): the store
    writes the record, then raises, once; the read-back then fails once."""
    from airflow.dag_processing.dagbag import DagBag

    from airflow_partitions.catalog import open_catalog
    from airflow_partitions.exceptions import ObjectStoreError
    from airflow_partitions.objectstore import LocalStore

    source.create(hostile_rows(51, range(1, 41), regions=REGIONS))
    project = source.spec(["region"])
    refresh_dataset(project, "items")
    oracle = Oracle(source.rows())
    appended = hostile_rows(52, range(300, 330), regions=REGIONS)
    pq.write_table(appended, tmp_path / "more.parquet")
    real_put, real_get_range = LocalStore.put_if_absent, LocalStore.get_range
    lost: dict[str, str] = {}

    def put_then_lose_the_answer(store: LocalStore, key: str, data: bytes) -> bool:
        created = real_put(store, key, data)
        if "/_catalog/log/" in key and not lost:
            lost["key"] = key
            raise ObjectStoreError(f"connection reset while writing {key}")
        return created

    def fail_the_read_back(store: LocalStore, key: str, start: int, length: int) -> bytes | None:
        if lost.get("key") == key and "read_back" not in lost:
            lost["read_back"] = key
            raise ObjectStoreError(f"connection reset while reading {key}")
        return real_get_range(store, key, start, length)

    monkeypatch.setattr(LocalStore, "put_if_absent", put_then_lose_the_answer)
    monkeypatch.setattr(LocalStore, "get_range", fail_the_read_back)
    dags, database = dags_folder
    (dags / "write_retry.py").write_text(
        textwrap.dedent(
            f"""\
            import datetime as dt
            from airflow.sdk import DAG
            from airflow_partitions.operators import PartitionedDatasetWriteOperator

            with DAG("write_retry", schedule=None):
                PartitionedDatasetWriteOperator(
                    task_id="append",
                    mode="append",
                    source_path={str(tmp_path / "more.parquet")!r},
                    spec_path={str(tmp_path / "spec.yaml")!r},
                    dataset="items",
                    retries=1,
                    retry_delay=dt.timedelta(0),
                )
            """
        )
    )
    run = DagBag(dag_folder=str(dags)).dags["write_retry"].test()
    assert str(run.state) == "success"
    assert "read_back" in lost, "the first try's commit landed and its outcome was unknown"
    with database.connect() as conn:
        tries = conn.execute(
            "SELECT try_number FROM task_instance WHERE run_id = %s AND task_id = 'append'", (run.run_id,)
        ).fetchall()
        result = conn.execute(
            "SELECT value FROM xcom WHERE run_id = %s AND key = 'return_value'", (run.run_id,)
        ).fetchall()[0][0]
    assert tries == [(2,)], "the first try failed, the retry succeeded"
    oracle.append(appended)
    assert_same_rows(read_all(project), oracle.table(), "after the retried write")
    assert open_catalog(project, project.dataset("items")).head_version() == 2, "published once"
    assert (result["version"], result["already_committed"]) == (2, True)
    assert result["commit_id"] == f"airflow:write_retry:append:-1:{run.run_id}"
