"""What each Spark deployment mode costs per partition task: in-process, spark-submit, Spark Connect.

    python -m benchmarks.bench_spark_modes            # 8 partitions x 2,000 rows, 3 cold tasks per mode
    python -m benchmarks.bench_spark_modes --quick    # 4 partitions x 500 rows, 1 cold task per mode
    python -m benchmarks.bench_spark_modes --json     # one JSON object instead of the table

Anchor: `refresh_dataset` in one process on a warm local JVM (discover, one Spark stage, finalize every
partition, commit): the refresh work itself, with no orchestration and no Spark start-up. Measured in the
same run on the same data, for each mode (the connection is the only difference):

* DAG, staged: `airflow dags test refresh_sales` (the example DAG file: one Spark stage task, then one
  mapped finalize task per partition, which uses no Spark) in a new process;
* DAG, per partition: the same DAG built with `stage=False`, so each mapped task runs its own Spark job;
* cold task: one mapped partition task with its own Spark job, run alone in a new Python process, as
  LocalExecutor, Celery and Kubernetes executors run every task. This is the per-partition price of a
  mode on a real deployment. Its floor, measured too: the same new process finalizing from an existing
  stage (no Spark), which is what the staged DAG's mapped tasks do.

Modes: in-process (no connection: a local JVM inside the task process), spark-submit (a `spark`
connection with master `local[2]`: a new driver JVM per job) and Spark Connect (a `spark_connect`
connection to a server started once for the benchmark, `local[2]`).
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
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from airflow_partitions.table import open_handle
from benchmarks import bench_orchestration, load

REPO_ROOT = Path(__file__).resolve().parent.parent
DATASET = "sales"
STAGED_DAG = "refresh_sales"
PER_PARTITION_DAG = "refresh_sales_per_partition"
SUBMIT_CONN_ID = "bench_spark_submit"
CONNECT_CONN_ID = "bench_spark_connect"
PER_PARTITION_DAG_FILE = f'''"""{DATASET} without a shared stage: each partition task runs a Spark job."""

from airflow_partitions.dag_factory import build_refresh_dag, default_spec_path
from airflow_partitions.spec import load_spec

project = load_spec(default_spec_path(__file__), check_types=False)
dag = build_refresh_dag(project, "{DATASET}", stage=False, dag_id="{PER_PARTITION_DAG}")
'''
# One mapped partition task, alone in a new process: what an executor's task process does.
COLD_TASK = """
import json, sys
from airflow_partitions.operators import SparkPartitionRefreshOperator

spec, plan_file, conn_id = sys.argv[1:4]
plan, item, stage = json.loads(open(plan_file).read())
SparkPartitionRefreshOperator(
    task_id="refresh", spec_path=spec, dataset="sales", work_item=item, plan=plan, stage=stage,
    spark_conn_id=conn_id or None,
).execute({})
"""


@dataclass
class ModeResult:
    mode: str
    staged_dag_s: float
    staged_stage_task_s: float | None
    per_partition_dag_s: float
    per_partition_task_median_s: float | None
    cold_task_s: list[float] = field(default_factory=list)

    @property
    def cold_task_median_s(self) -> float:
        return statistics.median(self.cold_task_s)


def write_data(root: Path, partitions: int, rows: int) -> Path:
    """The orchestration benchmark's data and example DAG file, plus the stage-less DAG file."""
    spec = bench_orchestration.write_data(root, partitions, rows)
    (root / "dags" / "refresh_sales_per_partition.py").write_text(PER_PARTITION_DAG_FILE)
    return spec


reset_acceleration = bench_orchestration.reset_acceleration


def run_anchor(spec: Path) -> tuple[float, float, int]:
    """(wall seconds, finalize seconds, partitions) of an in-process refresh on a warm JVM."""
    from airflow_partitions.refresh import refresh_dataset

    started = time.perf_counter()
    summary = refresh_dataset(str(spec), DATASET)
    return time.perf_counter() - started, float(summary.timings_s.get("finalize", 0.0)), summary.refreshed


def mode_environments(connect: tuple[str, int]) -> dict[str, dict[str, str]]:
    host, port = connect
    return {
        "in-process": {"AIRFLOW__AIRFLOW_PARTITIONS__SPARK_CONN_ID": ""},
        "spark-submit": {
            f"AIRFLOW_CONN_{SUBMIT_CONN_ID.upper()}": json.dumps({"conn_type": "spark", "host": "local[2]"}),
            "AIRFLOW__AIRFLOW_PARTITIONS__SPARK_CONN_ID": SUBMIT_CONN_ID,
        },
        "spark-connect": {
            f"AIRFLOW_CONN_{CONNECT_CONN_ID.upper()}": json.dumps(
                {"conn_type": "spark_connect", "host": host, "port": port}
            ),
            "AIRFLOW__AIRFLOW_PARTITIONS__SPARK_CONN_ID": CONNECT_CONN_ID,
        },
    }


def dag_run_timings(stack: Any, dag_id: str) -> tuple[float | None, float | None]:
    """(stage task seconds, median mapped refresh task seconds) of the DAG's latest run."""
    rows = stack.query(
        "SELECT task_id, duration FROM task_instance WHERE dag_id = %s AND run_id = "
        "(SELECT run_id FROM dag_run WHERE dag_id = %s ORDER BY id DESC LIMIT 1)",
        (dag_id, dag_id),
    )
    stage = [float(d) for task, d in rows if task == "stage" and d is not None]
    refresh = [float(d) for task, d in rows if task == "partition.refresh" and d is not None]
    return (stage[0] if stage else None), (statistics.median(refresh) if refresh else None)


def timed_dag_test(stack: Any, root: Path, dag_id: str, env: Mapping[str, str]) -> float:
    reset_acceleration(root)
    started = time.perf_counter()
    stack.dags_test(dag_id, {"full_refresh": True}, env=env, timeout=1800)
    return time.perf_counter() - started


def cold_tasks(
    stack: Any,
    root: Path,
    spec: Path,
    env: Mapping[str, str],
    conn_id: str,
    count: int,
    *,
    staged_in: Any = None,
) -> list[float]:
    """Seconds of `count` single-partition tasks, each in a new process with its own Spark job.

    With `staged_in` (a local session), the source is staged here first and the tasks only finalize
    their partition from that stage, as the staged DAG's mapped tasks do: the floor of a cold task.
    """
    from airflow_partitions.refresh import plan_refresh, stage_refresh
    from airflow_partitions.spec import load_spec

    reset_acceleration(root)
    project = load_spec(spec)
    dataset = project.dataset(DATASET)
    plan = plan_refresh(project, dataset)
    stage = (
        stage_refresh(open_handle(project, dataset), plan, spark=staged_in).to_json()
        if staged_in is not None
        else None
    )
    seconds: list[float] = []
    for item in plan.items[:count]:
        plan_file = root / "cold-plan.json"
        plan_file.write_text(json.dumps([plan.to_json(), item.to_json(), stage]))
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-c", COLD_TASK, str(spec), str(plan_file), conn_id],
            env={**stack.environment(), **env},
            cwd=REPO_ROOT,
            check=True,
            capture_output=True,
            timeout=600,
        )
        seconds.append(time.perf_counter() - started)
    return seconds


def report(
    partitions: int, anchor_s: float, finalize_s: float, floor: list[float], results: list[ModeResult]
) -> str:
    work = anchor_s / partitions

    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}s"

    lines = [
        f"Spark deployment modes, {partitions} partitions; anchor refresh_dataset in-process on a warm JVM: "
        f"{anchor_s:.2f}s ({work:.3f}s per partition, finalize {finalize_s / partitions:.3f}s per partition)",
        "",
        f"{'mode':<15}{'staged DAG':>12}{'+/part.':>10}{'stage task':>12}{'per-part DAG':>14}{'+/part.':>10}"
        f"{'part. task':>12}{'cold task':>11}{'x anchor/part':>15}",
    ]
    for r in results:
        staged_over = (r.staged_dag_s - anchor_s) / partitions
        per_over = (r.per_partition_dag_s - anchor_s) / partitions
        lines.append(
            f"{r.mode:<15}{fmt(r.staged_dag_s):>12}{fmt(staged_over):>10}{fmt(r.staged_stage_task_s):>12}"
            f"{fmt(r.per_partition_dag_s):>14}{fmt(per_over):>10}{fmt(r.per_partition_task_median_s):>12}"
            f"{fmt(r.cold_task_median_s):>11}{r.cold_task_median_s / work:>14.1f}x"
        )
    floor_s = statistics.median(floor)
    lines += [
        "",
        f"cold task floor (new process, finalize from an existing stage, no Spark): {floor_s:.2f}s; "
        "Spark's share of a cold task:",
        *(f"  {r.mode:<15}{r.cold_task_median_s - floor_s:>7.2f}s" for r in results),
    ]
    by_mode = {r.mode: r for r in results}
    if {"in-process", "spark-connect", "spark-submit"} <= by_mode.keys():
        connect = by_mode["spark-connect"].cold_task_median_s
        lines += [
            "",
            f"cold task, in-process / Connect: {by_mode['in-process'].cold_task_median_s / connect:.2f}x; "
            f"spark-submit / Connect: {by_mode['spark-submit'].cold_task_median_s / connect:.2f}x",
        ]
    lines += [
        "",
        "staged DAG / per-part DAG: wall of `airflow dags test` (new process: Airflow import, DAG parse,",
        "  every task in that process); +/part. = (wall - anchor) / partitions",
        "stage task / part. task: task durations recorded by Airflow (median over mapped partitions)",
        "cold task: one stage-less partition task alone in a new process (median), as executors run tasks",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=8, help="partitions (default 8)")
    parser.add_argument("--rows", type=int, default=2000, help="rows per partition (default 2000)")
    parser.add_argument(
        "--cold", type=int, default=3, help="cold single-partition tasks per mode (default 3)"
    )
    parser.add_argument("--quick", action="store_true", help="4 partitions x 500 rows, 1 cold task per mode")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = load.parse_args(parser, argv)
    partitions, rows, cold = (4, 500, 1) if args.quick else (args.partitions, args.rows, args.cold)

    from tests.airflow_e2e.spark_connect import running_connect_server
    from tests.airflow_e2e.stack import AirflowStack

    work = Path(tempfile.mkdtemp(prefix="ap-bench-spark-modes-"))
    os.environ.setdefault("AIRFLOW_HOME", str(work / "airflow_home_anchor"))
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    stack = AirflowStack(home=work / "airflow", dags_folder=work / "dags")
    try:
        spec = write_data(work, partitions, rows)
        from airflow_partitions.refresh.spark_session import build_local_session

        session = build_local_session()  # the anchor measures the work, not the JVM start
        run_anchor(spec)  # warm-up: the first job of a session pays for Python workers and codegen
        reset_acceleration(work)
        anchor_s, finalize_s, refreshed = run_anchor(spec)
        if refreshed != partitions:
            raise SystemExit(f"the anchor refreshed {refreshed} partitions, expected {partitions}")
        stack.prepare()
        no_spark = {"AIRFLOW__AIRFLOW_PARTITIONS__SPARK_CONN_ID": ""}
        floor = cold_tasks(stack, work, spec, no_spark, "", max(cold, 2), staged_in=session)
        results: list[ModeResult] = []
        with running_connect_server(work / "connect.log") as connect:
            for mode, env in mode_environments(connect).items():
                conn_id = env["AIRFLOW__AIRFLOW_PARTITIONS__SPARK_CONN_ID"]
                print(f"measuring {mode} ...", file=sys.stderr, flush=True)
                staged = timed_dag_test(stack, work, STAGED_DAG, env)
                stage_task, _ = dag_run_timings(stack, STAGED_DAG)
                per_partition = timed_dag_test(stack, work, PER_PARTITION_DAG, env)
                _, part_task = dag_run_timings(stack, PER_PARTITION_DAG)
                results.append(
                    ModeResult(
                        mode,
                        staged,
                        stage_task,
                        per_partition,
                        part_task,
                        cold_tasks(stack, work, spec, env, conn_id, cold),
                    )
                )
        if args.json:
            print(
                json.dumps(
                    {
                        "partitions": partitions,
                        "rows_per_partition": rows,
                        "anchor_s": anchor_s,
                        "cold_task_floor_s": floor,
                        "modes": [{**asdict(r), "cold_task_median_s": r.cold_task_median_s} for r in results],
                    },
                    indent=2,
                )
            )
        else:
            print(report(partitions, anchor_s, finalize_s, floor, results))
    finally:
        stack.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
