"""Scale: rows through the Spark path as Airflow runs it, partitions 100 -> 10,000, the catalog at 100,000.

    python -m benchmarks.bench_scale --quick                         # tiny sizes, every section
    python -m benchmarks.bench_scale                                 # 10M / 30M rows, 100 -> 10,000 partitions, 100k catalog
    python -m benchmarks.bench_scale --rows 10000000,30000000,100000000 --sections rows
    python -m benchmarks.bench_scale --sections catalog --catalog-partitions 100000

Sections (`--sections rows,partitions,catalog`):

* rows: taxi-like Parquet (`bench_refresh.taxi_chunk`) at each `--rows` size, partitioned by
  `bucket(50, PULocationID)`, refreshed as the DAG runs it: discovery, the Spark stage, one finalize per
  partition and the commit, **each in its own Python process** (as Airflow task processes are; finalize
  tasks `--task-slots` at a time). Each process reports its own peak RSS (`VmHWM`; the stage task also its
  Spark JVM's). Anchor, same size, same run, its own process too: the plain
  Spark job `bench_refresh.anchor_partition_write` (`pmod(hash(PULocationID), 50)`, `partitionBy`).
  Printed: refresh / anchor (paired rounds, shuffled), each phase's seconds, the largest peak RSS of the
  finalize and commit processes per size, and RSS(largest size) / RSS(smallest size), which must stay
  near 1 (a finalize that holds a partition's rows in memory grows with the data instead).
* partitions: 100, 1,000, 10,000 partitions of `--rows-per-partition` rows (identity on an int column),
  in this process with one Spark session: `plan_refresh` + `stage_refresh` + a sequential loop of
  `finalize_partition` (one partition after the other, so the figure is the per-partition cost, no pool)
  + `commit_refresh`. Anchor: the plain Spark `partitionBy` job on the same files. Printed: ours / anchor,
  ms per partition of each phase and how it grows from the smallest count.
* catalog: a catalog of `--catalog-partitions` partitions (built by one commit of entries carrying the
  fingerprints discovery computes for a source with one small file per 1,000 keys). Timed: `plan_refresh`
  with nothing changed (discovery diff against the catalog), `Catalog.commit` of 1 and of 1,000 changed
  partitions (a new `Catalog` per commit, as in a task), opening the newest snapshot, and `plan_partitions`
  for a point filter over `PartitionIndex.from_snapshot`. Anchor where natural: pyiceberg (in the venv) with
  an in-memory SQLite catalog holding a table with the same number of data files, one per identity
  partition: `fast_append` of 1 and of 1,000 files, `load_table` + `current_snapshot`, and a point-filter
  `scan().plan_files()`.

The machine may be shared: ratios of paired rounds (`benchmarks/pairing.py`) are what this prints.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.pairing import Target, figure_line, run_rounds

REPO_ROOT = Path(__file__).resolve().parent.parent
BUCKETS = 50
CHUNK_ROWS = 1_000_000
# The refresh of a dataset is one job more than the plain Spark write (discovery, per-partition tasks, the
# commit); this benchmark's bound on the ratio at scale, and on the RSS growth of the task processes.
REFRESH_BOUND = Target("<=", 1.5)
RSS_GROWTH_BOUND = Target("<=", 1.5)
COMMIT_TARGET_MS = 500.0


# --------------------------------------------------------------------------------------------------
# Task processes: each Airflow task of a refresh, as its own interpreter.
# --------------------------------------------------------------------------------------------------


def run_task(kind: str, request_path: str) -> None:
    """One task of the refresh DAG in this (child) process; inputs and outputs are JSON files, as XCom."""
    from airflow_partitions.spec import load_spec

    request = json.loads(Path(request_path).read_text())
    project = load_spec(request["spec"])
    dataset = project.dataset(request["dataset"])
    started = time.perf_counter()
    output: Any
    if kind == "plan":
        from airflow_partitions.refresh import plan_refresh

        plan = plan_refresh(project, dataset, full=True)
        directory = Path(request["items"])
        for index, item in enumerate(plan.items):
            (directory / f"{index}.json").write_text(json.dumps(item.to_json()))
        output = {"plan": plan.to_json(), "items": len(plan.items)}
    elif kind == "stage":
        from airflow_partitions.refresh import RefreshPlan, stage_refresh
        from airflow_partitions.refresh.spark_session import build_local_session

        plan = RefreshPlan.from_json(json.loads(Path(request["plan"]).read_text())["plan"])
        spark = build_local_session(app_name="bench-scale-stage")
        try:
            output = stage_refresh(project, dataset, plan, spark=spark, strategy="spark").to_json()
            jvm_rss_mib = peak_rss_mib(int(spark._jvm.java.lang.ProcessHandle.current().pid()))
        finally:
            spark.stop()
        output["_jvm_peak_rss_mib"] = jvm_rss_mib
    elif kind == "finalize":
        from airflow_partitions.refresh import PartitionWorkItem, StageResult, finalize_partition

        stage = StageResult.from_json(json.loads(Path(request["stage"]).read_text()))
        item = PartitionWorkItem.from_json(json.loads(Path(request["item"]).read_text()))
        output = finalize_partition(project, dataset, stage, item).to_json()
    elif kind == "commit":
        from airflow_partitions.refresh import PartitionResult, RefreshPlan, StageResult, commit_refresh

        plan = RefreshPlan.from_json(json.loads(Path(request["plan"]).read_text())["plan"])
        stage = StageResult.from_json(json.loads(Path(request["stage"]).read_text()))
        results = [PartitionResult.from_json(json.loads(Path(p).read_text())) for p in request["results"]]
        output = commit_refresh(project, dataset, plan, results, stage=stage).to_json()
    elif kind == "anchor":
        from benchmarks.bench_refresh import anchor_partition_write

        from airflow_partitions.refresh.spark_session import build_local_session

        spark = build_local_session(app_name="bench-scale-anchor")
        try:
            anchor_partition_write(spark, Path(request["source"]), Path(request["target"]))
        finally:
            spark.stop()
        output = {}
    else:
        raise SystemExit(f"unknown task {kind!r}")
    output = {"output": output, "seconds": time.perf_counter() - started, "peak_rss_mib": peak_rss_mib()}
    Path(request["out"]).write_text(json.dumps(output, default=str))


def peak_rss_mib(pid: int | str = "self") -> float:
    """A process's peak resident set (`VmHWM`) in MiB, read by the process itself before it exits.

    Not `wait4`'s `ru_maxrss`: Linux folds the high-water mark of the forked copy of the parent (the
    benchmark, before `exec`) into it, so every child would report at least the parent's size.
    """
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM in /proc/{pid}/status")


@dataclass(frozen=True)
class TaskRun:
    kind: str
    seconds: float  # wall time of the process, interpreter start included
    peak_rss_mib: float
    output: Any


def spawn_task(kind: str, request: dict[str, Any], workdir: Path) -> TaskRun:
    """Run one task in a fresh interpreter, which reports its own peak RSS."""
    name = f"{kind}-{uuid.uuid4().hex[:10]}"
    request = {**request, "out": str(workdir / f"{name}.out.json")}
    request_path = workdir / f"{name}.json"
    request_path.write_text(json.dumps(request))
    started = time.perf_counter()
    with open(workdir / f"{name}.log", "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.bench_scale", "--task", kind, "--request", str(request_path)],
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        )
        process.wait()
    seconds = time.perf_counter() - started
    if process.returncode != 0:
        tail = (workdir / f"{name}.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"task {kind} failed ({process.returncode}):\n{tail}")
    reported = json.loads(Path(request["out"]).read_text())
    return TaskRun(kind, seconds, float(reported["peak_rss_mib"]), reported["output"])


@dataclass
class TaskRefresh:
    """One refresh run as Airflow task processes."""

    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    rss: dict[str, list[float]] = field(default_factory=dict)
    committed_rows: int = 0
    partitions: int = 0


def refresh_as_tasks(spec: Path, dataset: str, workdir: Path, task_slots: int) -> TaskRefresh:
    """discover -> stage -> finalize (one process per partition, `task_slots` at a time) -> commit."""
    run_dir = workdir / f"run-{uuid.uuid4().hex[:8]}"
    items_dir = run_dir / "items"
    items_dir.mkdir(parents=True)
    base = {"spec": str(spec), "dataset": dataset}
    result = TaskRefresh()
    started = time.perf_counter()

    plan = spawn_task("plan", {**base, "items": str(items_dir)}, run_dir)
    plan_path = run_dir / "plan.json"
    plan_path.write_text(json.dumps(plan.output))
    result.phases["discover"] = plan.seconds
    result.rss["discover"] = [plan.peak_rss_mib]
    items = int(plan.output["items"])

    stage = spawn_task("stage", {**base, "plan": str(plan_path)}, run_dir)
    stage_path = run_dir / "stage.json"
    result.phases["stage"] = stage.seconds
    result.rss["stage driver"] = [stage.peak_rss_mib]
    result.rss["stage JVM"] = [float(stage.output.pop("_jvm_peak_rss_mib"))]
    stage_path.write_text(json.dumps(stage.output))

    mark = time.perf_counter()
    results_dir = run_dir / "results"
    results_dir.mkdir()

    def finalize(index: int) -> TaskRun:
        run = spawn_task(
            "finalize",
            {**base, "stage": str(stage_path), "item": str(items_dir / f"{index}.json")},
            run_dir,
        )
        (results_dir / f"{index}.json").write_text(json.dumps(run.output))
        return run

    with ThreadPoolExecutor(max_workers=task_slots) as pool:
        finalized = list(pool.map(finalize, range(items)))
    result.phases["finalize"] = time.perf_counter() - mark
    result.rss["finalize"] = [run.peak_rss_mib for run in finalized]

    commit = spawn_task(
        "commit",
        {
            **base,
            "plan": str(plan_path),
            "stage": str(stage_path),
            "results": [str(results_dir / f"{i}.json") for i in range(items)],
        },
        run_dir,
    )
    result.phases["commit"] = commit.seconds
    result.rss["commit"] = [commit.peak_rss_mib]
    result.seconds = time.perf_counter() - started
    result.committed_rows = int(commit.output["rows"])
    result.partitions = items
    shutil.rmtree(run_dir, ignore_errors=True)
    return result


# --------------------------------------------------------------------------------------------------
# Rows axis
# --------------------------------------------------------------------------------------------------


def write_taxi_source(directory: Path, rows: int) -> None:
    """`rows` taxi-like rows as 1M-row Parquet files (the generator of `bench_refresh`)."""
    import pyarrow.parquet as pq

    from benchmarks.bench_refresh import taxi_chunk

    directory.mkdir(parents=True)
    written = index = 0
    while written < rows:
        count = min(CHUNK_ROWS, rows - written)
        pq.write_table(taxi_chunk(count, seed=index), directory / f"part-{index:04d}.parquet", row_group_size=256_000)
        written += count
        index += 1


def directory_bytes(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())


def rows_axis(root: Path, sizes: Sequence[int], rounds: int, task_slots: int) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for rows in sizes:
        base = root / f"rows-{rows}"
        source = base / "source"
        started = time.perf_counter()
        write_taxi_source(source, rows)
        generated_s = time.perf_counter() - started
        spec = base / "spec.yaml"
        spec.write_text(
            "accelerator_dir: acc\n"
            "datasets:\n"
            f"  - name: trips\n    from: file:{source}\n"
            f"    acceleration:\n      partition_by: [{{b: 'bucket({BUCKETS}, PULocationID)'}}]\n"
        )
        print(
            f"rows {rows:,}: source {directory_bytes(source) / 2**30:.2f} GiB generated in {generated_s:.0f} s;"
            f" disk free {shutil.disk_usage(base).free / 2**30:.0f} GiB",
            flush=True,
        )
        workdir = base / "tasks"
        workdir.mkdir()
        anchor_target = base / "anchor"
        measured = run_rounds(
            {
                "ours": lambda spec=spec, workdir=workdir: refresh_as_tasks(spec, "trips", workdir, task_slots),
                "spark": lambda source=source, workdir=workdir, target=anchor_target: spawn_task(
                    "anchor", {"spec": str(spec), "dataset": "trips", "source": str(source), "target": str(target)},
                    workdir,
                ),
            },
            rounds,
            warmup=False,
        )
        ours: TaskRefresh = measured.results["ours"]
        assert ours.committed_rows == rows, f"committed {ours.committed_rows:,} rows of {rows:,}"
        anchor: TaskRun = measured.results["spark"]
        figures[rows] = {
            "ratio": measured.ratio("ours", "spark"),
            "ours_s": measured.median_seconds("ours"),
            "spark_s": measured.median_seconds("spark"),
            "phases": ours.phases,
            "rss": {name: max(values) for name, values in ours.rss.items()},
            "rss_finalize_median": statistics.median(ours.rss["finalize"]),
            "anchor_rss": anchor.peak_rss_mib,
            "partitions": ours.partitions,
        }
        print_rows_size(rows, figures[rows])
        shutil.rmtree(base, ignore_errors=True)
    return figures


def print_rows_size(rows: int, figure: dict[str, Any]) -> None:
    print(figure_line(f"{rows:>11,} rows: refresh as tasks / plain Spark partitionBy", figure["ratio"], REFRESH_BOUND))
    phases = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in figure["phases"].items())
    print(f"      ours {figure['ours_s']:.1f} s ({phases}); Spark job {figure['spark_s']:.1f} s")
    rss = ", ".join(f"{name} {mib:.0f}" for name, mib in figure["rss"].items())
    print(
        f"      peak RSS MiB: {rss} (finalize median {figure['rss_finalize_median']:.0f},"
        f" {figure['partitions']} finalize processes); Spark job process {figure['anchor_rss']:.0f}",
        flush=True,
    )


def print_rows_summary(figures: dict[int, dict[str, Any]]) -> None:
    if len(figures) < 2:
        return
    smallest, largest = min(figures), max(figures)
    for task in ("finalize", "commit"):
        growth = figures[largest]["rss"][task] / figures[smallest]["rss"][task]
        verdict = "met" if RSS_GROWTH_BOUND.met(growth) else "not met"
        print(
            f"  peak RSS of {task} processes, {largest:,} / {smallest:,} rows: {growth:5.2f}"
            f" ({figures[smallest]['rss'][task]:.0f} -> {figures[largest]['rss'][task]:.0f} MiB)"
            f"  {RSS_GROWTH_BOUND}: {verdict}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes for every section")
    parser.add_argument("--sections", default="rows,partitions,catalog", help="comma-separated sections to run")
    parser.add_argument("--rows", default="10000000,30000000", help="comma-separated row counts (rows axis)")
    parser.add_argument("--partitions", default="100,1000,10000", help="partition counts (partitions axis)")
    parser.add_argument("--rows-per-partition", type=int, default=20)
    parser.add_argument("--catalog-partitions", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=1, help="paired rounds per figure (default 1)")
    parser.add_argument("--task-slots", type=int, default=2, help="finalize task processes at a time")
    parser.add_argument("--workdir", help="where to put data (default: a temporary directory, removed)")
    parser.add_argument("--task", help=argparse.SUPPRESS)
    parser.add_argument("--request", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.task:
        run_task(args.task, args.request)
        return 0
    sections = {name.strip() for name in args.sections.split(",") if name.strip()}
    unknown = sections - {"rows", "partitions", "catalog"}
    if unknown:
        parser.error(f"unknown section(s) {', '.join(sorted(unknown))}; choose from rows, partitions, catalog")
    if args.quick:
        row_sizes, partition_counts, catalog_partitions = [100_000, 300_000], [10, 100], 2_000
    else:
        row_sizes = [int(value) for value in args.rows.split(",")]
        partition_counts = [int(value) for value in args.partitions.split(",")]
        catalog_partitions = args.catalog_partitions

    root = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="ap-bench-scale-"))
    root.mkdir(parents=True, exist_ok=True)
    print(
        f"cpus {os.cpu_count()}, memory {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB,"
        f" disk free under {root}: {shutil.disk_usage(root).free / 2**30:.0f} GiB (machine possibly shared);"
        f" {args.repeat} paired round(s), order shuffled per round",
        flush=True,
    )
    try:
        if "rows" in sections:
            print(f"\n== rows axis: {', '.join(f'{r:,}' for r in row_sizes)} rows, bucket({BUCKETS}, PULocationID),"
                  f" every task its own process, {args.task_slots} finalize processes at a time ==", flush=True)
            figures = rows_axis(root, row_sizes, args.repeat, args.task_slots)
            print_rows_summary(figures)
        if "partitions" in sections:
            partitions_axis(root, partition_counts, args.rows_per_partition, args.repeat)
        if "catalog" in sections:
            catalog_axis(root, catalog_partitions)
    finally:
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)
    return 0


def partitions_axis(root: Path, counts: Sequence[int], rows_per_partition: int, rounds: int) -> None:
    raise NotImplementedError


def catalog_axis(root: Path, partitions: int) -> None:
    raise NotImplementedError


if __name__ == "__main__":
    raise SystemExit(main())
