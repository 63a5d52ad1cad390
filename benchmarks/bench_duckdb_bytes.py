"""Bytes on disk of the DuckDB engine against the parquet engine, for the same refreshed CSV.

    python -m benchmarks.bench_duckdb_bytes                       # ~4 MB CSV, 300 partitions
    python -m benchmarks.bench_duckdb_bytes --quick               # ~400 KB CSV, 300 partitions
    python -m benchmarks.bench_duckdb_bytes --rows 200000 --partitions 50

One CSV is refreshed (Spark stage, then finalize and commit, as `airflow-partitions refresh` does) into
three datasets of one spec: engine `parquet` (the anchor), `duckdb` with `partition_mode: files` and
`duckdb` with `partition_mode: tables`, partitioned by `bucket(N, id)`. What is measured is the disk
usage of each dataset directory (allocated blocks, as `du` counts them, and apparent sizes), not the
catalog's `DataFile.bytes`. The goal is DuckDB <= 2x parquet.

A DuckDB file cannot be smaller than its three 4 KiB headers plus whole blocks: with DuckDB's default
256 KiB blocks the earlier partition file layout (rows + a schema table) took 0.5 MB even for one row,
which is why small partitions now use 16 KiB blocks (the smallest DuckDB accepts) and keep the schema in
a table comment. A small table in the shared `tables` file still takes a 16 KiB block, 3.5x a parquet
file's 4 KiB filesystem block, so the 2x goal holds only once partitions are tens of KiB or more. The
printed per-file floor is measured in this run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from benchmarks import load

ENGINES = (("parquet", None), ("duckdb", "files"), ("duckdb", "tables"))
GOAL = 2.0


def write_csv(path: Path, rows: int, seed: int = 5) -> int:
    """Order-like rows with NULLs, quotes, separators and unicode; returns the file size."""
    rng = np.random.default_rng(seed)
    ids = np.arange(rows, dtype=np.int64)
    cities = np.array(["Zürich", "a/b", "k=v", "100%", 'say "hi"', "", "Kyiv"])
    city = cities[rng.integers(0, len(cities), rows)].astype(object)
    city[rng.random(rows) < 0.05] = None
    amount = np.round(rng.gamma(2.0, 30.0, rows), 2).astype(object)
    amount[rng.random(rows) < 0.05] = None
    start = np.datetime64("2026-01-01T00:00:00", "s").astype(np.int64)
    seconds = start + rng.integers(0, 90 * 86_400, rows)
    table = pa.table(
        {
            "id": pa.array(ids),
            "city": pa.array(city.tolist(), pa.string()),
            "amount": pa.array(amount.tolist(), pa.float64()),
            "ordered_at": pa.array(seconds, pa.timestamp("s")),
        }
    )
    pacsv.write_csv(table, path)
    return path.stat().st_size


def write_spec(directory: Path, partitions: int) -> Path:
    datasets = []
    for engine, mode in ENGINES:
        name = f"{engine}_{mode}" if mode else engine
        params = f"\n      params: {{partition_mode: {mode}}}" if mode else ""
        datasets.append(
            f"""  - name: {name}
    from: file:{directory / "src"}
    params: {{file_format: csv}}
    acceleration:
      engine: {engine}{params}
      partition_by:
        - b: "bucket({partitions}, id)"
      refresh:
        max_partitions: {max(partitions, 1000)}"""
        )
    spec = directory / "spec.yaml"
    spec.write_text(f"accelerator_dir: {directory / 'acc'}\ndatasets:\n" + "\n".join(datasets) + "\n")
    return spec


def disk_usage(directory: Path) -> tuple[int, int, int]:
    """(allocated bytes as `du` counts them, apparent bytes, files) under `directory`."""
    allocated = apparent = files = 0
    for folder, _dirs, names in os.walk(directory):
        for name in names:
            info = os.lstat(os.path.join(folder, name))
            allocated += info.st_blocks * 512
            apparent += info.st_size
            files += 1
    return allocated, apparent, files


def duckdb_file_floor(directory: Path) -> tuple[int, int]:
    """Size of a one-row partition file as the duckdb engine writes it, and in the earlier layout."""
    import duckdb

    from airflow_partitions.storage import get_storage

    table = pa.table({"id": pa.array([1], pa.int64())})
    written = get_storage("duckdb", "files").write(table, directory, "b=1")
    ours = (directory / written[0].path).stat().st_size
    plain = directory / "default-blocks.duckdb"
    connection = duckdb.connect(str(plain))
    connection.register("t", table)
    connection.execute("CREATE TABLE data AS SELECT * FROM t")
    connection.execute("CREATE TABLE _ap_arrow_schema AS SELECT 'x'::BLOB AS arrow_schema")
    connection.close()
    return ours, plain.stat().st_size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="~400 KB CSV (about a minute with Spark start)")
    parser.add_argument("--rows", type=int, default=None, help="CSV rows (default 100,000; --quick 10,000)")
    parser.add_argument("--partitions", type=int, default=300, help="bucket count N of bucket(N, id)")
    args = load.parse_args(parser, argv)
    rows = args.rows if args.rows is not None else (10_000 if args.quick else 100_000)

    from airflow_partitions.refresh.pipeline import refresh_dataset
    from airflow_partitions.refresh.spark_session import build_local_session
    from airflow_partitions.spec import load_spec
    from airflow_partitions.table import open_handle

    with tempfile.TemporaryDirectory(prefix="bench-duckdb-bytes-") as tmp:
        root = Path(tmp)
        (root / "src").mkdir()
        csv_bytes = write_csv(root / "src" / "orders.csv", rows)
        project = load_spec(write_spec(root, args.partitions))
        spark = build_local_session(app_name="bench-duckdb-bytes")
        print(f"CSV: {rows:,} rows, {csv_bytes / 1e3:,.0f} KB; bucket({args.partitions}, id)")
        header = ("engine", "partitions", "files", "on disk", "apparent", "x parquet")
        print(
            f"{header[0]:<16} "
            + " ".join(f"{h:>{w}}" for h, w in zip(header[1:], (10, 6, 12, 12, 10), strict=True))
        )
        anchor: int | None = None
        results: dict[str, int] = {}
        for dataset in project.datasets:
            started = time.perf_counter()
            summary = refresh_dataset(project, dataset, spark=spark)
            elapsed = time.perf_counter() - started
            allocated, apparent, files = disk_usage(open_handle(project, dataset).local_root)
            anchor = anchor if anchor is not None else allocated
            results[dataset.name] = allocated
            print(
                f"{dataset.name:<16} {summary.refreshed:>10} {files:>6} {allocated / 1e6:>10.2f}MB "
                f"{apparent / 1e6:>10.2f}MB {allocated / anchor:>9.2f}x  ({elapsed:.1f} s)"
            )
        spark.stop()
        floor_dir = root / "floor"
        floor_dir.mkdir()
        ours, plain = duckdb_file_floor(floor_dir)
        shutil.rmtree(floor_dir)
    assert anchor is not None
    print(
        f"one-row DuckDB partition file: {ours / 1024:.0f} KiB as written (16 KiB blocks), "
        f"{plain / 1024:.0f} KiB in the earlier layout (DuckDB's default 256 KiB blocks, schema table)"
    )
    for name, allocated in results.items():
        if name != "parquet":
            verdict = "meets" if allocated <= GOAL * anchor else "misses"
            print(f"{name}: {allocated / anchor:.2f}x parquet, {verdict} the <= {GOAL:.0f}x goal")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
