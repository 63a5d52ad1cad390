"""Refresh runs with more partitions than a run may map: discovery hands out batches of contiguous work
items, each `partition.refresh` task refreshes its batch, and the commit publishes every partition.

Real `dag.test()` runs of the example DAG file (Postgres metadata database, local Spark) over flat
Parquet sources: 3,000 partitions through 24 batch tasks, a batch with one failing partition, and a
dataset over `refresh.max_partitions`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from airflow_e2e.metadata_db import in_process_metadata_db
from airflow_e2e.sample import install_example_dag

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.postgres, pytest.mark.slow]

WIDE_PARTITIONS = 3000
WIDE_BATCHES = 24
# Hostile partition values for the small dataset whose batch holds a failing partition.
FEW_REGIONS: tuple[str | None, ...] = (None, "EU", "a/b", "x=y", "ü ñ", "", "50%", "'q'", "US", "Zürich")
FEW_BATCHES = 3
TOO_MANY_LIMIT = 40


def row_digest(row: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(row, sort_keys=True, default=str).encode()).hexdigest()


def table_digests(table: Any) -> list[str]:
    return sorted(row_digest(row) for row in table.to_pylist())


def write_wide(directory: Path) -> Any:
    """Two rows per partition key 0..2999 plus rows with a NULL key; NULLs and unicode in the others."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    n = 2 * WIDE_PARTITIONS + 3
    ids = list(range(n))
    table = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "k": pa.array([i % WIDE_PARTITIONS if i < n - 3 else None for i in ids], pa.int64()),
            "note": pa.array([None if i % 7 == 0 else f"ü/{i}=%" for i in ids], pa.string()),
            "amount": pa.array([None if i % 5 == 0 else i * 0.25 for i in ids], pa.float64()),
        }
    )
    pq.write_table(table, directory / "wide.parquet")
    return table


def write_few(directory: Path) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    ids = list(range(3 * len(FEW_REGIONS)))
    table = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "region": pa.array([FEW_REGIONS[i % len(FEW_REGIONS)] for i in ids], pa.string()),
            "amount": pa.array([None if i % 4 == 0 else float(i) for i in ids], pa.float64()),
        }
    )
    pq.write_table(table, directory / "few.parquet")
    return table


def write_too_many(directory: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"k": pa.array(range(TOO_MANY_LIMIT + 5), pa.int64())}), directory / "t.parquet")


SPEC = """\
accelerator_dir: {root}/acc
datasets:
  - name: wide
    from: file:{root}/wide/
    params: {{file_format: parquet}}
    acceleration:
      engine: parquet
      partition_by:
        - k: k
  - name: few
    from: file:{root}/few/
    params: {{file_format: parquet}}
    acceleration:
      partition_by:
        - region: region
  - name: too_many
    from: file:{root}/too_many/
    params: {{file_format: parquet}}
    acceleration:
      partition_by:
        - k: k
      refresh:
        max_partitions: {limit}
"""


@dataclass
class Site:
    root: Path
    spec_path: Path
    dags: dict[str, Any]
    sources: dict[str, Any]

    def run(self, dag_id: str, conf: dict[str, Any] | None = None) -> Any:
        from airflow_partitions.operators.run_conf import RefreshRunConf

        return self.dags[dag_id].test(run_conf={**RefreshRunConf().to_conf(), **(conf or {})})

    def catalog(self, dataset: str) -> Any:
        from airflow_partitions.spec import load_spec
        from airflow_partitions.table import open_handle

        project = load_spec(self.spec_path)
        return open_handle(project, project.dataset(dataset)).catalog


@contextmanager
def mapped_task_limit(limit: int) -> Iterator[None]:
    """`[airflow_partitions] max_mapped_tasks` for the runs inside (dag.test() runs tasks in this process)."""
    from airflow.configuration import conf

    section, option = "airflow_partitions", "max_mapped_tasks"
    previous = conf.get(section, option) if conf.has_option(section, option) else None
    if not conf.has_section(section):
        conf.add_section(section)
    conf.set(section, option, str(limit))
    try:
        yield
    finally:
        if previous is None:
            conf.remove_option(section, option)
        else:
            conf.set(section, option, previous)


def refresh_instances(run: Any) -> dict[int, tuple[str | None, str | None]]:
    """map index -> (state, label) of the run's partition.refresh instances."""
    return {
        ti.map_index: (str(ti.state) if ti.state else None, ti.rendered_map_index)
        for ti in run.get_task_instances()
        if ti.task_id == "partition.refresh"
    }


def task_state(run: Any, task_id: str) -> str | None:
    return next(str(ti.state) for ti in run.get_task_instances() if ti.task_id == task_id)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("batches")
    sources = {"wide": write_wide(root / "wide"), "few": write_few(root / "few")}
    write_too_many(root / "too_many")
    spec_path = install_example_dag(root / "dags", SPEC.format(root=root, limit=TOO_MANY_LIMIT))
    with in_process_metadata_db(str(root / "dags")):
        from airflow.dag_processing.dagbag import DagBag

        bag = DagBag(dag_folder=str(root / "dags"))
        assert bag.import_errors == {}, bag.import_errors
        yield Site(root, spec_path, bag.dags, sources)


@pytest.mark.scale
def test_three_thousand_partitions_commit_through_batches(site: Site) -> None:
    from airflow_partitions.hooks.partitioned_dataset import PartitionedDatasetHook
    from airflow_partitions.refresh.partition_states import partition_states
    from airflow_partitions.spec import load_spec

    with mapped_task_limit(WIDE_BATCHES):
        run = site.run("refresh_wide")
    instances = refresh_instances(run)
    assert str(run.state) == "success", instances
    assert sorted(instances) == list(range(WIDE_BATCHES)), "exactly max_mapped_tasks batch tasks"
    assert all(state == "success" for state, _ in instances.values())
    # 3,001 partitions (3,000 keys and NULL) in 24 balanced batches of 125 or 126, labelled by count and ends.
    labels = [instances[i][1] or "" for i in range(WIDE_BATCHES)]
    assert labels[0].startswith("126 partitions: k="), labels[0]
    assert all(label.startswith("125 partitions: k=") for label in labels[1:]), labels[1:3]
    assert all(len(label) <= 250 for label in labels)

    snapshot = site.catalog("wide").latest()
    assert snapshot is not None
    assert len(snapshot.partitions) == WIDE_PARTITIONS + 1, "every key and the NULL partition committed"
    assert {snapshot.partitions[p].rows for p in snapshot.partitions} == {2, 3}
    writers = {snapshot.partitions[p].written_by.map_index for p in snapshot.partitions}
    assert writers == set(range(WIDE_BATCHES)), "each entry names the batch task that wrote it"

    table = PartitionedDatasetHook(spec_path=str(site.spec_path), dataset="wide").read()
    source = site.sources["wide"]
    assert table.num_rows == source.num_rows
    assert table_digests(table.select(source.column_names)) == table_digests(source)

    project = load_spec(site.spec_path)
    states = partition_states(project, project.dataset("wide"))
    assert {str(p.state) for p in states.partitions} == {"fresh"}
    assert len(states.partitions) == WIDE_PARTITIONS + 1


def test_a_failing_partition_in_a_batch_is_recorded_and_rerun(
    site: Site, capsys: pytest.CaptureFixture[str]
) -> None:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    from airflow_partitions.cli.main import main
    from airflow_partitions.keys import PartitionKey
    from airflow_partitions.operators.refresh import BATCH_OUTCOME_XCOM_KEY
    from airflow_partitions.refresh.failures import FailureStore

    def path_of(region: str | None) -> str:
        return PartitionKey((region,)).path(("region",))

    every = {path_of(r) for r in FEW_REGIONS}
    broken = path_of("x=y")
    # The partition's directory is taken by a plain file: writing that one partition fails.
    blocker = site.root / "acc" / "few" / broken
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("in the way")
    with mapped_task_limit(FEW_BATCHES):
        run = site.run("refresh_few")
    instances = refresh_instances(run)
    assert str(run.state) == "failed"
    failed_batches = [i for i, (state, _) in instances.items() if state == "failed"]
    assert len(instances) == FEW_BATCHES
    assert len(failed_batches) == 1, instances
    assert {state for i, (state, _) in instances.items() if i not in failed_batches} == {"success"}
    assert task_state(run, "commit") == "upstream_failed", "nothing is committed with a failed partition"

    # The failure is recorded for that partition alone, naming the batch task; the batch's other
    # partitions were refreshed (its outcome XCom), the other batches' too.
    failures = FailureStore.for_catalog(site.catalog("few")).failures()
    assert set(failures) == {broken}
    assert failures[broken].task_id == "partition.refresh"
    assert failures[broken].map_index == failed_batches[0]
    assert failures[broken].run_id == run.run_id
    with create_session() as session:
        outcome = session.scalars(
            XComModel.get_many(
                key=BATCH_OUTCOME_XCOM_KEY,
                run_id=run.run_id,
                dag_ids="refresh_few",
                task_ids="partition.refresh",
                map_indexes=failed_batches[0],
            )
        ).first()
        assert outcome is not None
        value = XComModel.deserialize_value(outcome)
    assert set(value["failed"]) == {broken}
    assert value["refreshed"], "the batch went on past its failing partition"
    assert broken not in value["refreshed"]

    capsys.readouterr()
    assert main(["status", str(site.spec_path), "few", "--partitions", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)["datasets"][0]
    states = {p["key_path"]: p["state"] for p in document["partitions"]}
    assert states == {**dict.fromkeys(every, "missing"), broken: "failed"}

    # Rerun the failed partition through the DAG once the cause is gone; then the rest commit too.
    blocker.unlink()
    with mapped_task_limit(FEW_BATCHES):
        rerun = site.run("refresh_few", {"partitions": sorted(failures)})
        assert str(rerun.state) == "success", refresh_instances(rerun)
        assert FailureStore.for_catalog(site.catalog("few")).failures() == {}
        assert set(site.catalog("few").latest().partitions) == {broken}
        full = site.run("refresh_few")
    assert str(full.state) == "success", refresh_instances(full)
    assert len(refresh_instances(full)) == FEW_BATCHES, "nine missing partitions over three batches"
    snapshot = site.catalog("few").latest()
    assert set(snapshot.partitions) == every
    assert sum(e.rows for e in snapshot.partitions.values()) == site.sources["few"].num_rows


def test_more_partitions_than_max_partitions_still_fails_discovery(
    site: Site, capfd: pytest.CaptureFixture[str]
) -> None:
    capfd.readouterr()
    with mapped_task_limit(4):
        run = site.run("refresh_too_many")
    assert str(run.state) == "failed"
    assert task_state(run, "discover") == "failed", "refused before any batch is planned"
    assert site.catalog("too_many").latest() is None
    logged = "".join(capfd.readouterr())
    assert "TooManyPartitionsError" in logged, logged[-2000:]
    assert f"more than refresh.max_partitions ({TOO_MANY_LIMIT})" in logged, logged[-2000:]
