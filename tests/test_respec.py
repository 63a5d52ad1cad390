"""Re-partitioning after a `partition_by` change, through the refresh paths.

A plain refresh rebuilds every partition under the new partition_by in one commit. A refresh of selected
partitions (`--partitions`, `--where`, the DAG's `partitions` / `where` params) first makes the new
partition_by the catalog's (one commit of renames) and moves the old partitions holding rows of the
selection into the new layout (one commit), then refreshes the selection: no row is in two layouts or
in none. A backfill is still refused with `PartitionSpecChangedError`. `status` says what to do.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_partitions.catalog import open_catalog
from airflow_partitions.cli.main import main
from airflow_partitions.exceptions import RefreshError
from airflow_partitions.refresh import Reason, RefreshPlan, plan_refresh
from airflow_partitions.refresh.commit import partition_spec_info
from airflow_partitions.refresh.plan import DiscoveryKind, PartitionWorkItem
from airflow_partitions.spec import load_spec

ROWS = 100_000
OLD_PARTITION_BY = ["region: region"]
NEW_PARTITION_BY = ["truncate(1000, id)"]


def write_spec(path: Path, partition_by: list[str]) -> Path:
    """A one-dataset spec `events`; a `name: expression` entry becomes the `{name: expression}` form."""
    fields = []
    for entry in partition_by:
        name, sep, expression = entry.partition(": ")
        fields.append(f"{{{name}: {json.dumps(expression)}}}" if sep else json.dumps(entry))
    lines = [
        "accelerator_dir: acc",
        "datasets:",
        "  - name: events",
        "    from: file:src",
        "    params: {file_format: parquet}",
        "    acceleration:",
        "      engine: parquet",
        "      partition_by:",
        *[f"        - {field}" for field in fields],
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_source(directory: Path, rows: int = ROWS) -> pa.Table:
    directory.mkdir(parents=True, exist_ok=True)
    table = pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "region": pa.array([["EU", "US", None, "a/b=%"][i % 4] for i in range(rows)], pa.string()),
            "amount": pa.array([None if i % 7 == 0 else i * 0.5 for i in range(rows)], pa.float64()),
        }
    )
    pq.write_table(table, directory / "part-0.parquet")
    return table


def catalog_state(spec_path: Path) -> tuple[int, int, int, str]:
    """(head version, rows, partitions, spec id) of the newest catalog version."""
    project = load_spec(spec_path)
    snapshot = open_catalog(project, project.dataset("events")).latest()
    assert snapshot is not None
    return snapshot.version, snapshot.total_rows, snapshot.partition_count, snapshot.partition_spec.spec_id


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_respec_message(text: str) -> None:
    """The refusal names the dataset, both partition_by lists, and the two ways out."""
    assert "'events'" in text
    assert "expr0: truncate(1000, id)" in text, "the new partition_by"
    assert "region: region" in text, "the partition_by that wrote the catalog"
    assert "airflow-partitions refresh SPEC events" in text, "how to rebuild"
    assert "--full" in text
    assert "one atomic commit" in text
    assert "revert partition_by" in text


@pytest.fixture(scope="module")
def respecced(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """100,000 rows refreshed under `region`, then the spec changed to `truncate(1000, id)`."""
    tmp_path = tmp_path_factory.mktemp("respec")
    write_source(tmp_path / "src")
    spec_path = write_spec(tmp_path / "spec.yaml", OLD_PARTITION_BY)
    assert main(["refresh", str(spec_path), "events"]) == 0
    _, rows, partitions, _ = catalog_state(spec_path)
    assert (rows, partitions) == (ROWS, 4)
    write_spec(spec_path, NEW_PARTITION_BY)
    return spec_path


def copy_of(respecced: Path, tmp_path: Path) -> Path:
    """A private copy of the re-specced project (spec, source and acceleration) for a test that commits."""
    shutil.copytree(respecced.parent, tmp_path / "copy")
    return tmp_path / "copy" / respecced.name


@pytest.mark.spark
@pytest.mark.parametrize(
    "selection",
    [
        ["--partitions", "expr0=5000"],
        ["--partitions", "expr0=5000", "--full"],
        ["--where", "id >= 5000 AND id < 6000"],
        ["--where", "expr0 = 5000"],
    ],
    ids=["partitions", "partitions-full", "where-column", "where-field"],
)
def test_partial_refresh_after_a_spec_change_moves_the_old_rows_first(
    respecced: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], selection: list[str]
) -> None:
    spec_path = copy_of(respecced, tmp_path)
    version, _, _, old_spec = catalog_state(spec_path)
    code, _, err = run_cli(capsys, "refresh", str(spec_path), "events", *selection)
    assert code == 0, err
    new_version, rows, _, spec_id = catalog_state(spec_path)
    assert rows == ROWS, "every row is still there, each in one layout"
    assert spec_id != old_spec, "the new partition_by is the catalog's"
    # One commit makes the new partition_by the catalog's (renames), moves the old partitions holding rows
    # of the selection and refreshes the selection, atomically.
    assert new_version == version + 1
    project = load_spec(spec_path)
    snapshot = open_catalog(project, project.dataset("events")).latest()
    assert snapshot is not None
    assert "expr0=5000" in snapshot.partitions
    assert snapshot.partitions["expr0=5000"].rows == 1000


@pytest.mark.spark
@pytest.mark.airflow
@pytest.mark.parametrize(
    "selection",
    [["--where", "id < 3000"], ["--partitions", "expr0=5000"], []],
    ids=["where", "partitions", "everything"],
)
def test_backfill_after_a_spec_change_is_refused(
    respecced: Path, capsys: pytest.CaptureFixture[str], selection: list[str]
) -> None:
    """A backfill always sends a partition list to the DAG: refused before anything runs."""
    before = catalog_state(respecced)
    code, _, err = run_cli(capsys, "backfill", str(respecced), "events", *selection, "--local")
    assert code != 0
    assert_respec_message(err)
    assert catalog_state(respecced) == before


def test_plan_refresh_of_a_selection_names_the_old_partitions_its_commit_moves(
    respecced: Path, tmp_path: Path
) -> None:
    full = plan_refresh(load_spec(respecced), "events", full=True)
    assert full.replace_all
    assert len(full.items) == full.discovered == 100, "a rebuild plans every partition"
    assert {item.reason for item in full.items} == {Reason.RESPEC}
    spec_path = copy_of(respecced, tmp_path)
    project = load_spec(spec_path)
    plan = plan_refresh(project, "events", partitions=["expr0=5000"])
    assert not plan.replace_all
    assert [item.key_path for item in plan.items] == ["expr0=5000"]
    catalog = open_catalog(project, project.dataset("events"))
    snapshot = catalog.latest()
    assert snapshot is not None
    # Planning commits nothing: the catalog's current spec is still the old one, and the plan's commit
    # makes the new partition_by current (the switch joins the refresh's version).
    assert plan.switch_spec
    assert plan.base_version == snapshot.version
    assert snapshot.partition_spec.spec_id != project.dataset("events").acceleration.partition_spec_id
    # Every region partition holds ids 5000..5999 (regions cycle): the plan names all four, as the switch
    # leaves them (older layouts), for its commit to move them.
    evolved = catalog.evolved(snapshot, partition_spec_info(project.dataset("events")))
    assert evolved.other_layout() == (4, ROWS)
    assert sorted(plan.migrate) == sorted(evolved.partitions)
    # The DAG's commit task gets the plan through XCom: the old partitions to move and the switch go with it.
    again = RefreshPlan.from_json(json.loads(plan.dumps()))
    assert (again.migrate, again.switch_spec) == (plan.migrate, plan.switch_spec)
    assert snapshot.total_rows == ROWS


def test_a_replace_all_plan_cannot_hold_a_subset() -> None:
    item = PartitionWorkItem(key=(5000,), key_path="expr0=5000", reason=Reason.RESPEC, fingerprint="f")
    with pytest.raises(RefreshError, match=r"replaces every partition.*1 of 100"):
        RefreshPlan(
            dataset="events",
            spec_id="0" * 16,
            partition_names=("expr0",),
            base_version=1,
            items=(item,),
            removed=(),
            unchanged=0,
            discovered=100,
            discovery=DiscoveryKind.DYNAMIC,
            fingerprint_granularity="source",
            replace_all=True,
        )
    whole = RefreshPlan(
        dataset="events",
        spec_id="0" * 16,
        partition_names=("expr0",),
        base_version=1,
        items=(item,),
        removed=(),
        unchanged=0,
        discovered=1,
        discovery=DiscoveryKind.DYNAMIC,
        fingerprint_granularity="source",
        replace_all=True,
    )
    assert whole.without_items().items == (), "the commit's item-less copy stays valid"
    assert RefreshPlan.from_json(whole.to_json()) == whole


# --- status says what to do ----------------------------------------------------------------------


def test_status_says_a_plain_refresh_rebuilds(respecced: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "status", str(respecced), "events")
    assert code == 0
    assert "WARNING: partition_by in the spec differs from the catalog's" in out
    assert "spec (expr0: truncate(1000, id)), catalog (region: region)" in out
    assert "A plain refresh (or refresh --full) rebuilds every partition" in out
    assert "first moves the old partitions holding their rows into the new layout" in out
    assert "airflow-partitions repartition SPEC events" in out
    assert "fails until" not in out, "a plain refresh does not fail: it rebuilds"

    code, out, _ = run_cli(capsys, "status", str(respecced), "events", "--json")
    assert code == 0
    report = json.loads(out)["datasets"][0]
    assert report["spec_matches_catalog"] is False
    assert report["spec_partition_by"] == [["expr0", "truncate(1000, id)"]]
    assert report["catalog_partition_by"] == [["region", "region"]]
    assert report["partition_by_changed"] == {
        "rebuild": "airflow-partitions refresh SPEC events",
        "repartition": "airflow-partitions repartition SPEC events",
        "partial_refresh": "moves the old partitions holding its rows first",
        "message": report["partition_by_changed"]["message"],
    }
    assert "rebuilds every partition" in report["partition_by_changed"]["message"]


# --- then a plain refresh rebuilds everything (last in this module: it changes the catalog) ---


@pytest.mark.spark
def test_plain_refresh_rebuilds_every_row_under_the_new_spec(
    respecced: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    version, _, _, old_spec = catalog_state(respecced)
    code, _, err = run_cli(capsys, "refresh", str(respecced), "events")
    assert code == 0, err
    new_version, rows, partitions, spec_id = catalog_state(respecced)
    assert new_version == version + 1, "one atomic commit"
    assert spec_id != old_spec
    assert (rows, partitions) == (ROWS, 100), "every row, re-partitioned into truncate(1000, id)"
    project = load_spec(respecced)
    snapshot = open_catalog(project, project.dataset("events")).latest()
    assert snapshot is not None
    assert set(snapshot.partitions) == {f"expr0={i * 1000}" for i in range(100)}
    code, out, _ = run_cli(capsys, "status", str(respecced), "events", "--json")
    assert "partition_by_changed" not in json.loads(out)["datasets"][0]
    code, _, err = run_cli(capsys, "refresh", str(respecced), "events", "--partitions", "expr0=5000")
    assert code == 0, f"selective refreshes work again once the rebuild is committed: {err}"
    assert catalog_state(respecced)[1] == ROWS


# --- the DAG's discover task moves the old rows the same way ---------------------------------------


@pytest.mark.spark
@pytest.mark.airflow
@pytest.mark.slow
def test_dag_run_with_partitions_or_where_moves_old_rows_after_a_spec_change(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    from airflow_e2e.metadata_db import in_process_metadata_db
    from airflow_e2e.sample import install_example_dag

    from airflow_partitions.dag_factory import build_refresh_dags
    from airflow_partitions.operators.run_conf import RefreshRunConf

    # The example DAG file reads the datasets.yaml beside it; dag.test() syncs it from the dags folder.
    dags_dir = tmp_path / "dags"
    spec_path = install_example_dag(dags_dir, "")
    write_source(dags_dir / "src", rows=2_000)
    write_spec(spec_path, OLD_PARTITION_BY)
    assert main(["refresh", str(spec_path), "events"]) == 0
    write_spec(spec_path, NEW_PARTITION_BY)
    before = catalog_state(spec_path)
    with in_process_metadata_db(str(dags_dir)):
        dag = build_refresh_dags(str(spec_path))["refresh_events"]
        for conf in ({"partitions": ["expr0=1000"]}, {"where": "id < 1500"}):
            run = dag.test(run_conf={**RefreshRunConf().to_conf(), **conf})
            states = {ti.task_id: str(ti.state) for ti in run.get_task_instances() if ti.map_index == -1}
            assert str(run.state) == "success", (conf, states)
            version, rows, _, spec_id = catalog_state(spec_path)
            assert rows == 2_000, f"{conf}: every row, each in one layout"
            assert spec_id != before[3], "the new partition_by is the catalog's"
            assert version > before[0]
