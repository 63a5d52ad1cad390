"""What recording read statistics costs a read: statistics on vs off, and what `advise` takes.

    python -m benchmarks.bench_read_stats           # 2,000,000 rows in bucket(16, user_id)
    python -m benchmarks.bench_read_stats --quick   # 200,000 rows, 7 rounds

Data: a parquet source of orders (`user_id`, `country`, `ts`, `amount`) refreshed in process (strategy
arrow) into `bucket(16, user_id)`. Figures, each a paired ratio with read statistics on (shapes, the
default) over off (`ReadStatsMode.OFF`, the anchor: the read as it was before statistics), shuffled order
each round (`pairing.run_rounds`), each sample `REPEAT_CALLS` calls back to back:

* `hot point read` — `user_id = <v>` read again through one reader (plan cached): the record is one
  line appended to the log (target ≤ 1.05);
* `hot query` — `SELECT count(*) ... WHERE user_id = <v>` through `query` (target ≤ 1.05).

Printed apart: the recording alone (`RECORD_CALLS` records of the cached plan, timed back to back) as a
share of the hot point read, a figure machine load disturbs less than the paired ratio; and `advise` over
the recorded reads, in seconds (no target; an offline command).
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks import load
from benchmarks.pairing import REPEAT_CALLS, Target, figure_line, repeated, run_rounds

HOT_TARGET = Target("<=", 1.05)
RECORD_CALLS = 2000


def build(base: Path, rows: int) -> Path:
    rng = random.Random(3)
    src = base / "src"
    src.mkdir()
    table = pa.table(
        {
            "user_id": pa.array([rng.randrange(100_000) for _ in range(rows)], pa.int64()),
            "country": pa.array([rng.choice(("DE", "FR", "UK", "US", "PL")) for _ in range(rows)]),
            "ts": pa.array(
                [dt.datetime(2026, 1, 1) + dt.timedelta(seconds=7 * i) for i in range(rows)],
                pa.timestamp("us"),
            ),
            "amount": pa.array([rng.random() for _ in range(rows)], pa.float64()),
        }
    )
    pq.write_table(table, src / "orders.parquet")
    spec = base / "spec.yaml"
    spec.write_text(
        f"accelerator_dir: {base / 'acc'}\n"
        "datasets:\n"
        "  - name: orders\n"
        f"    from: file:{src}\n"
        "    params: {file_format: parquet}\n"
        "    acceleration:\n"
        "      partition_by:\n"
        '        - ub: "bucket(16, user_id)"\n',
        encoding="utf-8",
    )
    from airflow_partitions.refresh import refresh_dataset

    refresh_dataset(str(spec), "orders", strategy="arrow")
    return spec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="200,000 rows, 7 rounds (a few seconds)")
    parser.add_argument("--rows", type=int, default=None, help="rows of the source (default 2,000,000)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default 21)")
    args = load.parse_args(parser, argv)
    rows = args.rows or (200_000 if args.quick else 2_000_000)
    rounds = args.rounds or (7 if args.quick else 21)

    from airflow_partitions.advisor import advise
    from airflow_partitions.read import PartitionedDatasetReader
    from airflow_partitions.read.read_stats import ReadStatsMode

    with tempfile.TemporaryDirectory(prefix="bench-read-stats-") as tmp:
        spec = build(Path(tmp), rows)
        where = "user_id = 4242"
        sql = "SELECT count(*) FROM orders WHERE user_id = 4242"
        with (
            PartitionedDatasetReader(spec, "orders") as on,
            PartitionedDatasetReader(spec, "orders") as off,
        ):
            on.read_stats.mode = ReadStatsMode.SHAPES
            off.read_stats.mode = ReadStatsMode.OFF
            reads = run_rounds(
                {
                    "on": repeated(lambda: on.read(where)),
                    "off": repeated(lambda: off.read(where)),
                },
                rounds,
            )
            # The recording alone, timed apart from the read (what a read pays for its record).
            plan = on.plan(where)
            started = time.perf_counter()
            for _ in range(RECORD_CALLS):
                on._record(plan, "read", 1, time.perf_counter())
            record_seconds = (time.perf_counter() - started) / RECORD_CALLS
            queries = run_rounds(
                {"on": repeated(lambda: on.query(sql)), "off": repeated(lambda: off.query(sql))}, rounds
            )
        print(
            f"read statistics on / off, {rows:,} rows in bucket(16, user_id), "
            f"{rounds} rounds x {REPEAT_CALLS}:"
        )
        print(figure_line("hot point read (stats on / off)", reads.ratio("on", "off"), HOT_TARGET))
        print(figure_line("hot query (stats on / off)", queries.ratio("on", "off"), HOT_TARGET))
        print(
            f"  hot point read, stats off: "
            f"{reads.median_seconds('off') / REPEAT_CALLS * 1000:.3f} ms per read"
        )
        read_seconds = reads.median_seconds("off") / REPEAT_CALLS
        print(
            f"  recording alone: {record_seconds * 1e6:.1f} µs per read = "
            f"{record_seconds / read_seconds:.3f} of the hot point read"
        )
        started = time.perf_counter()
        advice = advise(spec, "orders")
        print(
            f"  advise over {advice.workload['records']} recorded reads, {len(advice.candidates)} layouts: "
            f"{time.perf_counter() - started:.2f} s (winner: {advice.winner.name if advice.winner else None})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
