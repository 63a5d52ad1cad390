"""What Airflow orchestration adds per mapped partition, next to the Spark refresh work it wraps.

    python -m benchmarks.bench_orchestration                    # 8 partitions x 2,000 rows, all three runs
    python -m benchmarks.bench_orchestration --quick            # 4 partitions x 500 rows
    python -m benchmarks.bench_orchestration --skip-scheduler   # no real Airflow stacks (saves minutes)

Anchor: `refresh_dataset` in one process (discover, one Spark stage, finalize every partition, commit):
the work itself, with no orchestration. Measured in the same run on the same data (each run starts from
an empty acceleration so every partition is refreshed):

* `dag.test()`: the example DAG file's refresh DAG, every task in this process;
* real scheduler: scheduler + api-server + dag-processor + triggerer with LocalExecutor on a fresh
  Postgres metadata DB, triggered over the REST API (each task is its own process); once as installed,
  once with the `airflow_local_settings.py` preload the README recommends (forked task processes then
  start with pyarrow, DuckDB, sqlglot and the operators already imported).

Printed: wall times and their ratio to the anchor, the overhead per mapped partition
((run - anchor) / partitions), the median refresh task duration next to the median finalize work it
wraps, and the DAG file's parse time (after `import airflow.sdk`, in a fresh interpreter).
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
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import load

REPO_ROOT = Path(__file__).resolve().parent.parent
DAG_ID = "refresh_sales"


@dataclass
class Measured:
    label: str
    seconds: float
    refresh_task_median: float | None = None
    finalize_median: float | None = None
    stage_seconds: float | None = None
    note: str = ""


def write_data(root: Path, partitions: int, rows: int) -> Path:
    """`partitions` regions x 1 day of sales, `rows` rows each; returns the installed spec path."""
    from tests.airflow_e2e.sample import install_example_dag, sample_spec, write_sales

    regions = tuple(f"R{i:03d}" for i in range(partitions))
    write_sales(root / "sales", rows=rows * partitions, days=1, regions=regions)
    return install_example_dag(
        root / "dags", sample_spec(accelerator_dir=root / "acc", sales_dir=root / "sales")
    )


def reset_acceleration(root: Path) -> None:
    shutil.rmtree(root / "acc", ignore_errors=True)


def run_anchor(spec: Path) -> Measured:
    from airflow_partitions.refresh import refresh_dataset

    started = time.perf_counter()
    summary = refresh_dataset(str(spec), "sales")
    elapsed = time.perf_counter() - started
    return Measured(
        "refresh_dataset (anchor)",
        elapsed,
        stage_seconds=summary.timings_s.get("stage"),
        finalize_median=summary.timings_s.get("finalize", 0.0) / max(1, summary.refreshed),
        note=f"{summary.refreshed} partitions, {summary.rows} rows",
    )


def _task_seconds(start: Any, end: Any) -> float | None:
    if start is None or end is None:
        return None
    return float((end - start).total_seconds())


def run_dag_test(root: Path, spec: Path) -> Measured:
    from airflow.dag_processing.dagbag import DagBag

    from tests.airflow_e2e.metadata_db import in_process_metadata_db

    with in_process_metadata_db(str(root / "dags")):
        dag = DagBag(dag_folder=str(root / "dags")).dags[DAG_ID]
        conf = {"partitions": None, "where": None, "full_refresh": False, "snapshot": True}
        started = time.perf_counter()
        run = dag.test(run_conf=conf)
        elapsed = time.perf_counter() - started
        tis = run.get_task_instances()
        if str(run.state) != "success":
            raise SystemExit(f"dag.test run ended {run.state}")
        refresh = [
            _task_seconds(ti.start_date, ti.end_date) for ti in tis if ti.task_id == "partition.refresh"
        ]
        stage = [_task_seconds(ti.start_date, ti.end_date) for ti in tis if ti.task_id == "stage"]
    durations = [d for d in refresh if d is not None]
    return Measured(
        "dag.test()",
        elapsed,
        refresh_task_median=statistics.median(durations) if durations else None,
        stage_seconds=stage[0] if stage else None,
        note=f"{len(tis)} task instances in one process",
    )


def run_scheduler(root: Path, partitions: int, *, preload: bool) -> Measured:
    from airflow_partitions.cli.backfill import AirflowApiClient
    from tests.airflow_e2e.stack import running_airflow

    home = root / ("airflow_home_preload" if preload else "airflow_home")
    with running_airflow(home, root / "dags", parallelism=4, preload=preload) as stack:
        client = AirflowApiClient(stack.api_url, username="admin", password=stack.password)
        stack.wait_for_dag(client, DAG_ID)
        conf = {"partitions": None, "where": None, "full_refresh": False, "snapshot": True}
        started = time.perf_counter()
        run = client.trigger_dag_run(DAG_ID, conf)
        finished = client.wait_for_dag_run(DAG_ID, run["dag_run_id"], timeout=900, poll_interval=0.5)
        elapsed = time.perf_counter() - started
        if finished["state"] != "success":
            raise SystemExit(f"scheduler run ended {finished['state']}\n{stack.logs_tail()}")
        tis = client.task_instances(DAG_ID, run["dag_run_id"])

    def seconds(ti: dict[str, Any]) -> float | None:
        return float(ti["duration"]) if ti.get("duration") is not None else None

    refresh = [seconds(ti) for ti in tis if ti["task_id"] == "partition.refresh"]
    stage = [seconds(ti) for ti in tis if ti["task_id"] == "stage"]
    durations = [d for d in refresh if d is not None]
    return Measured(
        "scheduler, preloaded imports" if preload else "scheduler (LocalExecutor)",
        elapsed,
        refresh_task_median=statistics.median(durations) if durations else None,
        stage_seconds=stage[0] if stage else None,
        note=f"{len(tis)} task instances, one process each, trigger to success",
    )


def parse_time() -> tuple[float, int]:
    """Seconds to run the example DAG file after `import airflow.sdk`, in a fresh interpreter."""
    probe = textwrap.dedent(
        f"""\
        import json, runpy, time
        import airflow.sdk
        started = time.perf_counter()
        found = runpy.run_path({str(REPO_ROOT / "dags" / "refresh_datasets.py")!r})
        print(json.dumps([time.perf_counter() - started, sum(k.startswith("refresh_") for k in found)]))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO_ROOT
    )
    seconds, dags = json.loads(result.stdout.strip().splitlines()[-1])
    return float(seconds), int(dags)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:7.2f}s"


def report(partitions: int, anchor: Measured, runs: list[Measured], parse: tuple[float, int]) -> str:
    lines = [
        f"orchestration overhead, {partitions} mapped partitions ({anchor.note})",
        "",
        f"{'run':<32}{'wall':>10}{'x anchor':>10}{'+/partition':>13}{'stage':>10}{'refresh task':>14}",
    ]
    rows = [anchor, *runs]
    for measured in rows:
        ratio = measured.seconds / anchor.seconds if anchor.seconds else float("nan")
        overhead = (measured.seconds - anchor.seconds) / partitions if measured is not anchor else 0.0
        lines.append(
            f"{measured.label:<32}{_fmt(measured.seconds):>10}{ratio:>9.2f}x{_fmt(overhead):>13}"
            f"{_fmt(measured.stage_seconds):>10}{_fmt(measured.refresh_task_median):>14}"
        )
    lines += [
        "",
        f"per-partition work in the anchor (finalize wall / partitions): {_fmt(anchor.finalize_median)}",
        "refresh task = median duration of one mapped partition task (finalize + task overhead)",
        f"DAG file parse (after import airflow.sdk): {parse[0] * 1000:.0f} ms for {parse[1]} DAGs",
    ]
    for measured in runs:
        if measured.note:
            lines.append(f"{measured.label}: {measured.note}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=8, help="mapped partitions (default 8)")
    parser.add_argument("--rows", type=int, default=2000, help="rows per partition (default 2000)")
    parser.add_argument("--quick", action="store_true", help="4 partitions x 500 rows")
    parser.add_argument("--skip-scheduler", action="store_true", help="skip the real Airflow stack run")
    args = load.parse_args(parser, argv)
    partitions, rows = (4, 500) if args.quick else (args.partitions, args.rows)

    work = Path(tempfile.mkdtemp(prefix="ap-bench-orchestration-"))
    os.environ.setdefault("AIRFLOW_HOME", str(work / "airflow_home_dagtest"))
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    try:
        spec = write_data(work, partitions, rows)
        parse = parse_time()
        # Start the JVM first: neither the anchor nor dag.test() (same process) pays for it; the real
        # scheduler's stage task does, in its own process, and that is part of what it costs.
        from airflow_partitions.refresh.spark_session import build_local_session

        build_local_session()
        run_anchor(spec)  # warm-up: the first Spark job of a session pays for Python workers and codegen
        reset_acceleration(work)
        anchor = run_anchor(spec)
        reset_acceleration(work)
        runs = [run_dag_test(work, spec)]
        if not args.skip_scheduler:
            for preload in (False, True):
                reset_acceleration(work)
                runs.append(run_scheduler(work, partitions, preload=preload))
        print(report(partitions, anchor, runs, parse))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
