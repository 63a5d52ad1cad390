"""Big IN lists: planning and pruned reads per list size vs DuckDB filtering the same data directly.

    python -m benchmarks.bench_in_lists            # 2,000,000 rows, lists of 10k / 20k / 50k / 100k values
    python -m benchmarks.bench_in_lists --quick    # 200,000 rows, the same list sizes, one timed run

Data: `id` (int64, spread over 0..10M) and `zone` (int64, 1,000 values). Three accelerations of it, written
with the real storage engine and committed to the real catalog: `identity(zone)` (1,000 partitions),
`bucket(64, id)` and `truncate(100000, id)` (100 partitions). Each list holds half values the data has
and half it does not, over the layout's source column.

Measured (median of `--repeat` warm runs):

* plan: `plan_partitions(index, "col IN (...)")` over the version's pruning index (the reader builds the
  index once per version and caches plans per filter, so the plan is timed without those caches): parse,
  bind, project through the transform, judge partitions and files;
* read: `reader.read_plan(plan)`, the selected files with the residual;
* anchor: DuckDB running `SELECT * FROM read_parquet(<the source file>) WHERE col IN (...)` (its own
  parse, bind and filter over the whole source);
* ratio = (plan + read) / anchor; growth = plan time at the largest list / at the smallest (10 = linear).
"""

from __future__ import annotations

import argparse
import functools
import random
import shutil
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from airflow_partitions.pruning import plan_partitions
from airflow_partitions.read import PartitionedDatasetReader
from benchmarks import load
from benchmarks.bench_pruning import build, run_sql, timed
from benchmarks.pairing import run_rounds

SEED = 13
SIZES = (10_000, 20_000, 50_000, 100_000)
LAYOUTS = {  # dataset: (partition field, expression, column the IN list is over)
    "by_zone": ("zone_p", "zone", "zone"),
    "by_bucket": ("id_bucket", "bucket(64, id)", "id"),
    "by_truncate": ("id_range", "truncate(100000, id)", "id"),
}


def make_table(rows: int) -> pa.Table:
    rng = np.random.default_rng(SEED)
    return pa.table(
        {
            "id": pa.array(rng.integers(0, 10_000_000, rows), pa.int64()),
            "zone": pa.array(rng.integers(0, 1_000, rows), pa.int64()),
            "amount": pa.array(rng.random(rows) * 100, pa.float64()),
        }
    )


def in_list(table: pa.Table, column: str, size: int) -> str:
    """`column IN (...)` of `size` values: half of them in the data, half not (negative numbers)."""
    rng = random.Random(SEED + size)
    present = table.column(column).to_numpy()
    values = [int(present[rng.randrange(len(present))]) for _ in range(size // 2)]
    values += [-1 - rng.randrange(10_000_000) for _ in range(size - size // 2)]
    rng.shuffle(values)
    return f"{column} IN ({', '.join(map(str, values))})"


def write_spec(base: Path, source: Path) -> Path:
    datasets = "".join(
        textwrap.dedent(
            f"""\
              - name: {name}
                from: file:{source}
                acceleration:
                  engine: parquet
                  partition_by:
                    - {field}: "{expression}"
            """
        )
        for name, (field, expression, _) in LAYOUTS.items()
    )
    path = base / "datasets.yaml"
    path.write_text(f"accelerator_dir: {base}\ndatasets:\n{datasets}", encoding="utf-8")
    return path


def run(base: Path, rows: int, repeat: int) -> None:
    import duckdb

    print(f"generating {rows:,} rows ...", flush=True)
    table = make_table(rows)
    source = base / "source.parquet"
    pq.write_table(table, source)
    for name, (field, expression, _) in LAYOUTS.items():
        build(base, name, table, field, expression)
    spec_path = write_spec(base, source)
    anchor_connection = duckdb.connect()

    print()
    print(
        f"{'layout':12} {'values':>8} {'plan ms':>9} {'read ms':>9} {'anchor ms':>10} {'ratio':>7} "
        f"{'rows':>8}  partitions"
    )
    for name, (_, _, column) in LAYOUTS.items():
        reader = PartitionedDatasetReader(spec_path, name)
        index = reader.index(reader.snapshot())
        plan_times: dict[int, float] = {}
        for size in SIZES:
            where = in_list(table, column, size)
            plan_seconds, plan = timed(
                lambda where=where, index=index, name=name: plan_partitions(index, where, dataset=name),
                repeat,
            )
            plan_times[size] = plan_seconds
            anchor_sql = f"SELECT * FROM read_parquet('{source}') WHERE {where}"
            contenders: dict[str, Callable[[], Any]] = {
                "ours": functools.partial(reader.read_plan, plan),
                "anchor": functools.partial(run_sql, anchor_connection, anchor_sql),
            }
            rounds = run_rounds(contenders, repeat)
            read_seconds, anchor_seconds = rounds.median_seconds("ours"), rounds.median_seconds("anchor")
            ours, anchor = rounds.results["ours"], rounds.results["anchor"]
            if ours.num_rows != anchor.num_rows:
                raise SystemExit(
                    f"{name} IN ({size}): read {ours.num_rows} rows, DuckDB over the source {anchor.num_rows}"
                )
            ratio = (plan_seconds + read_seconds) / anchor_seconds if anchor_seconds else float("inf")
            print(
                f"{name:12} {size:>8,} {plan_seconds * 1000:9.1f} {read_seconds * 1000:9.1f} "
                f"{anchor_seconds * 1000:10.1f} {ratio:6.2f}x {ours.num_rows:>8,}  "
                f"{len(plan.selected)} of {plan.total}",
                flush=True,
            )
        growth = plan_times[SIZES[-1]] / plan_times[SIZES[0]]
        linear = SIZES[-1] / SIZES[0]
        print(
            f"{name:12} plan growth {SIZES[-1]:,} / {SIZES[0]:,} values: {growth:.1f}x "
            f"(linear = {linear:g}x)",
            flush=True,
        )
        reader.close()
    anchor_connection.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=2_000_000, help="rows to generate (default 2,000,000)")
    parser.add_argument("--quick", action="store_true", help="200,000 rows, one timed run per case")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per case (median reported)")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="keep the files here instead of a temp dir"
    )
    args = load.parse_args(parser, argv)
    rows = 200_000 if args.quick else args.rows
    repeat = 1 if args.quick else args.repeat
    base = args.workdir or Path(tempfile.mkdtemp(prefix="bench-in-lists-"))
    base.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        run(base, rows, repeat)
    finally:
        if args.workdir is None:
            shutil.rmtree(base, ignore_errors=True)
    print(f"\ndone in {time.perf_counter() - started:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
