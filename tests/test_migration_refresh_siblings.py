"""A refresh of selected partitions during a re-partitioning rewrites, from the source, the siblings of the
old partitions holding the selection's rows (the current keys those old partitions' rows route to) and
removes the old partitions in the same commit without reading them, where every such partition's rows are
the source's (full refresh mode, written whole by a refresh, bucket fields only). Where that does not hold
(rows written through the hook, `refresh_mode: append`), the old partitions are moved as before, and the
written rows are kept.

After every step a full read equals the source (or the source plus the rows only written through the hook)
and 30 random filters equal DuckDB over it (`test_repartition.Scenario.check`), on the hostile rows of
`matrix_support` (NULL partition values, extreme integers, unicode).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from test_migration_refresh_commit import change_source_rows
from test_repartition import TRANSITIONS, Scenario

from airflow_partitions.exceptions import RefreshError
from airflow_partitions.refresh.commit import commit_refresh
from airflow_partitions.refresh.pipeline import plan_refresh, refresh_dataset
from airflow_partitions.table import open_handle
from airflow_partitions.transforms import parse_transform
from airflow_partitions.write import append
from airflow_partitions.write.commit import open_write_target
from airflow_partitions.write.refresh_siblings import field_values
from airflow_partitions.write.repartition import repartition
from airflow_partitions.write.routing import route_to_paths

SIBLINGS = {
    "bucket-8-to-16": TRANSITIONS["bucket-8-to-16"],
    # gcd(6, 4) = 2: an old bucket's rows fall in two new ones, each held by three old ones.
    "bucket-6-to-4": (["p_b: bucket(6, id)"], ["p_b: bucket(4, id)"]),
    # Finer to coarser: each old bucket's rows all route to the refreshed key, no sibling.
    "bucket-16-to-8": (["p_b: bucket(16, id)"], ["p_b: bucket(8, id)"]),
    # NULL values: the NULL bucket of the old spec holds the NULL bucket of the new one.
    "n-int-4-to-8": (["p_n: bucket(4, n_int)"], ["p_n: bucket(8, n_int)"]),
    # Two fields, one kept as it is (its value carries over, NULL included).
    "two-fields": (
        ["p_b: bucket(4, id)", "p_n: bucket(3, n_int)"],
        ["p_b: bucket(8, id)", "p_n: bucket(3, n_int)"],
    ),
}


def holders_by_key(scenario: Scenario) -> dict[str, set[str]]:
    """Per current key path, the old partitions holding a row routing to it: every old partition read
    whole and routed (the truth the plan is judged against)."""
    handle = open_handle(scenario.project, scenario.dataset())
    target = open_write_target(handle)
    spec_id = scenario.dataset().acceleration.partition_spec_id
    holders: dict[str, set[str]] = {}
    for path, entry in scenario.snapshot().partitions.items():
        if entry.spec_id == spec_id or not entry.rows:
            continue
        for key_path in route_to_paths(target.read(entry.files), target.transforms, target.names):
            holders.setdefault(key_path, set()).add(path)
    return holders


def routed(scenario: Scenario, rows: pa.Table) -> dict[str, pa.Table]:
    """`rows` by their key path under the current partition_by."""
    target = open_write_target(open_handle(scenario.project, scenario.dataset()))
    parts = route_to_paths(rows, target.transforms, target.names)
    return {path: part for path, (_key, part) in parts.items()}


def start_migration(scenario: Scenario, new: list[str]) -> None:
    """The acceleration under the old partition_by, then the change and one batch (the layout switched,
    old partitions left)."""
    scenario.full_refresh()
    assert all(entry.whole_from_source for entry in scenario.snapshot().partitions.values())
    scenario.set_partition_by(new)
    repartition(open_handle(scenario.project, scenario.dataset()), max_partitions=1)
    scenario.check("first batch")


def record_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths of the partition files whose rows are read from now on (every read of a partition's rows
    on the write side, the holding search and the move included, goes through `WriteTarget.read`)."""
    from airflow_partitions.write.commit import WriteTarget

    read: list[str] = []
    real = WriteTarget.read

    def reading(self: Any, files: Any, columns: Any = None) -> Any:
        read.extend(f.path for f in files)
        return real(self, files, columns)

    monkeypatch.setattr(WriteTarget, "read", reading)
    return read


def files_of(snapshot: Any, paths: Any) -> set[str]:
    return {f.path for path in paths for f in snapshot.partitions[path].files}


def finish_migration(scenario: Scenario, step: str) -> None:
    while scenario.snapshot().other_layout(scenario.dataset().acceleration.partition_spec_id)[0]:
        repartition(open_handle(scenario.project, scenario.dataset()), max_partitions=2)
    scenario.check(step)


@pytest.mark.parametrize("transition", sorted(SIBLINGS))
def test_siblings_are_refreshed_from_the_source_and_old_partitions_removed_unread(
    tmp_path: Path, transition: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, new = SIBLINGS[transition]
    scenario = Scenario(tmp_path, 90 + sorted(SIBLINGS).index(transition), old)
    start_migration(scenario, new)
    holders = holders_by_key(scenario)
    # The key with the most old holders (a NULL key where the data has one held by old partitions).
    nulls = [path for path in holders if "NULL" in path]
    path = nulls[0] if nulls else max(sorted(holders), key=lambda p: len(holders[p]))
    source_keys = routed(scenario, scenario.source)
    # The source changes under the refresh, in the selected partition and in a sibling.
    siblings_of = {p for p, held in holders.items() if held & holders[path]} - {path}
    changed = [path, *sorted(siblings_of)[:1]]
    change_source_rows(
        scenario, [i for p in changed if p in source_keys for i in source_keys[p]["id"].to_pylist()[:3]]
    )

    plan = plan_refresh(scenario.project, "events", partitions=[path])
    replaced, refreshed = set(plan.replaced_old), {item.key_path for item in plan.items}
    assert replaced, plan.notes
    assert not plan.migrate, plan.notes
    assert any("instead of moved" in note for note in plan.notes), plan.notes
    # Closed and sufficient: the old partitions holding a row of a refreshed key are all replaced, and
    # every row of a replaced old partition routes to a refreshed key.
    for key_path, held in holders.items():
        if key_path in refreshed:
            assert held <= replaced, (key_path, held, replaced)
        else:
            assert not held & replaced, (key_path, held, replaced)
    if transition == "bucket-16-to-8" or (transition == "n-int-4-to-8" and "NULL" in path):
        assert refreshed == {path}, "every row of the old holders routes to the refreshed key: no sibling"
    else:
        assert refreshed > {path}, "the old holders' rows route to siblings, refreshed with it"

    # The refresh reads no row of the replaced old partitions.
    before = scenario.snapshot()
    with monkeypatch.context() as patched:
        read = record_reads(patched)
        summary = refresh_dataset(str(scenario.spec), "events", partitions=[path], strategy="arrow")
    assert not set(read) & files_of(before, replaced), read
    after = scenario.snapshot()
    assert after.version == summary.version == before.version + 1, "one version"
    assert "migrated" not in summary.conservation
    record = summary.conservation["replaced_from_source"]
    assert record["partitions"] == len(replaced)
    assert record["read"] == 0
    assert record["rows"] == sum(before.partitions[p].rows for p in replaced)
    assert record["refreshed_partitions"] == len(refreshed)
    assert not replaced & set(after.partitions), "the old partitions are gone"
    now = routed(scenario, scenario.source)
    for key_path in refreshed:
        assert after.partitions[key_path].whole_from_source
        assert after.partitions[key_path].rows == (now[key_path].num_rows if key_path in now else 0)
    scenario.check(f"refresh of {path} with its siblings")
    finish_migration(scenario, "migration complete")


def test_a_selection_by_filter_takes_the_siblings_along(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`where` selects several keys: their old holders' siblings join, and the old holders leave unread."""
    old, new = SIBLINGS["bucket-8-to-16"]
    scenario = Scenario(tmp_path, 97, old)
    start_migration(scenario, new)
    ids = sorted(scenario.source.column("id").to_pylist())
    low = ids[len(ids) // 2]
    where = f"(bucket(16, id) = 1 OR bucket(16, id) = 2) AND id >= {low}"
    plan = plan_refresh(scenario.project, "events", where=where)
    assert plan.replaced_old
    assert not plan.migrate
    before = scenario.snapshot()
    with monkeypatch.context() as patched:
        read = record_reads(patched)
        summary = refresh_dataset(str(scenario.spec), "events", where=where, strategy="arrow")
    assert not set(read) & files_of(before, plan.replaced_old), read
    assert summary.conservation["replaced_from_source"]["read"] == 0
    scenario.check("refresh by filter with the siblings")
    finish_migration(scenario, "migration complete")


@pytest.mark.parametrize("when", ["before the change", "during the migration"])
def test_rows_written_through_the_hook_are_moved_not_lost(
    tmp_path: Path, when: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows the hook wrote and the source never had: in an old partition (written before the change), or
    in the sibling's current partition (written during the migration). The refresh of the selected key
    moves the old partition as before: the written rows of keys it does not refresh stay. (Were the
    siblings rewritten from the source, they would be lost: the full read would lack them.)"""
    old, new = SIBLINGS["bucket-8-to-16"]
    scenario = Scenario(tmp_path, 98 if when == "before the change" else 99, old)
    scenario.full_refresh()
    handle = open_handle(scenario.project, scenario.dataset())
    written = scenario.new_rows(64)
    if when == "before the change":
        append(handle, written)  # into old partitions, the source never has them
    scenario.set_partition_by(new)
    repartition(open_handle(scenario.project, scenario.dataset()), max_partitions=1)
    holders = holders_by_key(scenario)
    by_key = routed(scenario, written)
    # A selected key whose old holder's rows also route to a sibling the written rows reach.
    choices = [
        p
        for p in sorted(holders)
        if "NULL" not in p and any(s != p and s in by_key and holders.get(s) == holders[p] for s in holders)
    ]
    path = choices[0]
    sibling = next(s for s in sorted(holders) if s != path and s in by_key and holders[s] == holders[path])
    if when == "during the migration":
        written = by_key[sibling]
        append(open_handle(scenario.project, scenario.dataset()), written)  # the sibling's current partition
        assert not scenario.snapshot().partitions[sibling].whole_from_source
    kept = pa.concat_tables([part for p, part in routed(scenario, written).items() if p != path])
    assert sibling in routed(scenario, kept)

    plan = plan_refresh(scenario.project, "events", partitions=[path])
    assert plan.migrate, plan.notes
    assert not plan.replaced_old, plan.notes
    assert any("not written whole from the source" in note for note in plan.notes), plan.notes
    before = scenario.snapshot()
    with monkeypatch.context() as patched:
        read = record_reads(patched)
        summary = refresh_dataset(str(scenario.spec), "events", partitions=[path], strategy="arrow")
    assert files_of(before, plan.migrate) <= set(read), "the move reads the old partitions: counted"
    assert summary.conservation["migrated"]["appended"] > 0
    assert "replaced_from_source" not in summary.conservation
    truth = scenario.source
    scenario.source = pa.concat_tables([truth, kept])  # what the acceleration holds: the source + kept
    scenario.check(f"refresh of {path}: the written rows of {sibling} kept")
    finish_migration(scenario, "migration complete, the written rows kept")


def test_append_mode_moves_the_old_partitions(tmp_path: Path) -> None:
    """`refresh_mode: append` keeps rows the source may no longer have: the plan moves the old partitions
    (`migrate`), never rewrites siblings from the source, and says why."""
    old, new = SIBLINGS["bucket-8-to-16"]
    scenario = Scenario(tmp_path, 100, old)
    mode = "      refresh_mode: append\n      refresh: {watermark_column: id}\n"

    def with_mode() -> None:
        text = scenario.spec.read_text(encoding="utf-8")
        scenario.spec.write_text(text.replace("      engine: parquet\n", "      engine: parquet\n" + mode))

    with_mode()
    scenario.full_refresh()
    scenario.set_partition_by(new)
    with_mode()
    repartition(open_handle(scenario.project, scenario.dataset()), max_partitions=1)
    holders = holders_by_key(scenario)
    path = max(sorted(holders), key=lambda p: len(holders[p]))
    plan = plan_refresh(scenario.project, "events", partitions=[path])
    assert not plan.replaced_old
    assert set(plan.migrate) >= holders[path]
    assert path in {item.key_path for item in plan.items}
    assert any("refresh_mode append" in note for note in plan.notes), plan.notes


def test_a_partial_commit_of_a_plan_with_siblings_is_refused(tmp_path: Path) -> None:
    """The old partitions leave only with every partition written in their place: a commit missing one
    (`require_all=False`) is refused, nothing published."""
    old, new = SIBLINGS["bucket-8-to-16"]
    scenario = Scenario(tmp_path, 101, old)
    start_migration(scenario, new)
    holders = holders_by_key(scenario)
    path = sorted(holders)[0]
    plan = plan_refresh(scenario.project, "events", partitions=[path])
    assert plan.replaced_old
    before = scenario.snapshot().version
    with pytest.raises(RefreshError, match="all of them or none"):
        commit_refresh(open_handle(scenario.project, scenario.dataset()), plan, [], require_all=False)
    assert scenario.snapshot().version == before
    scenario.check("nothing published")


@pytest.mark.parametrize(("old_count", "new_count"), [(8, 16), (16, 8), (6, 4), (4, 6), (3, 5), (7, 7)])
def test_the_buckets_a_row_can_fall_in_hold_every_row(old_count: int, new_count: int) -> None:
    """For values of every kind the hash takes (extremes, negatives, NULL), the new bucket of a value is
    among the values `field_values` gives for its old bucket, and that list is as small as the counts
    allow (M / gcd(M, N) buckets)."""
    import math

    rng = random.Random(old_count * 100 + new_count)
    values = [None, 0, -1, 2**63 - 1, -(2**63), *(rng.randrange(-(2**40), 2**40) for _ in range(400))]
    column = pa.array(values, pa.int64())
    old = parse_transform(f"bucket({old_count}, id)")
    new = parse_transform(f"bucket({new_count}, id)")
    old_buckets = old.apply(column).to_pylist()
    new_buckets = new.apply(column).to_pylist()
    for value, before, after in zip(values, old_buckets, new_buckets, strict=True):
        allowed = field_values(new, [(old, old.canonical)], [before])
        assert allowed is not None
        assert after in allowed, (value, before, after, allowed)
        if before is not None:
            assert len(allowed) == new_count // math.gcd(new_count, old_count)
    # Another column bounds nothing.
    other = parse_transform(f"bucket({new_count}, n_int)")
    assert field_values(other, [(old, old.canonical)], [0]) is None


def test_the_mark_of_rows_written_whole_from_the_source(tmp_path: Path) -> None:
    """`whole_from_source` holds after a refresh, through a checkpoint and a layout switch (a rename), and
    no longer once a write changed the partition's rows."""
    from airflow_partitions.catalog import open_catalog

    old, new = SIBLINGS["bucket-8-to-16"]
    scenario = Scenario(tmp_path, 102, old)
    scenario.full_refresh()
    snapshot = scenario.snapshot()
    assert all(entry.whole_from_source for entry in snapshot.partitions.values())
    rows = scenario.new_rows(3)
    touched = set(routed(scenario, rows))
    append(open_handle(scenario.project, scenario.dataset()), rows)
    catalog = open_catalog(scenario.project, scenario.dataset())
    catalog.write_checkpoint(catalog.latest())
    reopened = open_catalog(scenario.project, scenario.dataset()).latest()
    for path, entry in reopened.partitions.items():
        assert entry.whole_from_source == (path not in touched), path
    scenario.set_partition_by(new)
    repartition(open_handle(scenario.project, scenario.dataset()), max_partitions=1)
    switched = scenario.snapshot()
    spec_id = scenario.dataset().acceleration.partition_spec_id
    for path, entry in switched.partitions.items():
        if entry.spec_id != spec_id:
            plain = path.split("/", 1)[1]
            assert entry.whole_from_source == (plain not in touched), path
        else:
            assert not entry.whole_from_source, f"{path} holds moved rows"


@pytest.mark.parametrize("race", ["batch", "write"])
def test_a_refresh_with_siblings_racing_a_batch_or_a_write_is_refused(
    tmp_path: Path, race: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the plan and the commit, a batch moves an old partition the plan removes unread, or a
    write adds rows to a sibling it rewrites: the commit is refused (`CommitConflictError`), nothing of
    it published; run again, the refresh is exact."""
    from test_migration_races import between_plan_and_commit, move_old

    from airflow_partitions.exceptions import CommitConflictError

    old, new = SIBLINGS["bucket-8-to-16"]
    scenario = Scenario(tmp_path, 103 if race == "batch" else 104, old)
    start_migration(scenario, new)
    holders = holders_by_key(scenario)
    path = max(sorted(holders), key=lambda p: len(holders[p]))
    versions: list[int] = []

    def racing(plan: Any) -> None:
        assert plan.replaced_old
        if race == "batch":
            move_old(scenario, plan.replaced_old[0])
        else:
            sibling = next(i.key_path for i in plan.items if i.key_path != path)
            # Written through the hook only (the source file is left as the refresh planned it): the
            # acceleration holds the source and these rows from then on.
            rows = routed(scenario, scenario.new_rows(160))[sibling]
            append(open_handle(scenario.project, scenario.dataset()), rows)
            scenario.source = pa.concat_tables([scenario.source, rows])
        versions.append(scenario.snapshot().version)

    with monkeypatch.context() as patched:
        between_plan_and_commit(patched, racing)
        with pytest.raises(CommitConflictError):
            refresh_dataset(str(scenario.spec), "events", partitions=[path], strategy="arrow")
    assert scenario.snapshot().version == versions[0], "nothing of the refused refresh is published"
    scenario.check(f"refresh refused by a racing {race}")
    refresh_dataset(str(scenario.spec), "events", partitions=[path], strategy="arrow")
    scenario.check(f"refresh after the racing {race}")
    finish_migration(scenario, "migration complete")
