"""What the query limits cost a cached point read: bounded reads vs the same reads without the bounds.

    python -m benchmarks.bench_limits             # 20,000 rows, 30 rounds
    python -m benchmarks.bench_limits --quick     # 5 rounds

Every read and query runs under a budget (`pruning.limits`): a context variable holding its deadline, the
shared watchdog armed to interrupt DuckDB, and the process's `RLIMIT_AS` lowered for the DuckDB call and
restored after. Measured in one run, paired and shuffled per round (`benchmarks/pairing.py`), each sample
ten back-to-back calls on a warm reader (plan cached, Parquet footers cached):

* cached point read: `reader.read(where)` (bounded) / the same steps without a budget (the version, the
  cached plan, the scan: what `read` did before the limits): target <= 1.1;
* the bounds alone (`budget` + `run_bounded` around a no-op) / the unbounded cached point read: the
  share of a read the limits add; target <= 0.05.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa

from benchmarks import load
from benchmarks.pairing import Target, figure_line, repeated, run_rounds

ROWS = 20_000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=30, help="paired rounds (default 30)")
    parser.add_argument("--quick", action="store_true", help="5 rounds")
    args = load.parse_args(parser, argv)
    if args.quick:
        args.rounds = 5
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from test_pruning_support import build_acceleration

    from airflow_partitions.pruning.limits import budget, run_bounded

    ids = range(ROWS)
    table = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "region": pa.array([["EU", "US", "APAC"][i % 3] for i in ids]),
            "note": pa.array([f"note {i}" for i in ids]),
        }
    )
    with tempfile.TemporaryDirectory() as directory:
        acc = build_acceleration(Path(directory), table, [("region", "region")], engine="parquet")
        with acc.reader() as reader:
            where = "region = 'EU' AND id = 42"
            plan = reader.plan(where)
            columns = list(plan.index.schema.names)

            class Idle:
                def interrupt(self) -> None:
                    pass

            idle = Idle()

            def bounds_alone() -> Any:
                with budget(300.0, 4 * 1024**3, "benchmark"):
                    return run_bounded(idle, lambda: None)

            rounds = run_rounds(
                {
                    "bounded": repeated(lambda: reader.read(where)),
                    # What `read` did before the limits: the version, the cached plan, the scan.
                    "unbounded": repeated(
                        lambda: reader._scanner.read(reader._plan(reader.snapshot(), where), columns)
                    ),
                    "bounds": repeated(bounds_alone),
                },
                args.rounds,
            )
    print(f"cached point read over {ROWS:,} rows, {args.rounds} rounds (median, min-max of per-round ratios)")
    print(
        figure_line("bounded read / unbounded read", rounds.ratio("bounded", "unbounded"), Target("<=", 1.1))
    )
    print(
        figure_line(
            "the bounds alone / unbounded read", rounds.ratio("bounds", "unbounded"), Target("<=", 0.05)
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
