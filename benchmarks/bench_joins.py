"""Partition-wise joins: a join of two datasets bucketed on the key, against DuckDB and the plain join.

    python -m benchmarks.bench_joins            # two 10,000,000-row datasets, 3 rounds
    python -m benchmarks.bench_joins --quick    # two 50,000-row datasets, 1 round

Two datasets of one spec, `left` and `right`, each `bucket(16, k)` on an int64 key drawn from as many
values as rows (so most keys match about one row of the other side), joined and aggregated:

    SELECT count(*), sum(l.v + r.w) FROM left l JOIN right r ON l.k = r.k

The accelerations are written as a refresh writes them (the storage of their spec): Parquet, each
bucket's rows sorted by `k` (a bucketed dataset's default `sort_by`), `k` delta-encoded. The sources are
pyarrow's default Parquet (snappy, dictionary encoding), rows in random order.

Contenders, each in a fresh interpreter per round (shuffled order each round) that runs the statement
three times and reports the third run's seconds (files checked and footers cached, and for ours the
merge loaded, as on a long-lived reader: it loads the merge once its mergeable joins reach
`MERGE_MIN_ROWS`, 32M rows, which the second 20M-row join does) and its own peak RSS (`VmHWM`):

* ours: `datasets_query(spec).query(sql)`, the join split into one small join per bucket, a window of as
  many buckets as DuckDB has threads run as one statement, whose `count` / `sum` partials are added up;
  each bucket pair's sorted keys merged (`read.merge_join`: DuckDB reads the pair's columns, Polars
  merges the keys, the matched rows joined by position) (at `--quick` sizes the join is under
  `SPLIT_MIN_BYTES` and not split; the plan's reasons are printed);
* ours, hash pairs: the same with `merge_joins=False` (each bucket pair a DuckDB hash join);
* ours, plain join: the same with `split_joins=False` (one hash join over both datasets' files);
* DuckDB over the raw source files: the same statement over `read_parquet` of each side's source files
  (the anchor: what a user gets without the acceleration).

Printed: ours / DuckDB (target <= 0.7), ours / ours-plain (target <= 0.8) and ours / ours with hash
pairs (no target: what the merge saves), each with the highest load average of its rounds; the same
ratios of CPU seconds (the worker's user + system time over all its threads during the timed run: the
work done, which a loaded machine disturbs far less than the wall clock); the same ratios of the wall
clock less the seconds the worker's main thread waited, runnable, for a core
(`/proc/thread-self/schedstat`: an estimate, on a shared machine, of the idle wall clock); each
contender's median seconds, CPU seconds, seconds less that wait and peak RSS, and ours' planning seconds.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import load
from benchmarks.pairing import Ratio, Target, figure_line

BUCKETS = 16
SQL = 'SELECT count(*) AS n, sum(l.v + r.w) AS total FROM "left" l JOIN "right" r ON l.k = r.k'
CONTENDERS = ("ours", "ours_hash", "ours_plain", "duckdb")


def build(directory: Path, rows: int) -> Path:
    """Write both datasets (sources and bucketed accelerations, one commit each) and their spec.

    Each acceleration is written by the storage its spec gives (`get_storage(acceleration)`), as a
    refresh writes it: Parquet, each bucket's rows sorted by `k` (the default `sort_by` of a bucketed
    dataset: the bucket's source column).
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from airflow_partitions.catalog import Catalog, LocalStore, PartitionEntry, PartitionSpecInfo
    from airflow_partitions.keys import PartitionKey
    from airflow_partitions.read.reader import open_project
    from airflow_partitions.storage import get_storage
    from airflow_partitions.transforms import parse_transform

    root = directory / "accelerations"
    expression = f"bucket({BUCKETS}, k)"
    path = directory / "joins.yaml"
    path.write_text(
        f"accelerator_dir: {root}\ndatasets:\n"
        + "".join(
            f"  - name: {name}\n    from: file:{directory / f'source_{name}'}/*.parquet\n"
            f"    acceleration:\n      engine: parquet\n      mode: file\n"
            f'      partition_by:\n        - kb: "{expression}"\n'
            for name in ("left", "right")
        )
    )
    project = open_project(path)
    spec = PartitionSpecInfo.from_fields([("kb", parse_transform(expression).canonical)])
    generator = np.random.default_rng(7)
    for name, value in (("left", "v"), ("right", "w")):
        storage = get_storage(project.dataset(name).acceleration)
        table = pa.table(
            {
                "k": pa.array(generator.integers(0, rows, rows), pa.int64()),
                value: pa.array(generator.integers(0, 1000, rows), pa.int64()),
            }
        )
        sources = directory / f"source_{name}"
        sources.mkdir()
        step = -(-rows // 4)
        for part in range(4):
            pq.write_table(table.slice(part * step, step), sources / f"part-{part}.parquet")
        bound = parse_transform(expression).bind(pa.int64())
        buckets = bound.apply(table.column("k"))
        order = pc.sort_indices(buckets)
        table, buckets = table.take(order), buckets.take(order)
        counts = np.bincount(buckets.to_numpy(), minlength=BUCKETS)
        dataset_root = root / name
        dataset_root.mkdir(parents=True)
        entries = []
        offset = 0
        for bucket, count in enumerate(counts.tolist()):
            key = PartitionKey((bucket,))
            key_path = key.path(["kb"])
            files = storage.write(table.slice(offset, count), dataset_root, key_path)
            entries.append(PartitionEntry.from_files(key, spec, storage.publish(dataset_root, files)))
            offset += count
        Catalog(LocalStore(root), name, storage=storage).commit(
            base_version=None, upserts=entries, partition_spec=spec
        )
    return path


def worker(contender: str, spec: Path, out: Path) -> None:
    """One contender in this fresh interpreter: the statement three times, the third timed."""
    if contender == "duckdb":
        import duckdb

        connection = duckdb.connect()
        directory = spec.parent
        sql = SQL.replace('"left"', f"read_parquet('{directory}/source_left/*.parquet')").replace(
            '"right"', f"read_parquet('{directory}/source_right/*.parquet')"
        )

        def run() -> list[tuple[int, ...]]:
            return [tuple(int(value) for value in row) for row in connection.sql(sql).fetchall()]

    else:
        from airflow_partitions.read.reader import datasets_query

        query = datasets_query(spec, merge_joins=contender != "ours_hash")
        split = contender != "ours_plain"

        def run() -> list[tuple[int, ...]]:
            table = query.query(SQL, split_joins=split)
            return [tuple(int(value) for value in row.values()) for row in table.to_pylist()]

    started = time.perf_counter()
    first = run()
    cold = time.perf_counter() - started
    assert run() == first
    queued = run_queue_seconds()
    started, cpu_started = time.perf_counter(), time.process_time()
    second = run()
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    queued = run_queue_seconds() - queued
    assert first == second
    report: dict[str, Any] = {
        "seconds": seconds,
        "cpu": cpu,
        "unqueued": seconds - queued,
        "cold": cold,
        "rss": peak_rss_mib(),
        "result": second,
    }
    if contender == "ours":
        started = time.perf_counter()
        plan = query.plan(SQL)
        report["plan_seconds"] = time.perf_counter() - started
        report["decision"] = plan.joins[0].reason + (
            f"; pair joins: {'merged' if plan.merge else 'hashed'} ({plan.merge_reason})"
            if plan.streamed
            else ""
        )
    out.write_text(json.dumps(report))


def run_queue_seconds() -> float:
    """Seconds this (the calling) thread has waited, runnable, for a core (`schedstat`'s second field;
    0 where the kernel does not say): the wall clock less it is what the run would have taken had this
    thread never waited for another process, on a shared machine an estimate of the idle figure."""
    try:
        return int(Path("/proc/thread-self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def peak_rss_mib() -> float:
    """This process's peak resident set (`VmHWM`) in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_contender(contender: str, spec: Path, out: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.bench_joins", "--worker", contender, "--spec", str(spec)]
    subprocess.run([*command, "--out", str(out)], check=True)
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=10_000_000, help="rows per dataset (default 10M)")
    parser.add_argument("--rounds", type=int, default=3, help="paired rounds (default 3)")
    parser.add_argument("--quick", action="store_true", help="50,000 rows per dataset, 1 round")
    parser.add_argument("--worker", choices=CONTENDERS, help=argparse.SUPPRESS)
    parser.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    load.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.spec, args.out)
        return 0
    # The parent alone checks and prints the load: a worker is one timed contender.
    load.parse_args(
        argparse.ArgumentParser(add_help=False),
        [
            *(["--max-load", str(args.max_load)] if args.max_load is not None else []),
            *(["--allow-load"] if args.allow_load else []),
        ],
    )
    if args.quick:
        args.rows, args.rounds = 50_000, 1
    with tempfile.TemporaryDirectory() as directory:
        started = time.perf_counter()
        spec = build(Path(directory), args.rows)
        built = time.perf_counter() - started
        print(f"built two {args.rows:,}-row datasets bucket({BUCKETS}, k) in {built:.1f} s")
        seconds: dict[str, list[float]] = {name: [] for name in CONTENDERS}
        cpu: dict[str, list[float]] = {name: [] for name in CONTENDERS}
        unqueued: dict[str, list[float]] = {name: [] for name in CONTENDERS}
        loads: list[float] = []
        plan_seconds: list[float] = []
        rss: dict[str, list[float]] = {name: [] for name in CONTENDERS}
        results = {}
        decision = ""
        order = list(CONTENDERS)
        shuffler = random.Random(0)
        for _ in range(args.rounds):
            shuffler.shuffle(order)
            before = load.current()
            for name in order:
                report = run_contender(name, spec, Path(directory) / f"{name}.json")
                seconds[name].append(float(report["seconds"]))
                cpu[name].append(float(report["cpu"]))
                unqueued[name].append(float(report["unqueued"]))
                plan_seconds.extend([float(report["plan_seconds"])] if "plan_seconds" in report else [])
                rss[name].append(float(report["rss"]))
                results[name] = report["result"]
                decision = report.get("decision", decision)
            loads.append(max(before, load.current()))
        if len({json.dumps(result) for result in results.values()}) != 1:
            print(f"RESULTS DIFFER: {results}")
            return 1
    print(f"join of two {args.rows:,}-row datasets, {args.rounds} round(s); every contender's answer agrees")
    print(f"ours: {decision}")

    def ratio(top: str, bottom: str, of: dict[str, list[float]] = seconds) -> Ratio:
        return Ratio(tuple(a / b for a, b in zip(of[top], of[bottom], strict=True)), tuple(loads))

    for label, anchor, target in (
        ("DuckDB over the raw files", "duckdb", Target("<=", 0.7)),
        ("ours (one plain join)", "ours_plain", Target("<=", 0.8)),
        ("ours (hash-joined pairs)", "ours_hash", None),
    ):
        print(figure_line(f"ours (partition-wise) / {label}", ratio("ours", anchor), target))
        print(figure_line("  the same, CPU seconds", ratio("ours", anchor, cpu), None))
        print(figure_line("  the same, wall less run-queue wait", ratio("ours", anchor, unqueued), None))
    for name in CONTENDERS:
        print(
            f"  {name:12} {statistics.median(seconds[name]):7.3f} s (timed run)  "
            f"CPU {statistics.median(cpu[name]):7.3f} s   less run-queue wait "
            f"{statistics.median(unqueued[name]):7.3f} s   peak RSS {max(rss[name]):8.1f} MiB"
        )
    print(f"  ours' planning (pruning, pair groups): {statistics.median(plan_seconds):.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
