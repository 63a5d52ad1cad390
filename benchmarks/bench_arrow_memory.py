"""The in-process Arrow refresh's peak memory and speed beside pyiceberg and DuckDB's partitioned COPY.

    python -m benchmarks.bench_arrow_memory --quick            # 1M rows
    python -m benchmarks.bench_arrow_memory                    # 10M rows
    python -m benchmarks.bench_arrow_memory --rows 100000000   # 100M rows (about 3 GB of Parquet)

Taxi-like Parquet (`bench_refresh.taxi_chunk`, 1M-row files) partitioned by `bucket(50, PULocationID)`.
Every contender runs in its own fresh Python process, which reports its own peak RSS (`VmHWM`) and the
seconds of its work (imports done before the clock starts, including the modules the refresh loads on
first use: about 0.16 s of CPU; the work's CPU seconds, every thread, and the process's wall time, imports
included, are printed too):

* auto: `refresh_dataset(full=True)` with `strategy="auto"` and the default budgets: on one machine
  the streaming Arrow path (batches routed and spilled per partition past the spill budget, each
  partition written from its spill, every count checked), then the commit;
* arrow, whole read (`--whole`): the same refresh reading the source whole, as the Arrow path did
  before it streamed (for the memory it saves);
* pyiceberg: pyarrow reads the source, `create_table` with `bucket(50, PULocationID)`, `append`
  (skipped, saying why, without pyiceberg and pyiceberg-core);
* DuckDB COPY, the single-machine floor: `COPY (SELECT *, hash(PULocationID) % 50 AS b FROM
  read_parquet(...)) TO dir (FORMAT parquet, COMPRESSION zstd, PARTITION_BY (b))`, multi-threaded, no
  checks, no catalog. The rows it wrote are counted back afterwards, outside the clock.

Printed: each contender's median seconds and peak RSS; auto / DuckDB COPY (target ≤ 1.5), auto /
pyiceberg and auto's peak RSS / pyiceberg's (target ≤ 1), from paired shuffled rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks import load
from benchmarks.pairing import Ratio, Target, figure_line, run_rounds

REPO_ROOT = Path(__file__).resolve().parent.parent
BUCKETS = 50
COPY_TARGET = Target("<=", 1.5)
RSS_TARGET = Target("<=", 1.0)


def write_spec(root: Path, flat: Path) -> Path:
    spec = root / "spec.yaml"
    spec.write_text(
        f"accelerator_dir: {root / 'acc'}\n"
        "datasets:\n"
        f"  - name: trips\n    from: file:{flat}\n"
        f"    acceleration:\n      partition_by: [{{b: 'bucket({BUCKETS}, PULocationID)'}}]\n"
    )
    return spec


def copy_sql(flat: Path, target: Path) -> str:
    source = str(flat / "*.parquet").replace("'", "''")
    return (
        f"COPY (SELECT *, hash(PULocationID) % {BUCKETS} AS b FROM read_parquet('{source}')) "
        f"TO '{str(target).replace(chr(39), chr(39) * 2)}' "
        "(FORMAT parquet, COMPRESSION zstd, PARTITION_BY (b))"
    )


def process_cpu() -> float:
    """CPU seconds (user + system, every thread) this process has used."""
    times = os.times()
    return times.user + times.system


def run_task(kind: str, request_path: str) -> None:
    """One contender in this fresh process: imports first, then the timed work; writes its report."""
    from benchmarks.bench_scale import peak_rss_mib

    request = json.loads(Path(request_path).read_text())
    output: dict[str, Any] = {}
    if kind in ("auto", "whole"):
        import duckdb
        import pyarrow.dataset
        import pyarrow.parquet  # noqa: F401
        import sqlglot.dialects.duckdb  # noqa: F401  (the transform parser's dialect)

        import airflow_partitions.pruning  # discovery by file facts
        import airflow_partitions.storage.parquet  # noqa: F401
        from airflow_partitions.refresh import arrow_stream, refresh_dataset

        if kind == "whole":
            arrow_stream.streams = lambda source: False
        started, cpu_started = time.perf_counter(), process_cpu()
        summary = refresh_dataset(request["spec"], "trips", full=True, strategy="auto")
        seconds, cpu = time.perf_counter() - started, process_cpu() - cpu_started
        output = {
            "rows": summary.rows,
            "strategy": summary.strategy,
            "reason": summary.strategy_reason,
            "spill": arrow_stream.spill_facts(),
        }
    elif kind == "pyiceberg":
        from benchmarks.bench_refresh import anchor_pyiceberg_append, pyiceberg_catalog

        fresh = Path(request["root"]) / f"iceberg-{uuid.uuid4().hex[:10]}"  # a new catalog per process
        fresh.mkdir(parents=True)
        catalog = pyiceberg_catalog(fresh)
        started, cpu_started = time.perf_counter(), process_cpu()
        output = {"rows": anchor_pyiceberg_append(catalog, Path(request["flat"]))}
        seconds, cpu = time.perf_counter() - started, process_cpu() - cpu_started
    elif kind == "copy":
        import duckdb

        connection = duckdb.connect()
        started, cpu_started = time.perf_counter(), process_cpu()
        connection.execute(request["sql"])
        seconds, cpu = time.perf_counter() - started, process_cpu() - cpu_started
    else:
        raise SystemExit(f"unknown task {kind!r}")
    report = {"output": output, "seconds": seconds, "cpu": cpu, "peak_rss_mib": peak_rss_mib()}
    Path(request["out"]).write_text(json.dumps(report, default=str))


def spawn(kind: str, request: dict[str, Any], workdir: Path) -> dict[str, Any]:
    name = f"{kind}-{uuid.uuid4().hex[:10]}"
    request = {**request, "out": str(workdir / f"{name}.out.json")}
    request_path = workdir / f"{name}.json"
    request_path.write_text(json.dumps(request))
    started = time.perf_counter()
    with open(workdir / f"{name}.log", "wb") as log:
        process = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.bench_arrow_memory",
                "--task",
                kind,
                "--request",
                str(request_path),
            ],
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            check=False,
        )
    wall = time.perf_counter() - started
    if process.returncode != 0:
        tail = (workdir / f"{name}.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"task {kind} failed ({process.returncode}):\n{tail}")
    report = json.loads(Path(request["out"]).read_text())
    report["wall"] = wall
    return report


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--task":
        run_task(sys.argv[2], sys.argv[4])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000, help="source rows (default 10M; 100M works)")
    parser.add_argument("--quick", action="store_true", help="1M rows")
    parser.add_argument("--repeat", type=int, default=3, help="paired rounds (default 3)")
    parser.add_argument(
        "--whole", action="store_true", help="also the Arrow refresh reading the source whole"
    )
    parser.add_argument("--workdir", help="where to put data (default: a temporary directory, removed)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = load.parse_args(parser, argv)
    rows = 1_000_000 if args.quick else args.rows

    from benchmarks.bench_refresh import pyiceberg_missing, write_taxi_files

    root = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="ap-bench-arrow-memory-"))
    root.mkdir(parents=True, exist_ok=True)
    tasks = root / "tasks"
    tasks.mkdir(exist_ok=True)
    try:
        flat = root / "flat"
        started = time.perf_counter()
        if not flat.exists():
            write_taxi_files(flat, rows)
        stored = sum(p.stat().st_size for p in flat.iterdir())
        print(
            f"{rows:,} rows, {stored / 2**20:,.0f} MiB of Parquet, "
            f"ready in {time.perf_counter() - started:.1f} s"
        )
        spec = write_spec(root, flat)
        reports: dict[str, list[dict[str, Any]]] = {}

        def contender(kind: str, request: dict[str, Any]) -> Any:
            def run() -> Any:
                if kind == "copy":
                    shutil.rmtree(root / "copy", ignore_errors=True)
                if kind == "pyiceberg":
                    for old in (root / "iceberg-runs").glob("iceberg-*"):
                        shutil.rmtree(old, ignore_errors=True)
                report = spawn(kind, request, tasks)
                reports.setdefault(kind, []).append(report)
                return report

            return run

        contenders = {
            "auto": contender("auto", {"spec": str(spec)}),
            "copy": contender("copy", {"sql": copy_sql(flat, root / "copy")}),
        }
        if args.whole:
            contenders["whole"] = contender("whole", {"spec": str(spec)})
        iceberg_skipped = pyiceberg_missing()
        if iceberg_skipped is None:
            contenders["pyiceberg"] = contender(
                "pyiceberg", {"root": str(root / "iceberg-runs"), "flat": str(flat)}
            )
        else:
            print(f"pyiceberg anchor skipped: {iceberg_skipped}")
        measured = run_rounds(contenders, args.repeat, warmup=False)
        import duckdb

        copied = (
            duckdb.connect()
            .execute(
                f"SELECT count(*) FROM read_parquet('{root / 'copy'}/**/*.parquet', "
                "hive_partitioning = false)"
            )
            .fetchone()
        )
        assert copied is not None
        assert copied[0] == rows, ("DuckDB COPY rows", copied, rows)
        for kind in ("auto", "whole", "pyiceberg"):
            for report in reports.get(kind, []):
                assert report["output"]["rows"] == rows, (kind, report["output"], rows)
        auto = reports["auto"][-1]["output"]
        print(f"  auto ran {auto['strategy']}: {auto['reason']}")
        print(f"  spill: {auto['spill']}")

        def work(kind: str) -> list[float]:
            return [report["seconds"] for report in reports[kind]]

        def ratio(top: str, bottom: str, key: str = "seconds") -> Ratio:
            pairs = zip(reports[top], reports[bottom], strict=True)
            return Ratio(tuple(a[key] / b[key] for a, b in pairs), tuple(measured.loads))

        names = {
            "auto": "auto (streaming Arrow)",
            "whole": "arrow, whole read",
            "pyiceberg": "pyiceberg read + append",
            "copy": "DuckDB partitioned COPY",
        }
        for kind, name in names.items():
            if kind in reports:
                rss = statistics.median(r["peak_rss_mib"] for r in reports[kind])
                wall = statistics.median(r["wall"] for r in reports[kind])
                cpu = statistics.median(r["cpu"] for r in reports[kind])
                print(
                    f"      {name:28} {statistics.median(work(kind)):7.2f} s work ({cpu:6.2f} CPU s), "
                    f"{wall:7.2f} s process, peak RSS {rss:8,.0f} MiB"
                )
        print(
            figure_line(f"auto / DuckDB partitioned COPY, {rows:,} rows", ratio("auto", "copy"), COPY_TARGET)
        )
        print(figure_line("  the same, whole processes", ratio("auto", "copy", "wall"), None))
        print(figure_line("  the same, CPU seconds of the work", ratio("auto", "copy", "cpu"), None))
        figures: dict[str, Any] = {"rows": rows, "auto_vs_copy": ratio("auto", "copy").samples}
        if "pyiceberg" in reports:
            print(figure_line("auto / pyiceberg, seconds", ratio("auto", "pyiceberg"), None))
            print(
                figure_line(
                    "auto / pyiceberg, peak RSS", ratio("auto", "pyiceberg", "peak_rss_mib"), RSS_TARGET
                )
            )
            figures["auto_vs_pyiceberg"] = ratio("auto", "pyiceberg").samples
            figures["rss_vs_pyiceberg"] = ratio("auto", "pyiceberg", "peak_rss_mib").samples
        if "whole" in reports:
            print(figure_line("auto / whole read, peak RSS", ratio("auto", "whole", "peak_rss_mib"), None))
        if args.json:
            print(json.dumps(figures))
    finally:
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
