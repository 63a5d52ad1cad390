"""Append refresh against full refresh after one day lands in a 365-day source, Postgres and Parquet files.

    python -m benchmarks.bench_refresh_modes             # 365 days x 2,000 rows
    python -m benchmarks.bench_refresh_modes --quick     # 365 days x 200 rows, 3 rounds

Both contenders keep the same source in their own accelerator_dir, partitioned by `bucket(16, account)`,
so every partition receives rows every day. Each round one more day of rows is added to the source
(untimed), then the contenders refresh in a shuffled order (`benchmarks/pairing.py`, one round at a time)
and the figure is the per-round ratio append / full:
* `refresh_mode: append`: reads the rows past each partition's watermark and writes them as a new file
  next to the partition's files;
* `refresh_mode: full` (the anchor): rewrites each changed partition from all its source rows.
Both run one Spark stage (bucket has no range to push down). Postgres gives per-partition fingerprints;
the Parquet files (one per day, no Hive layout) one for the whole source; either way every partition
changed, so full mode rewrites the whole dataset and append reads and writes one day (the read pushed into
the Postgres query, or to Parquet row-group statistics).
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks import load
from benchmarks.pairing import Ratio, Rounds, Target, figure_line, run_rounds

APPEND_TARGET = Target("<=", 0.5)
START = dt.datetime(2025, 1, 1)


def day_rows(day: int, rows: int) -> pa.Table:
    rng = np.random.default_rng(day)
    base = np.datetime64(START + dt.timedelta(days=day), "us").astype(np.int64)
    created = np.sort(base + rng.integers(0, 86_400_000_000, rows))
    return pa.table(
        {
            "id": pa.array(np.arange(day * rows, (day + 1) * rows), type=pa.int64()),
            "account": pa.array(rng.integers(0, 5000, rows), type=pa.int64()),
            "amount": pa.array(rng.normal(50, 20, rows)),
            "note": pa.array([f"n{v % 97}" for v in range(rows)], type=pa.string()),
            "created_at": pa.array(created.astype("datetime64[us]"), type=pa.timestamp("us")),
        }
    )


def spec_text(root: Path, source: str, params: str) -> str:
    datasets = []
    for mode in ("append", "full"):
        datasets.append(
            f"  - name: {mode}\n"
            f"    from: {source}\n"
            f"    params: {params}\n"
            "    acceleration:\n"
            f"      refresh_mode: {mode}\n"
            '      partition_by: ["bucket(16, account)"]\n'
            "      refresh: {watermark_column: created_at}\n"
        )
    return f"accelerator_dir: {root / 'acc'}\ndatasets:\n" + "".join(datasets)


def paired_days(
    add_day: Callable[[int], None], contenders: dict[str, Callable[[], Any]], days: int, rounds: int
) -> Rounds:
    """One day added per round, untimed; then one shuffled, paired round of the contenders."""
    measured = Rounds(seconds={name: [] for name in contenders})
    for round_index in range(rounds):
        add_day(days + round_index)
        one = run_rounds(contenders, 1, warmup=False, seed=round_index)
        for name, seconds in one.seconds.items():
            measured.seconds[name].extend(seconds)
        measured.results.update(one.results)
    return measured


def check_equal(project: Any) -> None:
    """Both accelerations hold the same rows after the last round (a benchmark of wrong answers is void)."""
    from airflow_partitions.catalog import open_catalog

    totals = []
    for name in ("append", "full"):
        snapshot = open_catalog(project, project.dataset(name)).latest()
        assert snapshot is not None
        totals.append(snapshot.total_rows)
    assert totals[0] == totals[1], totals


def postgres_figure(root: Path, url: str, days: int, rows: int, rounds: int) -> Ratio:
    import adbc_driver_postgresql.dbapi as adbc
    import psycopg

    from airflow_partitions.refresh import refresh_dataset
    from airflow_partitions.refresh.spark_session import build_local_session
    from airflow_partitions.spec import load_spec

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS public.bench_events")
        conn.execute(
            "CREATE TABLE public.bench_events (id bigint PRIMARY KEY, account bigint, amount float8, "
            "note text, created_at timestamp)"
        )
        conn.execute("CREATE INDEX ON public.bench_events (created_at)")

    def add_day(day: int) -> None:
        with adbc.connect(url) as conn, conn.cursor() as cur:
            cur.adbc_ingest("bench_events", day_rows(day, rows), mode="append")
            conn.commit()

    for day in range(days):
        add_day(day)
    (root / "pg.yaml").write_text(spec_text(root / "pg", "postgres:public.bench_events", f"{{url: '{url}'}}"))
    project = load_spec(root / "pg.yaml")
    spark = build_local_session(app_name="bench-refresh-modes")
    for name in ("append", "full"):
        refresh_dataset(project, name, spark=spark)
    add_day(days)  # the warm-up round
    for name in ("append", "full"):
        refresh_dataset(project, name, spark=spark)
    contenders = {
        name: (lambda n=name: refresh_dataset(project, n, spark=spark)) for name in ("append", "full")
    }
    measured = paired_days(add_day, contenders, days + 1, rounds)
    check_equal(project)
    summary = measured.results["append"]
    assert summary.refresh_mode == "append"
    assert summary.appended_rows == rows, summary.to_json()
    return measured.ratio("append", "full")


def parquet_figure(root: Path, days: int, rows: int, rounds: int) -> Ratio:
    from airflow_partitions.refresh import refresh_dataset
    from airflow_partitions.refresh.spark_session import build_local_session
    from airflow_partitions.spec import load_spec

    source = root / "days"
    source.mkdir()

    def add_day(day: int) -> None:
        pq.write_table(
            day_rows(day, rows), source / f"day-{day:04d}.parquet", row_group_size=max(rows // 4, 1)
        )

    for day in range(days):
        add_day(day)
    (root / "files.yaml").write_text(spec_text(root / "files", f"file:{source}", "{file_format: parquet}"))
    project = load_spec(root / "files.yaml")
    spark = build_local_session(app_name="bench-refresh-modes")
    for name in ("append", "full"):
        refresh_dataset(project, name, spark=spark)
    add_day(days)
    for name in ("append", "full"):
        refresh_dataset(project, name, spark=spark)
    contenders = {
        name: (lambda n=name: refresh_dataset(project, n, spark=spark)) for name in ("append", "full")
    }
    measured = paired_days(add_day, contenders, days + 1, rounds)
    check_equal(project)
    assert measured.results["append"].appended_rows == rows
    return measured.ratio("append", "full")


@contextmanager
def scratch_database(admin_url: str) -> Iterator[str]:
    import psycopg

    name = f"ap_bench_modes_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield admin_url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=int, default=365, help="days in the source before the rounds")
    parser.add_argument("--rows-per-day", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5, help="paired rounds (one new day each)")
    parser.add_argument("--quick", action="store_true", help="200 rows a day, 3 rounds")
    parser.add_argument(
        "--pg-admin-url",
        default="postgresql://postgres@127.0.0.1:5432/postgres",
        help="a server where a scratch database is created for the run, then dropped",
    )
    parser.add_argument("--no-postgres", action="store_true", help="skip the Postgres figure")
    args = load.parse_args(parser, argv)
    rows = 200 if args.quick else args.rows_per_day
    rounds = 3 if args.quick else args.repeat
    root = Path(tempfile.mkdtemp(prefix="ap-bench-modes-"))
    try:
        print(f"{args.days} days x {rows:,} rows, one more day per round, {rounds} paired rounds")
        if not args.no_postgres:
            with scratch_database(args.pg_admin_url) as url:
                ratio = postgres_figure(root, url, args.days, rows, rounds)
            print(
                figure_line("Postgres: append refresh / full refresh (one day added)", ratio, APPEND_TARGET)
            )
        ratio = parquet_figure(root, args.days, rows, rounds)
        print(figure_line("Parquet day files: append refresh / full refresh", ratio, APPEND_TARGET))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
