"""Scale: rows through the Spark path as Airflow runs it, partitions 100 -> 10,000, the catalog at 100,000.

    python -m benchmarks.bench_scale --quick                         # tiny sizes, every section
    python -m benchmarks.bench_scale                                 # 10M, 30M rows; 100-10,000; 100k
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
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_partitions.table import open_handle
from benchmarks import load
from benchmarks.pairing import Target, figure_line, run_rounds

REPO_ROOT = Path(__file__).resolve().parent.parent
BUCKETS = 50
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
            output = stage_refresh(
                open_handle(project, dataset), plan, spark=spark, strategy="spark"
            ).to_json()
            jvm_rss_mib = peak_rss_mib(int(spark._jvm.java.lang.ProcessHandle.current().pid()))
        finally:
            spark.stop()
        output["_jvm_peak_rss_mib"] = jvm_rss_mib
    elif kind == "finalize":
        from airflow_partitions.refresh import PartitionWorkItem, StageResult, finalize_partition

        stage = StageResult.from_json(json.loads(Path(request["stage"]).read_text()))
        item = PartitionWorkItem.from_json(json.loads(Path(request["item"]).read_text()))
        output = finalize_partition(open_handle(project, dataset), stage, item).to_json()
    elif kind == "commit":
        from airflow_partitions.refresh import PartitionResult, RefreshPlan, StageResult, commit_refresh

        plan = RefreshPlan.from_json(json.loads(Path(request["plan"]).read_text())["plan"])
        stage = StageResult.from_json(json.loads(Path(request["stage"]).read_text()))
        results = [PartitionResult.from_json(json.loads(Path(p).read_text())) for p in request["results"]]
        output = commit_refresh(open_handle(project, dataset), plan, results, stage=stage).to_json()
    elif kind == "anchor":
        from airflow_partitions.refresh.spark_session import build_local_session
        from benchmarks.bench_refresh import anchor_partition_write

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


def directory_bytes(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())


def rows_axis(root: Path, sizes: Sequence[int], rounds: int, task_slots: int) -> dict[str, Any]:
    from benchmarks.bench_refresh import write_taxi_files

    figures: dict[str, Any] = {}
    for rows in sizes:
        base = root / f"rows-{rows}"
        source = base / "source"
        started = time.perf_counter()
        write_taxi_files(source, rows)
        generated_s = time.perf_counter() - started
        spec = base / "spec.yaml"
        spec.write_text(
            "accelerator_dir: acc\n"
            "datasets:\n"
            f"  - name: trips\n    from: file:{source}\n"
            f"    acceleration:\n      partition_by: [{{b: 'bucket({BUCKETS}, PULocationID)'}}]\n"
        )
        print(
            f"rows {rows:,}: source {directory_bytes(source) / 2**30:.2f} GiB"
            f" generated in {generated_s:.0f} s;"
            f" disk free {shutil.disk_usage(base).free / 2**30:.0f} GiB",
            flush=True,
        )
        workdir = base / "tasks"
        workdir.mkdir()
        anchor_target = base / "anchor"
        measured = run_rounds(
            {
                "ours": lambda spec=spec, workdir=workdir: refresh_as_tasks(
                    spec, "trips", workdir, task_slots
                ),
                "spark": lambda spec=spec, source=source, workdir=workdir, target=anchor_target: spawn_task(
                    "anchor",
                    {"spec": str(spec), "dataset": "trips", "source": str(source), "target": str(target)},
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
    print(
        figure_line(
            f"{rows:>11,} rows: refresh as tasks / plain Spark partitionBy", figure["ratio"], REFRESH_BOUND
        )
    )
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
    parser.add_argument(
        "--sections", default="rows,partitions,catalog", help="comma-separated sections to run"
    )
    parser.add_argument("--rows", default="10000000,30000000", help="comma-separated row counts (rows axis)")
    parser.add_argument("--partitions", default="100,1000,10000", help="partition counts (partitions axis)")
    parser.add_argument("--rows-per-partition", type=int, default=20)
    parser.add_argument("--catalog-partitions", type=int, default=100_000)
    parser.add_argument(
        "--no-catalog-anchor",
        action="store_true",
        help="skip the pyiceberg anchor of the catalog section (its table takes minutes to build at 100k)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="paired rounds per figure (default 1)")
    parser.add_argument("--task-slots", type=int, default=2, help="finalize task processes at a time")
    parser.add_argument("--workdir", help="where to put data (default: a temporary directory, removed)")
    parser.add_argument("--task", help=argparse.SUPPRESS)
    parser.add_argument("--request", help=argparse.SUPPRESS)
    args = load.parse_args(parser, argv)
    if args.task:
        run_task(args.task, args.request)
        return 0
    sections = {name.strip() for name in args.sections.split(",") if name.strip()}
    unknown = sections - {"rows", "partitions", "catalog"}
    if unknown:
        parser.error(
            f"unknown section(s) {', '.join(sorted(unknown))}; choose from rows, partitions, catalog"
        )
    if args.quick:
        row_sizes, partition_counts, catalog_partitions = [100_000, 300_000], [10, 100], 2_000
    else:
        row_sizes = [int(value) for value in args.rows.split(",")]
        partition_counts = [int(value) for value in args.partitions.split(",")]
        catalog_partitions = args.catalog_partitions

    root = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="ap-bench-scale-"))
    root.mkdir(parents=True, exist_ok=True)
    print(
        f"cpus {os.cpu_count()},"
        f" memory {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB,"
        f" disk free under {root}: {shutil.disk_usage(root).free / 2**30:.0f} GiB (machine possibly shared);"
        f" {args.repeat} paired round(s), order shuffled per round",
        flush=True,
    )
    try:
        if "rows" in sections:
            print(
                f"\n== rows axis: {', '.join(f'{r:,}' for r in row_sizes)} rows,"
                f" bucket({BUCKETS}, PULocationID),"
                f" every task its own process, {args.task_slots} finalize processes at a time ==",
                flush=True,
            )
            figures = rows_axis(root, row_sizes, args.repeat, args.task_slots)
            print_rows_summary(figures)
        if "partitions" in sections:
            partitions_axis(root, partition_counts, args.rows_per_partition, args.repeat)
        if "catalog" in sections:
            catalog_axis(root, catalog_partitions, anchor=not args.no_catalog_anchor)
    finally:
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)
    return 0


@dataclass
class InProcessRefresh:
    phases: dict[str, float]
    partitions: int
    rows: int


def refresh_in_process(spec: Path, name: str, spark: Any) -> InProcessRefresh:
    """plan_refresh + stage_refresh (Spark) + finalize_partition one partition after the other + commit."""
    from airflow_partitions.refresh import commit_refresh, finalize_partition, plan_refresh, stage_refresh
    from airflow_partitions.spec import load_spec

    project = load_spec(spec)
    dataset = project.dataset(name)
    phases: dict[str, float] = {}
    mark = time.perf_counter()
    plan = plan_refresh(project, dataset, full=True)
    phases["discover"] = time.perf_counter() - mark
    mark = time.perf_counter()
    stage = stage_refresh(open_handle(project, dataset), plan, spark=spark, strategy="spark")
    phases["stage"] = time.perf_counter() - mark
    mark = time.perf_counter()
    results = [finalize_partition(open_handle(project, dataset), stage, item) for item in plan.items]
    phases["finalize"] = time.perf_counter() - mark
    mark = time.perf_counter()
    commit = commit_refresh(open_handle(project, dataset), plan, results, stage=stage)
    phases["commit"] = time.perf_counter() - mark
    return InProcessRefresh(phases, len(plan.items), commit.rows)


def anchor_partition_by(spark: Any, source: Path, target: Path) -> None:
    """What a plain Spark user writes for an identity partitioning: `partitionBy` on the column."""
    spark.read.parquet(str(source)).write.mode("overwrite").partitionBy("part_id").parquet(str(target))


def partitions_axis(root: Path, counts: Sequence[int], rows_per_partition: int, rounds: int) -> None:
    from airflow_partitions.refresh.spark_session import build_local_session

    print(
        f"\n== partitions axis: {', '.join(f'{c:,}' for c in counts)} partitions of {rows_per_partition} rows"
        " (identity part_id), in this process, one Spark session, finalize one partition after the other ==",
        flush=True,
    )
    spark = build_local_session(app_name="bench-scale-partitions")
    warm = root / "partitions-warm"
    write_keyed_source(warm / "source", 10, rows_per_partition)
    refresh_in_process(keyed_spec(warm, "warm", warm / "source", 10), "warm", spark)
    anchor_partition_by(spark, warm / "source", warm / "anchor")
    per_partition: dict[int, dict[str, float]] = {}
    for count in counts:
        base = root / f"partitions-{count}"
        write_keyed_source(base / "source", count, rows_per_partition)
        spec = keyed_spec(base, f"keyed_{count}", base / "source", count)
        measured = run_rounds(
            {
                "ours": lambda spec=spec, count=count: refresh_in_process(spec, f"keyed_{count}", spark),
                "spark": lambda base=base: anchor_partition_by(spark, base / "source", base / "anchor"),
            },
            rounds,
            warmup=False,
        )
        ours: InProcessRefresh = measured.results["ours"]
        assert ours.partitions == count, (ours, count)
        assert ours.rows == count * rows_per_partition, (ours, count)
        per_partition[count] = {
            **{phase: seconds * 1000 / count for phase, seconds in ours.phases.items()},
            "total": measured.median_seconds("ours") * 1000 / count,
            "spark": measured.median_seconds("spark") * 1000 / count,
        }
        print(
            figure_line(
                f"{count:>7,} partitions: refresh / plain Spark partitionBy",
                measured.ratio("ours", "spark"),
                None,
            )
        )
        phases = ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in ours.phases.items())
        print(
            f"      ours {measured.median_seconds('ours'):.1f} s ({phases}); Spark job"
            f" {measured.median_seconds('spark'):.1f} s",
            flush=True,
        )
        shutil.rmtree(base, ignore_errors=True)
    smallest = min(per_partition)
    print("  ms per partition (growth vs the smallest count: 1.0 = linear in partitions):")
    names = ["discover", "stage", "finalize", "commit", "total", "spark"]
    print("    " + f"{'partitions':>10}" + "".join(f"{n:>18}" for n in names))
    for count, figures in per_partition.items():
        cells = "".join(
            f"{figures[n]:10.2f} ({figures[n] / per_partition[smallest][n]:4.1f}x)" for n in names
        )
        print(f"    {count:>10,}{cells}", flush=True)
    spark.stop()


KEYS_PER_FILE = 1_000


def write_keyed_source(directory: Path, partitions: int, rows_per_partition: int) -> None:
    """`partitions` distinct `part_id` values, `rows_per_partition` rows each, one file per 1,000 keys."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True)
    for start in range(0, partitions, KEYS_PER_FILE):
        keys = np.arange(start, min(start + KEYS_PER_FILE, partitions), dtype=np.int64)
        part_id = np.repeat(keys, rows_per_partition)
        rng = np.random.default_rng(start)
        pq.write_table(
            pa.table({"part_id": part_id, "amount": np.round(rng.gamma(2.0, 10.0, len(part_id)), 2)}),
            directory / f"keys-{start:08d}.parquet",
        )


def keyed_spec(root: Path, name: str, source: Path, partitions: int) -> Path:
    spec = root / f"{name}.yaml"
    spec.write_text(
        "accelerator_dir: acc\n"
        "datasets:\n"
        f"  - name: {name}\n    from: file:{source}\n"
        "    acceleration:\n      partition_by: [part_id]\n"
        f"      refresh: {{max_partitions: {partitions + 10}}}\n"
    )
    return spec


def synthetic_entry(item: Any, spec_info: Any, generation: int = 0) -> Any:
    """The entry a finalize of `item` would give: one Parquet file with statistics on both columns."""
    from airflow_partitions.catalog import PartitionEntry
    from airflow_partitions.storage.datafile import ColumnStats, DataFile

    key = item.partition_key
    value = key.values[0]
    data_file = DataFile(
        path=f"{key.path(spec_info.names)}/part-{uuid.uuid4().hex}-0000.parquet",
        format="parquet",
        rows=20,
        bytes=2_048,
        checksum=uuid.uuid4().hex * 2,
        stats={"part_id": ColumnStats(value, value, 0), "amount": ColumnStats(0.5, 99.5 + generation, 0)},
    )
    return PartitionEntry.from_files(
        key, spec_info, [data_file], source_fingerprint=item.fingerprint, refreshed_at=dt.datetime.now(dt.UTC)
    )


def samples_ms(action: Callable[[], Any], repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def print_ms(
    name: str, ours: list[float], anchor: list[float] | None, partitions: int, note: str = ""
) -> None:
    median = statistics.median(ours)
    line = f"  {name:<44} {median:9.1f} ms [{min(ours):.1f}–{max(ours):.1f}]"
    line += f"  {median * 1000 / partitions:7.2f} µs per catalog partition"
    if anchor is not None:
        anchor_median = statistics.median(anchor)
        line += f"   pyiceberg {anchor_median:9.1f} ms  ours/pyiceberg {median / anchor_median:6.2f}"
    print(line + (f"  {note}" if note else ""), flush=True)


def catalog_axis(root: Path, partitions: int, repeat: int = 3, anchor: bool = True) -> None:
    from airflow_partitions.pruning import PartitionIndex, plan_partitions
    from airflow_partitions.refresh import plan_refresh
    from airflow_partitions.refresh.commit import partition_spec_info
    from airflow_partitions.refresh.pipeline import bind_dataset
    from airflow_partitions.sources import open_dataset_source
    from airflow_partitions.spec import load_spec
    from airflow_partitions.table import open_handle

    print(f"\n== catalog at {partitions:,} partitions (identity part_id, one file each) ==", flush=True)
    base = root / "catalog"
    source = base / "source"
    write_keyed_source(source, partitions, rows_per_partition=2)
    spec = keyed_spec(base, "keyed", source, partitions)
    project = load_spec(spec)
    dataset = project.dataset("keyed")
    bound = bind_dataset(dataset, open_dataset_source(dataset))
    spec_info = partition_spec_info(bound)

    started = time.perf_counter()
    first = plan_refresh(project, dataset, full=True)
    print(
        f"  first discovery, {len(first.items):,} new partitions:"
        f" {time.perf_counter() - started:.2f} s (setup)"
    )
    assert len(first.items) == partitions, (len(first.items), partitions)
    entries = [synthetic_entry(item, spec_info) for item in first.items]
    started = time.perf_counter()
    open_handle(project, dataset).catalog.commit(
        base_version=None, upserts=entries, partition_spec=spec_info, replace_all=True
    )
    print(
        f"  initial commit of {partitions:,} partitions: {time.perf_counter() - started:.2f} s (setup)",
        flush=True,
    )
    items = {item.key_path: item for item in first.items}
    del entries

    def unchanged_plan() -> None:
        plan = plan_refresh(project, dataset)
        assert not plan.items, f"{len(plan.items)} partitions planned with nothing changed"

    generation = 0

    def commit_changed(count: int) -> Callable[[], None]:
        def commit() -> None:
            nonlocal generation
            generation += 1
            catalog = open_handle(project, dataset).catalog
            newest = catalog.latest()
            assert newest is not None
            chosen = [first.items[(generation * 7919 + i * 97) % partitions] for i in range(count)]
            upserts = {
                e.key_path: e for e in (synthetic_entry(item, spec_info, generation) for item in chosen)
            }
            catalog.commit(
                base_version=newest.version, upserts=list(upserts.values()), partition_spec=spec_info
            )

        return commit

    def open_newest() -> Any:
        snapshot = open_handle(project, dataset).catalog.latest()
        assert snapshot is not None
        assert snapshot.partition_count == partitions
        return snapshot

    point = partitions // 2
    snapshot = open_newest()
    schema = bound.bound_schema

    def point_plan() -> None:
        plan = plan_partitions(PartitionIndex.from_snapshot(open_newest(), schema), f"part_id = {point}")
        assert len(plan.selected) == 1, len(plan.selected)

    index = PartitionIndex.from_snapshot(snapshot, schema)

    def point_plan_on_index() -> None:
        assert len(plan_partitions(index, f"part_id = {point}").selected) == 1

    ours = {
        "plan_refresh, nothing changed": samples_ms(unchanged_plan, repeat),
        "commit 1 changed partition": samples_ms(commit_changed(1), repeat),
        "commit 1,000 changed partitions": samples_ms(commit_changed(1_000), repeat),
        "open the newest snapshot": samples_ms(open_newest, repeat),
        "open + index + plan_partitions(part_id = k)": samples_ms(point_plan, repeat),
        "plan_partitions(part_id = k), index built": samples_ms(point_plan_on_index, repeat),
    }
    del items
    for name, samples in ours.items():
        target = f"target {COMMIT_TARGET_MS:.0f} ms" if name.startswith("commit 1 ") else ""
        print_ms(name, samples, None, partitions, target)
    # The anchor is timed after ours, not in paired rounds: its setup (a table of as many files) takes
    # minutes at 100,000, and ours are printed first in case it takes longer still.
    anchors = pyiceberg_catalog_anchor(base, partitions, repeat) if anchor else None
    anchor_of = {
        "commit 1 changed partition": "fast_append 1 file",
        "commit 1,000 changed partitions": "fast_append 1,000 files",
        "open the newest snapshot": "load_table + scan().plan_files (every file)",
        "open + index + plan_partitions(part_id = k)": "load_table + scan(part_id = k).plan_files",
    }
    if anchors:
        print("  anchor: pyiceberg, in-memory SQLite catalog, a table of the same number of data files:")
        for name, samples in anchors.items():
            print(
                f"    {name:<42} {statistics.median(samples):9.1f} ms [{min(samples):.1f}–{max(samples):.1f}]"
            )
        print("  ours / pyiceberg (ratio of medians, not paired):")
        for name, anchor_name in anchor_of.items():
            ratio = statistics.median(ours[name]) / statistics.median(anchors[anchor_name])
            print(f"    {name:<44} / {anchor_name:<44} {ratio:7.2f}")
    shutil.rmtree(base, ignore_errors=True)


def pyiceberg_catalog_anchor(base: Path, partitions: int, repeat: int) -> dict[str, list[float]] | None:
    """pyiceberg with the same number of files, one per identity partition; None when not installed."""
    try:
        from pyiceberg.catalog.sql import SqlCatalog
        from pyiceberg.expressions import EqualTo
        from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
        from pyiceberg.partitioning import PartitionField, PartitionSpec
        from pyiceberg.schema import Schema
        from pyiceberg.transforms import IdentityTransform
        from pyiceberg.typedef import Record
        from pyiceberg.types import DoubleType, LongType, NestedField
    except ImportError as error:
        print(f"  pyiceberg anchor skipped: {error.name} is not installed")
        return None

    warehouse = base / "iceberg"
    warehouse.mkdir()
    catalog = SqlCatalog("bench", uri="sqlite:///:memory:", warehouse=f"file://{warehouse}")
    catalog.create_namespace("bench")
    table = catalog.create_table(
        "bench.keyed",
        schema=Schema(
            NestedField(1, "part_id", LongType(), required=False),
            NestedField(2, "amount", DoubleType(), required=False),
        ),
        partition_spec=PartitionSpec(PartitionField(1, 1000, IdentityTransform(), "part_id")),
    )
    generation = 0

    def data_files(keys: Sequence[int]) -> list[Any]:
        import struct

        return [
            DataFile.from_args(
                content=DataFileContent.DATA,
                file_path=f"{warehouse}/data/part_id={k}/{uuid.uuid4().hex}.parquet",
                file_format=FileFormat.PARQUET,
                partition=Record(k),
                file_size_in_bytes=2_048,
                record_count=20,
                lower_bounds={1: struct.pack("<q", k), 2: struct.pack("<d", 0.5)},
                upper_bounds={1: struct.pack("<q", k), 2: struct.pack("<d", 99.5)},
                null_value_counts={1: 0, 2: 0},
                value_counts={1: 20, 2: 20},
                spec_id=0,
            )
            for k in keys
        ]

    def append(keys: Sequence[int]) -> None:
        loaded = catalog.load_table("bench.keyed")
        with loaded.transaction() as transaction, transaction.update_snapshot().fast_append() as fast_append:
            for data_file in data_files(keys):
                fast_append.append_data_file(data_file)

    started = time.perf_counter()
    append(range(partitions))
    print(
        f"  pyiceberg: table of {partitions:,} files in one fast_append:"
        f" {time.perf_counter() - started:.2f} s (setup)"
    )
    assert table is not None

    def append_changed(count: int) -> Callable[[], None]:
        def run() -> None:
            nonlocal generation
            generation += 1
            append([(generation * 7919 + i * 97) % partitions for i in range(count)])

        return run

    point = partitions // 2

    def newest() -> None:
        assert catalog.load_table("bench.keyed").current_snapshot() is not None

    def all_files() -> None:
        assert len(list(catalog.load_table("bench.keyed").scan().plan_files())) >= partitions

    def point_scan() -> None:
        tasks = list(
            catalog.load_table("bench.keyed").scan(row_filter=EqualTo("part_id", point)).plan_files()
        )
        assert len(tasks) >= 1, len(tasks)

    return {
        "fast_append 1 file": samples_ms(append_changed(1), repeat),
        "fast_append 1,000 files": samples_ms(append_changed(1_000), repeat),
        "load_table + current_snapshot": samples_ms(newest, repeat),
        "load_table + scan().plan_files (every file)": samples_ms(all_files, repeat),
        "load_table + scan(part_id = k).plan_files": samples_ms(point_scan, repeat),
    }


if __name__ == "__main__":
    raise SystemExit(main())
