"""`@task.read_run_partitions` and `ReadRunPartitionsOperator`: a task handed exactly its run's partitions."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pyarrow as pa
import pytest
from test_pruning_support import Acceleration, build_acceleration

from airflow_partitions.exceptions import OrchestrationError


@pytest.fixture(scope="module")
def acceleration(tmp_path_factory: pytest.TempPathFactory) -> Acceleration:
    """`events` by (region, day): NULL regions, unicode and `/ = % '` in region values."""
    rows = 240
    regions = ["EU", "Zürich/=%'", None, ""]
    table = pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "region": pa.array([regions[i % 4] for i in range(rows)], pa.string()),
            "ts": pa.array(
                [dt.datetime(2026, 1, 1) + dt.timedelta(hours=i) for i in range(rows)], pa.timestamp("us")
            ),
            "amount": pa.array([None if i % 9 == 0 else i * 1.5 for i in range(rows)], pa.float64()),
        }
    )
    return build_acceleration(
        tmp_path_factory.mktemp("read_run"), table, [("region", "region"), ("day", "date_trunc('day', ts)")]
    )


def test_importing_the_operator_loads_no_heavy_module() -> None:
    code = (
        "import sys, airflow_partitions.operators.read; "
        "print(sorted(m for m in ('pyarrow', 'duckdb', 'pyspark', 'pandas') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", "DAG files import it: heavy modules load on use"


def test_the_decorator_is_registered_as_task_read_run_partitions() -> None:
    from airflow.sdk import task

    from airflow_partitions.operators.read import read_run_partitions_task

    assert task.read_run_partitions is read_run_partitions_task


def test_a_function_without_rows_or_an_unknown_rows_as_is_refused_at_parse() -> None:
    from airflow.sdk import DAG

    from airflow_partitions.operators.read import ReadRunPartitionsOperator, read_run_partitions_task

    def no_rows(partition_keys: list[str]) -> None:
        return None

    with DAG("refused", schedule=None):
        with pytest.raises(OrchestrationError, match=r"no_rows\(\) .* has no `rows` parameter"):
            read_run_partitions_task(dataset="events", spec_path="x.yaml")(no_rows)()
        with pytest.raises(OrchestrationError, match=r"rows_as='polars' is not one of arrow, pandas"):
            ReadRunPartitionsOperator(
                task_id="t", dataset="events", python_callable=lambda rows: None, rows_as="polars"
            )
        with pytest.raises(OrchestrationError, match=r"`rows` is filled with the run's partitions"):
            read_run_partitions_task(dataset="events", spec_path="x.yaml")(lambda rows: None)(rows=1)


READ_DAG = """\
import json
from pathlib import Path

from airflow.sdk import DAG, task

from airflow_partitions.operators.read import ReadRunPartitionsOperator

OUT = Path({out!r})

with DAG("read_run_partitions", schedule=None):

    @task.read_run_partitions(dataset="events", spec_path={spec_path!r}, columns=["id", "amount"])
    def summarise(rows, partition_keys, ti=None):
        OUT.joinpath("decorated.json").write_text(json.dumps({{
            "keys": partition_keys,
            "type": type(rows).__module__,
            "columns": rows.column_names,
            "ids": rows.column("id").to_pylist(),
        }}))
        return rows.num_rows

    def as_pandas(rows, label):
        OUT.joinpath("operator.json").write_text(json.dumps({{
            "label": label,
            "type": type(rows).__module__,
            "ids": [int(i) for i in rows["id"]],
            "nulls": int(rows["amount"].isna().sum()),
        }}))

    counted = summarise()
    counted >> ReadRunPartitionsOperator(
        task_id="as_pandas",
        dataset="events",
        spec_path={spec_path!r},
        python_callable=as_pandas,
        op_kwargs={{"label": "{{{{ dag_run.partition_key }}}}"}},
        rows_as="pandas",
    )
"""


def run_with_partition_key(dag: Any, key: str | None) -> Any:
    """`dag.test()`, its run carrying `key` as a run triggered with a partition key does (`dag.test()`
    takes no key in Airflow 3.3: the run it creates gets one before its tasks start)."""
    from airflow.models import dagrun

    real = dagrun.get_or_create_dagrun

    def keyed(*args: Any, **kwargs: Any) -> Any:
        run = real(*args, **kwargs)
        run.partition_key = key
        kwargs["session"].commit()
        return run

    with mock.patch.object(dagrun, "get_or_create_dagrun", keyed):
        return dag.test()


@pytest.mark.airflow
@pytest.mark.postgres
def test_a_dag_test_run_with_a_partition_key_reads_exactly_that_partition(
    acceleration: Acceleration, tmp_path: Path
) -> None:
    """A real `dag.test()` run keyed with one hostile partition (unicode, `/ = % '` in the region) in
    Airflow's composite spelling: the decorated task gets exactly its rows as a pyarrow Table and the
    keys; the operator gets them as pandas, NULLs kept, its templated kwargs rendered. A run without a
    key fails before the function runs."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow_e2e.metadata_db import in_process_metadata_db

    from airflow_partitions.keys import composite_key

    snapshot = acceleration.snapshot()
    entry = next(
        e
        for e in sorted(snapshot.partitions.values(), key=lambda e: e.key_path)
        if e.key.values[0] == "Zürich/=%'"
    )
    key = composite_key(entry.key)
    ids = acceleration.table.column("id").to_pylist()
    expected = sorted(
        i for i, path in zip(ids, acceleration.key_paths, strict=True) if path == entry.key_path
    )
    assert len(expected) > 1
    amounts = dict(zip(ids, acceleration.table.column("amount").to_pylist(), strict=True))
    dags, out = tmp_path / "dags", tmp_path / "out"
    dags.mkdir()
    out.mkdir()
    (dags / "read_run_partitions.py").write_text(
        READ_DAG.format(spec_path=str(acceleration.spec_path), out=str(out))
    )
    with in_process_metadata_db(str(dags)):
        bag = DagBag(dag_folder=str(dags))
        assert bag.import_errors == {}, bag.import_errors
        dag = bag.dags["read_run_partitions"]
        run = run_with_partition_key(dag, key)
        assert run.state == "success"
        decorated = json.loads((out / "decorated.json").read_text())
        operator = json.loads((out / "operator.json").read_text())
        (out / "decorated.json").unlink()
        unkeyed = run_with_partition_key(dag, None)
    assert decorated["keys"] == [key]
    assert decorated["type"].startswith("pyarrow")
    assert decorated["columns"] == ["id", "amount"]
    assert sorted(decorated["ids"]) == expected, "exactly the rows of the run's partition"
    assert operator["type"].startswith("pandas")
    assert operator["label"] == key, "op_kwargs are templated as for PythonOperator"
    assert sorted(operator["ids"]) == expected
    assert operator["nulls"] == sum(amounts[i] is None for i in expected) > 0, "NULLs kept"
    assert unkeyed.state == "failed"
    assert not (out / "decorated.json").exists(), "without a key the function is not called"
