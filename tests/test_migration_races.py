"""Refreshes during a re-partitioning racing other commits between their plan and their commit.

A refresh plans the old-layout partitions it moves (`RefreshPlan.migrate`) and moves them in its own
commit. Before that commit, a re-partitioning batch may move one of them, or move another old partition
into a current partition the refresh writes; a write may append or upsert rows there. The refresh's
commit must then refuse (`CommitConflictError`: nothing of it published, the other commit intact) or
publish an exact result, never lose or double a row; planned again, the refresh goes through. A retried
commit (same commit id, the first attempt's response lost) publishes nothing twice, and a changes refresh
whose stage read other changed keys than its plan found (the count the same) publishes nothing.

After every step a full read equals the source and 30 random filters equal DuckDB over the source
(`test_repartition.Scenario.check`), on the hostile rows of `matrix_support`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from matrix_support import SCHEMA
from test_migration_refresh_commit import change_source_rows, current_keys, old_holding
from test_migration_refresh_modes import AppendScenario, ChangesScenario, landing_in_one_partition
from test_repartition import TRANSITIONS, Scenario

from airflow_partitions.catalog.model import split_key_path
from airflow_partitions.exceptions import CommitConflictError, ConservationError
from airflow_partitions.refresh import pipeline
from airflow_partitions.refresh.layouts import old_holdings
from airflow_partitions.refresh.pipeline import refresh_dataset
from airflow_partitions.refresh.plan import RefreshPlan
from airflow_partitions.table import open_handle
from airflow_partitions.write import append, upsert
from airflow_partitions.write.commit import open_write_target
from airflow_partitions.write.repartition import old_entries, repartition

# Old and new fields on different columns: an old partition holds rows of several new ones and a new one
# rows of several old ones, so an old partition the refresh does not move can hold rows of a partition
# its commit writes.
CROSS = (["p_b: bucket(16, id)"], ["p_m: date_trunc('month', ts)"])


def between_plan_and_commit(monkeypatch: pytest.MonkeyPatch, race: Callable[[RefreshPlan], None]) -> None:
    """`refresh_dataset` runs `race(plan)` once it has planned, before it reads, writes and commits."""
    real = pipeline._plan_for_refresh

    def planned(*args: Any, **kwargs: Any) -> RefreshPlan:
        plan = real(*args, **kwargs)
        race(plan)
        return plan

    monkeypatch.setattr(pipeline, "_plan_for_refresh", planned)


def pick_split(scenario: Scenario) -> tuple[str, list[int]]:
    """A current key (not NULL, at least two rows) with rows still in old partitions: its path, its ids."""
    for path, (key, rows) in sorted(current_keys(scenario).items(), key=lambda item: -item[1][1].num_rows):
        if None not in key.values and rows.num_rows >= 2 and old_holding(scenario, key).holding:
            return path, rows.column("id").to_pylist()
    raise AssertionError("no key of the source is left in old partitions")


def move_old(scenario: Scenario, key_path: str) -> None:
    """A re-partitioning batch moving exactly the old partition `key_path` (committed on its own)."""
    entry = scenario.snapshot().partitions[key_path]
    handle = open_handle(scenario.project, scenario.dataset())
    report = repartition(handle, only=[(entry.spec_id, split_key_path(key_path)[1])])
    assert report.moved == (key_path,)
    assert report.version is not None


def written_by(scenario: Scenario, plan: RefreshPlan) -> set[str]:
    """The current partitions the plan's commit writes: its items, and those the moved rows join."""
    handle = open_handle(scenario.project, scenario.dataset())
    moved = set(plan.migrate)
    holdings = old_holdings(handle, handle.catalog)
    return {item.key_path for item in plan.items} | {p for p, h in holdings.items() if h.paths & moved}


def neighbour(scenario: Scenario, plan: RefreshPlan) -> str:
    """An old partition the plan does not move holding rows of a current partition its commit writes."""
    handle = open_handle(scenario.project, scenario.dataset())
    holdings = old_holdings(handle, handle.catalog)
    written = written_by(scenario, plan)
    others = {old for path in written if path in holdings for old in holdings[path].paths} - set(plan.migrate)
    assert others, "an old partition not planned holds rows of a partition the refresh writes"
    return sorted(others)[0]


def with_new_ids(scenario: Scenario, rows: pa.Table) -> pa.Table:
    ids = pa.array(range(scenario.next_id, scenario.next_id + rows.num_rows), pa.int64())
    scenario.next_id += rows.num_rows
    return rows.set_column(0, "id", ids)


def with_rows(table: pa.Table, rows: pa.Table) -> pa.Table:
    """`table` with `rows` upserted by id (appended when their ids are new)."""
    keep = pc.invert(pc.is_in(table.column("id"), value_set=rows.column("id")))
    return pa.concat_tables([table.filter(keep), rows])


def write_rows(scenario: Scenario, rows: pa.Table, *, replace: bool = False) -> None:
    """An `append` (or, `replace`, an `upsert` by id) of `rows`, to the acceleration and the source."""
    handle = open_handle(scenario.project, scenario.dataset())
    if replace:
        upsert(handle, rows, keys=["id"])
    else:
        append(handle, rows)
    scenario.source = with_rows(scenario.source, rows)
    scenario.save_source()


def check_before(scenario: Scenario, source: pa.Table, step: str) -> None:
    """The full read and the filters against `source`, the source as the refused refresh left it
    unread (the rows it was to bring in are not in the acceleration yet)."""
    now = scenario.source
    scenario.source = source
    try:
        scenario.check(step)
    finally:
        scenario.source = now


def raced_refresh(scenario: Scenario, refresh: Callable[[], Any], expected: str) -> None:
    """Run the raced refresh: refused with nothing of it published, or published in one version."""
    before = scenario.snapshot().version
    if expected == "refused":
        with pytest.raises(CommitConflictError, match="Plan the refresh again"):
            refresh()
        assert scenario.snapshot().version == before + 1, "only the racing commit is published"
    else:
        refresh()
        assert scenario.snapshot().version == before + 2, "the racing commit and the refresh"


SELECTIVE_RACES = [
    "batch-planned",
    "batch-vacuum",  # the batch, then a vacuum deleting the moved partition's files
    "batch-neighbour",
    "append-into",
    "upsert-moved",
    "append-elsewhere",
]


def race_rows(scenario: Scenario, race: str, path: str) -> pa.Table:
    """The rows a racing write sends: two new rows of the refreshed partition (`append-into`), two of its
    rows with another `x` (`upsert-moved`: their old rows are in an old partition the refresh moves), or
    three new rows of a month no partition holds yet (`append-elsewhere`: the refresh does not touch it)."""
    if race == "append-into":
        return with_new_ids(scenario, current_keys(scenario)[path][1].slice(0, 2))
    if race == "upsert-moved":
        rows = current_keys(scenario)[path][1].slice(0, 2)
        x = pa.array([777.25, -0.0], pa.float64())
        return rows.set_column(rows.schema.get_field_index("x"), "x", x)
    rows = with_new_ids(scenario, scenario.source.slice(0, 3))
    far = pa.array([dt.datetime(2099, 1, 15, tzinfo=dt.UTC)] * 3, rows.schema.field("ts").type)
    return rows.set_column(rows.schema.get_field_index("ts"), "ts", far)


@pytest.mark.parametrize("race", SELECTIVE_RACES)
def test_a_selective_refresh_racing_a_batch_or_a_write_is_refused_or_exact(
    tmp_path: Path, race: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = Scenario(tmp_path, 120 + SELECTIVE_RACES.index(race), CROSS[0])
    scenario.full_refresh()
    scenario.set_partition_by(CROSS[1])
    repartition(open_handle(scenario.project, scenario.dataset()), max_partitions=1)
    scenario.check("first batch")
    # The refresh writes the partition from the changed source and moves the old ones holding its rows.
    path, ids = pick_split(scenario)
    before = scenario.source
    change_source_rows(scenario, ids)
    raced: list[str] = []

    def commit_between(plan: RefreshPlan) -> None:
        nonlocal before
        assert plan.migrate, "the refresh moves old partitions in its commit"
        raced.append(race)
        if race in ("batch-planned", "batch-vacuum"):
            move_old(scenario, plan.migrate[0])
            if race == "batch-vacuum":
                scenario.vacuum()
        elif race == "batch-neighbour":
            move_old(scenario, neighbour(scenario, plan))
        else:
            rows = race_rows(scenario, race, path)
            write_rows(scenario, rows, replace=race == "upsert-moved")
            before = with_rows(before, rows)

    with monkeypatch.context() as patched:
        between_plan_and_commit(patched, commit_between)
        raced_refresh(
            scenario,
            lambda: refresh_dataset(str(scenario.spec), "events", partitions=[path], strategy="arrow"),
            "published" if race == "append-elsewhere" else "refused",
        )
    assert raced == [race]
    if race == "append-elsewhere":
        scenario.check(f"refresh raced by {race}")
    else:
        check_before(scenario, before, f"refresh raced by {race}, refused")
    refresh_dataset(str(scenario.spec), "events", partitions=[path], strategy="arrow")
    scenario.check("the refresh planned again")
    assert path in scenario.snapshot().partitions


@pytest.mark.spark
@pytest.mark.parametrize("race", ["batch-planned", "batch-neighbour", "append-into"])
def test_an_append_refresh_racing_a_batch_or_a_write_is_refused_or_exact(
    spark: Any, tmp_path: Path, race: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = AppendScenario(tmp_path, 131, CROSS[0], spark)
    scenario.full_refresh()
    scenario.set_partition_by(CROSS[1])
    repartition(open_handle(scenario.project, scenario.dataset()), max_partitions=1)
    rows = landing_in_one_partition(scenario.dataset(), scenario.new_rows(40))
    before = scenario.source
    scenario.source = pa.concat_tables([scenario.source, rows])
    scenario.save_source()

    def commit_between(plan: RefreshPlan) -> None:
        nonlocal before
        assert plan.refresh_mode == "append"
        assert plan.migrate
        if race == "batch-planned":
            move_old(scenario, plan.migrate[0])
        elif race == "batch-neighbour":
            move_old(scenario, neighbour(scenario, plan))
        else:
            # The write adds rows the refresh reads from the source too (new ids, past the watermark).
            appended = plan.appending[0].key_path if plan.appending else plan.items[0].key_path
            more = current_keys(scenario)[appended][1].slice(0, 2)
            more = with_new_ids(scenario, more)
            write_rows(scenario, more)
            before = with_rows(before, more)

    with monkeypatch.context() as patched:
        between_plan_and_commit(patched, commit_between)
        raced_refresh(scenario, lambda: refresh_dataset(str(scenario.spec), "events", spark=spark), "refused")
    check_before(scenario, before, f"append refresh raced by {race}")
    scenario.refresh_incrementally()
    scenario.check("the append refresh planned again")


@pytest.mark.postgres
@pytest.mark.parametrize("race", ["batch-planned", "batch-neighbour"])
def test_a_changes_refresh_racing_a_batch_is_refused_then_exact(
    tmp_path: Path, pg_database: str, race: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, new = TRANSITIONS["day-to-month"]
    scenario = ChangesScenario(tmp_path, 141, old, pg_database)
    scenario.refresh()
    scenario.set_partition_by(new)
    repartition(open_handle(scenario.project, scenario.dataset()), max_partitions=1)
    scenario.check("first batch")

    def commit_between(plan: RefreshPlan) -> None:
        assert plan.refresh_mode == "changes"
        assert plan.migrate
        move_old(scenario, plan.migrate[0] if race == "batch-planned" else neighbour(scenario, plan))

    before = scenario.source
    with monkeypatch.context() as patched:
        between_plan_and_commit(patched, commit_between)
        with pytest.raises(CommitConflictError, match="Plan the refresh again"):
            scenario.update_rows()
    check_before(scenario, before, f"changes refresh raced by {race}")
    scenario.refresh()
    scenario.check(f"changes refresh raced by {race}, planned again")


def lose_first_response(monkeypatch: pytest.MonkeyPatch, meanwhile: Callable[[], None]) -> list[int | None]:
    """The refresh's commit lands but its caller never hears (a lost response, a task killed after it);
    `meanwhile` another commit lands; the retry (same commit id), which removes the stage, then one more
    once it is gone. The versions each attempt returned."""
    real = pipeline.commit_refresh
    versions: list[int | None] = []

    def retried(handle: Any, plan: RefreshPlan, results: Any, **kwargs: Any) -> Any:
        assert plan.migrate, "the commit moves old partitions"
        versions.append(real(handle, plan, results, **{**kwargs, "cleanup": False}).version)
        meanwhile()
        versions.append(real(handle, plan, results, **kwargs).version)  # removes the stage
        last = real(handle, plan, results, **kwargs)
        versions.append(last.version)
        return last

    monkeypatch.setattr(pipeline, "commit_refresh", retried)
    return versions


@pytest.mark.postgres
def test_a_retried_changes_commit_with_moves_publishes_once(
    tmp_path: Path, pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, new = TRANSITIONS["day-to-month"]
    scenario = ChangesScenario(tmp_path, 151, old, pg_database)
    scenario.refresh()
    scenario.set_partition_by(new)
    repartition(open_handle(scenario.project, scenario.dataset()), max_partitions=1)
    with monkeypatch.context() as patched:
        versions = lose_first_response(patched, scenario.batch)
        # The batch makes the refresh's run two versions: refresh without the one-version assertion.
        patched.setattr(scenario, "refresh", lambda: refresh_dataset(str(scenario.spec), "events"))
        scenario.update_rows()
    first = versions[0]
    assert first is not None
    assert versions == [first] * 3, versions
    assert scenario.snapshot().version == first + 1, "the refresh once, then the batch"
    scenario.check("a retried changes commit")
    scenario.update_rows()
    scenario.check("the next changes refresh")


def test_a_retried_selective_commit_with_moves_publishes_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = Scenario(tmp_path, 152, CROSS[0])
    scenario.full_refresh()
    scenario.set_partition_by(CROSS[1])
    repartition(open_handle(scenario.project, scenario.dataset()), max_partitions=1)
    path, ids = pick_split(scenario)
    change_source_rows(scenario, ids)
    with monkeypatch.context() as patched:
        versions = lose_first_response(patched, scenario.batch)
        refresh_dataset(str(scenario.spec), "events", partitions=[path], strategy="arrow")
    first = versions[0]
    assert first is not None
    assert versions == [first] * 3, versions
    assert scenario.snapshot().version == first + 1, "the refresh once, then the batch"
    scenario.check("a retried selective commit")


def ids_in_old_partitions(scenario: Scenario) -> dict[int, str]:
    """Each id still in an old-layout partition, with that partition's key path."""
    handle = open_handle(scenario.project, scenario.dataset())
    target = open_write_target(handle)
    snapshot = scenario.snapshot()
    found: dict[int, str] = {}
    for entry in old_entries(snapshot, snapshot.partition_spec.spec_id):
        for row_id in target.read(entry.files, ["id"]).column("id").to_pylist():
            found[row_id] = entry.key_path
    return found


@pytest.mark.postgres
def test_a_changes_stage_reading_other_keys_than_planned_publishes_nothing(
    tmp_path: Path, pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between plan and stage the source changes with the count unchanged: the update of id A is taken
    back (its old values and `updated_at`) and id B, held by another old partition, gets the same new
    values and `updated_at`. The stage reads B where the plan found A: the plan neither merges B's old
    row away nor moves its old partition, so publishing would leave B on two rows. The commit compares
    the staged changed keys with the plan's (count and key hash) and publishes nothing; planned again,
    the refresh is exact."""
    old, new = TRANSITIONS["day-to-month"]
    scenario = ChangesScenario(tmp_path, 161, old, pg_database)
    scenario.refresh()
    scenario.set_partition_by(new)
    repartition(open_handle(scenario.project, scenario.dataset()), max_partitions=1)
    held = ids_in_old_partitions(scenario)
    rows = {row["id"]: row for row in scenario.source.to_pylist()}
    first = sorted(held)[0]
    fresh = scenario.new_rows(1).to_pylist()[0]
    columns = ("n_int", "s", "ts", "d")
    update = "UPDATE public.src SET n_int = %s, s = %s, ts = %s, d = %s, updated_at = %s WHERE id = %s"
    stamp = scenario.tick()
    with psycopg.connect(scenario.url, autocommit=True) as conn:
        found = conn.execute("SELECT updated_at FROM public.src WHERE id = %s", (first,)).fetchone()
        assert found is not None
        was = found[0]
        conn.execute(update, (*(fresh[c] for c in columns), stamp, first))

    def swap_the_change(plan: RefreshPlan) -> None:
        assert held[first] in plan.migrate
        second = next(i for i in sorted(held) if held[i] not in plan.migrate)
        with psycopg.connect(scenario.url, autocommit=True) as conn:
            conn.execute(update, (*(rows[first][c] for c in columns), was, first))
            conn.execute(update, (*(fresh[c] for c in columns), stamp, second))
        rows[second].update({c: fresh[c] for c in columns})
        scenario.source = pa.Table.from_pylist(list(rows.values()), schema=SCHEMA)

    unchanged = scenario.source
    before = scenario.snapshot().version
    refused: ConservationError | None = None
    with monkeypatch.context() as patched:
        between_plan_and_commit(patched, swap_the_change)
        try:
            refresh_dataset(str(scenario.spec), "events")
        except ConservationError as err:
            refused = err
    if refused is None:
        scenario.check("published over a stage of other changed keys than planned")
    assert refused is not None, "a stage of other changed keys than planned is refused"
    assert "changed keys" in str(refused)
    assert "Plan the refresh again" in str(refused)
    planned, staged = refused.partitions["[changed keys]"]
    assert planned == staged, "the same count: only the keys differ"
    assert scenario.snapshot().version == before, "nothing published"
    check_before(scenario, unchanged, "the refused changes refresh")
    summary = scenario.refresh()
    assert summary.refresh_mode == "changes"
    scenario.check("the changes refresh planned again")


@pytest.mark.airflow
@pytest.mark.postgres
def test_a_dag_commit_refused_by_a_batch_fails_without_retries_and_the_next_run_refreshes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refresh DAG's commit task meets a batch that moved an old partition its plan moves: every
    retry of that plan would meet it again, so the task fails at once (retries configured or not), with
    the message saying the next run plans again; nothing of it is published. The next run refreshes."""
    from airflow_e2e.metadata_db import in_process_metadata_db
    from airflow_e2e.sample import install_example_dag

    from airflow_partitions.dag_factory import build_refresh_dags
    from airflow_partitions.operators.run_conf import RefreshRunConf
    from airflow_partitions.refresh import commit as refresh_commit
    from airflow_partitions.refresh.arrow_budget import BUDGET_ENV

    dags = tmp_path / "dags"
    dags.mkdir()
    scenario = Scenario(dags, 171, CROSS[0])
    scenario.full_refresh()
    scenario.set_partition_by(CROSS[1])
    repartition(open_handle(scenario.project, scenario.dataset()), max_partitions=1)
    path, _ids = pick_split(scenario)
    monkeypatch.setenv(BUDGET_ENV, "1GiB")  # dag.test() runs the tasks in this process
    real = refresh_commit.commit_refresh
    raced: list[str] = []

    def batch_first(handle: Any, plan: RefreshPlan, results: Any, **kwargs: Any) -> Any:
        if not raced:
            raced.append(plan.migrate[0])
            move_old(scenario, plan.migrate[0])
        return real(handle, plan, results, **kwargs)

    monkeypatch.setattr(refresh_commit, "commit_refresh", batch_first)
    # The example DAG file reads the datasets.yaml beside it (the scenario's spec); dag.test() syncs it.
    spec_path = install_example_dag(dags, scenario.spec.read_text(encoding="utf-8"))
    conf = {**RefreshRunConf().to_conf(), "partitions": [path]}
    with in_process_metadata_db(str(dags)):
        retrying = {"retries": 2, "retry_delay": dt.timedelta(seconds=1)}
        dag = build_refresh_dags(str(spec_path), default_args=retrying)["refresh_events"]
        before = scenario.snapshot().version
        run = dag.test(run_conf=conf)
        commits = [ti for ti in run.get_task_instances() if ti.task_id == "commit"]
        assert str(run.state) == "failed"
        assert [(str(ti.state), ti.try_number) for ti in commits] == [("failed", 1)], "no retry"
        assert raced, "the batch committed between the plan and the commit"
        assert scenario.snapshot().version == before + 1, "only the batch"
        scenario.check("the DAG's refused commit")
        run = dag.test(run_conf=conf)
        states = {ti.task_id: str(ti.state) for ti in run.get_task_instances() if ti.map_index == -1}
        assert str(run.state) == "success", states
    assert path in scenario.snapshot().partitions
    scenario.check("the next DAG run")
