"""Stages of crashed or abandoned runs are swept by the next refresh and by vacuum, once older than the
grace period; younger ones, and stages a finalize task is still reading, stay."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from airflow_partitions.cli.main import main
from airflow_partitions.refresh.finalize import finalize_partition
from airflow_partitions.refresh.pipeline import plan_refresh, refresh_dataset
from airflow_partitions.refresh.stage import stage_refresh
from airflow_partitions.refresh.stage_layout import staging_root
from airflow_partitions.spec import load_spec
from airflow_partitions.table import open_handle

HOSTILE = ["Zürich", "a/b", "k=v", "100%", 'say "hi"', "it's", None, ""]


def _spec(tmp_path: Path) -> Path:
    source = tmp_path / "src"
    source.mkdir()
    rows = 400
    table = pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "city": pa.array([HOSTILE[i % len(HOSTILE)] for i in range(rows)], pa.string()),
        }
    )
    pacsv.write_csv(table, source / "orders.csv")
    path = tmp_path / "spec.yaml"
    path.write_text(
        f"""accelerator_dir: {tmp_path / "acc"}
datasets:
  - name: orders
    from: file:{source}
    params: {{file_format: csv}}
    acceleration:
      engine: parquet
      partition_by:
        - b: "bucket(4, id)"
"""
    )
    return path


def _age(directory: Path, seconds: float) -> None:
    """Make every entry under `directory` (and itself) look last touched `seconds` ago."""
    stamp = time.time() - seconds
    for folder, dirs, names in os.walk(directory, topdown=False):
        for name in [*names, *dirs]:
            os.utime(os.path.join(folder, name), (stamp, stamp), follow_symlinks=False)
    os.utime(directory, (stamp, stamp))


def _bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def test_next_refresh_and_vacuum_sweep_stages_older_than_the_grace(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec_path = _spec(tmp_path)
    project = load_spec(spec_path)
    dataset = project.dataset("orders")
    root = staging_root(project, dataset)

    # Stages of three runs: one killed after its stage (no finalize, no commit), one whose finalize tasks
    # are still running (another DAG run's mapped tasks), one in flight.
    plan = plan_refresh(project, dataset)
    abandoned, in_use, young = (
        Path(str(stage_refresh(open_handle(project, dataset), plan, spark=spark).location)) for _ in range(3)
    )
    _age(abandoned, 2 * 3600)
    _age(in_use, 2 * 3600)
    finalize_partition(open_handle(project, dataset), str(in_use), plan.items[0])
    # A run killed while Spark was writing: no manifest, Spark's temporary output only.
    crashed = root / "20260101T000000-0123456789"
    (crashed / "data" / "_temporary" / "0").mkdir(parents=True)
    (crashed / "data" / "_temporary" / "0" / "part-00000.parquet").write_bytes(b"x" * 4096)
    _age(crashed, 2 * 3600)
    # A spark-submit stage and its job files, left by a killed task.
    submitted = root / "submit-0123456789ab"
    (submitted / "data").mkdir(parents=True)
    job_files = root / ".job-k1ll3d"
    job_files.mkdir()
    (job_files / "plan.json").write_text("{}")
    _age(submitted, 2 * 3600)
    _age(job_files, 2 * 3600)
    # Not a stage: never touched, however old.
    unrelated = root / "notes"
    unrelated.mkdir()
    (unrelated / "readme.txt").write_text("mine")
    _age(unrelated, 30 * 86400)
    before = _bytes(root)

    summary = refresh_dataset(project, dataset, spark=spark)
    assert summary.failed == {}
    for gone in (abandoned, crashed, submitted, job_files):
        assert not gone.exists(), f"the next refresh sweeps {gone.name}, older than the grace period"
    for kept in (in_use, young, unrelated):
        assert kept.exists(), f"{kept.name} stays: in flight, in use or not a stage"
    after_refresh = _bytes(root)
    assert after_refresh < before, (before, after_refresh, sorted(p.name for p in root.iterdir()))

    assert main(["vacuum", str(spec_path), "orders", "--grace", "0s", "--dry-run", "--json"]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert sorted(dry["staging"]["removed"]) == sorted([in_use.name, young.name])
    assert young.exists(), "a dry run deletes nothing"
    assert in_use.exists(), "a dry run deletes nothing"

    assert main(["vacuum", str(spec_path), "orders", "--grace", "0s", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    staging = document["staging"]
    assert staging["bytes_before"] == after_refresh
    assert staging["bytes_after"] == _bytes(root) == len("mine")
    assert not young.exists()
    assert not in_use.exists()
    assert unrelated.exists()

    assert main(["vacuum", str(spec_path), "orders", "--grace", "0s"]) == 0
    assert "staging" in capsys.readouterr().out
