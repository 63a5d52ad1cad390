"""A refresh of selected partitions during a re-partitioning publishes the move of the old partitions
holding their rows and the refresh itself in ONE catalog version; the search for those old partitions
reads only the candidates the pruning keeps, and finds exactly what reading them all finds."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from test_repartition import TRANSITIONS, Scenario

from airflow_partitions.keys import PartitionKey
from airflow_partitions.refresh.pipeline import refresh_dataset
from airflow_partitions.table import open_handle
from airflow_partitions.write.commit import open_write_target
from airflow_partitions.write.refresh_moves import old_partitions_holding
from airflow_partitions.write.repartition import repartition, start_layout
from airflow_partitions.write.routing import route_to_paths

MOVES = {
    "day-to-month": TRANSITIONS["day-to-month"],
    # Coarser to finer: an old month partition holds rows of days the refresh does not select.
    "month-to-day": (["p_day: date_trunc('month', ts)"], ["p_day: date_trunc('day', ts)"]),
    "bucket-8-to-16": TRANSITIONS["bucket-8-to-16"],
}
SEARCHES = {**TRANSITIONS, "month-to-day": MOVES["month-to-day"]}
# Transitions where a refresh of full mode rewrites the old holders' siblings from the source instead of
# moving the old holders (every field a bucket; `write.refresh_siblings`).
FROM_SOURCE = {"bucket-8-to-16"}
# Transitions where an old partition's key fixes the new key of each of its rows (finer to coarser).
IMPLIED = {"day-to-month", "identity-to-truncate"}


def current_keys(scenario: Scenario) -> dict[str, tuple[PartitionKey, pa.Table]]:
    """The source's rows by their key under the current partition_by: {key path: (key, rows)}."""
    target = open_write_target(open_handle(scenario.project, scenario.dataset()))
    routed = route_to_paths(scenario.source, target.transforms, target.names, dataset="events")
    return {path: (key, rows) for path, (key, rows) in routed.items()}


def old_holding(scenario: Scenario, key: PartitionKey, *, prune: bool = True) -> Any:
    return old_partitions_holding(open_handle(scenario.project, scenario.dataset()), [key], prune=prune)


def change_source_rows(scenario: Scenario, ids: list[int]) -> None:
    """The source changes under the refresh: rows `ids` get a new `x`, one of them is deleted and a copy
    of another (same partition values) is added."""
    chosen = pc.is_in(scenario.source.column("id"), value_set=pa.array(ids, pa.int64()))
    changed = scenario.source.filter(chosen)
    rest = scenario.source.filter(pc.invert(chosen))
    x = pa.array([1234.5 + n for n in range(changed.num_rows)], pa.float64())
    changed = changed.set_column(changed.schema.get_field_index("x"), "x", x)
    # Same partition values (the id too: bucket fields hash it), another x.
    extra = changed.slice(0, 1)
    extra = extra.set_column(extra.schema.get_field_index("x"), "x", pa.array([-0.5], pa.float64()))
    scenario.source = pa.concat_tables([rest, changed.slice(1), extra])
    scenario.save_source()


def kill_refresh_commit(scenario: Scenario, partition: str) -> None:
    """Run the refresh of `partition` in a child SIGKILLed as it commits: nothing may be published."""
    script = textwrap.dedent(
        f"""
        import os, signal
        from airflow_partitions.catalog.catalog import Catalog
        from airflow_partitions.refresh.pipeline import refresh_dataset
        real = Catalog.commit
        def commit(self, **kwargs):
            if kwargs.get("operation") in ("refresh", "repartition"):
                os.kill(os.getpid(), signal.SIGKILL)
            return real(self, **kwargs)
        Catalog.commit = commit
        refresh_dataset({str(scenario.spec)!r}, "events", partitions=[{partition!r}], strategy="arrow")
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=scenario.root, timeout=120)
    assert done.returncode == -9, "the child was killed as it committed"


def pick_partition(scenario: Scenario) -> tuple[str, PartitionKey, list[int]]:
    """A current key (not NULL) whose rows are all still in old partitions, at least two of them."""
    keys = current_keys(scenario)
    for path, (key, rows) in sorted(keys.items(), key=lambda item: -item[1][1].num_rows):
        if None in key.values or rows.num_rows < 2 or path in scenario.snapshot().partitions:
            continue
        if old_holding(scenario, key).holding:
            return path, key, rows.column("id").to_pylist()
    raise AssertionError("no key of the source is left in old partitions")


@pytest.mark.parametrize("transition", sorted(MOVES))
def test_a_selective_refresh_moves_and_refreshes_in_one_commit(
    tmp_path: Path, transition: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, new = MOVES[transition]
    scenario = Scenario(tmp_path, 40 + sorted(MOVES).index(transition), old)
    scenario.full_refresh()
    scenario.set_partition_by(new)
    repartition(open_handle(scenario.project, scenario.dataset()), max_partitions=1)
    scenario.check("first batch")
    path, key, ids = pick_partition(scenario)
    holding = old_holding(scenario, key).key_paths
    change_source_rows(scenario, ids)
    before = scenario.snapshot()

    # The refresh fails after planning (its rows are never written): nothing of it, the move included,
    # is published.
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the refresh's engine failed")

    with monkeypatch.context() as patched:
        patched.setattr("airflow_partitions.refresh.pipeline.arrow_refresh", broken)
        with pytest.raises(RuntimeError, match="engine failed"):
            refresh_dataset(str(scenario.spec), "events", partitions=[path], strategy="arrow")
    assert scenario.snapshot().version == before.version, "a failed refresh publishes no move"
    kill_refresh_commit(scenario, path)
    assert scenario.snapshot().version == before.version, "a refresh killed as it commits publishes nothing"

    summary = refresh_dataset(str(scenario.spec), "events", partitions=[path], strategy="arrow")
    after = scenario.snapshot()
    assert after.version == before.version + 1, "the move and the refresh are one version"
    assert summary.version == after.version
    if transition in FROM_SOURCE:
        # Its old holders' rows are the source's: their siblings are rewritten from it, nothing moved
        # (`test_migration_refresh_siblings`).
        assert "migrated" not in summary.conservation
        replaced = summary.conservation["replaced_from_source"]
        assert replaced["partitions"] == len(holding)
        assert replaced["read"] == 0
    else:
        migrated = summary.conservation["migrated"]
        assert migrated["partitions"] == len(holding)
        assert migrated["rows"] == migrated["superseded"] + migrated["appended"]
        assert migrated["superseded"] > 0, "old rows of the refreshed partition are superseded, not copied"
    assert not set(holding) & set(after.partitions), "the old partitions holding its rows are gone"
    assert after.partitions[path].rows == current_keys(scenario)[path][1].num_rows
    scenario.check(f"refresh of {path} during the migration")

    # A selection by filter, taking the NULL partition along: its rows too leave the old layout at once.
    column = "id" if "bucket" in transition else "ts"
    nulls = current_keys(scenario)
    null_paths = [p for p, (k, _rows) in nulls.items() if None in k.values and p not in after.partitions]
    summary = refresh_dataset(
        str(scenario.spec), "events", where=f"{column} IS NULL OR {column} < {low(scenario, column)}"
    )
    assert scenario.snapshot().version == after.version + 1
    for null_path in null_paths:
        assert null_path in scenario.snapshot().partitions
    scenario.check("refresh by filter during the migration")
    while scenario.snapshot().other_layout(scenario.dataset().acceleration.partition_spec_id)[0]:
        repartition(open_handle(scenario.project, scenario.dataset()), max_partitions=3)
    scenario.check("migration complete")


def low(scenario: Scenario, column: str) -> str:
    """A literal splitting the source's non-NULL values of `column` about a third of the way."""
    values = sorted(v for v in scenario.source.column(column).to_pylist() if v is not None)
    value = values[len(values) // 3]
    return str(value) if column == "id" else f"TIMESTAMPTZ '{value.isoformat()}'"


@pytest.mark.parametrize("transition", sorted(SEARCHES))
def test_the_holding_search_reads_only_candidates_and_finds_the_same(tmp_path: Path, transition: str) -> None:
    """For every key of the source under the new partition_by (NULL keys included), the pruned search
    finds exactly the old partitions reading all of them finds, and reads fewer partitions in total:
    none where each old key implies the new one."""
    old, new = SEARCHES[transition]
    scenario = Scenario(tmp_path, 60 + sorted(SEARCHES).index(transition), old)
    scenario.full_refresh()
    scenario.set_partition_by(new)
    handle = open_handle(scenario.project, scenario.dataset())
    assert start_layout(open_write_target(handle))
    pruned_reads = full_reads = 0
    keys = current_keys(scenario)
    if transition != "bucket-8-to-16":  # ids are never NULL
        assert any(None in key.values for key, _rows in keys.values()), "the data has NULL keys"
    for path, (key, rows) in keys.items():
        pruned = old_holding(scenario, key)
        full = old_holding(scenario, key, prune=False)
        assert pruned.key_paths == full.key_paths, path
        assert full.holding, f"{path}: its {rows.num_rows} rows are in some old partition"
        pruned_reads += pruned.read
        full_reads += full.read
    assert pruned_reads < full_reads, (pruned_reads, full_reads)
    if transition in IMPLIED:
        # Every old key implies one new key: the plan judges each candidate exact, none is read.
        assert pruned_reads == 0, pruned_reads


@pytest.mark.parametrize("slice_rows", [1, 3])
def test_the_holding_search_stops_early_and_still_finds_exactly(
    tmp_path: Path, slice_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The search routes an old partition's rows in growing slices and stops at the first wanted key:
    with slices of a row or a few, it finds, for every key, exactly the old partitions whose rows routed
    whole reach that key."""
    from airflow_partitions.write import refresh_moves

    old, new = SEARCHES["month-to-day"]
    scenario = Scenario(tmp_path, 66, old)
    scenario.full_refresh()
    scenario.set_partition_by(new)
    handle = open_handle(scenario.project, scenario.dataset())
    assert start_layout(open_write_target(handle))
    target = open_write_target(handle)
    snapshot = scenario.snapshot()
    truth: dict[str, set[str]] = {}
    for path, entry in snapshot.partitions.items():
        for key_path in route_to_paths(target.read(entry.files), target.transforms, target.names):
            truth.setdefault(key_path, set()).add(path)
    monkeypatch.setattr(refresh_moves, "FIRST_SLICE_ROWS", slice_rows)
    for path, (key, _rows) in current_keys(scenario).items():
        assert set(old_holding(scenario, key, prune=False).key_paths) == truth[path], path


def test_reads_right_after_a_change_judge_old_partitions_under_their_spec(tmp_path: Path) -> None:
    """Once partition_by changed and the catalog took the new spec, every partition is still under the
    old one: a filter on the new expression must judge them with the old fields (it pruned bucket
    partitions of `bucket(8, id)` as if their keys were `bucket(16, id)` values, losing rows)."""
    old, new = TRANSITIONS["bucket-8-to-16"]
    scenario = Scenario(tmp_path, 40, old)
    scenario.full_refresh()
    scenario.set_partition_by(new)
    assert start_layout(open_write_target(open_handle(scenario.project, scenario.dataset())))
    assert scenario.snapshot().spec_ids_in_use() != {scenario.dataset().acceleration.partition_spec_id}
    scenario.check("every partition under the old spec, the new one current")


@pytest.mark.spark
def test_the_spark_strategy_moves_and_refreshes_in_one_commit(tmp_path: Path, spark: Any) -> None:
    """The move joins the commit after staging, whatever engine staged: the same with the Spark stage."""
    old, new = MOVES["month-to-day"]
    scenario = Scenario(tmp_path, 44, old)
    scenario.full_refresh()
    scenario.set_partition_by(new)
    repartition(open_handle(scenario.project, scenario.dataset()), max_partitions=1)
    path, key, ids = pick_partition(scenario)
    holding = old_holding(scenario, key).key_paths
    change_source_rows(scenario, ids)
    before = scenario.snapshot()
    summary = refresh_dataset(str(scenario.spec), "events", partitions=[path], strategy="spark", spark=spark)
    assert summary.strategy == "spark"
    after = scenario.snapshot()
    assert after.version == before.version + 1, "the move and the refresh are one version"
    assert summary.conservation["migrated"]["partitions"] == len(holding)
    assert summary.conservation["migrated"]["appended"] > 0, "the old month held days not refreshed"
    assert not set(holding) & set(after.partitions)
    scenario.check(f"Spark refresh of {path} during the migration")


@pytest.mark.s3
def test_the_commit_moves_old_partitions_on_s3(
    tmp_path: Path, s3_server: dict[str, str], s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`accelerator_dir: s3://...`: the holding search fetches the candidates' files, and the commit of a
    plan naming old partitions (here with its one partition left unrefreshed, `require_all=False`, so
    every moved row is appended) uploads the moved rows and removes the old partitions in one version."""
    from airflow_partitions.refresh.commit import commit_refresh
    from airflow_partitions.refresh.pipeline import plan_refresh
    from airflow_partitions.write import append

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server["endpoint_url"])
    monkeypatch.chdir(tmp_path)
    old, new = MOVES["month-to-day"]
    scenario = Scenario(tmp_path, 12, old, accelerator_dir=f"s3://{s3_bucket}/acc")
    append(open_handle(scenario.project, scenario.dataset()), scenario.source)
    scenario.set_partition_by(new)
    repartition(open_handle(scenario.project, scenario.dataset()), max_partitions=1)
    path, key, _ids = pick_partition(scenario)
    holding = old_holding(scenario, key).key_paths
    before = scenario.snapshot()
    plan = plan_refresh(scenario.project, "events", partitions=[path])
    assert sorted(plan.migrate) == sorted(holding)
    assert plan.base_version == before.version
    commit = commit_refresh(open_handle(scenario.project, scenario.dataset()), plan, [], require_all=False)
    after = scenario.snapshot()
    assert commit.version == after.version == before.version + 1
    assert commit.conservation is not None
    assert commit.conservation["migrated"]["appended"] == sum(before.partitions[p].rows for p in holding)
    assert not set(holding) & set(after.partitions)
    assert not (tmp_path / "acc").exists(), "nothing of the acceleration is local"
    scenario.check("old partitions moved by a commit on S3")


def test_a_lost_row_or_a_damaged_old_file_refuses_the_whole_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition gaining moved rows whose new file holds one row less than routed to it: the refresh's
    commit raises `ConservationError` naming it with both counts, and publishes nothing (the refresh
    included). A damaged old file is refused before it is read (`StorageError`), nothing published."""
    import pyarrow.parquet as pq

    from airflow_partitions.exceptions import ConservationError, StorageError
    from airflow_partitions.refresh.commit import commit_refresh
    from airflow_partitions.refresh.pipeline import plan_refresh
    from airflow_partitions.write import commit as write_commit

    old, new = MOVES["month-to-day"]
    scenario = Scenario(tmp_path, 13, old)
    scenario.full_refresh()
    scenario.set_partition_by(new)
    repartition(open_handle(scenario.project, scenario.dataset()), max_partitions=1)
    path, _key, _ids = pick_partition(scenario)
    plan = plan_refresh(scenario.project, "events", partitions=[path])
    before = scenario.snapshot()
    handle = open_handle(scenario.project, scenario.dataset())
    real = write_commit._write_change
    short: list[str] = []

    def write_one_row_short(target: Any, change: Any) -> Any:
        files, written = real(target, change)
        if written and not short:
            short.append(change.key_path)
            return files, written - 1
        return files, written

    with monkeypatch.context() as patched:
        patched.setattr(write_commit, "_write_change", write_one_row_short)
        with pytest.raises(ConservationError) as refused:
            commit_refresh(handle, plan, [], require_all=False)
    expected, actual = refused.value.partitions[short[0]]
    assert actual == expected - 1
    assert scenario.snapshot().version == before.version, "nothing published"

    victim = max(plan.migrate, key=lambda p: before.partitions[p].rows)
    file = open_write_target(handle).root / before.partitions[victim].files[0].path
    pq.write_table(pq.read_table(file).slice(1), file)
    with pytest.raises(StorageError, match="damaged"):
        commit_refresh(handle, plan, [], require_all=False)
    assert scenario.snapshot().version == before.version, "nothing published"


def test_a_filtered_refresh_drops_old_rows_of_keys_the_source_no_longer_has(tmp_path: Path) -> None:
    """Every source row of a month still held by old day partitions is deleted; a refresh whose filter
    covers that month removes those rows too (as it removes a partition of the current layout the
    source no longer has), in its one commit: the full read equals the source."""
    old, new = MOVES["day-to-month"]
    scenario = Scenario(tmp_path, 14, old)
    scenario.full_refresh()
    scenario.set_partition_by(new)
    repartition(open_handle(scenario.project, scenario.dataset()), max_partitions=1)
    _path, key, ids = pick_partition(scenario)
    month = key.values[0]
    holding = old_holding(scenario, key).key_paths
    gone = pc.is_in(scenario.source.column("id"), value_set=pa.array(ids, pa.int64()))
    scenario.source = scenario.source.filter(pc.invert(gone))
    scenario.save_source()
    before = scenario.snapshot()
    summary = refresh_dataset(
        str(scenario.spec),
        "events",
        where=f"ts >= TIMESTAMPTZ '{month.isoformat()}' AND ts < TIMESTAMPTZ '{month.isoformat()}' + "
        "INTERVAL 1 MONTH",
        strategy="arrow",
    )
    after = scenario.snapshot()
    assert after.version == before.version + 1
    assert summary.conservation["migrated"]["superseded"] >= len(ids)
    assert not set(holding) & set(after.partitions)
    scenario.check("the month the source no longer has is gone from both layouts")


def biggest_key(scenario: Scenario) -> tuple[str, list[int]]:
    """The current key (not NULL) with the most source rows: its path and its rows' ids."""
    keys = current_keys(scenario)
    path = max((p for p, (k, _r) in keys.items() if None not in k.values), key=lambda p: keys[p][1].num_rows)
    return path, keys[path][1].column("id").to_pylist()


@pytest.mark.parametrize("transition", ["bucket-8-to-16", "month-to-day"])
def test_the_first_selective_refresh_after_a_change_switches_the_layout_in_its_own_commit(
    tmp_path: Path, transition: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Right after partition_by changed (no batch ran), a refresh of one partition makes the new spec
    current, moves the old partitions holding its rows and refreshes it in ONE catalog version. One that
    fails after planning, or is killed as it commits, leaves the catalog at the version it started from,
    the old spec current. The switch must be based on the newest version: a commit landing between the
    plan and the refresh's commit refuses it (`CommitConflictError`), nothing of it published. The same
    after a cancel (partition_by reverted), where partitions of the new spec go back to qualified paths
    and the old ones to plain paths, a bucket's among them replaced in the same commit."""
    from airflow_partitions.exceptions import CommitConflictError
    from airflow_partitions.refresh import pipeline

    old, new = MOVES[transition]
    scenario = Scenario(tmp_path, 70 + sorted(MOVES).index(transition), old)
    scenario.full_refresh()
    scenario.set_partition_by(new)
    before = scenario.snapshot()
    assert before.partition_spec.spec_id != scenario.dataset().acceleration.partition_spec_id
    path, ids = biggest_key(scenario)
    change_source_rows(scenario, ids[:3])

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the refresh's engine failed")

    with monkeypatch.context() as patched:
        patched.setattr("airflow_partitions.refresh.pipeline.arrow_refresh", broken)
        with pytest.raises(RuntimeError, match="engine failed"):
            refresh_dataset(str(scenario.spec), "events", partitions=[path], strategy="arrow")
    kill_refresh_commit(scenario, path)
    unchanged = scenario.snapshot()
    assert unchanged.version == before.version, "a failed refresh publishes nothing, the switch neither"
    assert unchanged.partition_spec.spec_id == before.partition_spec.spec_id

    summary = refresh_dataset(str(scenario.spec), "events", partitions=[path], strategy="arrow")
    after = scenario.snapshot()
    assert after.version == summary.version == before.version + 1, "switch, move and refresh: one version"
    assert after.operation == "refresh"
    assert after.partition_spec.spec_id == scenario.dataset().acceleration.partition_spec_id
    if transition in FROM_SOURCE:
        assert summary.conservation["replaced_from_source"]["read"] == 0
    else:
        assert summary.conservation["migrated"]["superseded"] > 0
    assert after.partitions[path].rows == current_keys(scenario)[path][1].num_rows
    assert after.total_rows == scenario.source.num_rows
    scenario.check(f"first refresh of {path} after the change")

    # Cancel: the first refresh switches back in its own commit.
    scenario.set_partition_by(old)
    path, ids = biggest_key(scenario)
    change_source_rows(scenario, ids[:2])
    refresh_dataset(str(scenario.spec), "events", partitions=[path], strategy="arrow")
    cancelled = scenario.snapshot()
    assert cancelled.version == after.version + 1
    assert cancelled.partition_spec.spec_id == before.partition_spec.spec_id
    scenario.check(f"first refresh of {path} after the cancel")

    # Back to the new partition_by, and a repartition run switches the layout while the refresh runs.
    scenario.set_partition_by(new)
    path, _ids = biggest_key(scenario)
    real_commit = pipeline.commit_refresh

    def racing(*args: Any, **kwargs: Any) -> Any:
        assert start_layout(open_write_target(open_handle(scenario.project, scenario.dataset())))
        return real_commit(*args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(pipeline, "commit_refresh", racing)
        with pytest.raises(CommitConflictError, match="switches the current partition spec"):
            refresh_dataset(str(scenario.spec), "events", partitions=[path], strategy="arrow")
    raced = scenario.snapshot()
    assert raced.version == cancelled.version + 1
    assert raced.operation == "repartition-start"
    scenario.check("a refresh refused by a concurrent switch")
    refresh_dataset(str(scenario.spec), "events", partitions=[path], strategy="arrow")
    assert scenario.snapshot().version == raced.version + 1
    scenario.check(f"refresh of {path} after the concurrent switch")
    while scenario.snapshot().other_layout(scenario.dataset().acceleration.partition_spec_id)[0]:
        repartition(open_handle(scenario.project, scenario.dataset()), max_partitions=3)
    scenario.check("migration complete")
