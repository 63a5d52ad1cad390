"""Online re-partitioning: partitions of several specs side by side, moved batch by batch.

After every step a full read equals the source (row by row, NULLs and types included) and 30 random
filters equal DuckDB over the source. Refreshes run with the in-process Arrow strategy (no Spark).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from matrix_support import (
    SCHEMA,
    DuckDBOracle,
    FilterGenerator,
    hostile_chunks,
    multiset_difference,
    rows_by_key,
)
from test_operators import StatsdListener, statsd  # noqa: F401 (the `statsd` fixture)

from airflow_partitions.catalog import open_catalog
from airflow_partitions.cli.main import main
from airflow_partitions.exceptions import ConservationError, RefreshError
from airflow_partitions.read import PartitionedDatasetReader
from airflow_partitions.refresh.pipeline import refresh_dataset
from airflow_partitions.spec import load_spec
from airflow_partitions.table import open_handle
from airflow_partitions.transforms import parse_transform
from airflow_partitions.write import append, delete, upsert
from airflow_partitions.write.repartition import check_moved_rows, repartition

FILTERS_PER_CHECK = 30
TRANSITIONS = {
    "day-to-month": (["p_day: date_trunc('day', ts)"], ["p_day: date_trunc('month', ts)"]),
    "region-to-region-bucket": (["p_s: s"], ["p_s: s", "p_b: bucket(4, n_int)"]),
    "bucket-8-to-16": (["p_b: bucket(8, id)"], ["p_b: bucket(16, id)"]),
    "identity-to-truncate": (["p_n: n_int"], ["p_n: truncate(10, n_int)"]),
}


def write_spec(path: Path, partition_by: list[str], accelerator_dir: str = "acc") -> Path:
    fields = []
    for entry in partition_by:
        name, _, expression = entry.partition(": ")
        fields.append(f"        - {{{name}: {json.dumps(expression)}}}")
    path.write_text(
        "\n".join(
            [
                f"accelerator_dir: {accelerator_dir}",
                *(["local_scratch_dir: scratch"] if accelerator_dir.startswith("s3://") else []),
                "datasets:",
                "  - name: events",
                "    from: file:src",
                "    params: {file_format: parquet}",
                "    acceleration:",
                "      engine: parquet",
                "      partition_by:",
                *fields,
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    return path


class Scenario:
    """A source directory (the truth), a spec, and the checks against both."""

    def __init__(self, root: Path, seed: int, partition_by: list[str], accelerator_dir: str = "acc") -> None:
        self.root = root
        self.seed = seed
        self.rng = random.Random(seed)
        self.partition_by = partition_by
        self.accelerator_dir = accelerator_dir
        self.spec = write_spec(root / "spec.yaml", partition_by, accelerator_dir)
        self.source = pa.concat_tables(hostile_chunks(seed, rows=90, chunks=2))
        self.next_id = 10**13
        self.checks = 0
        self.save_source()

    def save_source(self) -> None:
        directory = self.root / "src"
        directory.mkdir(exist_ok=True)
        for old in directory.glob("*.parquet"):
            old.unlink()
        pq.write_table(self.source, directory / f"part-{self.checks}.parquet")

    @property
    def project(self) -> Any:
        return load_spec(self.spec)

    def dataset(self) -> Any:
        return self.project.dataset("events")

    def set_partition_by(self, partition_by: list[str]) -> None:
        self.partition_by = partition_by
        write_spec(self.spec, partition_by, self.accelerator_dir)

    def snapshot(self) -> Any:
        project = self.project
        return open_catalog(project, project.dataset("events")).latest()

    def new_rows(self, count: int) -> pa.Table:
        rows = pa.concat_tables(hostile_chunks(self.rng.randrange(10**6), rows=count, chunks=1))
        ids = pa.array(range(self.next_id, self.next_id + rows.num_rows), pa.int64())
        self.next_id += rows.num_rows
        return rows.set_column(0, "id", ids)

    def check(self, step: str) -> None:
        """Full read == source; random filters == DuckDB over the source."""
        self.checks += 1
        reader = PartitionedDatasetReader(self.spec, "events")
        try:
            full = reader.read()
            missing, extra = multiset_difference(full.select(SCHEMA.names), self.source)
            assert not missing, f"{step}: full read lacks rows: {missing[:2]}"
            assert not extra, f"{step}: full read has extra rows: {extra[:2]}"
            assert full.num_rows == self.source.num_rows, step
            expressions = [entry.partition(": ")[2] for entry in self.partition_by]
            generator = FilterGenerator(self.source, expressions, self.seed * 1000 + self.checks)
            oracle = DuckDBOracle(generator.oracle_table())
            try:
                for item in generator.filters(FILTERS_PER_CHECK):
                    got = reader.read(item.reader_sql).select(SCHEMA.names)
                    expected = self.source.take(pa.array(oracle.rows(item.oracle_sql), pa.int64()))
                    missing, extra = multiset_difference(got, expected)
                    assert not missing, f"{step}: filter {item.reader_sql}: {len(missing)} rows missing"
                    assert not extra, f"{step}: filter {item.reader_sql}: {len(extra)} extra rows"
            finally:
                oracle.close()
        finally:
            reader.close()

    # --- steps ------------------------------------------------------------------------------------

    def full_refresh(self) -> None:
        refresh_dataset(str(self.spec), "events", strategy="arrow")

    def batch(self) -> None:
        before = self.snapshot()
        report = repartition(open_handle(self.project, self.dataset()), max_partitions=self.rng.randint(1, 3))
        after = self.snapshot()
        assert after.total_rows == before.total_rows, "a batch moves rows, never adds or drops one"
        assert report.partitions_left == after.other_layout()[0]
        assert report.rows_left == after.other_layout()[1]

    def append_rows(self) -> None:
        rows = self.new_rows(self.rng.randint(1, 12))
        append(open_handle(self.project, self.dataset()), rows)
        self.source = pa.concat_tables([self.source, rows])
        self.save_source()

    def upsert_rows(self) -> None:
        """Existing ids with other values (most move to another partition) plus a new id."""
        positions = sorted(self.rng.sample(range(self.source.num_rows), 4))
        replacement = self.new_rows(len(positions) + 1)
        old_ids = self.source.column("id").take(pa.array(positions)).to_pylist()
        ids = pa.array([*old_ids, replacement.column("id")[-1].as_py()], pa.int64())
        replacement = replacement.set_column(0, "id", ids)
        upsert(open_handle(self.project, self.dataset()), replacement, keys=["id"])
        keep = pc.invert(pc.is_in(self.source.column("id"), value_set=ids))
        self.source = pa.concat_tables([self.source.filter(keep), replacement])
        self.save_source()

    def delete_rows(self) -> None:
        ids = self.rng.sample(self.source.column("id").to_pylist(), 3)
        delete(open_handle(self.project, self.dataset()), f"id IN ({', '.join(str(i) for i in ids)})")
        self.source = self.source.filter(pc.invert(pc.is_in(self.source.column("id"), pa.array(ids))))
        self.save_source()

    def partial_refresh(self) -> None:
        """A refresh of selected partitions during the migration: one commit rewrites the selected
        partitions from the source and moves the old partitions holding their rows (rows of the selection
        superseded, the others appended to their partitions); nothing else changes."""
        before = self.snapshot()
        keys = [p for p in self.plain_paths(before) if "NULL" not in p] or None
        if keys and self.rng.random() < 0.5:
            refresh_dataset(str(self.spec), "events", partitions=[self.rng.choice(keys)], strategy="arrow")
        else:
            low = self.rng.choice(self.source.column("id").to_pylist())
            refresh_dataset(str(self.spec), "events", where=f"id >= {low}", strategy="arrow")
        assert self.snapshot().total_rows == self.source.num_rows

    @staticmethod
    def plain_paths(snapshot: Any) -> list[str]:
        return sorted(p for p in snapshot.partitions if not p.startswith("@"))

    def crash_mid_batch(self) -> None:
        """SIGKILL a child process after it wrote a batch's files, before its commit: nothing published."""
        before = self.snapshot()
        script = textwrap.dedent(
            f"""
            import os, signal
            from airflow_partitions.catalog.catalog import Catalog
            from airflow_partitions.spec import load_spec
            from airflow_partitions.table import open_handle
            from airflow_partitions.write.repartition import repartition
            real = Catalog.commit
            def commit(self, **kwargs):
                if kwargs.get("operation") == "repartition":
                    os.kill(os.getpid(), signal.SIGKILL)
                return real(self, **kwargs)
            Catalog.commit = commit
            project = load_spec({str(self.spec)!r})
            repartition(open_handle(project, "events"), max_partitions=2)
            """
        )
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        done = subprocess.run([sys.executable, "-c", script], env=env, cwd=self.root, timeout=120)
        assert done.returncode == -9, "the child was killed in the middle of the batch"
        after = self.snapshot()
        assert after.total_rows == before.total_rows

    def compact(self) -> None:
        from airflow_partitions.refresh.compaction import compact_dataset

        compact_dataset(self.project, self.dataset(), target_file_bytes=1 << 30)

    def vacuum(self) -> None:
        project = self.project
        open_catalog(project, project.dataset("events")).vacuum(retain_versions=1, grace=dt.timedelta(0))


@pytest.mark.parametrize("transition", sorted(TRANSITIONS))
def test_randomised_migration_keeps_every_row(tmp_path: Path, transition: str) -> None:
    old, new = TRANSITIONS[transition]
    seed = sorted(TRANSITIONS).index(transition) + 7
    scenario = Scenario(tmp_path, seed, old)
    scenario.full_refresh()
    scenario.check("first refresh")
    scenario.set_partition_by(new)
    scenario.check("partition_by changed, nothing moved")
    steps = [
        scenario.batch,
        scenario.append_rows,
        scenario.batch,
        scenario.upsert_rows,
        scenario.crash_mid_batch,
        scenario.delete_rows,
        scenario.partial_refresh,
        scenario.partial_refresh,
        scenario.vacuum,
        scenario.compact,
        scenario.batch,
    ]
    scenario.rng.shuffle(steps)
    for step in [scenario.batch, *steps]:
        step()
        scenario.check(step.__name__)
    spec_id = scenario.dataset().acceleration.partition_spec_id
    assert scenario.snapshot().partition_spec.spec_id == spec_id
    # Cancel: revert partition_by; partitions already moved stay readable, then move back.
    scenario.set_partition_by(old)
    scenario.check("cancelled")
    scenario.batch()
    scenario.check("first batch back")
    scenario.append_rows()
    scenario.check("append while moving back")
    scenario.set_partition_by(new)
    while scenario.snapshot().other_layout(scenario.dataset().acceleration.partition_spec_id)[0]:
        scenario.batch()
    scenario.check("migration complete")
    snapshot = scenario.snapshot()
    assert snapshot.spec_ids_in_use() == {spec_id}
    assert not any(path.startswith("@") for path in snapshot.partitions), "one layout: plain key paths"
    scenario.vacuum()
    scenario.full_refresh()
    scenario.check("full refresh after the migration")


@pytest.mark.s3
def test_a_migration_of_an_acceleration_on_s3_moves_batch_by_batch(
    tmp_path: Path, s3_server: dict[str, str], s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`accelerator_dir: s3://...` (endpoint from the environment, as the CLI and a worker run): each
    batch fetches the old partitions' files from S3, uploads the new ones and commits in the catalog on
    S3; after every batch a full read equals the source, 30 filters equal DuckDB over it, and verify (the
    old partitions' files fetched from S3) finds every partition equal across both layouts."""
    import boto3

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server["endpoint_url"])
    monkeypatch.chdir(tmp_path)
    old, new = TRANSITIONS["day-to-month"]
    scenario = Scenario(tmp_path, 11, old, accelerator_dir=f"s3://{s3_bucket}/acc")
    # The Arrow refresh writes locally only: the acceleration is built by appends through the write path.
    for offset in range(0, scenario.source.num_rows, 60):
        append(open_handle(scenario.project, scenario.dataset()), scenario.source.slice(offset, 60))
    assert not (tmp_path / "acc").exists(), "nothing of the acceleration is local"
    scenario.check("first refresh on S3")
    old_partitions = scenario.snapshot().partition_count
    assert old_partitions > 6
    scenario.set_partition_by(new)
    spec_id = scenario.dataset().acceleration.partition_spec_id
    batch = -(-old_partitions // 4)
    batches = 0
    while True:
        before = scenario.snapshot()
        if batches == 2:
            assert main(["repartition", str(scenario.spec), "events", "--max-partitions", str(batch)]) == 0
            left = scenario.snapshot().other_layout(spec_id)
        else:
            report = repartition(open_handle(scenario.project, scenario.dataset()), max_partitions=batch)
            left = (report.partitions_left, report.rows_left)
            assert left == scenario.snapshot().other_layout(spec_id)
        after = scenario.snapshot()
        assert after.total_rows == before.total_rows == scenario.source.num_rows
        batches += 1
        scenario.check(f"batch {batches} on S3")
        _assert_equal_across_layouts(scenario, f"verify after batch {batches} on S3")  # old files fetched
        if left[0] == 0:
            break
        assert batches < 10, "the migration ends"
        if batches == 1:
            scenario.append_rows()  # a write between batches routes to the layout holding its keys
            scenario.check("append between batches on S3")
    assert batches >= 3, "the migration took several batches"
    snapshot = scenario.snapshot()
    assert snapshot.spec_ids_in_use() == {spec_id}
    keys = boto3.client("s3", **s3_server).list_objects_v2(Bucket=s3_bucket, Prefix="acc/events/")
    stored = {o["Key"] for o in keys.get("Contents", [])}
    referenced = {f"acc/events/{f.path}" for e in snapshot.partitions.values() for f in e.files}
    assert referenced <= stored, "every file the migrated version references is on S3"
    assert not list((tmp_path / "scratch").rglob("*.parquet")), "no scratch file left behind"


def test_full_refresh_during_a_migration_rebuilds_under_the_new_spec(tmp_path: Path) -> None:
    old, new = TRANSITIONS["bucket-8-to-16"]
    scenario = Scenario(tmp_path, 3, old)
    scenario.full_refresh()
    scenario.set_partition_by(new)
    scenario.batch()
    assert scenario.snapshot().other_layout()[0] > 0
    scenario.full_refresh()
    snapshot = scenario.snapshot()
    assert snapshot.spec_ids_in_use() == {scenario.dataset().acceleration.partition_spec_id}
    assert snapshot.other_specs == ()
    scenario.check("full refresh ended the migration")


def test_plan_prunes_each_partition_under_its_own_spec(tmp_path: Path, capsys: Any) -> None:
    """`ts = X` selects the day partition of X under the old spec and the month partition under the new."""
    scenario = Scenario(tmp_path, 5, TRANSITIONS["day-to-month"][0])
    scenario.full_refresh()
    scenario.set_partition_by(TRANSITIONS["day-to-month"][1])
    repartition(open_handle(scenario.project, scenario.dataset()), max_partitions=2)
    snapshot = scenario.snapshot()
    old_id = next(s for s in snapshot.spec_ids_in_use() if s != snapshot.partition_spec.spec_id)
    old_days = sorted(p for p in snapshot.partitions if p.startswith("@") and "NULL" not in p)
    moved_month = sorted(p for p in snapshot.partitions if not p.startswith("@") and "NULL" not in p)[0]
    # A day still in the old layout, and a day of a month already moved.
    day_text = old_days[0].split("p_day=")[1][:10]
    with_ts = scenario.source.filter(pc.is_valid(scenario.source.column("ts")))
    value = next(t for t in with_ts.column("ts").to_pylist() if t.date().isoformat() == day_text).isoformat()
    reader = PartitionedDatasetReader(scenario.spec, "events")
    plan = reader.plan(f"ts = '{value}'")
    chosen = {(p.key_path, reader.index(reader.snapshot()).spec_id(p.position)) for p in plan.selected}
    assert chosen == {(old_days[0], old_id)}, f"only the day partition may hold {value}: {chosen}"
    document = plan.to_json()
    assert document["selected_partitions"][0]["spec_id"] == old_id
    month_text = moved_month.split("p_day=")[1][:7]
    moved_value = next(t for t in with_ts.column("ts").to_pylist() if t.isoformat()[:7] == month_text)
    plan = reader.plan(f"ts = '{moved_value.isoformat()}'")
    assert moved_month in {p.key_path for p in plan.selected}, "the month partition of the new spec"
    reader.close()
    assert main(["plan", str(scenario.spec), "events", "--where", f"ts = '{value}'", "--json"]) == 0
    assert old_id in capsys.readouterr().out


def test_status_and_cli_report_progress(tmp_path: Path, capsys: Any) -> None:
    scenario = Scenario(tmp_path, 11, TRANSITIONS["bucket-8-to-16"][0])
    scenario.full_refresh()
    scenario.set_partition_by(TRANSITIONS["bucket-8-to-16"][1])
    spec = str(scenario.spec)
    version = scenario.snapshot().version
    assert main(["repartition", spec, "events", "--dry-run", "--json"]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert dry["dry_run"]
    assert dry["version"] is None
    assert dry["partitions_left"] == 9
    assert scenario.snapshot().version == version, "a dry run commits nothing"
    assert main(["repartition", spec, "events", "--max-rows", "1"]) == 0
    assert "moved 1 old partition(s)" in capsys.readouterr().out
    assert main(["status", spec, "events", "--json"]) == 0
    progress = json.loads(capsys.readouterr().out)["datasets"][0]["repartition"]
    assert progress["in_progress"]
    assert progress["partitions_left"] == 8
    assert progress["rows_left"] == scenario.snapshot().other_layout()[1] > 0
    assert main(["status", spec, "events"]) == 0
    assert "8 partition(s)" in capsys.readouterr().out
    assert main(["repartition", spec, "events", "--max-partitions", "100", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["done"] is True
    assert main(["status", spec, "events", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["datasets"][0]["repartition"]["in_progress"] is False
    assert main(["repartition", spec, "events", "--max-partitions", "0"]) == 2
    assert "max_partitions must be at least 1" in capsys.readouterr().err
    scenario.check("after the CLI migration")


def _verify(scenario: Scenario, **kwargs: Any) -> Any:
    from airflow_partitions.refresh.verify import verify_dataset

    return verify_dataset(scenario.project, "events", record=False, **kwargs)


def _assert_equal_across_layouts(scenario: Scenario, step: str, **kwargs: Any) -> Any:
    """verify finds every partition equal, counting each current partition's rows in both layouts."""
    report = _verify(scenario, **kwargs)
    assert report.ok, f"{step}: {[c.to_json() for c in report.differing]}"
    snapshot = scenario.snapshot()
    spec_id = scenario.dataset().acceleration.partition_spec_id
    left, rows_left = snapshot.other_layout(spec_id)
    assert (report.old_partitions, report.old_rows) == (left, rows_left), step
    assert sum(c.old_layout_rows for c in report.partitions) == rows_left, f"{step}: every old row counted"
    assert sum(c.acceleration_rows for c in report.partitions) == scenario.source.num_rows, step
    assert sum(c.source_rows for c in report.partitions) == scenario.source.num_rows, step
    old_paths = {p for p, e in snapshot.partitions.items() if e.spec_id != spec_id and e.rows}
    named = {name for c in report.partitions for name in c.old_layout}
    assert len(named) == len(old_paths), f"{step}: each old partition named by the partitions it holds"
    return report


@pytest.mark.parametrize("transition", sorted(TRANSITIONS))
def test_verify_during_a_migration_compares_across_both_layouts(
    tmp_path: Path, transition: str, capsys: Any
) -> None:
    """After 0, 1 and more batches (an append between them) verify finds every partition equal: the source's
    rows of each current partition against its current-layout files plus its rows still in old partitions,
    routed under the current spec; with `--deep`, for a selection, and in the CLI's `--json`."""
    old, new = TRANSITIONS[transition]
    scenario = Scenario(tmp_path, sorted(TRANSITIONS).index(transition) + 41, old)
    scenario.full_refresh()
    first = _verify(scenario)
    assert first.ok
    assert first.old_partitions == 0
    scenario.set_partition_by(new)
    report = _assert_equal_across_layouts(scenario, "partition_by changed, nothing moved")
    assert all(c.old_layout and c.checked_by == "recomputed" for c in report.partitions)
    scenario.batch()
    report = _assert_equal_across_layouts(scenario, "one batch")
    assert any(c.old_layout for c in report.partitions), "some still have rows in old partitions"
    scenario.append_rows()
    _assert_equal_across_layouts(scenario, "append between batches")
    scenario.batch()
    deep = _assert_equal_across_layouts(scenario, "two batches, deep", deep=True)
    assert all(c.checked_by == "recomputed" for c in deep.partitions if c.acceleration_rows)
    held = sorted(c.key_path for c in deep.partitions if c.old_layout and "NULL" not in c.key_path)
    if held:
        selected = _verify(scenario, partitions=[held[0]])
        assert selected.ok, [c.to_json() for c in selected.differing]
        assert [c.key_path for c in selected.partitions] == [held[0]]
        assert selected.partitions[0].old_layout, "its rows in old partitions are counted"
    assert main(["verify", str(scenario.spec), "events", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["ok"]
    assert document["old_layout"]["partitions"] == scenario.snapshot().other_layout()[0]
    assert document["old_layout"]["partitions_with_old_rows"] == [
        c.key_path for c in deep.partitions if c.old_layout
    ]
    assert main(["verify", str(scenario.spec), "events"]) == 0
    assert "re-partitioning in progress" in capsys.readouterr().err
    # Cancelled (partition_by reverted, nothing moved back yet): the moved partitions are the old layout now.
    scenario.set_partition_by(old)
    report = _assert_equal_across_layouts(scenario, "cancelled")
    assert any(c.old_layout for c in report.partitions)
    scenario.set_partition_by(new)
    while scenario.snapshot().other_layout()[0]:
        scenario.batch()
    report = _assert_equal_across_layouts(scenario, "migration complete")
    assert not any(c.old_layout for c in report.partitions)


@pytest.mark.parametrize("transition", sorted(TRANSITIONS))
def test_verify_selects_partitions_of_the_new_layout_during_a_migration(
    tmp_path: Path, transition: str
) -> None:
    """Right after a partition_by change (nothing moved, no commit) and after batches, `--partitions` and
    `--where` select current partitions: each is its source rows against its rows in both layouts; the
    selection commits nothing, and a row deleted from an old-layout file is still reported."""
    from test_verify import _partition_rows, _republish

    old, new = TRANSITIONS[transition]
    scenario = Scenario(tmp_path, sorted(TRANSITIONS).index(transition) + 71, old)
    scenario.full_refresh()
    scenario.set_partition_by(new)
    pairs = [(name, expression) for name, _, expression in (entry.partition(": ") for entry in new)]
    by_key = rows_by_key(scenario.source.select(SCHEMA.names), pairs)
    wanted = sorted(path for path in by_key if "NULL" not in path)[:2]
    for step in ("nothing moved", "one batch", "two batches"):
        version = scenario.snapshot().version
        report = _verify(scenario, partitions=wanted)
        assert report.ok, f"{step}: {[c.to_json() for c in report.differing]}"
        assert [c.key_path for c in report.partitions] == wanted, step
        assert [c.source_rows for c in report.partitions] == [by_key[p].num_rows for p in wanted], step
        assert [c.acceleration_rows for c in report.partitions] == [by_key[p].num_rows for p in wanted], step
        first = pairs[0][0]
        where = _verify(scenario, where=f"{first} IS NULL")
        column = parse_transform(pairs[0][1]).source_columns[0]
        source = scenario.source.select(SCHEMA.names)
        nulls = sorted(rows_by_key(source.filter(pc.is_null(source.column(column))), pairs))
        assert where.ok, f"{step}: {[c.to_json() for c in where.differing]}"
        assert sorted(c.key_path for c in where.partitions) == nulls, step
        assert scenario.snapshot().version == version, f"{step}: a verify committed nothing"
        if step == "nothing moved":
            assert all(c.old_layout for c in report.partitions), "every row is still in the old layout"
        scenario.batch()
    # Tampering with an old-layout partition is still found by a selection naming a partition it feeds.
    snapshot = scenario.snapshot()
    spec_id = scenario.dataset().acceleration.partition_spec_id
    held = [p for p, e in snapshot.partitions.items() if e.spec_id != spec_id and e.rows]
    if not held:
        return
    victim = max(held, key=lambda p: (snapshot.partitions[p].rows, p))
    rows = _partition_rows(scenario.spec, victim, "events")
    (target,) = rows_by_key(rows.slice(0, 1).select(SCHEMA.names), pairs)
    _republish(scenario.spec, {victim: rows.slice(1)}, "events")
    report = _verify(scenario, partitions=[target])
    assert [c.key_path for c in report.differing] == [target]
    assert report.differing[0].acceleration_rows == report.differing[0].source_rows - 1


def _misfile_a_row(scenario: Scenario) -> tuple[str, pa.Table]:
    """One row moved from the largest old-layout partition's file into the next largest's (totals
    unchanged): the partition now holding it, and its rows before."""
    from test_verify import _partition_rows, _republish

    snapshot = scenario.snapshot()
    spec_id = scenario.dataset().acceleration.partition_spec_id
    held = sorted(
        (p for p, e in snapshot.partitions.items() if e.spec_id != spec_id and e.rows),
        key=lambda p: (-snapshot.partitions[p].rows, p),
    )
    assert len(held) >= 2, "two old partitions left to move a row between"
    donor, victim = held[0], held[1]
    donor_rows = _partition_rows(scenario.spec, donor, "events")
    victim_rows = _partition_rows(scenario.spec, victim, "events")
    _republish(
        scenario.spec,
        {donor: donor_rows.slice(1), victim: pa.concat_tables([victim_rows, donor_rows.slice(0, 1)])},
        "events",
    )
    return victim, victim_rows


@pytest.mark.parametrize("transition", sorted(TRANSITIONS))
def test_verify_finds_a_row_misfiled_in_an_old_layout_partition(tmp_path: Path, transition: str) -> None:
    """A row moved from one old-layout partition's file into another's (totals unchanged; under the current
    partition_by it still routes where it belongs): reads pruned by the old partition_by would miss it, so
    verify reports the partition holding it, with its rows and the misfiled count, and `--repair` moves
    that partition into the current partition_by (each row by its own values) in one checked commit."""
    old, new = TRANSITIONS[transition]
    scenario = Scenario(tmp_path, sorted(TRANSITIONS).index(transition) + 91, old)
    scenario.full_refresh()
    scenario.set_partition_by(new)
    scenario.batch()
    victim, victim_rows = _misfile_a_row(scenario)
    report = _verify(scenario)
    assert not report.ok, "a misfiled row in an old-layout partition must be found"
    (check,) = [c for c in report.differing if c.misfiled_rows]
    assert check.key_path == victim
    assert (check.acceleration_rows, check.misfiled_rows) == (victim_rows.num_rows + 1, 1)
    assert "1 of its" in check.reason
    assert victim in check.old_layout
    assert (
        report.to_json()["partitions"][[c.key_path for c in report.partitions].index(victim)]["misfiled_rows"]
        == 1
    )
    repaired = _verify(scenario, repair=True, strategy="arrow")
    assert victim in repaired.repaired
    assert repaired.after_repair is not None
    assert repaired.after_repair.ok, [c.to_json() for c in repaired.after_repair.differing]
    assert victim not in scenario.snapshot().partitions, "the misfiled partition was moved"
    _assert_equal_across_layouts(scenario, "after the repair")
    scenario.check("after the repair")


def test_verify_finds_a_row_misfiled_in_an_old_layout_partition_of_a_multi_column_field(
    tmp_path: Path,
) -> None:
    """The old partition_by hashes two columns into its buckets (`multi_bucket`): each old partition's rows
    are keyed again under it, every column the field reads bound, so verify passes the untouched dataset
    and names the partition holding a row of another."""
    scenario = Scenario(tmp_path, 97, ["p_m: multi_bucket(4, s, n_int)"])
    scenario.full_refresh()
    scenario.set_partition_by(["p_b: bucket(8, id)"])
    scenario.batch()
    _assert_equal_across_layouts(scenario, "one batch moved")
    victim, victim_rows = _misfile_a_row(scenario)
    report = _verify(scenario)
    (check,) = [c for c in report.differing if c.misfiled_rows]
    assert (check.key_path, check.acceleration_rows, check.misfiled_rows) == (
        victim,
        victim_rows.num_rows + 1,
        1,
    )


TAMPERING = ["delete-old-row", "duplicate-in-both-layouts", "change-old-value"]


@pytest.mark.parametrize(
    ("transition", "tampering"), [(t, TAMPERING[n % 3]) for n, t in enumerate(sorted(TRANSITIONS) * 3)]
)
def test_verify_during_a_migration_names_the_partition_of_a_tampered_row(
    tmp_path: Path, transition: str, tampering: str
) -> None:
    """A row deleted from an old-layout file, duplicated into the new layout, or changed in an old-layout
    file: verify reports exactly the current partition the row routes to, with both counts and hashes;
    `repair` refreshes it (moving its old holders in the same commit) and the dataset equals its source."""
    from test_verify import _partition_rows, _republish

    old, new = TRANSITIONS[transition]
    scenario = Scenario(tmp_path, sorted(TRANSITIONS).index(transition) * 3 + TAMPERING.index(tampering), old)
    scenario.full_refresh()
    scenario.set_partition_by(new)
    repartition(open_handle(scenario.project, scenario.dataset()), max_partitions=2)
    snapshot = scenario.snapshot()
    spec_id = scenario.dataset().acceleration.partition_spec_id
    victim = max(
        (p for p, e in snapshot.partitions.items() if e.spec_id != spec_id),
        key=lambda p: (snapshot.partitions[p].rows, p),
    )
    rows = _partition_rows(scenario.spec, victim, "events")
    row = rows.slice(0, 1)
    pairs = [(name, expression) for name, _, expression in (entry.partition(": ") for entry in new)]
    (target,) = rows_by_key(row.select(SCHEMA.names), pairs)  # the current partition the row belongs to
    if tampering == "delete-old-row":
        _republish(scenario.spec, {victim: rows.slice(1)}, "events")
    elif tampering == "duplicate-in-both-layouts":
        append(open_handle(scenario.project, scenario.dataset()), row)
    else:
        flags = rows.column("flag").to_pylist()
        flags[0] = True if flags[0] is None else not flags[0]
        changed = rows.set_column(rows.schema.get_field_index("flag"), "flag", pa.array(flags, pa.bool_()))
        _republish(scenario.spec, {victim: changed}, "events")
    report = _verify(scenario)
    assert [c.key_path for c in report.differing] == [target], [c.to_json() for c in report.differing]
    (check,) = report.differing
    expected_rows = {"delete-old-row": -1, "duplicate-in-both-layouts": 1, "change-old-value": 0}[tampering]
    assert check.acceleration_rows - check.source_rows == expected_rows
    assert check.source_hash != check.acceleration_hash
    assert check.source_hash is not None
    if tampering != "delete-old-row":
        assert victim in check.old_layout, "the old partition holding the row is named"
    if victim in check.old_layout and tampering != "duplicate-in-both-layouts":
        assert check.certificate_matches is False, "the old partition's files differ from its certificate"
    by_path = {c["key_path"]: c for c in report.to_json()["partitions"]}
    assert by_path[target]["old_layout_partitions"] == list(check.old_layout)
    repaired = _verify(scenario, repair=True, strategy="arrow")
    assert repaired.ok, [c.to_json() for c in repaired.after_repair.differing]
    assert repaired.repaired == [target]
    _assert_equal_across_layouts(scenario, "after the repair")
    scenario.check("after the repair")


def test_conservation_mismatch_is_a_typed_error() -> None:
    check_moved_rows("events", 10, 10, {"a": 6, "b": 4})
    with pytest.raises(ConservationError, match="rows added to partitions of the new layout"):
        check_moved_rows("events", 10, 10, {"a": 6, "b": 3})
    with pytest.raises(ConservationError, match="rows read from the old files"):
        check_moved_rows("events", 10, 9, {"a": 9})


def test_a_catalog_written_before_spec_versions_reads_as_one_layout(tmp_path: Path) -> None:
    """Records and checkpoints without `other_specs` (every release before this one) load as one spec."""
    scenario = Scenario(tmp_path, 13, TRANSITIONS["bucket-8-to-16"][0])
    scenario.full_refresh()
    project = scenario.project
    catalog = open_catalog(project, project.dataset("events"))
    headers = [record.header() for record in catalog._records(0, catalog.head_version())]
    assert headers
    assert all("other_specs" not in header for header in headers)
    snapshot = scenario.snapshot()
    assert snapshot.other_specs == ()
    assert list(snapshot.specs) == [snapshot.partition_spec.spec_id]
    assert snapshot.other_layout() == (0, 0)
    scenario.check("old catalog")


def test_operator_moves_a_batch_and_sets_the_progress_gauges(
    tmp_path: Path,
    statsd: StatsdListener,  # noqa: F811 (the fixture imported above)
) -> None:
    from airflow_partitions.exceptions import OrchestrationError
    from airflow_partitions.operators import RepartitionOperator

    scenario = Scenario(tmp_path, 17, TRANSITIONS["identity-to-truncate"][0])
    scenario.full_refresh()
    scenario.set_partition_by(TRANSITIONS["identity-to-truncate"][1])
    with pytest.raises(OrchestrationError, match="max_partitions"):
        RepartitionOperator(task_id="bad", spec_path=scenario.spec, dataset="events", max_partitions=0)
    spec_id = scenario.dataset().acceleration.partition_spec_id
    left = scenario.snapshot().other_layout(spec_id)
    operator = RepartitionOperator(
        task_id="move", spec_path=scenario.spec, dataset="events", max_partitions=2
    )
    summary = operator.execute({})  # type: ignore[arg-type]
    json.dumps(summary)  # XCom-safe
    assert summary["moved_partitions"] == 2
    after = scenario.snapshot().other_layout(spec_id)
    assert summary["partitions_left"] == after[0] == left[0] - 2
    gauge = "airflow.dataset_acceleration_repartition_partitions_left.events"
    assert statsd.wait_for(gauge, 1) == [(float(after[0]), "g")]
    rows_gauge = "airflow.dataset_acceleration_repartition_rows_left.events"
    assert statsd.wait_for(rows_gauge, 1) == [(float(after[1]), "g")]
    scenario.check("after the operator's batch")


def test_a_snapshot_published_mid_migration_bootstraps_both_layouts(
    tmp_path: Path, s3_server: dict[str, str], s3_bucket: str
) -> None:
    """The manifest carries every spec in use; a replica bootstrapped from it reads exactly the source."""
    from airflow_partitions.snapshots import (
        bootstrap_snapshot,
        read_snapshot_manifest,
        select_where,
        upload_snapshot_manifest,
    )

    old, new = TRANSITIONS["day-to-month"]
    scenario = Scenario(tmp_path, 23, old)
    scenario.full_refresh()
    scenario.set_partition_by(new)
    scenario.batch()
    scenario.append_rows()
    snapshot = scenario.snapshot()
    assert len(snapshot.spec_ids_in_use()) == 2, "published in the middle of the migration"
    project = scenario.project
    source_catalog = open_catalog(project, project.dataset("events"))
    location = f"s3://{s3_bucket}/snapshots"
    upload_snapshot_manifest(s3_server, location, "events", snapshot, dataset_root=source_catalog.data_root)
    manifest = read_snapshot_manifest(s3_server, location, "events")
    assert manifest is not None
    assert set(manifest.specs) == snapshot.spec_ids_in_use()
    # Selecting by a filter judges each partition under its own spec, like a read.
    day = next(p for p in snapshot.partitions if p.startswith("@") and "NULL" not in p)
    day_text = day.split("p_day=")[1][:10]
    selected = select_where(manifest, SCHEMA, f"ts >= '{day_text}' AND ts < '{day_text} 23:59:59'")
    assert day in selected

    replica_spec = tmp_path / "replica.yaml"
    replica_spec.write_text(
        scenario.spec.read_text(encoding="utf-8").replace("accelerator_dir: acc", "accelerator_dir: replica"),
        encoding="utf-8",
    )
    replica_project = load_spec(replica_spec)
    replica_catalog = open_catalog(replica_project, replica_project.dataset("events"))
    assert replica_catalog.latest() is None, "a fresh directory"
    result = bootstrap_snapshot(
        s3_server, location, "events", replica_catalog.data_root, catalog=replica_catalog
    )
    assert result.version == snapshot.version
    restored = replica_catalog.latest()
    assert restored is not None
    assert restored.spec_ids_in_use() == snapshot.spec_ids_in_use()
    assert restored.other_layout() == snapshot.other_layout()
    assert sorted(restored.partitions) == sorted(snapshot.partitions)
    scenario.spec = replica_spec
    scenario.check("bootstrapped mid-migration")
    # Bootstrapping again changes nothing.
    again = bootstrap_snapshot(
        s3_server, location, "events", replica_catalog.data_root, catalog=replica_catalog
    )
    assert again.committed_version is None


def test_a_manifest_without_other_specs_reads_as_one_spec(
    tmp_path: Path, s3_server: dict[str, str], s3_bucket: str
) -> None:
    """Manifests of a single layout (and of every earlier release) carry no `other_specs` key."""
    from airflow_partitions.snapshots import read_snapshot_manifest, upload_snapshot_manifest
    from airflow_partitions.snapshots.manifest import encode_manifest

    scenario = Scenario(tmp_path, 29, TRANSITIONS["bucket-8-to-16"][0])
    scenario.full_refresh()
    snapshot = scenario.snapshot()
    assert "other_specs" not in json.loads(encode_manifest("events", snapshot))
    project = scenario.project
    root = open_catalog(project, project.dataset("events")).data_root
    location = f"s3://{s3_bucket}/snapshots"
    upload_snapshot_manifest(s3_server, location, "events", snapshot, dataset_root=root)
    manifest = read_snapshot_manifest(s3_server, location, "events")
    assert manifest is not None
    assert manifest.other_specs == ()
    assert list(manifest.specs) == [snapshot.partition_spec.spec_id]


def test_a_renamed_source_column_is_rebuilt_not_migrated(tmp_path: Path) -> None:
    """A field's identity is its name and canonical expression: renaming its source column changes the spec
    id, and since the stored rows still carry the old name, an online batch refuses and a full refresh
    rebuilds every partition under the new name."""
    from airflow_partitions.exceptions import PartitionSpecChangedError

    scenario = Scenario(tmp_path, 31, TRANSITIONS["region-to-region-bucket"][0])
    scenario.full_refresh()
    before = scenario.snapshot()
    names = ["region" if name == "s" else name for name in scenario.source.column_names]
    scenario.source = scenario.source.rename_columns(names)
    scenario.save_source()
    scenario.set_partition_by(["p_s: region"])
    assert scenario.dataset().acceleration.partition_spec_id != before.partition_spec.spec_id
    with pytest.raises(PartitionSpecChangedError, match="refresh SPEC DATASET --full"):
        repartition(open_handle(scenario.project, scenario.dataset()), max_partitions=2)
    with pytest.raises(PartitionSpecChangedError, match="a source column was renamed"):
        refresh_dataset(str(scenario.spec), "events", where="id >= 0", strategy="arrow")
    assert scenario.snapshot().version == before.version, "refused: nothing committed"
    # verify cannot route the stored rows either: it names each old partition, and a repair refuses.
    report = _verify(scenario)
    unroutable = [c for c in report.differing if c.key_path.startswith("@")]
    assert len(unroutable) == before.partition_count
    assert all("cannot be read as the source's rows" in c.reason for c in unroutable)
    assert sum(c.acceleration_rows for c in unroutable) == before.total_rows
    with pytest.raises(RefreshError, match="refresh SPEC events --full"):
        _verify(scenario, repair=True)
    assert scenario.snapshot().version == before.version, "refused: nothing committed"
    scenario.full_refresh()
    assert _verify(scenario).ok
    after = scenario.snapshot()
    assert after.spec_ids_in_use() == {scenario.dataset().acceleration.partition_spec_id}
    assert sorted(after.partitions) == sorted(before.partitions), "the same values, the same key paths"
    reader = PartitionedDatasetReader(scenario.spec, "events")
    try:
        full = reader.read().select(names)
        missing, extra = multiset_difference(full, scenario.source)
        assert not missing
        assert not extra
        assert full.num_rows == scenario.source.num_rows
        chosen = scenario.source.column("region").drop_null()[0].as_py()
        got = reader.read(f"region = '{chosen.replace(chr(39), chr(39) * 2)}'").select(names)
        expected = scenario.source.filter(pc.equal(scenario.source.column("region"), chosen))
        missing, extra = multiset_difference(got, expected)
        assert not missing
        assert not extra
    finally:
        reader.close()
