"""Run every benchmark, each in its own interpreter (Spark sessions and Airflow settings stay apart).

    python -m benchmarks.run_all            # full sizes (tens of minutes)
    python -m benchmarks.run_all --quick    # every benchmark's --quick size
    python -m benchmarks.run_all bench_pruning bench_spark_modes --quick
    python -m benchmarks.run_all --quick --allow-load   # report even on a busy machine, marked as such

Each benchmark prints its figures as ratios to its own anchor, measured in the same run, with the load
average beside them; above `--max-load` (per core) a benchmark refuses to report unless `--allow-load`
(`benchmarks/load.py`; both are passed on to every benchmark).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import load

BENCHMARKS = (
    "bench_transforms",
    "bench_expressions",
    "bench_catalog",
    "bench_pruning",
    "bench_cold_reads",
    "bench_cold_start",
    "bench_verified_reads",
    "bench_read_stats",
    "bench_in_lists",
    "bench_index",
    "bench_refresh",
    "bench_arrow_memory",
    "bench_spark_stage",
    "bench_refresh_modes",
    "bench_cdc",
    "bench_changed_files",
    "bench_snapshots",
    "bench_s3_faults",
    "bench_s3_reads",
    "bench_orchestration",
    "bench_spark_modes",
    "bench_spark_joins",
    "bench_task_overhead",
    "bench_duckdb_bytes",
    "bench_writes",
    "bench_scale",
    "bench_limits",
    "bench_verify",
    "bench_page_overview",
    "bench_repartition",
    "bench_joins",
)
REPO_ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help=f"benchmarks to run (default all: {', '.join(BENCHMARKS)})")
    parser.add_argument("--quick", action="store_true", help="pass --quick to every benchmark")
    load.add_arguments(parser)
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    failed: list[str] = []
    for name in args.names or BENCHMARKS:
        print(f"\n=== {name} ===", flush=True)
        started = time.perf_counter()
        command = [sys.executable, "-m", f"benchmarks.{name}", *(["--quick"] if args.quick else [])]
        command += [*(["--allow-load"] if args.allow_load else [])]
        command += [] if args.max_load is None else ["--max-load", str(args.max_load)]
        if subprocess.run(command, cwd=REPO_ROOT, check=False).returncode != 0:
            failed.append(name)
        print(f"=== {name}: {time.perf_counter() - started:.0f}s ===", flush=True)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
