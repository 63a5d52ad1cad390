"""What one mapped partition of a refresh costs in a real scheduler, next to Airflow's own floor.

    python -m benchmarks.bench_task_overhead              # widths 4 and 16, 3 paired rounds
    python -m benchmarks.bench_task_overhead --quick      # widths 2 and 6, 1 round
    python -m benchmarks.bench_task_overhead --no-preload # task processes without the preload settings

One real stack (scheduler + api-server + dag-processor, LocalExecutor, a fresh Postgres metadata DB; the
`deploy/airflow_local_settings.py` preload unless `--no-preload`) serves, for each width N:

* `refresh_w<N>`: the example DAG file's refresh DAG over an N-partition dataset (partitioned by region,
  `full_refresh` so every partition is refreshed each run): discover -> stage -> `partition.refresh`
  mapped over N items -> commit;
* `floor_w<N>` (the anchor): the same DAG shape with empty tasks, under identical conditions: a
  discover task returning N items -> a stage task -> a `partition` task group with one `refresh` task
  mapped over the items (it takes the stage's output, as ours does) -> a commit task reducing the mapped
  results (trigger rule `none_failed`, one active run, as ours). Its tasks are plain `BaseOperator`
  subclasses, like ours, not TaskFlow `@task` functions: a TaskFlow DAG file makes every forked task
  process import the standard provider's Python operator module at parse time, which the preload
  (warming what our DAG file uses) does not load, so such a floor paid more per task than ours did
  (3.2 s vs 0.7 s per mapped task once). Same executor, same slots, same number of mapped tasks, the
  same warm-up round, the same shuffled rounds. What Airflow itself costs per mapped task instance.

Each round triggers the four DAGs one after the other in a freshly shuffled order (benchmarks/pairing.py);
the first round is a warm-up. Durations come from the task instances in the metadata DB: per mapped task
queued -> end (median over the N instances), and the group's span (first mapped task queued -> last one
ended). Printed, as median [min-max] over rounds:

* per-partition task, ours / floor (target <= 1.5) and its seconds (ours target <= 1 s; it includes
  the partition's finalize work, a few hundred rows here), queued -> end and, apart from the wait for a
  slot, start -> end;
* the added cost per extra partition: (span at the wide width - span at the narrow one) / extra
  partitions, for ours and for the floor (ours target <= 0.5 s), and their ratio (target <= 1.5).

Beside the wall figures, the CPU seconds the whole stack used per run (every process under the
scheduler, API server, DAG processor and triggerer, reaped task processes included, read from /proc):
the CPU slope per extra partition, ours and the floor's, and their ratio, which load on the machine
barely moves.

A floor whose empty task takes longer (start -> end) than ours is not a floor: the benchmark says so
beside the figures instead of reporting the ratio as met.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks import load
from benchmarks.pairing import Ratio, Target, figure_line, run_rounds

REPO_ROOT = Path(__file__).resolve().parent.parent
MAPPED_TASK = "partition.refresh"
RUN_CONF = {"partitions": None, "where": None, "full_refresh": True, "snapshot": False}
TASK_RATIO_TARGET = Target("<=", 1.5)
TASK_SECONDS_TARGET = Target("<=", 1.0)
SLOPE_SECONDS_TARGET = Target("<=", 0.5)

FLOOR_DAG = '''\
"""Airflow's floor: the refresh DAG's shape with empty tasks, {width} mapped instances."""

from airflow.sdk import DAG, BaseOperator, TriggerRule, task_group


class Discover(BaseOperator):
    def execute(self, context):
        return [{{"item": i}} for i in range({width})]


class Stage(BaseOperator):
    template_fields = ("work_items",)

    def __init__(self, *, work_items, **kwargs):
        super().__init__(**kwargs)
        self.work_items = work_items

    def execute(self, context):
        return {{"staged": len(self.work_items)}}


class Refresh(BaseOperator):
    template_fields = ("work_item", "stage")

    def __init__(self, *, work_item, stage, **kwargs):
        super().__init__(**kwargs)
        self.work_item = work_item
        self.stage = stage

    def execute(self, context):
        return {{"item": self.work_item["item"]}}


class Commit(BaseOperator):
    template_fields = ("results",)

    def __init__(self, *, results, **kwargs):
        super().__init__(**kwargs)
        self.results = results

    def execute(self, context):
        return len(list(self.results))


with DAG("floor_w{width}", schedule=None, catchup=False, max_active_runs=1, tags=["benchmark"]) as dag:
    discover = Discover(task_id="discover")
    staged = Stage(task_id="stage", work_items=discover.output)

    @task_group(group_id="partition")
    def partition(work_item):
        Refresh(task_id="refresh", work_item=work_item, stage=staged.output)

    partitions = partition.expand(work_item=discover.output)
    staged >> partitions
    commit = Commit(
        task_id="commit",
        results=dag.get_task("{mapped}").output,
        trigger_rule=TriggerRule.NONE_FAILED,
    )
    partitions >> commit
    discover >> commit
'''


@dataclass(frozen=True)
class RunTimes:
    """One DAG run's mapped tasks: median queued -> end and start -> end, and the group's span."""

    task_median_s: float
    run_median_s: float
    span_s: float
    mapped: int
    cpu_s: float = 0.0  # CPU seconds the whole Airflow stack used from trigger to the run's end


def _tree_cpu_seconds(roots: list[int]) -> float:
    """User + system CPU seconds of the processes under `roots` (alive, and reaped children's)."""
    ticks = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    used: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile: its CPU is in its parent's reaped-children figure
        parents[int(entry)] = int(fields[1])
        used[int(entry)] = sum(int(value) for value in fields[11:15]) / ticks  # utime stime cutime cstime
    tree = set(roots)
    grown = True
    while grown:
        grown = False
        for pid, parent in parents.items():
            if parent in tree and pid not in tree:
                tree.add(pid)
                grown = True
    return sum(used.get(pid, 0.0) for pid in tree)


def stack_cpu_seconds(stack: Any) -> float:
    """CPU seconds used so far by the Airflow stack (scheduler, workers and task processes, API server,
    DAG processor, triggerer): far less sensitive to other load on the machine than wall time."""
    return _tree_cpu_seconds([process.pid for process in stack.processes.values()])


def write_project(root: Path, widths: tuple[int, ...], rows: int) -> Path:
    """Per width: sales data over `width` regions, a dataset in the spec, and a floor DAG file."""
    from tests.airflow_e2e.sample import install_example_dag, write_sales

    spec = f"accelerator_dir: {root / 'acc'}\ndatasets:\n"
    for width in widths:
        regions = tuple(f"R{i:03d}" for i in range(width))
        write_sales(root / f"sales_w{width}", rows=rows * width, days=1, regions=regions)
        spec += textwrap.dedent(
            f"""\
              - name: w{width}
                from: file:{root / f"sales_w{width}"}/
                params: {{file_format: parquet}}
                acceleration:
                  engine: parquet
                  partition_by:
                    - region: region
            """
        )
    spec_path = install_example_dag(root / "dags", spec)
    for width in widths:
        (root / "dags" / f"floor_w{width}.py").write_text(FLOOR_DAG.format(width=width, mapped=MAPPED_TASK))
    return spec_path


def run_times(stack: Any, dag_id: str, run_id: str) -> RunTimes:
    rows = stack.query(
        "SELECT queued_dttm, start_date, end_date FROM task_instance "
        "WHERE dag_id = %s AND run_id = %s AND task_id = %s AND map_index >= 0",
        (dag_id, run_id, MAPPED_TASK),
    )
    if not rows or any(end is None for _, _, end in rows):
        raise SystemExit(f"{dag_id} run {run_id}: mapped tasks without an end ({len(rows)} rows)")
    # A task queued before it is recorded as queued (rare) counts from its start.
    begun = [queued or started for queued, started, _ in rows]
    durations = [(end - first).total_seconds() for first, (_, _, end) in zip(begun, rows, strict=True)]
    running = [(end - (started or end)).total_seconds() for _, started, end in rows]
    span = (max(end for _, _, end in rows) - min(begun)).total_seconds()
    return RunTimes(statistics.median(durations), statistics.median(running), span, len(rows))


def wait_for_run(stack: Any, client: Any, dag_id: str, run_id: str, timeout: float = 900.0) -> dict[str, Any]:
    """Poll a run until it ends; an API call that times out on the loaded machine is asked again."""
    from airflow_partitions.exceptions import AirflowApiError

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            run = client.get_dag_run(dag_id, run_id)
        except AirflowApiError:
            stack.raise_if_dead()
            continue
        if run["state"] in ("success", "failed"):
            return dict(run)
        time.sleep(0.5)
    raise SystemExit(f"{dag_id} run {run_id} did not end in {timeout:.0f}s\n{stack.logs_tail()}")


def contender(
    stack: Any, client: Any, dag_id: str, conf: dict[str, Any], out: list[RunTimes]
) -> Callable[[], None]:
    def run() -> None:
        cpu_before = stack_cpu_seconds(stack)
        triggered = client.trigger_dag_run(dag_id, conf)
        finished = wait_for_run(stack, client, dag_id, triggered["dag_run_id"])
        cpu_used = stack_cpu_seconds(stack) - cpu_before
        if finished["state"] != "success":
            raise SystemExit(f"{dag_id} run ended {finished['state']}\n{stack.logs_tail()}")
        out.append(replace(run_times(stack, dag_id, triggered["dag_run_id"]), cpu_s=cpu_used))

    return run


def slope(wide: RunTimes, narrow: RunTimes, extra: int) -> float:
    return (wide.span_s - narrow.span_s) / extra


def cpu_slope(wide: RunTimes, narrow: RunTimes, extra: int) -> float:
    return (wide.cpu_s - narrow.cpu_s) / extra


def report(widths: tuple[int, int], times: dict[str, list[RunTimes]], rounds: int, parallelism: int) -> str:
    narrow, wide = widths
    extra = wide - narrow
    lines = [
        f"per-partition Airflow task overhead: widths {narrow} and {wide}, {rounds} round(s), "
        f"LocalExecutor parallelism {parallelism}",
        "",
    ]

    def seconds_line(label: str, samples: list[float], target: Target | None) -> str:
        return figure_line(label, Ratio(tuple(samples)), target).replace("(no target)", "s")

    untrusted: list[int] = []
    for width in widths:
        ours, floor = times[f"refresh_w{width}"][-rounds:], times[f"floor_w{width}"][-rounds:]
        ratio = Ratio(tuple(o.task_median_s / f.task_median_s for o, f in zip(ours, floor, strict=True)))
        lines.append(
            figure_line(f"N={width}: mapped task queued->end, ours / floor", ratio, TASK_RATIO_TARGET)
        )
        lines.append(
            figure_line(
                f"N={width}: mapped task queued->end, ours (s)",
                Ratio(tuple(o.task_median_s for o in ours)),
                TASK_SECONDS_TARGET,
            )
        )
        lines.append(
            seconds_line(
                f"N={width}: mapped task queued->end, floor (s)", [f.task_median_s for f in floor], None
            )
        )
        lines.append(
            figure_line(
                f"N={width}: mapped task start->end, ours / floor",
                Ratio(tuple(o.run_median_s / f.run_median_s for o, f in zip(ours, floor, strict=True))),
                TASK_RATIO_TARGET,
            )
        )
        for who, samples in (("ours", ours), ("floor", floor)):
            lines.append(
                seconds_line(
                    f"N={width}: mapped task start->end, {who} (s)", [t.run_median_s for t in samples], None
                )
            )
        if statistics.median(f.run_median_s for f in floor) > statistics.median(o.run_median_s for o in ours):
            untrusted.append(width)
        lines.append(
            figure_line(
                f"N={width}: group span, ours / floor",
                Ratio(tuple(o.span_s / f.span_s for o, f in zip(ours, floor, strict=True))),
                None,
            )
        )
    ours_slopes, floor_slopes = [], []
    ours_cpu, floor_cpu = [], []
    for i in range(rounds):
        ours_pair = (times[f"refresh_w{wide}"][-rounds:][i], times[f"refresh_w{narrow}"][-rounds:][i])
        floor_pair = (times[f"floor_w{wide}"][-rounds:][i], times[f"floor_w{narrow}"][-rounds:][i])
        ours_slopes.append(slope(*ours_pair, extra))
        floor_slopes.append(slope(*floor_pair, extra))
        ours_cpu.append(cpu_slope(*ours_pair, extra))
        floor_cpu.append(cpu_slope(*floor_pair, extra))
    lines += [
        "",
        figure_line(
            "per extra partition (span slope), ours (s)", Ratio(tuple(ours_slopes)), SLOPE_SECONDS_TARGET
        ),
        seconds_line("per extra partition (span slope), floor (s)", floor_slopes, None),
        figure_line(
            "per extra partition, ours / floor",
            Ratio(
                tuple(
                    o / f if f > 0 else float("inf") for o, f in zip(ours_slopes, floor_slopes, strict=True)
                )
            ),
            TASK_RATIO_TARGET,
        ),
        seconds_line("per extra partition, CPU of the whole stack, ours (s)", ours_cpu, None),
        seconds_line("per extra partition, CPU of the whole stack, floor (s)", floor_cpu, None),
        figure_line(
            "per extra partition, CPU, ours / floor",
            Ratio(tuple(o / f if f > 0 else float("inf") for o, f in zip(ours_cpu, floor_cpu, strict=True))),
            TASK_RATIO_TARGET,
        ),
        "",
        "queued->end per mapped task includes ours' finalize work; the slope is wall time per extra mapped",
        f"instance with {parallelism} task slots (the floor's is Airflow's own scheduling cost). The CPU",
        "slope counts every process of the stack (scheduler, workers, task processes, API server, DAG",
        "processor) from trigger to the run's end: far less sensitive to other load than wall time.",
    ]
    if untrusted:
        lines.append(
            f"WARNING: at width(s) {untrusted} the empty floor task ran longer (start->end) than ours: the "
            "floor is not a floor on this run (load?), so its ratios above mean nothing"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", type=int, nargs=2, default=(4, 16), help="two widths (default 4 16)")
    parser.add_argument("--rounds", type=int, default=3, help="paired rounds after a warm-up (default 3)")
    parser.add_argument("--rows", type=int, default=200, help="rows per partition (default 200)")
    parser.add_argument("--parallelism", type=int, default=4, help="LocalExecutor slots (default 4)")
    parser.add_argument("--quick", action="store_true", help="widths 2 and 6, one round")
    parser.add_argument("--no-preload", action="store_true", help="without deploy/airflow_local_settings.py")
    parser.add_argument(
        "--keep", action="store_true", help="keep the stack's directory (task logs under airflow_home/logs)"
    )
    args = load.parse_args(parser, argv)
    widths: tuple[int, int] = (2, 6) if args.quick else (min(args.widths), max(args.widths))
    rounds = 1 if args.quick else args.rounds
    if widths[0] == widths[1]:
        parser.error("--widths takes two different widths")

    from airflow_partitions.cli.backfill import AirflowApiClient
    from tests.airflow_e2e.stack import running_airflow

    work = Path(tempfile.mkdtemp(prefix="ap-bench-overhead-"))
    try:
        write_project(work, widths, args.rows)
        times: dict[str, list[RunTimes]] = {}
        with running_airflow(
            work / "airflow_home", work / "dags", parallelism=args.parallelism, preload=not args.no_preload
        ) as stack:
            client = AirflowApiClient(stack.api_url, username="admin", password=stack.password)
            contenders = {}
            for width in widths:
                for dag_id, conf in ((f"refresh_w{width}", RUN_CONF), (f"floor_w{width}", {})):
                    stack.wait_for_dag(client, dag_id, timeout=300)
                    times[dag_id] = []
                    contenders[dag_id] = contender(stack, client, dag_id, dict(conf), times[dag_id])
            run_rounds(contenders, rounds, warmup=True)
        print(report(widths, times, rounds, args.parallelism))
    finally:
        if args.keep:
            print(f"kept {work} (task logs in {work / 'airflow_home' / 'logs'})")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
