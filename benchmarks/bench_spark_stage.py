"""Where the Spark pipeline's refresh time goes, step by step, against the plain native Spark job.

    python -m benchmarks.bench_spark_stage                   # 10,000,000 taxi-like rows (issue 17's size)
    python -m benchmarks.bench_spark_stage --quick           # 300,000 rows
    python -m benchmarks.bench_spark_stage --rows 100000000 --repeat 1 --source-dir /data/taxi100m \
        --only plain,ours                                    # 100M rows: the files made once, reused

`--source-dir` keeps the generated files in that directory (made when missing; reused when it holds
`--rows` rows) so a large run does not generate them each time; `--only` runs only the named contenders
(`plain` always runs: it is every ratio's anchor).

Each contender is the stage job cut after one more step, with its output discarded by Spark's `noop`
sink (every column materialized, nothing written), on the same files and Spark session; a round runs
them all once in a shuffled order (`benchmarks/pairing.py`) and each is printed as median [min-max] of
its per-round ratio to the plain job (`pmod(hash(PULocationID), 50)` + `partitionBy`):
* scan: read every column;
* + bucket (native): `bucket(50, PULocationID)` as our Spark expression (Spark's Murmur3 seeded to 0);
* + bucket (Arrow UDF): the same buckets through a Python Arrow UDF (what strings and decimals use);
* + route: the broadcast join on the planned keys, NULL-safe;
* + item shuffle: rows repartitioned by work item (one task owns an item);
* + hand-off: the shuffled rows converted to Arrow batches for the Python writers (which do nothing);
* ours: the whole refresh (`refresh_dataset(strategy="spark")`, the default stage: for these Parquet
  files the executors read their splits themselves with pyarrow, route and write, `refresh/split_read.py`:
  no JVM scan and no hand-off of the rows from the JVM to Python);
* spark read: the same refresh with Spark reading the source (`stage_refresh(executors_read=False)`, the
  default before): Spark scans, buckets and routes, the rows are handed to the Python writers, which sort,
  write, count back; with few scan tasks, as here, without the shuffle by item;
* shuffled: the Spark-read refresh with `stage_refresh(shuffle_items=True)` (one task per item);
* candidate (b), Spark's Parquet writer: the routed rows written by Spark itself (`partitionBy` item,
  zstd, 32k-row groups, page checksums), then what Python must still do to catalog them: read every
  footer (rows, statistics), checksum every file and row-hash every file with DuckDB (the certificate).
The difference between consecutive steps is what that step costs. CPU is the CPU seconds of the whole
process tree (this driver, Spark's JVM, its Python workers), printed as a ratio beside the wall-clock one;
the machine may be shared, so the load average is printed with each figure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa

from benchmarks import load
from benchmarks.bench_expressions import CpuMeter, process_tree_cpu
from benchmarks.bench_refresh import BUCKETS, anchor_partition_write, bound_transform, write_taxi_files
from benchmarks.pairing import Target, figure_line, run_rounds

REFRESH_TARGET = Target("<=", 1.0)


def discard_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A Python writer that writes nothing: what is left is Spark's hand-off of the rows to Python."""
    rows = sum(batch.num_rows for batch in batches)
    yield pa.RecordBatch.from_pylist([{"rows": rows}], schema=pa.schema([("rows", pa.int64())]))


def spark_writer_candidate(routed: Any, target: Path) -> int:
    """Candidate (b): Spark writes the partition files; Python reads back what the catalog needs."""
    import pyarrow.parquet as pq

    from airflow_partitions.storage.datafile import file_checksum
    from airflow_partitions.write.row_hash import tally_parquet_files

    (
        routed.write.mode("overwrite")
        .option("compression", "zstd")
        .option("parquet.block.row.count.limit", str(32 * 1024))
        .option("parquet.page.write-checksum.enabled", "true")
        .partitionBy("item")
        .parquet(str(target))
    )
    paths = sorted(str(p) for p in target.rglob("*.parquet"))
    rows = 0
    for path in paths:
        metadata = pq.read_metadata(path)
        rows += metadata.num_rows
        for group in range(metadata.num_row_groups):
            row_group = metadata.row_group(group)
            for column in range(row_group.num_columns):
                row_group.column(column).statistics  # noqa: B018 (the catalog's per-file stats)
        file_checksum(Path(path))
    tallies = tally_parquet_files(paths, pq.read_schema(paths[0]).remove_metadata()) if paths else {}
    assert tallies is not None, "DuckDB reads Spark's files"
    assert sum(t.rows for t in tallies.values()) == rows, "row hash read back"
    return rows


class WorkerPeak:
    """The peak resident memory of Spark's Python workers (this process's descendants that are not the
    JVM) while a contender runs, sampled every 0.2 s: the largest single worker, which holds one task."""

    def __init__(self) -> None:
        self.peaks: dict[str, int] = {}

    def wrap(self, name: str, run: Callable[[], Any]) -> Callable[[], Any]:
        import threading

        import psutil

        def sampled() -> Any:
            done = threading.Event()

            def sample() -> None:
                me = psutil.Process()
                while not done.wait(0.2):
                    for child in me.children(recursive=True):
                        try:
                            if "java" in child.name():
                                continue
                            rss = child.memory_info().rss
                        except psutil.Error:
                            continue
                        self.peaks[name] = max(self.peaks.get(name, 0), rss)

            thread = threading.Thread(target=sample, daemon=True)
            thread.start()
            try:
                return run()
            finally:
                done.set()
                thread.join()

        return sampled


def source_files(directory: Path, rows: int) -> Path:
    """`rows` taxi-like rows in `directory`: generated there when it does not exist, else reused (it must
    hold exactly `rows` rows)."""
    import pyarrow.parquet as pq

    if not directory.exists():
        write_taxi_files(directory, rows)
        return directory
    held = sum(pq.read_metadata(path).num_rows for path in directory.glob("*.parquet"))
    if held != rows:
        raise SystemExit(f"--source-dir {directory} holds {held:,} rows, not {rows:,}; give a new directory")
    return directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--quick", action="store_true", help="300,000 rows")
    parser.add_argument("--repeat", type=int, default=3, help="paired rounds (default 3)")
    parser.add_argument("--source-dir", type=Path, help="generated files kept here and reused")
    parser.add_argument("--only", help="comma-separated contenders to run (plain always runs)")
    args = load.parse_args(parser, argv)
    rows = 300_000 if args.quick else args.rows

    from pyspark.sql import functions as F

    from airflow_partitions.refresh import refresh_dataset
    from airflow_partitions.refresh.spark_session import build_local_session
    from airflow_partitions.spec import load_spec
    from airflow_partitions.transforms.spark import arrow_udf, spark_type_for

    root = Path(tempfile.mkdtemp(prefix="ap-bench-spark-stage-"))
    try:
        flat = source_files(args.source_dir or root / "flat", rows)
        spec = root / "spec.yaml"
        spec.write_text(
            "accelerator_dir: acc\n"
            "datasets:\n"
            f"  - name: trips\n    from: file:{flat}\n"
            f"    acceleration:\n      partition_by: [{{b: 'bucket({BUCKETS}, PULocationID)'}}]\n"
        )
        project = load_spec(spec)
        transform = bound_transform(project, "trips")
        spark = build_local_session(app_name="bench-spark-stage")
        keys = spark.createDataFrame([(b, b) for b in range(BUCKETS)], "k BIGINT, item INT")

        def scan() -> Any:
            return spark.read.parquet(str(flat))

        def bucketed() -> Any:
            return scan().withColumn("b", transform.to_spark(F.col("PULocationID")))

        def bucketed_udf() -> Any:
            result = spark_type_for(transform.result_type)
            udf = arrow_udf(transform.apply, F.col("PULocationID"), transform.source_type, result)
            return scan().withColumn("b", udf)

        def routed() -> Any:
            frame = bucketed()
            joined = frame.join(F.broadcast(keys), frame["b"].eqNullSafe(keys["k"]), "inner")
            return joined.drop("b", "k")

        def shuffled() -> Any:
            return routed().repartition(8, "item")

        def spark_writer() -> int:
            return spark_writer_candidate(routed(), root / "candidate_b")

        def refresh_with(**stage_options: Any) -> Any:
            from airflow_partitions.refresh import pipeline

            original = pipeline.stage_refresh
            pipeline.stage_refresh = partial(original, **stage_options)  # type: ignore[assignment]
            try:
                return refresh_dataset(project, "trips", full=True, spark=spark, strategy="spark")
            finally:
                pipeline.stage_refresh = original  # type: ignore[assignment]

        notes: list[str] = []

        def ours() -> Any:
            summary = refresh_dataset(project, "trips", full=True, spark=spark, strategy="spark")
            notes[:] = [note for note in summary.notes if note.startswith("stage:")]
            return summary

        def sink(frame: Any) -> None:
            frame.write.format("noop").mode("overwrite").save()

        contenders: dict[str, Callable[[], Any]] = {
            "plain": lambda: anchor_partition_write(spark, flat, root / "anchor"),
            "scan": lambda: sink(scan()),
            "bucket": lambda: sink(bucketed()),
            "bucket_udf": lambda: sink(bucketed_udf()),
            "route": lambda: sink(routed()),
            "shuffle": lambda: sink(shuffled()),
            "handoff": lambda: shuffled().mapInArrow(discard_rows, "rows BIGINT").collect(),
            "ours": ours,
            "spark_read": lambda: refresh_with(executors_read=False),
            "shuffled": lambda: refresh_with(executors_read=False, shuffle_items=True),
            "spark_writer": spark_writer,
        }
        if args.only:
            wanted = {"plain", *args.only.split(",")}
            unknown = wanted - set(contenders)
            if unknown:
                parser.error(f"--only: no contender {sorted(unknown)}; choose from {sorted(contenders)}")
            contenders = {name: run for name, run in contenders.items() if name in wanted}
        cpu = CpuMeter(process_tree_cpu)
        peak = WorkerPeak()
        wrapped = {name: peak.wrap(name, cpu.wrap(name, run)) for name, run in contenders.items()}
        measured = run_rounds(wrapped, args.repeat)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    print(f"\nrows: {rows:,}   cpus: {os.cpu_count()}   {args.repeat} paired rounds, shuffled")
    print("each step / the plain native Spark job (pmod(hash) + partitionBy), median [min–max]:")
    labels = {
        "scan": "scan (noop sink)",
        "bucket": "+ bucket(50, PULocationID), native",
        "bucket_udf": "  (the same bucket as an Arrow UDF, for comparison)",
        "route": "+ route (broadcast join on planned keys)",
        "shuffle": "+ shuffle by item",
        "handoff": "+ hand-off to Python writers (writers discard)",
    }
    for name, label in labels.items():
        if name in contenders:
            print(figure_line(label, measured.ratio(name, "plain"), None))
    if "ours" in contenders:
        whole = measured.ratio("ours", "plain")
        print(figure_line("ours: the whole Spark-pipeline refresh", whole, REFRESH_TARGET))
        print(f"      {notes[0] if notes else 'stage: (no note)'}")
        print(figure_line("  CPU seconds, ours / plain", cpu.ratio("ours", "plain"), None))
        worker = peak.peaks.get("ours", 0) / 2**30
        print(f"      peak RSS of one Python worker (one read task): {worker:.2f} GiB")
    if "spark_read" in contenders:
        spark_read = measured.ratio("spark_read", "plain")
        print(figure_line("the refresh with Spark reading the source", spark_read, None))
        print(figure_line("  CPU seconds, spark read / plain", cpu.ratio("spark_read", "plain"), None))
    if {"ours", "spark_read"} <= contenders.keys():
        print(
            figure_line("ours / the refresh with Spark reading", measured.ratio("ours", "spark_read"), None)
        )
    if "shuffled" in contenders:
        print(figure_line("  Spark read, shuffled by item first", measured.ratio("shuffled", "plain"), None))
    if "spark_writer" in contenders:
        print(
            figure_line(
                "(b) Spark's Parquet writer + footers, checksums, row hash",
                measured.ratio("spark_writer", "plain"),
                None,
            )
        )
    seconds = ", ".join(f"{name} {measured.median_seconds(name):.2f}s" for name in contenders)
    print(f"      median seconds: {seconds}")
    processes = ", ".join(f"{name} {cpu.median(name):.2f}s" for name in contenders)
    print(f"      median CPU seconds (process tree): {processes}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
