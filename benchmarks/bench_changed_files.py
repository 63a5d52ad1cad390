"""Changed-file refresh of a flat (not Hive) file source: one new daily file vs a full refresh.

    python -m benchmarks.bench_changed_files                  # 365 files x 20,000 rows
    python -m benchmarks.bench_changed_files --rows-per-file 50000
    python -m benchmarks.bench_changed_files --quick          # 365 files x 2,000 rows, 2 rounds

The source is 365 daily Parquet files in one directory (no `day=` directories), partitioned by
`date_trunc('day', ts)`. Two datasets of one spec read it, each with its own catalog:
* `days_full` is refreshed with `--full` (every partition rewritten: the anchor);
* `days_changed` gets one new daily file appended before each of its refreshes, which per-file facts map
  to the one new partition: only that file is read (discovery and stage) and only that partition written.
Both run once per round in a shuffled order (`benchmarks/pairing.py`); the figure is the median and
min-max of the per-round ratios, with issue 16's target: incremental / full <= 0.05. Rows staged (read
from the source into partitions) are compared too.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks import load
from benchmarks.pairing import Target, figure_line, run_rounds

DAYS = 365
TARGET = Target("<=", 0.05)
START = dt.date(2026, 1, 1)


def day_file(directory: Path, day: int, rows: int) -> Path:
    """One day's events: timestamps within the day, a few numeric and text columns."""
    rng = np.random.default_rng(day)
    start = np.datetime64(START + dt.timedelta(days=day), "us").astype(np.int64)
    ts = start + np.sort(rng.integers(0, 86_400_000_000, rows))
    table = pa.table(
        {
            "id": pa.array(np.arange(day * rows, (day + 1) * rows, dtype=np.int64)),
            "ts": pa.array(ts, pa.timestamp("us")),
            "user_id": pa.array(rng.integers(1, 100_000, rows)),
            "amount": pa.array(np.round(rng.gamma(2.0, 10.0, rows), 2)),
            "kind": pa.array(rng.choice(["view", "click", "buy"], rows)),
        }
    )
    path = directory / f"events-{START + dt.timedelta(days=day)}.parquet"
    pq.write_table(table, path)
    return path


def write_spec(root: Path, source: Path) -> Path:
    datasets = "".join(
        f"""  - name: {name}
    from: file:{source}
    params: {{file_format: parquet}}
    acceleration:
      engine: parquet
      mode: file
      partition_by:
        - day: "date_trunc('day', ts)"
      refresh: {{max_partitions: 5000}}
"""
        for name in ("days_full", "days_changed")
    )
    path = root / "datasets.yaml"
    path.write_text(f"accelerator_dir: {root / 'acc'}\ndatasets:\n{datasets}", encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows-per-file", type=int, default=20_000)
    parser.add_argument("--quick", action="store_true", help="2,000 rows per file, 2 rounds")
    parser.add_argument("--repeat", type=int, default=3, help="paired rounds (default 3)")
    parser.add_argument("--workdir", help="where to put data (default: a temporary directory, removed)")
    args = load.parse_args(parser, argv)
    rows = 2_000 if args.quick else args.rows_per_file
    rounds = 2 if args.quick else args.repeat

    from airflow_partitions.refresh import refresh_dataset
    from airflow_partitions.refresh.spark_session import build_local_session
    from airflow_partitions.spec import load_spec

    root = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="ap-bench-changed-"))
    source = root / "events"
    source.mkdir(parents=True, exist_ok=True)
    try:
        started = time.perf_counter()
        for day in range(DAYS):
            day_file(source, day, rows)
        print(f"generated {DAYS} daily files x {rows:,} rows in {time.perf_counter() - started:.1f} s")
        project = load_spec(write_spec(root, source))
        spark = build_local_session(app_name="bench-changed-files")
        initial = time.perf_counter()
        refresh_dataset(project, "days_changed", spark=spark)
        print(f"initial refresh of days_changed: {time.perf_counter() - initial:.1f} s")
        next_day = [DAYS]
        staged: dict[str, int] = {}

        def full() -> Any:
            summary = refresh_dataset(project, "days_full", full=True, spark=spark)
            staged["full"] = int((summary.conservation or {}).get("routed") or summary.rows)
            return summary

        def changed() -> Any:
            day_file(source, next_day[0], rows)
            next_day[0] += 1
            summary = refresh_dataset(project, "days_changed", spark=spark)
            if summary.refreshed != 1:
                raise RuntimeError(f"one new daily file must refresh one partition, not {summary.refreshed}")
            staged["changed"] = int((summary.conservation or {}).get("routed") or summary.rows)
            return summary

        measured = run_rounds({"full": full, "changed": changed}, rounds)
    finally:
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)
    print(
        f"\n{DAYS}+ daily Parquet files x {rows:,} rows, partitioned by date_trunc('day', ts), flat layout; "
        f"{rounds} paired rounds, {os.cpu_count()} CPUs"
    )
    print(
        f"  full refresh {measured.median_seconds('full'):.2f} s, one new daily file "
        f"{measured.median_seconds('changed'):.2f} s (median)"
    )
    print(
        figure_line(
            "incremental refresh (1 new daily file) / full refresh", measured.ratio("changed", "full"), TARGET
        )
    )
    share = staged["changed"] / staged["full"] if staged.get("full") else float("nan")
    print(
        f"  rows staged: {staged.get('changed', 0):,} / {staged.get('full', 0):,} = {share:.4f}   "
        f"(one day of {DAYS}+: ~{1 / (DAYS + rounds + 1):.4f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
