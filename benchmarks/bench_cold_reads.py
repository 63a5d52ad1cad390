"""Cold point reads vs a DuckDB full scan, by partition file layout: unsorted vs sorted row groups.

    python -m benchmarks.bench_cold_reads                   # 2,000,000 rows in bucket(10, ...)
    python -m benchmarks.bench_cold_reads --rows 10000000 --buckets 50   # the issue's data set
    python -m benchmarks.bench_cold_reads --quick           # 300,000 rows, 5 rounds

The default (2M rows, 10 buckets) gives bucket files of the issue's size (10M rows / 50 buckets, ~100k-
200k rows each) in a fifth of the time; the anchor then scans 2M rows, not 10M, so its ratio is lower.

Data: bench_pruning's taxi-like trips in `bucket(N, PULocationID)` (the cold zone holds 60-300 rows).
The same trips are written once per layout with the parquet engine and committed to the real catalog:

* `unsorted 128k` — rows in source order, 131,072-row groups (the layout before sorting);
* `sorted Nk` — each partition sorted by `PULocationID` (the default sort: the bucket's source column)
  in N Ki-row groups, for N in 16, 32, 64, 128.

Each round runs every case once in a shuffled order: `reader.read("PULocationID = <cold>")` per layout,
pyarrow's dataset scan of the one matching bucket file per layout (the reader's floor on that file), and
the anchor, DuckDB over the source Parquet file with its own filter pushdown (a full scan). Printed per
case: median ms, and the median and min-max over rounds of the paired ratio anchor / case (target >= 4x
for our read, from issue 17). Page cache warm; the figure is about what a file lets a reader skip.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from airflow_partitions.catalog import Catalog, LocalStore, PartitionEntry, PartitionSpecInfo
from airflow_partitions.keys import PartitionKey
from airflow_partitions.read import PartitionedDatasetReader, new_duckdb_connection
from airflow_partitions.storage.parquet import ParquetStorage
from airflow_partitions.transforms import parse_transform
from benchmarks import load
from benchmarks.bench_pruning import BUCKETS, COLD_ZONE, make_trips
from benchmarks.pairing import Target, run_rounds

TARGET = Target(">=", 4)  # issue 17: cold point read, DuckDB full scan with pushdown / ours
LAYOUTS: dict[str, tuple[int, tuple[str, ...]]] = {
    "unsorted_128k": (128 * 1024, ()),
    "sorted_16k": (16 * 1024, ("PULocationID",)),
    "sorted_32k": (32 * 1024, ("PULocationID",)),
    "sorted_64k": (64 * 1024, ("PULocationID",)),
    "sorted_128k": (128 * 1024, ("PULocationID",)),
}


def build(
    base: Path, name: str, table: pa.Table, storage: ParquetStorage, expression: str
) -> tuple[dict[Any, list[Path]], float]:
    """Write `table` bucketed with `storage`, commit once; the files per bucket and the write seconds."""
    transform = parse_transform(expression).bind(pa.int64())
    buckets = transform.apply(table.column("PULocationID"))
    spec = PartitionSpecInfo.from_fields([("pu_bucket", transform.canonical)])
    root = base / name
    root.mkdir(parents=True)
    entries, files = [], {}
    seconds = 0.0
    for value in pc.unique(buckets).to_pylist():
        rows = table.filter(pc.equal(buckets, value) if value is not None else pc.is_null(buckets))
        key = PartitionKey((value,))
        started = time.perf_counter()
        written = storage.write(rows, root, key.path(["pu_bucket"]))
        seconds += time.perf_counter() - started
        files[value] = [root / f.path for f in written]
        entries.append(PartitionEntry.from_files(key, spec, written))
    Catalog(LocalStore(base), name, storage=storage).commit(
        base_version=None, upserts=entries, partition_spec=spec
    )
    return files, seconds


def write_spec(base: Path, source: Path, expression: str) -> Path:
    datasets = "".join(
        f"""
          - name: {name}
            from: file:{source}
            acceleration:
              engine: parquet
              partition_by:
                - pu_bucket: "{expression}"
        """
        for name in LAYOUTS
    )
    path = base / "datasets.yaml"
    path.write_text(textwrap.dedent(f"accelerator_dir: {base}\ndatasets:") + textwrap.dedent(datasets))
    return path


def scan_files(paths: list[Path]) -> pa.Table:
    """pyarrow's dataset scan of `paths` with the cold filter pushed to row-group statistics."""
    return ds.dataset([str(p) for p in paths], format="parquet").to_table(
        filter=ds.field("PULocationID") == COLD_ZONE
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=2_000_000, help="trips to generate (default 2,000,000)")
    parser.add_argument("--quick", action="store_true", help="300,000 rows, 5 rounds")
    parser.add_argument(
        "--buckets", type=int, default=10, help=f"bucket count (default 10; issue: {BUCKETS})"
    )
    parser.add_argument("--rounds", type=int, default=21, help="shuffled rounds (default 21)")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="keep the files here instead of a temp dir"
    )
    args = load.parse_args(parser, argv)
    rows, rounds = (300_000, 5) if args.quick else (args.rows, args.rounds)
    base = args.workdir or Path(tempfile.mkdtemp(prefix="bench-cold-reads-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        run(base, rows, rounds, f"bucket({args.buckets}, PULocationID)")
    finally:
        if args.workdir is None:
            shutil.rmtree(base, ignore_errors=True)
    return 0


def run(base: Path, rows: int, rounds: int, expression: str) -> None:
    print(f"generating {rows:,} trips ...", flush=True)
    table = make_trips(rows)
    source = base / "source.parquet"
    pq.write_table(table, source)
    where = f"PULocationID = {COLD_ZONE}"
    cold_bucket = parse_transform(expression).bind(pa.int64()).apply_scalar(COLD_ZONE)
    expected = int(np.count_nonzero(table.column("PULocationID").to_numpy() == COLD_ZONE))

    files: dict[str, list[Path]] = {}
    print(f"partitioned by {expression}")
    print(f"{'layout':16} {'write s':>8} {'vs unsorted':>11} {'row groups in the cold file':>28}")
    for name, (row_group_rows, sort_by) in LAYOUTS.items():
        storage = ParquetStorage(row_group_rows=row_group_rows, sort_by=sort_by)
        by_bucket, seconds = build(base, name, table, storage, expression)
        files[name] = by_bucket[cold_bucket]
        groups = sum(pq.read_metadata(path).num_row_groups for path in files[name])
        if name == "unsorted_128k":
            unsorted_seconds = seconds
        print(f"{name:16} {seconds:8.2f} {seconds / unsorted_seconds:10.2f}x {groups:>28}", flush=True)
    spec_path = write_spec(base, source, expression)
    del table

    anchor = new_duckdb_connection(functions=False)
    anchor_sql = f"SELECT * FROM read_parquet('{source}') WHERE {where}"
    readers = {name: PartitionedDatasetReader(spec_path, name) for name in LAYOUTS}
    cases: dict[str, Callable[[], Any]] = {"anchor": lambda: anchor.sql(anchor_sql).to_arrow_table()}
    for name in LAYOUTS:
        cases[f"ours {name}"] = functools.partial(readers[name].read, where)
        cases[f"pyarrow {name}"] = functools.partial(scan_files, files[name])
    for name, run_case in cases.items():
        got = run_case().num_rows
        assert got == expected, f"{name}: {got} rows, expected {expected}"
    measured = run_rounds(cases, rounds, seed=17)

    anchor_ms = measured.median_seconds("anchor") * 1000
    print(
        f"\ncold point read ({expected} rows of zone {COLD_ZONE}), {rounds} shuffled rounds; anchor: DuckDB "
        f"full scan with pushdown over the source file, median {anchor_ms:.2f} ms"
    )
    print(f"{'case':24} {'median ms':>10}  anchor/case median [min-max]")
    for name in cases:
        if name == "anchor":
            continue
        ratio = measured.ratio("anchor", name)
        target = TARGET if name.startswith("ours") else None
        print(f"{name:24} {measured.median_seconds(name) * 1000:10.2f}  {ratio.format(target)}")
    for reader in readers.values():
        reader.close()
    anchor.close()


if __name__ == "__main__":
    raise SystemExit(main())
