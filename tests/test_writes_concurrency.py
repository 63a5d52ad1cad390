"""Writes against concurrent refreshes and against SIGKILL, in separate processes.

A writer and a refresh plan from the same catalog version, meet at a barrier, then both commit: when they
touch the same partition exactly one of them commits and the other gets `CommitConflictError` (and
succeeds when run again); when they touch different partitions the later one rebases and both commit.
A CLI write killed at random points leaves the previous version whole: every write's rows are all there
or none, the files of the newest version are intact, and the next write succeeds.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_partitions.catalog import open_catalog
from airflow_partitions.refresh.pipeline import refresh_dataset
from airflow_partitions.table import open_handle
from tests.writes_support import Oracle, Source, assert_same_rows, fresh_database, hostile_rows, read_all

REGIONS: list[str | None] = [None, "EU", "US"]

pytestmark = [pytest.mark.postgres]


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    with fresh_database() as url:
        yield url


@pytest.fixture
def source(pg_url: str, tmp_path: Path) -> Source:
    return Source(pg_url, tmp_path)


def written_rows(region: str, first_id: int) -> pa.Table:
    return hostile_rows(first_id, range(first_id, first_id + 20), regions=[region])


def write_worker(spec_path: str, region: str, first_id: int, barrier: Any, outcome: Any) -> None:
    """Plan an append of rows of `region`, wait for the refresh to have planned too, then commit."""
    from airflow_partitions.spec import load_spec
    from airflow_partitions.write.commit import (
        WriteOperation,
        append_changes,
        commit_changes,
        open_write_target,
    )

    try:
        project = load_spec(spec_path)
        target = open_write_target(open_handle(project, project.dataset("items")))
        rows = written_rows(region, first_id)
        changes = append_changes(target, rows)
        barrier.wait(timeout=120)
        commit_changes(target, WriteOperation.APPEND, changes, rows_in=rows.num_rows)
        outcome.put(("write", "committed"))
    except Exception as err:
        outcome.put(("write", type(err).__name__))


def refresh_worker(spec_path: str, partition: str, barrier: Any, outcome: Any) -> None:
    """Plan a refresh of `partition`, wait for the writer to have planned too, then stage and commit."""
    from airflow_partitions.refresh.commit import commit_refresh
    from airflow_partitions.refresh.finalize import finalize_partition
    from airflow_partitions.refresh.pipeline import plan_refresh
    from airflow_partitions.refresh.stage import stage_refresh
    from airflow_partitions.spec import load_spec

    try:
        project = load_spec(spec_path)
        dataset = project.dataset("items")
        plan = plan_refresh(project, dataset, partitions=[partition])
        barrier.wait(timeout=120)
        stage = stage_refresh(open_handle(project, dataset), plan)
        results = [finalize_partition(open_handle(project, dataset), stage, item) for item in plan.items]
        commit_refresh(open_handle(project, dataset), plan, results, stage=stage)
        outcome.put(("refresh", "committed"))
    except Exception as err:
        outcome.put(("refresh", type(err).__name__))


def _race(spec_path: Path, write_region: str, first_id: int, refresh_partition: str) -> dict[str, str]:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["pyarrow", "pyarrow.compute", "duckdb", __name__])
    barrier = context.Barrier(2)
    outcome = context.Queue()
    writer = context.Process(
        target=write_worker, args=(str(spec_path), write_region, first_id, barrier, outcome)
    )
    refresher = context.Process(
        target=refresh_worker, args=(str(spec_path), refresh_partition, barrier, outcome)
    )
    writer.start()
    refresher.start()
    results = dict(outcome.get(timeout=300) for _ in range(2))
    writer.join(timeout=60)
    refresher.join(timeout=60)
    return results


def test_writer_and_refresh_of_the_same_partition_conflict_of_different_ones_both_commit(
    source: Source,
) -> None:
    source.create(hostile_rows(71, range(1, 61), regions=REGIONS))
    project = source.spec(["region"])
    refresh_dataset(project, "items")
    spec_path = Path(project.path)
    written = written_rows("EU", 5000)

    same = _race(spec_path, "EU", 5000, "expr0=EU")
    assert sorted(same.values()) == ["CommitConflictError", "committed"], same
    expected = Oracle(source.rows())
    if same["write"] == "committed":
        expected.append(written)
    assert_same_rows(read_all(project), expected.table(), "the winner's version, whole")
    if same["write"] != "committed":
        # The loser writes again from the newest version and commits.
        from airflow_partitions.write.commit import append

        append(open_handle(project, project.dataset("items")), written)
        expected.append(written)
        assert_same_rows(read_all(project), expected.table(), "after writing again")

    head = open_catalog(project, project.dataset("items")).head_version()
    # (Refreshing EU again would rebuild it from the source, without the rows written to EU above.)
    other = _race(spec_path, "US", 6000, "expr0=%NULL")
    assert other == {"write": "committed", "refresh": "committed"}, "different partitions: both commit"
    assert open_catalog(project, project.dataset("items")).head_version() == head + 2
    expected.append(written_rows("US", 6000))
    assert_same_rows(read_all(project), expected.table(), "both commits, rebased")


# --- SIGKILL during a CLI write -------------------------------------------------------------------

KILLS = 3


def _cli_write(spec_path: Path, rows_file: Path) -> subprocess.Popen[bytes]:
    root = Path(__file__).resolve().parent.parent
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    command = ["write", str(spec_path), "items", "--append", str(rows_file)]
    return subprocess.Popen(
        [sys.executable, "-m", "airflow_partitions.cli.main", *command],
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _check_files_intact(project: Any) -> None:
    dataset = project.dataset("items")
    catalog = open_catalog(project, dataset)
    latest = catalog.latest()
    assert latest is not None
    assert catalog.data_root is not None
    for entry in latest.partitions.values():
        for file in entry.files:
            digest = hashlib.sha256((Path(catalog.data_root) / file.path).read_bytes()).hexdigest()
            assert digest == file.checksum, f"{file.path} changed after it was committed"


def test_cli_write_killed_at_random_points_keeps_whole_versions(source: Source, tmp_path: Path) -> None:
    source.create(hostile_rows(81, range(1, 201), regions=REGIONS))
    project = source.spec(["region"])
    refresh_dataset(project, "items")
    spec_path = Path(project.path)
    base = source.rows()
    batches: dict[int, pa.Table] = {}

    def batch(number: int) -> Path:
        rows = hostile_rows(100 + number, range(10_000 * number, 10_000 * number + 3000), regions=REGIONS)
        batches[number] = rows
        path = tmp_path / f"batch-{number}.parquet"
        pq.write_table(rows, path)
        return path

    first = _cli_write(spec_path, batch(1))
    _, report = first.communicate(timeout=300)
    assert first.returncode == 0, report
    # How long the write itself takes once the command has started (it says so): kills land inside it.
    write_seconds = float(re.search(rb"in (\d+\.\d+) s", report).group(1))  # type: ignore[union-attr]
    committed = {1}
    rng = random.Random(2026)
    for number in range(2, 2 + KILLS):
        before = open_catalog(project, project.dataset("items")).head_version()
        run = _cli_write(spec_path, batch(number))
        assert run.stderr is not None
        assert b"append of" in run.stderr.readline(), "the command announces the write before it starts"
        time.sleep(rng.uniform(0.0, 1.0) * write_seconds)
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(timeout=60)
        after = open_catalog(project, project.dataset("items")).head_version()
        assert after in (before, before + 1), "a killed write commits at most its own version"
        if after == before + 1:
            committed.add(number)
        _check_files_intact(project)
        expected = pa.concat_tables([base, *(batches[n] for n in sorted(committed))])
        assert_same_rows(read_all(project), expected, f"after killing write {number}: whole writes only")
    last = _cli_write(spec_path, batch(99))
    assert last.wait(timeout=300) == 0, last.stderr.read() if last.stderr else ""
    committed.add(99)
    expected = pa.concat_tables([base, *(batches[n] for n in sorted(committed))])
    assert_same_rows(read_all(project), expected, "the next write commits")
