"""Watermark refreshes during a re-partitioning: `refresh_mode: append` and `changes` stay incremental
(no full rebuild), move into the current layout only the old partitions holding rows of the partitions
they change, and never leave a row in two layouts or in none.

After every step a full read equals the source and 30 random filters equal DuckDB over the source
(`test_repartition.Scenario.check`), on the hostile rows of `matrix_support` (NULLs in partition columns,
unicode, `/ = %`, quotes, timestamps with offsets).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from matrix_support import SCHEMA
from test_repartition import TRANSITIONS, Scenario

from airflow_partitions.catalog import open_catalog
from airflow_partitions.refresh.pipeline import refresh_dataset
from airflow_partitions.spec import load_spec
from airflow_partitions.table import open_handle
from airflow_partitions.write.repartition import repartition
from airflow_partitions.write.routing import route_to_paths

APPEND_TRANSITIONS = ["bucket-8-to-16", "day-to-month"]


def landing_in_one_partition(dataset: Any, rows: pa.Table) -> pa.Table:
    """The rows of `rows` routed (under the dataset's partition_by) to its most frequent non-NULL key."""
    bound = dataset.bind(SCHEMA)
    transforms = [f.transform for f in bound.acceleration.partition_by]
    routed = route_to_paths(rows, transforms, bound.acceleration.partition_names)
    groups = [part for path, (_, part) in routed.items() if "NULL" not in path]
    return max(groups, key=lambda part: part.num_rows)


class AppendScenario(Scenario):
    """`refresh_mode: append` on the watermark `id` (new rows get larger ids; late rows smaller ones)."""

    MODE = "      refresh_mode: append\n      refresh: {watermark_column: id, late_rows: rewrite}\n"

    def __init__(self, root: Path, seed: int, partition_by: list[str], spark: Any) -> None:
        super().__init__(root, seed, partition_by)
        self.spark = spark
        self.add_mode()
        self.late_id = 10**12 - 1

    def add_mode(self) -> None:
        text = self.spec.read_text(encoding="utf-8")
        self.spec.write_text(text.replace("      engine: parquet\n", "      engine: parquet\n" + self.MODE))

    def set_partition_by(self, partition_by: list[str]) -> None:
        super().set_partition_by(partition_by)
        self.add_mode()

    def versions(self) -> list[Any]:
        project = self.project
        return open_catalog(project, project.dataset("events")).versions()

    def append_refresh(self, rows: pa.Table | None = None) -> Any:
        """New source rows, then an append refresh: must stay an append, never a rebuild."""
        rows = rows if rows is not None else self.new_rows(self.rng.randint(1, 12))
        self.source = pa.concat_tables([self.source, rows])
        self.save_source()
        return self.refresh_incrementally()

    def refresh_incrementally(self) -> Any:
        before = len(self.versions())
        summary = refresh_dataset(str(self.spec), "events", spark=self.spark)
        assert summary.refresh_mode == "append", summary.notes
        made = self.versions()[before:]
        assert len(made) <= 1, f"one catalog version per refresh, moves included: {made}"
        for info in made:
            assert not info.replace_all, f"no rebuild during the migration: {info}"
            assert info.operation == "refresh", info
        return summary

    def late_rows(self) -> None:
        """Rows below every watermark (smaller ids): the audit finds them, `rewrite` rewrites their
        partitions whole after moving their old holders."""
        rows = self.new_rows(self.rng.randint(1, 4))
        ids = pa.array(range(self.late_id - rows.num_rows + 1, self.late_id + 1), pa.int64())
        self.late_id -= rows.num_rows
        summary = self.append_refresh(rows.set_column(0, "id", ids))
        assert sum(summary.late_rows.values()) == rows.num_rows, "the audit counts both layouts"

    def source_delete(self) -> None:
        """Rows deleted from the source only: fewer rows at or below the watermark, rewritten whole."""
        ids = self.rng.sample(self.source.column("id").to_pylist(), 2)
        self.source = self.source.filter(pc.invert(pc.is_in(self.source.column("id"), pa.array(ids))))
        self.save_source()
        summary = self.refresh_incrementally()
        assert sum(summary.late_rows.values()) == -2, "the audit counts both layouts"

    def crash_mid_refresh(self) -> None:
        """SIGKILL an append refresh in a child process at its commit (the one commit that would also move
        the old partitions it needs): the catalog stays at the version the refresh started from, every row
        in the layout it was in; the next append catches up."""
        from airflow_partitions.refresh.layouts import old_holdings

        held = self.source
        handle = open_handle(self.project, self.dataset())
        split = set(old_holdings(handle, handle.catalog))
        bound = self.dataset().bind(SCHEMA)
        transforms = [f.transform for f in bound.acceleration.partition_by]
        routed = route_to_paths(self.new_rows(200), transforms, bound.acceleration.partition_names)
        path, (_, rows) = next((p, r) for p, r in sorted(routed.items()) if p in split and "NULL" not in p)
        self.source = pa.concat_tables([held, rows.slice(0, 3)])
        self.save_source()
        started = [info.version for info in self.versions()]
        script = textwrap.dedent(
            f"""
            import os, signal
            from airflow_partitions.catalog.catalog import Catalog
            from airflow_partitions.refresh.pipeline import refresh_dataset
            real = Catalog.commit
            def commit(self, **kwargs):
                if kwargs.get("operation") == "refresh":
                    os.kill(os.getpid(), signal.SIGKILL)
                return real(self, **kwargs)
            Catalog.commit = commit
            refresh_dataset({str(self.spec)!r}, "events", strategy="spark")
            """
        )
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        done = subprocess.run([sys.executable, "-c", script], env=env, cwd=self.root, timeout=300)
        assert done.returncode == -9, "the child was killed at the refresh's commit"
        after = [info.version for info in self.versions()]
        assert after == started, "nothing of the killed refresh committed, its moves neither"
        assert path in set(old_holdings(handle, handle.catalog)), f"the old holders of {path} did not move"
        self.source = held
        self.check("killed append refresh")
        self.source = pa.concat_tables([held, rows.slice(0, 3)])
        self.refresh_incrementally()

    def append_one_partition(self) -> None:
        self.append_refresh(landing_in_one_partition(self.dataset(), self.new_rows(40)))


@pytest.mark.spark
@pytest.mark.parametrize("transition", APPEND_TRANSITIONS)
def test_append_refresh_during_a_migration_moves_only_what_it_changes(
    spark: Any, tmp_path: Path, transition: str
) -> None:
    old, new = TRANSITIONS[transition]
    scenario = AppendScenario(tmp_path, 41 + APPEND_TRANSITIONS.index(transition), old, spark)
    scenario.full_refresh()
    scenario.check("first refresh")
    scenario.set_partition_by(new)
    scenario.batch()
    scenario.check("first batch")
    left = scenario.snapshot().other_layout()
    assert left[0] > 2

    # New rows of one current partition: only the old partitions holding its rows move.
    scenario.append_one_partition()
    scenario.check("append into one partition")
    after = scenario.snapshot()
    assert 0 < after.other_layout()[0] < left[0], "some old partitions moved, the others are left"
    assert scenario.versions()[-1].operation == "refresh"

    steps = [
        scenario.append_refresh,
        scenario.late_rows,
        scenario.batch,
        scenario.append_rows,  # the write path, between refreshes
        scenario.source_delete,
        scenario.append_refresh,
        scenario.late_rows,
        scenario.append_one_partition,
    ]
    scenario.rng.shuffle(steps)
    for step in steps:
        step()
        scenario.check(step.__name__)
    if transition == "day-to-month":
        scenario.crash_mid_refresh()
        scenario.check("append after a killed one")
    while scenario.snapshot().other_layout()[0]:
        scenario.batch()
    scenario.append_refresh()
    scenario.check("append after the migration")


# --- refresh_mode: changes (watermark) on Postgres -------------------------------------------------

CHANGES_TRANSITIONS = ["day-to-month", "bucket-8-to-16"]


class ChangesScenario(Scenario):
    """The hostile rows in Postgres (`public.src`, plus `updated_at`, the watermark), refreshed with
    `refresh_mode: changes`; the steps change the table with SQL and `self.source` with it."""

    def __init__(
        self, root: Path, seed: int, partition_by: list[str], url: str, detection: str = "watermark"
    ) -> None:
        self.url = url
        self.detection = detection
        self.spark = None
        self.clock = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)
        self.created = False
        super().__init__(root, seed, partition_by)
        self.write_changes_spec()

    def tick(self) -> dt.datetime:
        self.clock += dt.timedelta(seconds=1)
        return self.clock

    def write_changes_spec(self) -> None:
        refresh = (
            "{watermark_column: updated_at, change_detection: watermark, late_rows: rewrite}"
            if self.detection == "watermark"
            else "{change_detection: cdc}"
        )
        fields = "\n".join(
            f"        - {{{name}: {json.dumps(expression)}}}"
            for name, _, expression in (entry.partition(": ") for entry in self.partition_by)
        )
        self.spec.write_text(
            "accelerator_dir: acc\n"
            "datasets:\n"
            "  - name: events\n"
            "    from: postgres:public.src\n"
            f"    params: {{url: '{self.url}'}}\n"
            "    acceleration:\n"
            "      engine: parquet\n"
            "      refresh_mode: changes\n"
            "      primary_key: [id]\n"
            f"      refresh: {refresh}\n"
            "      partition_by:\n"
            f"{fields}\n",
            encoding="utf-8",
        )

    def set_partition_by(self, partition_by: list[str]) -> None:
        self.partition_by = partition_by
        self.write_changes_spec()

    def save_source(self) -> None:
        """Only the first time: the table with every row at one `updated_at` (later steps change it)."""
        if self.created:
            return
        self.created = True
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE public.src (id bigint PRIMARY KEY, n_int bigint, amount numeric(12, 2), "
                "x double precision, s text, ts timestamptz, ts_naive timestamp, d date, flag boolean, "
                "updated_at timestamptz)"
            )
            conn.execute("CREATE INDEX src_updated ON public.src (updated_at)")
            self.insert(conn, self.source, self.tick)

    @staticmethod
    def insert(conn: Any, rows: pa.Table, updated_at: Callable[[], dt.datetime]) -> None:
        """`rows` inserted, each with the `updated_at` the callable gives it."""
        names = ", ".join([*SCHEMA.names, "updated_at"])
        with conn.cursor() as cursor, cursor.copy(f"COPY public.src ({names}) FROM STDIN") as copy:
            for row in rows.to_pylist():
                copy.write_row([*(row[name] for name in SCHEMA.names), updated_at()])

    def refresh(self) -> Any:
        before = len(self.versions())
        summary = refresh_dataset(str(self.spec), "events", spark=self.spark)
        assert summary.refresh_mode in ("changes", "full"), summary.notes
        made = self.versions()[before:]
        assert len(made) <= 1, f"one catalog version per refresh, moves included: {made}"
        for info in made:
            assert not info.replace_all, f"no rebuild during the migration: {info}"
            assert info.operation == "refresh", info
        return summary

    def versions(self) -> list[Any]:
        project = self.project
        return open_catalog(project, project.dataset("events")).versions()

    # --- steps ---------------------------------------------------------------------------------------

    def insert_rows(self) -> None:
        rows = self.new_rows(self.rng.randint(1, 8))
        with psycopg.connect(self.url, autocommit=True) as conn:
            self.insert(conn, rows, self.tick)
        self.source = pa.concat_tables([self.source, rows])
        self.refresh()

    def update_rows(self) -> None:
        """Existing ids take the partition columns of fresh rows: most move to another partition."""
        ids = self.rng.sample(self.source.column("id").to_pylist(), 4)
        fresh = self.new_rows(len(ids)).to_pylist()
        rows = {row["id"]: row for row in self.source.to_pylist()}
        with psycopg.connect(self.url, autocommit=True) as conn:
            for row_id, new in zip(ids, fresh, strict=True):
                row = rows[row_id]
                for name in ("n_int", "s", "ts", "d"):
                    row[name] = new[name]
                conn.execute(
                    "UPDATE public.src SET n_int = %s, s = %s, ts = %s, d = %s, updated_at = %s "
                    "WHERE id = %s",
                    (row["n_int"], row["s"], row["ts"], row["d"], self.tick(), row_id),
                )
        self.source = pa.Table.from_pylist(list(rows.values()), schema=SCHEMA)
        self.refresh()

    def delete_rows(self) -> None:
        """A hard delete: no change the watermark reads; the audit finds it (rows in both layouts)."""
        ids = self.rng.sample(self.source.column("id").to_pylist(), 2)
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("DELETE FROM public.src WHERE id = ANY(%s)", (ids,))
        self.source = self.source.filter(pc.invert(pc.is_in(self.source.column("id"), pa.array(ids))))
        summary = self.refresh()
        if self.detection == "watermark":
            assert sum(summary.late_rows.values()) == -2, "the audit counts both layouts"

    def late_rows(self) -> None:
        """Rows inserted below the watermark: the audit finds them."""
        rows = self.new_rows(self.rng.randint(1, 3))
        with psycopg.connect(self.url, autocommit=True) as conn:
            self.insert(conn, rows, lambda: dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
        self.source = pa.concat_tables([self.source, rows])
        summary = self.refresh()
        if self.detection == "watermark":
            assert sum(summary.late_rows.values()) == rows.num_rows, "the audit counts both layouts"


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("transition", "detection"),
    [("day-to-month", "watermark"), ("bucket-8-to-16", "watermark"), ("bucket-8-to-16", "cdc")],
)
def test_changes_refresh_during_a_migration_merges_without_a_rebuild(
    tmp_path: Path, transition: str, detection: str, request: pytest.FixtureRequest
) -> None:
    """Watermark: the audit counts rows in both layouts (deletes, late rows). cdc: the keys decoded from
    the stream (upserts and deletes) find their old partitions the same way."""
    old, new = TRANSITIONS[transition]
    url = request.getfixturevalue("pg_logical_database" if detection == "cdc" else "pg_database")
    seed = 61 + CHANGES_TRANSITIONS.index(transition)
    scenario = ChangesScenario(tmp_path, seed, old, url, detection)
    first = scenario.refresh()
    assert first.refresh_mode == "full", "the first refresh reads every row"
    scenario.check("first refresh")
    scenario.set_partition_by(new)
    scenario.batch()
    scenario.check("first batch")
    left = scenario.snapshot().other_layout()
    assert left[0] > 2

    scenario.update_rows()
    scenario.check("rows updated across partitions")
    assert scenario.versions()[-1].operation == "refresh"
    assert scenario.snapshot().other_layout()[0] < left[0], "old holders of updated keys moved in its commit"
    summary = scenario.refresh()
    assert summary.refresh_mode == "changes", "changes merged, no rebuild"
    assert scenario.snapshot().other_layout()[0] > 0, "old partitions are left"

    steps = [
        scenario.insert_rows,
        scenario.update_rows,
        scenario.delete_rows,
        scenario.late_rows,
        scenario.batch,
        scenario.update_rows,
        scenario.vacuum,
        scenario.insert_rows,
    ]
    scenario.rng.shuffle(steps)
    for step in steps:
        step()
        scenario.check(step.__name__)
    while scenario.snapshot().other_layout()[0]:
        scenario.batch()
    scenario.update_rows()
    scenario.check("changes after the migration")


# --- strategy spark during a migration ------------------------------------------------------------


class SparkScenario(Scenario):
    """Full and selective refreshes staged by Spark (`strategy: spark`, the shared local session)."""

    def __init__(self, root: Path, seed: int, partition_by: list[str], spark: Any) -> None:
        super().__init__(root, seed, partition_by)
        self.spark = spark

    def full_refresh(self) -> None:
        summary = refresh_dataset(str(self.spec), "events", spark=self.spark, strategy="spark")
        assert summary.strategy == "spark", summary.strategy_reason

    def partial_refresh(self) -> None:
        """New source rows of one current partition, then a refresh of that partition only."""
        rows = landing_in_one_partition(self.dataset(), self.new_rows(40))
        self.source = pa.concat_tables([self.source, rows])
        self.save_source()
        bound = self.dataset().bind(SCHEMA)
        transforms = [f.transform for f in bound.acceleration.partition_by]
        (key_path,) = route_to_paths(rows, transforms, bound.acceleration.partition_names)
        summary = refresh_dataset(
            str(self.spec), "events", spark=self.spark, strategy="spark", partitions=[key_path]
        )
        assert summary.strategy == "spark", summary.strategy_reason
        assert summary.refreshed == 1, "only the selected partition is rewritten"

    def source_rows(self) -> None:
        """Rows added to the source only (the full refresh picks them up)."""
        self.source = pa.concat_tables([self.source, self.new_rows(self.rng.randint(1, 6))])
        self.save_source()


@pytest.mark.spark
def test_spark_refreshes_interleaved_with_migration_batches(spark: Any, tmp_path: Path) -> None:
    old, new = TRANSITIONS["day-to-month"]
    scenario = SparkScenario(tmp_path, 83, old, spark)
    scenario.full_refresh()
    scenario.check("first refresh by Spark")
    scenario.set_partition_by(new)
    for step in [
        scenario.batch,
        scenario.partial_refresh,
        scenario.batch,
        scenario.append_rows,
        scenario.partial_refresh,
    ]:
        step()
        scenario.check(step.__name__)
    assert scenario.snapshot().other_layout()[0] > 0, "still migrating"
    scenario.source_rows()
    scenario.full_refresh()
    scenario.check("full refresh by Spark ends the migration")
    assert scenario.snapshot().spec_ids_in_use() == {scenario.dataset().acceleration.partition_spec_id}


# --- a changes refresh merged by Spark executors after a declared column rename -----------------------


@pytest.mark.postgres
@pytest.mark.spark
def test_a_changes_refresh_merged_by_spark_executors_after_a_rename(
    spark: Any, pg_database: str, tmp_path: Path
) -> None:
    """`ALTER TABLE ... RENAME COLUMN` of the partition column and the watermark, declared in the spec;
    the changed rows (read under the new names, stored under the old) are merged by the executors
    (`written` stage): moves between partitions, a NULL partition value, new rows, a delete found by the
    audit; full read == the table, filters == DuckDB over it."""
    from test_rename_columns import assert_postgres_equals, pg_rows, pg_spec

    url = pg_database
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE public.accounts (id bigint PRIMARY KEY, region text, balance numeric(12, 2), "
            "note text, updated_at timestamptz)"
        )
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO public.accounts VALUES (%s, %s, %s, %s, %s)", pg_rows(range(40)))
    spec = tmp_path / "spec.yaml"
    project = pg_spec(spec, url, "watermark", renamed=False)
    assert refresh_dataset(project, "accounts", spark=spark).refresh_mode == "full"

    later = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE public.accounts RENAME COLUMN region TO area")
        conn.execute("ALTER TABLE public.accounts RENAME COLUMN updated_at TO changed_at")
        conn.execute("UPDATE public.accounts SET area = NULL, changed_at = %s WHERE id = 3", (later,))
        conn.execute("UPDATE public.accounts SET area = 'ÉNEW/=%%', changed_at = %s WHERE id = 4", (later,))
        conn.execute("UPDATE public.accounts SET balance = 7, changed_at = %s WHERE id = 8", (later,))
        with conn.cursor() as cur:
            rows = [(*row[:4], later) for row in pg_rows(range(100, 106), version=1)]
            cur.executemany("INSERT INTO public.accounts VALUES (%s, %s, %s, %s, %s)", rows)
    project = pg_spec(spec, url, "watermark", renamed=True)
    summary = refresh_dataset(project, "accounts", spark=spark)
    assert summary.refresh_mode == "changes", summary
    assert summary.stage_mode == "written", "the executors merged the changes"
    assert summary.changed_rows == 10, "6 new rows, ids 3, 4 and 8, and the newest row before"
    assert_postgres_equals(project, url, 51)

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE public.accounts SET area = 'k=V', changed_at = %s WHERE id = 6", (later,))
    summary = refresh_dataset(project, "accounts", spark=spark)
    assert (summary.refresh_mode, summary.stage_mode) == ("changes", "written"), summary
    assert_postgres_equals(project, url, 52)
    # A hard delete: the audit names it, and (late_rows: rewrite) its partition is rewritten whole.
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM public.accounts WHERE id = 10")
    summary = refresh_dataset(project, "accounts", spark=spark)
    assert sum((summary.late_rows or {}).values()) == -1, "the delete is found by the audit"
    assert_postgres_equals(project, url, 53)
    again = refresh_dataset(project, "accounts", spark=spark)
    assert again.refresh_mode == "changes", again.notes

    # partition_by changes (over the current names) and a batch moves: the executors merge changes whose
    # old rows are in old partitions (moved first) while other old partitions stay.
    text = spec.read_text(encoding="utf-8").replace(
        '[{r: "lower(area)"}]', '[{r: "lower(area)"}, {b: "bucket(3, id)"}]'
    )
    spec.write_text(text, encoding="utf-8")
    project = load_spec(spec)
    repartition(open_handle(project, project.dataset("accounts")), max_partitions=1)
    assert_postgres_equals(project, url, 54)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE public.accounts SET area = 'it''s', changed_at = %s WHERE id = 12", (later,))
        conn.execute("UPDATE public.accounts SET balance = 1.5, changed_at = %s WHERE id = 13", (later,))
    summary = refresh_dataset(project, "accounts", spark=spark)
    assert (summary.refresh_mode, summary.stage_mode) == ("changes", "written"), summary
    assert open_catalog(project, project.dataset("accounts")).latest().other_layout()[0] > 0
    assert_postgres_equals(project, url, 55)


def test_late_rows_fail_refuses_an_append_during_a_migration_before_anything_moves(tmp_path: Path) -> None:
    """`late_rows: fail`: rows below the watermark of a partition whose rows are in both layouts are named
    (counted across the layouts) and nothing is committed, not even a move."""
    from airflow_partitions.exceptions import LateRowsError
    from airflow_partitions.refresh.pipeline import plan_refresh

    old, new = TRANSITIONS["day-to-month"]
    scenario = AppendScenario(tmp_path, 97, old, spark=None)
    scenario.full_refresh()  # the first refresh reads every row (Arrow)
    scenario.set_partition_by(new)
    scenario.batch()
    text = scenario.spec.read_text(encoding="utf-8")
    scenario.spec.write_text(text.replace("late_rows: rewrite", "late_rows: fail"), encoding="utf-8")
    late = landing_in_one_partition(scenario.dataset(), scenario.new_rows(40)).slice(0, 2)
    ids = pa.array([10**12 - 2, 10**12 - 1], pa.int64())
    scenario.source = pa.concat_tables([scenario.source, late.set_column(0, "id", ids)])
    scenario.save_source()
    before = scenario.snapshot()
    with pytest.raises(LateRowsError, match="both layouts counted") as raised:
        plan_refresh(scenario.project, "events")
    assert sum(raised.value.late_rows.values()) == 2
    after = scenario.snapshot()
    assert after.version == before.version, "nothing moved, nothing committed"


@pytest.mark.spark
def test_a_selective_append_refresh_during_a_migration_keeps_every_row(spark: Any, tmp_path: Path) -> None:
    """A refresh of one partition of an append dataset while partitions of both layouts hold rows of
    other partitions: the audit of the partitions not selected counts their rows in both layouts."""
    old, new = TRANSITIONS["day-to-month"]
    scenario = AppendScenario(tmp_path, 101, old, spark)
    scenario.full_refresh()
    scenario.set_partition_by(new)
    # One day of a month with several days moves: that month is in both layouts.
    days = sorted(p for p in scenario.snapshot().partitions if "NULL" not in p)
    months: dict[str, list[str]] = {}
    for day in days:
        months.setdefault(day.split("p_day=")[1][:7], []).append(day)
    split = next(group for group in months.values() if len(group) > 2)
    spec_id = scenario.snapshot().partition_spec.spec_id
    repartition(open_handle(scenario.project, scenario.dataset()), only=[(spec_id, split[0])])
    scenario.check("one day of a month moved")
    rows = landing_in_one_partition(scenario.dataset(), scenario.new_rows(40))
    scenario.source = pa.concat_tables([scenario.source, rows])
    scenario.save_source()
    bound = scenario.dataset().bind(SCHEMA)
    transforms = [f.transform for f in bound.acceleration.partition_by]
    (key_path,) = route_to_paths(rows, transforms, bound.acceleration.partition_names)
    refresh_dataset(str(scenario.spec), "events", spark=spark, partitions=[key_path])
    scenario.check("selective append refresh")


@pytest.mark.postgres
def test_a_changes_refresh_whose_move_loses_a_row_publishes_nothing(
    tmp_path: Path, pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The moved rows of changed keys are dropped in the refresh's commit; a drop that loses one more row
    than it counts fails the check across the layouts (`ConservationError`), and nothing is published,
    the merge included."""
    from airflow_partitions.exceptions import ConservationError
    from airflow_partitions.write import refresh_moves

    old, new = TRANSITIONS["bucket-8-to-16"]
    scenario = ChangesScenario(tmp_path, 67, old, pg_database)
    scenario.refresh()
    scenario.set_partition_by(new)
    # One old partition moved: the updated ids are (almost all) still in old partitions.
    repartition(open_handle(scenario.project, scenario.dataset()), max_partitions=1)
    real = refresh_moves.delete_rows_by_key
    lost: list[int] = []

    def one_row_short(existing: pa.Table, key_rows: pa.Table, keys: Any) -> Any:
        result = real(existing, key_rows, keys)
        if result.table.num_rows and not lost:
            lost.append(1)
            return dataclasses.replace(result, table=result.table.slice(1))
        return result

    before = scenario.snapshot().version
    monkeypatch.setattr(refresh_moves, "delete_rows_by_key", one_row_short)
    with pytest.raises(ConservationError, match="old layout -> new layout"):
        scenario.update_rows()
    assert lost, "the commit moved old partitions holding a changed key"
    assert scenario.snapshot().version == before, "nothing published"
    monkeypatch.undo()
    scenario.refresh()
    scenario.check("the next changes refresh")
