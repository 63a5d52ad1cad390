"""Write throughput: an append through the write API against a plain pyarrow Parquet write of the rows.

    python -m benchmarks.bench_writes            # 1,000,000 rows, bucket(16, id), 5 rounds
    python -m benchmarks.bench_writes --quick    # 100,000 rows, 3 rounds

Data: `id` (int64), `region` (string, NULL in 1 row of 10), `ts` (timestamp, UTC), `amount` (double).

Contenders, each on a fresh directory per round (nothing accumulates), in shuffled order per round
(`benchmarks/pairing.py`):

* append: `airflow_partitions.write.commit.append` into a dataset partitioned by `bucket(16, id)` (parquet
  engine): conform to the schema, route every row with the bucket transform, write one zstd Parquet file
  per partition (fsynced, checksummed, statistics), count the rows back from the files, one catalog
  commit with the conservation counts;
* upsert: `upsert` of 1% of the rows (existing ids, new values) into the appended dataset (a fresh copy
  per round): only the partitions the keys route to are rewritten;
* anchor: `pyarrow.parquet.write_table` of the same rows to one file (no partitioning, no fsync, no
  catalog).

Figures: append time / anchor time (the cost of routing, partitioned files, durability and the commit
over writing the bytes once), rows per second of each, and upsert time / anchor time.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from airflow_partitions.spec import load_spec
from airflow_partitions.table import open_handle
from airflow_partitions.write.commit import append, upsert
from benchmarks import load
from benchmarks.pairing import Target, figure_line, run_rounds

SEED = 16
APPEND_TARGET = Target("<=", 4.0)


def make_table(rows: int) -> pa.Table:
    rng = np.random.default_rng(SEED)
    regions = np.array(["EU", "US", "APAC", "a/b", "k=v", "日本"], dtype=object)[rng.integers(0, 6, rows)]
    region = pa.array(regions, pa.string(), mask=rng.random(rows) < 0.1)
    seconds = rng.integers(1_767_225_600, 1_767_225_600 + 90 * 86_400, rows)
    return pa.table(
        {
            "id": pa.array(np.arange(rows, dtype=np.int64)),
            "region": region,
            "ts": pa.array(seconds * 1_000_000, pa.timestamp("us", "UTC")),
            "amount": pa.array(rng.random(rows) * 1000, pa.float64()),
        }
    )


def write_spec(directory: Path) -> Path:
    spec = directory / "spec.yaml"
    spec.write_text(
        textwrap.dedent(
            f"""\
            accelerator_dir: {directory / "acc"}
            datasets:
              - name: events
                from: file:{directory / "absent.parquet"}
                schema: {{id: int64, region: string, ts: "timestamp[us, UTC]", amount: double}}
                acceleration:
                  engine: parquet
                  primary_key: [id]
                  partition_by:
                    - b: "bucket(16, id)"
            """
        ),
        encoding="utf-8",
    )
    return spec


def run(rows: int, rounds: int) -> None:
    table = make_table(rows)
    changed = table.take(np.arange(0, rows, 100)).set_column(
        3, "amount", pa.array(np.full(len(range(0, rows, 100)), -1.0))
    )
    scratch = Path(tempfile.mkdtemp(prefix="bench-writes-"))
    seeded = scratch / "seeded"
    seeded.mkdir()
    project = load_spec(write_spec(seeded))
    append(open_handle(project, project.dataset("events")), table)
    counter = iter(range(10**9))

    def fresh() -> Path:
        directory = scratch / f"round-{next(counter)}"
        directory.mkdir()
        return directory

    def appended() -> Any:
        directory = fresh()
        spec = load_spec(write_spec(directory))
        result = append(open_handle(spec, spec.dataset("events")), table)
        shutil.rmtree(directory)
        return result

    def upserted() -> Any:
        directory = fresh()
        shutil.copytree(seeded / "acc", directory / "acc")
        spec = load_spec(write_spec(directory))
        result = upsert(open_handle(spec, spec.dataset("events")), changed)
        shutil.rmtree(directory)
        return result

    def plain() -> Any:
        directory = fresh()
        pq.write_table(table, directory / "rows.parquet")
        shutil.rmtree(directory)

    try:
        measured = run_rounds(
            {"append": appended, "upsert": upserted, "pyarrow": plain},
            rounds,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result = measured.results["append"]
    assert result.rows_added == rows, "conservation: every row appended"
    assert measured.results["upsert"].rows_removed == changed.num_rows
    append_seconds = measured.median_seconds("append")
    plain_seconds = measured.median_seconds("pyarrow")
    print(f"\n{rows:,} rows, bucket(16, id), parquet engine, {rounds} rounds (median)")
    partitions = len(result.partitions)
    rate = rows / append_seconds
    print(f"  append   {append_seconds:8.3f} s  {rate:>12,.0f} rows/s  ({partitions} partitions)")
    print(f"  pyarrow  {plain_seconds:8.3f} s  {rows / plain_seconds:>12,.0f} rows/s  (one file)")
    print(
        f"  upsert   {measured.median_seconds('upsert'):8.3f} s  for {changed.num_rows:,} rows "
        f"({len(measured.results['upsert'].partitions)} partitions rewritten)"
    )
    print()
    same_rows = "append / pyarrow.parquet.write_table (same rows)"
    print(figure_line(same_rows, measured.ratio("append", "pyarrow"), APPEND_TARGET))
    # Informational: 1% of keys spread over every bucket, so every partition is read and rewritten.
    rewrite = "upsert 1% / pyarrow.parquet.write_table of all rows"
    print(figure_line(rewrite, measured.ratio("upsert", "pyarrow"), None))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100,000 rows, 3 rounds")
    parser.add_argument("--rows", type=int, default=None, help="rows to write (default 1,000,000)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default 5)")
    args = load.parse_args(parser, argv)
    rows = args.rows or (100_000 if args.quick else 1_000_000)
    rounds = args.rounds or (3 if args.quick else 5)
    run(rows, rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
