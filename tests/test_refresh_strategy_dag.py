"""`strategy="auto"` in the refresh DAG (`dag.test()` of the example DAG file, Postgres metadata database):
a source that fits the worker's memory budget is written by the stage task with the in-process Arrow path,
the partition tasks only build their entries, and the stage task's XCom says which strategy ran and why.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from airflow_e2e.metadata_db import in_process_metadata_db
from airflow_e2e.sample import install_example_dag
from matrix_support import hostile_chunks, multiset_difference

from airflow_partitions.refresh.arrow_budget import BUDGET_ENV

pytestmark = [pytest.mark.airflow, pytest.mark.postgres]

SPEC = """\
accelerator_dir: {root}/acc
datasets:
  - name: trips
    from: file:{root}/src/
    params: {{file_format: parquet}}
    acceleration:
      partition_by:
        - cb: "bucket(4, s)"
        - cf: flag
"""


def test_auto_refresh_dag_writes_in_the_stage_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    from airflow_partitions.operators.run_conf import RefreshRunConf
    from airflow_partitions.read import PartitionedDatasetReader

    chunks = hostile_chunks(seed=341)
    (tmp_path / "src").mkdir()
    for index, chunk in enumerate(chunks):
        pq.write_table(chunk, tmp_path / "src" / f"part{index}.parquet")
    source = pa.concat_tables(chunks)
    spec_path = install_example_dag(tmp_path / "dags", SPEC.format(root=tmp_path))
    monkeypatch.setenv(BUDGET_ENV, "1GiB")  # dag.test() runs the tasks in this process
    with in_process_metadata_db(str(tmp_path / "dags")):
        from airflow.dag_processing.dagbag import DagBag

        bag = DagBag(dag_folder=str(tmp_path / "dags"))
        assert bag.import_errors == {}, bag.import_errors
        run = bag.dags["refresh_trips"].test(run_conf=RefreshRunConf().to_conf())
        states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
        assert str(run.state) == "success", states
        with create_session() as session:
            stored = session.scalars(
                XComModel.get_many(
                    key="return_value", run_id=run.run_id, dag_ids="refresh_trips", task_ids="stage"
                )
            ).first()
            assert stored is not None
            stage = XComModel.deserialize_value(stored)
    assert stage["strategy"] == "arrow"
    assert stage["mode"] == "written", "the stage task wrote the partition files itself"
    assert "<= Arrow memory budget 1.0 GiB" in stage["strategy_reason"]
    assert stage["source_rows"] == source.num_rows
    with PartitionedDatasetReader(spec_path, "trips") as reader:
        got = reader.read()
    got = pa.table([got.column(f.name).cast(f.type) for f in source.schema], schema=source.schema)
    missing, extra = multiset_difference(got, source)
    assert (missing, extra) == ([], [])
