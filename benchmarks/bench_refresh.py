"""Refresh speed against plain Spark and pyiceberg, on taxi-like rows partitioned by bucket(50, PULocationID).

    python -m benchmarks.bench_refresh                   # 2,000,000 rows
    python -m benchmarks.bench_refresh --rows 10000000   # the issue's size
    python -m benchmarks.bench_refresh --quick           # 300,000 rows, no Postgres section
    python -m benchmarks.bench_refresh --pg-rows 0       # skip the Postgres reader comparison

Anchors, run in the same process and Spark session on the same files; the contenders of a figure run once
per round in a shuffled order (`benchmarks/pairing.py`) and a figure is the median and min-max of the
per-round ratios, printed with issue 17's target:
* full refresh vs what a plain Spark user writes: one job bucketing with a native expression
  (`pmod(hash(PULocationID), 50)`) and `df.write.partitionBy(...).parquet()`: ours / it <= 1.0;
* full refresh with `strategy="arrow"` (one in-process pyarrow read, routed and written on 2 threads, no
  Spark) against the same two anchors, and against the Spark-staged refresh;
* full refresh vs pyiceberg: `pyarrow` reads the source, `create_table` with `bucket(50, PULocationID)`,
  `append`: ours / it <= 1.0 (skipped, saying why, without pyiceberg and pyiceberg-core);
* incremental refresh after rewriting one partition's source rows vs the full refresh of the same dataset
  (target <= 10%); this needs a source layout that maps files to partitions (Hive directories by
  PULocationID here), otherwise any change refreshes everything;
* dynamic discovery of `date_trunc('day', tpep_pickup_datetime)` vs a plain Spark
  `SELECT DISTINCT` of the same expression (this benchmark's bound: <= 1.2);
* Postgres: staging a table through Spark's JDBC reader vs through ADBC (how `params.reader` was chosen).

The machine may be shared: ratios of paired rounds are what this prints; `--repeat` sets the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from airflow_partitions.table import open_handle
from benchmarks import load
from benchmarks.pairing import Target, figure_line, run_rounds

BUCKETS = 50
# Issue 17's target for both full-refresh anchors; the discovery bound is this benchmark's own.
REFRESH_TARGET = Target("<=", 1.0)
DISCOVERY_BOUND = Target("<=", 1.2)
LOCATIONS = 265
CHUNK_ROWS = 1_000_000


def taxi_chunk(rows: int, seed: int) -> pa.Table:
    """NYC-taxi-shaped rows: timestamps over January 2026, skewed pickup locations, fares."""
    rng = np.random.default_rng(seed)
    start = np.datetime64("2026-01-01T00:00:00", "us").astype(np.int64)
    pickup = start + rng.integers(0, 31 * 86_400_000_000, rows)
    duration = rng.integers(60_000_000, 3_600_000_000, rows)
    # Real pickups cluster in a few zones: a Zipf-like skew over 1..265.
    location = (rng.zipf(1.3, rows) % LOCATIONS + 1).astype(np.int32)
    distance = rng.gamma(2.0, 1.5, rows)
    fare = np.round(3.0 + distance * 2.5, 2)
    tip = np.round(fare * rng.uniform(0, 0.3, rows), 2)
    return pa.table(
        {
            "VendorID": pa.array(rng.integers(1, 3, rows).astype(np.int32)),
            "tpep_pickup_datetime": pa.array(pickup, pa.timestamp("us")),
            "tpep_dropoff_datetime": pa.array(pickup + duration, pa.timestamp("us")),
            "passenger_count": pa.array(rng.integers(1, 7, rows).astype(np.int32)),
            "trip_distance": pa.array(np.round(distance, 2)),
            "PULocationID": pa.array(location),
            "DOLocationID": pa.array(rng.integers(1, LOCATIONS + 1, rows).astype(np.int32)),
            "payment_type": pa.array(rng.integers(1, 5, rows).astype(np.int32)),
            "fare_amount": pa.array(fare),
            "tip_amount": pa.array(tip),
            "total_amount": pa.array(np.round(fare + tip + 1.0, 2)),
        }
    )


def write_taxi_files(directory: Path, rows: int) -> None:
    """`rows` taxi-like rows as 1M-row Parquet files (`part-NNNN.parquet`) in a new `directory`."""
    directory.mkdir(parents=True)
    written = index = 0
    while written < rows:
        count = min(CHUNK_ROWS, rows - written)
        pq.write_table(
            taxi_chunk(count, seed=index), directory / f"part-{index:04d}.parquet", row_group_size=256_000
        )
        written += count
        index += 1


def write_sources(root: Path, rows: int) -> tuple[Path, Path]:
    """The same rows twice: flat files (`flat/part-N.parquet`) and Hive directories by PULocationID."""
    flat, hive = root / "flat", root / "hive"
    write_taxi_files(flat, rows)
    # One pass over the flat files: one file per location directory, with reasonably sized row groups.
    pads.write_dataset(
        pads.dataset(flat, format="parquet"),
        hive,
        format="parquet",
        partitioning=pads.partitioning(pa.schema([("PULocationID", pa.int32())]), flavor="hive"),
        min_rows_per_group=16_384,
        max_rows_per_group=262_144,
        max_open_files=LOCATIONS + 10,
    )
    return flat, hive


def write_spec(root: Path, flat: Path, hive: Path) -> Path:
    warm = root / "warm"
    warm.mkdir()
    pq.write_table(taxi_chunk(20_000, seed=7), warm / "part-0.parquet")
    spec = root / "spec.yaml"
    spec.write_text(
        "accelerator_dir: acc\n"
        "datasets:\n"
        f"  - name: trips_warm\n    from: file:{warm}\n"
        f"    acceleration:\n      partition_by: [{{b: 'bucket({BUCKETS}, PULocationID)'}}]\n"
        f"  - name: trips_flat\n    from: file:{flat}\n"
        f"    acceleration:\n      partition_by: [{{b: 'bucket({BUCKETS}, PULocationID)'}}]\n"
        f"  - name: trips_hive\n    from: file:{hive}\n"
        f"    acceleration:\n      partition_by: [{{b: 'bucket({BUCKETS}, PULocationID)'}}]\n"
        f"  - name: trips_days\n    from: file:{flat}\n"
        "    acceleration:\n      partition_by: [{day: \"date_trunc('day', tpep_pickup_datetime)\"}]\n"
        "  - name: trips_xcom\n"
        f"    from: file:{flat}\n"
        "    acceleration:\n"
        # 9,999 buckets plus the NULL partition: 10,000 work items.
        "      partition_by: [{b: 'bucket(9999, PULocationID)'}]\n"
        "      refresh: {max_partitions: 10000}\n"
    )
    return spec


def timed(action: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    best = float("inf")
    result: Any = None
    for _ in range(repeat):
        started = time.perf_counter()
        result = action()
        best = min(best, time.perf_counter() - started)
    return best, result


def bound_transform(project: Any, name: str) -> Any:
    from airflow_partitions.sources import open_source

    dataset = project.dataset(name)
    return dataset.bind(open_source(dataset.source).schema()).partition_by[0].transform


def anchor_partition_write(spark: Any, source: Path, target: Path) -> None:
    """What a plain Spark user writes: bucket with a native expression, `partitionBy`, Parquet."""
    from pyspark.sql import functions as F

    frame = spark.read.parquet(str(source))
    frame = frame.withColumn("b", F.expr(f"pmod(hash(PULocationID), {BUCKETS})"))
    frame.write.mode("overwrite").partitionBy("b").parquet(str(target))


def pyiceberg_missing() -> str | None:
    """Why the pyiceberg append anchor cannot run here, or None when it can."""
    try:
        import pyiceberg  # noqa: F401
        import pyiceberg_core  # noqa: F401
    except ImportError as error:
        return (
            f"{error.name} is not installed; pyiceberg writes to a bucket-partitioned table need "
            "pyiceberg[pyiceberg-core] (in the dev extra: pip install -e '.[dev]')"
        )
    return None


def pyiceberg_catalog(root: Path) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    directory = root / "iceberg"
    directory.mkdir(exist_ok=True)
    catalog = SqlCatalog(
        "bench", uri=f"sqlite:///{directory / 'catalog.db'}", warehouse=f"file://{directory}"
    )
    catalog.create_namespace("bench")
    return catalog


def anchor_pyiceberg_append(catalog: Any, source: Path) -> int:
    """A full refresh the pyiceberg way: read the source to Arrow, a new bucket-partitioned table, append."""
    from pyiceberg.transforms import BucketTransform

    arrow = pads.dataset(source, format="parquet").to_table()
    table = catalog.create_table(f"bench.trips_{uuid.uuid4().hex[:8]}", schema=arrow.schema)
    with table.update_spec() as update:
        update.add_field("PULocationID", BucketTransform(BUCKETS), "b")
    table = catalog.load_table(table.name())
    table.append(arrow)
    return arrow.num_rows


def anchor_distinct(spark: Any, source: Path, transform: Any) -> int:
    from pyspark.sql import functions as F

    frame = spark.read.parquet(str(source))
    return len(
        frame.select(transform.to_spark(F.col(transform.source_column)).alias("k")).distinct().collect()
    )


def change_one_location(hive: Path, location: int) -> None:
    """Rewrite one PULocationID directory's rows (fares up by 1): one bucket's source rows change."""
    directory = hive / f"PULocationID={location}"
    files = sorted(directory.glob("*.parquet"))
    table = pa.concat_tables([pq.read_table(f) for f in files])
    fares = pa.compute.add(table.column("fare_amount"), 1.0)
    table = table.set_column(table.schema.get_field_index("fare_amount"), "fare_amount", fares)
    for f in files:
        f.unlink()
    pq.write_table(table, directory / f"changed-{uuid.uuid4().hex[:8]}.parquet")


def postgres_readers(spark: Any, root: Path, rows: int, url: str) -> dict[str, float]:
    """Stage a Postgres table through Spark JDBC and through ADBC; seconds per reader."""
    import psycopg

    from airflow_partitions.refresh import plan_refresh, stage_refresh
    from airflow_partitions.refresh.commit import remove_stage
    from airflow_partitions.spec import load_spec

    database = f"ap_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    base = url.rsplit("/", 1)[0]
    db_url = f"{base}/{database}"
    try:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE trips (id bigint PRIMARY KEY, pickup timestamp, location int, fare float8)"
            )
            chunk = taxi_chunk(rows, seed=99)
            with conn.cursor().copy("COPY trips (id, pickup, location, fare) FROM STDIN") as copy:
                for i, (pickup, location, fare) in enumerate(
                    zip(
                        chunk.column("tpep_pickup_datetime").to_pylist(),
                        chunk.column("PULocationID").to_pylist(),
                        chunk.column("fare_amount").to_pylist(),
                        strict=True,
                    )
                ):
                    copy.write_row((i, pickup, location, fare))
            conn.execute("ANALYZE trips")
        timings: dict[str, float] = {}
        for reader in ("jdbc", "adbc"):
            spec = root / f"pg-{reader}.yaml"
            spec.write_text(
                "accelerator_dir: acc\n"
                "datasets:\n"
                "  - name: pg_trips\n"
                "    from: postgres:public.trips\n"
                f"    params: {{url: '{db_url}', reader: {reader}}}\n"
                f"    acceleration:\n      partition_by: [{{b: 'bucket({BUCKETS}, location)'}}]\n"
            )
            project = load_spec(spec)
            plan = plan_refresh(project, "pg_trips")
            started = time.perf_counter()
            stage = stage_refresh(open_handle(project, project.dataset("pg_trips")), plan, spark=spark)
            timings[reader] = time.perf_counter() - started
            remove_stage(stage)
        return timings
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--quick", action="store_true", help="300,000 rows and no Postgres section")
    parser.add_argument("--repeat", type=int, default=3, help="paired rounds per figure (default 3)")
    parser.add_argument("--pg-rows", type=int, default=1_000_000, help="rows for the JDBC/ADBC comparison")
    parser.add_argument(
        "--pg-url", default=os.environ.get("AP_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    parser.add_argument("--workdir", help="where to put data (default: a temporary directory, removed)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = load.parse_args(parser, argv)
    rows = 300_000 if args.quick else args.rows
    pg_rows = 0 if args.quick else args.pg_rows

    from airflow_partitions.refresh import plan_refresh, refresh_dataset
    from airflow_partitions.refresh.spark_session import build_local_session
    from airflow_partitions.spec import load_spec

    root = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="ap-bench-refresh-"))
    root.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Any] = {"rows": rows, "cpus": os.cpu_count(), "rounds": args.repeat}
    iceberg_skipped = pyiceberg_missing()
    try:
        started = time.perf_counter()
        flat, hive = write_sources(root, rows)
        print(f"generated {rows:,} rows in {time.perf_counter() - started:.1f} s under {root}")
        project = load_spec(write_spec(root, flat, hive))
        spark = build_local_session(app_name="bench-refresh")
        day = bound_transform(project, "trips_days")
        contenders: dict[str, Callable[[], Any]] = {
            "ours": lambda: refresh_dataset(project, "trips_flat", full=True, spark=spark, strategy="spark"),
            "spark": lambda: anchor_partition_write(spark, flat, root / "anchor"),
            # strategy arrow: one in-process pyarrow read, route, 2 writer threads, commit (no Spark).
            "arrow": lambda: refresh_dataset(project, "trips_flat", full=True, strategy="arrow"),
        }
        # Warm up every side on a small source: JVM code paths, our Python workers, pyiceberg's imports.
        anchor_partition_write(spark, root / "warm", root / "warmup")
        refresh_dataset(project, "trips_warm", spark=spark, strategy="spark")
        refresh_dataset(project, "trips_warm", full=True, strategy="arrow")
        if iceberg_skipped is None:
            catalog = pyiceberg_catalog(root)
            anchor_pyiceberg_append(catalog, root / "warm")
            contenders["pyiceberg"] = lambda: anchor_pyiceberg_append(catalog, flat)
        else:
            print(f"pyiceberg append anchor skipped: {iceberg_skipped}")

        full = run_rounds(contenders, args.repeat, warmup=False)
        figures["full_refresh"] = full
        figures["full_timings"] = full.results["ours"].timings_s
        if "pyiceberg" in full.results:
            assert full.results["pyiceberg"] == rows, (full.results["pyiceberg"], rows)

        hive_full_s, _ = timed(
            lambda: refresh_dataset(project, "trips_hive", full=True, spark=spark), args.repeat
        )
        hive_spark_s, _ = timed(
            lambda: refresh_dataset(project, "trips_hive", full=True, spark=spark, strategy="spark"),
            args.repeat,
        )
        change_one_location(hive, location=7)
        incremental_s, incremental = timed(lambda: refresh_dataset(project, "trips_hive", spark=spark), 1)
        figures.update(
            hive_full_pushdown_s=hive_full_s,
            hive_full_spark_s=hive_spark_s,
            incremental_s=incremental_s,
            incremental_refreshed=incremental.refreshed,
            incremental_mode=incremental.stage_mode,
        )

        discovery = run_rounds(
            {
                "ours": lambda: plan_refresh(project, "trips_days"),
                "distinct": lambda: anchor_distinct(spark, flat, day),
            },
            args.repeat,
        )
        figures["discovery"] = discovery
        anchor_keys = discovery.results["distinct"]
        assert discovery.results["ours"].discovered == anchor_keys, (
            discovery.results["ours"].discovered,
            anchor_keys,
        )

        xcom_plan = plan_refresh(project, "trips_xcom")
        items_json = json.dumps(xcom_plan.items_json(), separators=(",", ":")).encode()
        figures.update(xcom_items=len(xcom_plan.items), xcom_bytes=len(items_json))

        if pg_rows:
            figures["postgres"] = {"rows": pg_rows, **postgres_readers(spark, root, pg_rows, args.pg_url)}
    finally:
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)

    full = figures["full_refresh"]
    print(
        f"\nrows: {rows:,}   cpus: {os.cpu_count()} (machine possibly shared)   {args.repeat} paired rounds, "
        "order shuffled per round"
    )
    print("ratio median [min–max]:")
    print(
        figure_line(
            "full refresh: ours / plain native Spark job", full.ratio("ours", "spark"), REFRESH_TARGET
        )
    )
    print(
        f"      ours {full.median_seconds('ours'):.2f} s, Spark pmod(hash(PULocationID), {BUCKETS})"
        f".write.partitionBy {full.median_seconds('spark'):.2f} s"
    )
    phases = ", ".join(f"{k} {v:.2f}s" for k, v in figures["full_timings"].items())
    print(f"      our phases (last round): {phases}")
    print(
        figure_line(
            "full refresh, strategy arrow / plain native Spark job",
            full.ratio("arrow", "spark"),
            REFRESH_TARGET,
        )
    )
    print(figure_line("full refresh, strategy arrow / ours (Spark stage)", full.ratio("arrow", "ours"), None))
    print(
        "      strategy arrow (pyarrow read, route, 2 writer threads, commit) "
        f"{full.median_seconds('arrow'):.2f} s"
    )
    if "pyiceberg" in full.seconds:
        print(
            figure_line(
                "full refresh: ours / pyiceberg Arrow append", full.ratio("ours", "pyiceberg"), REFRESH_TARGET
            )
        )
        print(f"      pyiceberg read + create_table + append {full.median_seconds('pyiceberg'):.2f} s")
        print(
            figure_line(
                "full refresh, strategy arrow / pyiceberg Arrow append",
                full.ratio("arrow", "pyiceberg"),
                REFRESH_TARGET,
            )
        )
    else:
        print(f"  full refresh: ours / pyiceberg Arrow append: skipped ({iceberg_skipped})")
    spark_s = full.median_seconds("spark")
    print(
        f"  full refresh, Hive files (pushdown, no Spark) / plain Spark job: "
        f"{figures['hive_full_pushdown_s'] / spark_s:5.2f} (best of {args.repeat}, not paired)"
    )
    print(
        f"  full refresh, Hive files (Spark stage) / plain Spark job:        "
        f"{figures['hive_full_spark_s'] / spark_s:5.2f} (best of {args.repeat}, not paired)"
    )
    incremental_share = figures["incremental_s"] / figures["hive_full_pushdown_s"]
    print(
        f"  incremental, 1 location rewritten -> {figures['incremental_refreshed']} partition "
        f"({figures['incremental_mode']}): {incremental_share:5.1%} of full (pushdown), "
        f"{figures['incremental_s'] / figures['hive_full_spark_s']:5.1%} of full (Spark)   "
        f"this benchmark's bound ≤ 10%: {'met' if incremental_share <= 0.10 else 'not met'}"
    )
    discovery = figures["discovery"]
    print(
        figure_line(
            "dynamic discovery / Spark SELECT DISTINCT date_trunc(day)",
            discovery.ratio("ours", "distinct"),
            DISCOVERY_BOUND,
        )
        + " (this benchmark's bound)"
    )
    print(
        f"  XCom: {figures['xcom_items']:,} work items = {figures['xcom_bytes']:,} bytes of JSON "
        f"({figures['xcom_bytes'] / figures['xcom_items']:.0f} bytes each)"
    )
    if "postgres" in figures:
        pg = figures["postgres"]
        print(
            f"  Postgres stage of {pg['rows']:,} rows: JDBC {pg['jdbc']:.2f} s, ADBC {pg['adbc']:.2f} s "
            f"(ADBC/JDBC {pg['adbc'] / pg['jdbc']:.2f}x)"
        )
    if args.json:
        summary = {key: value for key, value in figures.items() if key not in ("full_refresh", "discovery")}
        summary["full_refresh_s"] = {name: full.seconds[name] for name in full.seconds}
        summary["discovery_s"] = {name: discovery.seconds[name] for name in discovery.seconds}
        print(json.dumps(summary, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
