"""Side indexes: a point lookup on a non-partition, high-cardinality column with and without the index,
and what building the index adds to writing the files.

    python -m benchmarks.bench_index            # 10,000,000 rows, 50 partitions, 10 files each
    python -m benchmarks.bench_index --quick    # 200,000 rows, 50 partitions, 4 files each

Data: `id` (int64, the partition column: `bucket(50, id)`), `user_id` (int64, random over 0..10^12: every
file's min / max spans nearly the whole range, so statistics cannot skip a file), `amount` (double),
`country` (string, 6 values), `ts` (timestamp). Two
accelerations of the same rows, written with the real parquet engine and committed to the real catalog:
`indexed` (`index_columns: [user_id]`, fpp 0.01) and `plain` (none). Files are capped at
`rows / 50 / files_per_partition` rows, so a partition holds several files and skipping one matters.

Figures (median of per-round ratios, rounds shuffled, see `pairing.py`):

* point lookup: `reader.read("user_id = v")` of a value present in one file (a fresh value per call, so
  no plan cache helps either side), ours with the index / ours without it (goal ≤ 0.3);
* build cost: writing one partition's rows as its files (`storage.write`: parquet, stats, checksums) with
  the index / without (goal ≤ 1.15). Files of one row group (all of them here) get no Parquet bloom
  filter (`ParquetStorage._bloom_filter_options`), so this is the catalog side index's cost.
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_partitions.catalog import Catalog, LocalStore, PartitionEntry, PartitionSpecInfo
from airflow_partitions.keys import PartitionKey
from airflow_partitions.read import PartitionedDatasetReader
from airflow_partitions.storage import IndexConfig, get_storage
from airflow_partitions.transforms import parse_transform
from benchmarks import load
from benchmarks.pairing import Target, figure_line, run_rounds

SEED = 17
PARTITIONS = 50
LOOKUP_TARGET = Target("<=", 0.3)
BUILD_TARGET = Target("<=", 1.15)


def make_table(rows: int) -> pa.Table:
    rng = np.random.default_rng(SEED)
    return pa.table(
        {
            "id": pa.array(np.arange(rows), pa.int64()),
            "user_id": pa.array(rng.integers(0, 10**12, rows), pa.int64()),
            "amount": pa.array(rng.random(rows) * 100, pa.float64()),
            "country": pa.array(np.array(["DE", "FR", "US", "ES", "IT", "NL"])[rng.integers(0, 6, rows)]),
            "ts": pa.array(
                rng.integers(1_700_000_000_000_000, 1_800_000_000_000_000, rows), pa.timestamp("us")
            ),
        }
    )


def partitions_of(table: pa.Table) -> list[tuple[int, pa.Table]]:
    transform = parse_transform(f"bucket({PARTITIONS}, id)").bind(pa.int64())
    buckets = transform.apply(table.column("id")).to_numpy(zero_copy_only=False)
    order = np.argsort(buckets, kind="stable")
    bounds = np.flatnonzero(np.diff(buckets[order])) + 1
    return [(int(buckets[chunk[0]]), table.take(pa.array(chunk))) for chunk in np.split(order, bounds)]


def write_acceleration(base: Path, name: str, parts: list[tuple[int, pa.Table]], storage: object) -> None:
    canonical = parse_transform(f"bucket({PARTITIONS}, id)").canonical
    spec = PartitionSpecInfo.from_fields([("b", canonical)])
    root = base / name
    root.mkdir(parents=True, exist_ok=True)
    entries = []
    for value, rows in parts:
        key = PartitionKey((value,))
        written = storage.write(rows, root, key.path(["b"]))  # type: ignore[attr-defined]
        entries.append(PartitionEntry.from_files(key, spec, written))
    catalog = Catalog(LocalStore(base), name, storage=storage)  # type: ignore[arg-type]
    catalog.commit(base_version=None, upserts=entries, partition_spec=spec)


def write_spec(base: Path, source: Path, file_rows: int) -> Path:
    path = base / "datasets.yaml"
    common = f"""
                from: file:{source}
                acceleration:
                  engine: parquet
                  partition_by:
                    - b: "bucket({PARTITIONS}, id)\""""
    path.write_text(
        textwrap.dedent(
            f"""\
            accelerator_dir: {base}
            datasets:
              - name: indexed{common}
                  params: {{index_columns: [user_id], max_rows_per_file: {file_rows}}}
              - name: plain{common}
                  params: {{max_rows_per_file: {file_rows}}}
            """
        ),
        encoding="utf-8",
    )
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="200,000 rows, 4 files per partition")
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--files-per-partition", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    args = load.parse_args(parser, argv)
    rows = args.rows or (200_000 if args.quick else 10_000_000)
    per_partition = args.files_per_partition or (4 if args.quick else 10)
    rounds = args.rounds or (5 if args.quick else 9)
    file_rows = max(1, -(-rows // PARTITIONS // per_partition))
    base = Path(tempfile.mkdtemp(prefix="bench-index-"))
    try:
        table = make_table(rows)
        source = base / "source.parquet"
        pq.write_table(table, source)
        parts = partitions_of(table)
        indexed = get_storage("parquet", max_rows_per_file=file_rows, index=IndexConfig(("user_id",)))
        plain = get_storage("parquet", max_rows_per_file=file_rows)
        write_acceleration(base, "indexed", parts, indexed)
        write_acceleration(base, "plain", parts, plain)
        spec = write_spec(base, source, file_rows)
        files = sum(1 for _ in (base / "indexed").rglob("*.parquet"))
        print(
            f"{rows:,} rows, {PARTITIONS} partitions, {files} files of up to {file_rows:,} rows; "
            f"{rounds} rounds"
        )

        # A fresh present value per call: no plan cache helps either side.
        rng = np.random.default_rng(SEED + 1)
        probes = itertools.cycle(
            table.column("user_id").take(pa.array(rng.integers(0, rows, 4 * rounds + 8))).to_pylist()
        )
        readers = {name: PartitionedDatasetReader(spec, name) for name in ("indexed", "plain")}
        checked: dict[str, int] = {}

        def lookup(name: str) -> int:
            value = next(probes)
            result = readers[name].read(f"user_id = {value}")
            expected = pc.sum(pc.equal(table.column("user_id"), value)).as_py()
            assert result.num_rows == expected, f"{name}: user_id = {value}: {result.num_rows} != {expected}"
            checked[name] = checked.get(name, 0) + 1
            return result.num_rows

        plan = readers["indexed"].plan(f"user_id = {table.column('user_id')[0].as_py()}")
        print(
            f"plan of one lookup with the index: {len(plan.files)} of {files} file(s) read, "
            f"{plan.files_skipped_by_index} skipped by index"
        )
        measured = run_rounds(
            {"indexed": lambda: lookup("indexed"), "plain": lambda: lookup("plain")}, rounds
        )
        print(
            f"  point lookup medians: with index {measured.median_seconds('indexed') * 1000:.1f} ms, "
            f"without {measured.median_seconds('plain') * 1000:.1f} ms"
        )
        print(
            figure_line(
                "point lookup, ours with index / ours without",
                measured.ratio("indexed", "plain"),
                LOOKUP_TARGET,
            )
        )
        for reader in readers.values():
            reader.close()

        # Build cost: one partition's rows written as its files, with and without the index.
        _, one = max(parts, key=lambda p: p[1].num_rows)
        scratch = base / "writes"
        writes = run_rounds(
            {
                "indexed": lambda: indexed.write(one, scratch / "indexed", "b=0"),
                "plain": lambda: plain.write(one, scratch / "plain", "b=0"),
            },
            rounds,
        )
        sizes = [
            len(f.index["user_id"].bloom_text or "")
            for f in writes.results["indexed"]
            if "user_id" in f.index
        ]
        print(
            f"  write medians ({one.num_rows:,} rows): "
            f"with index {writes.median_seconds('indexed') * 1000:.1f} ms, "
            f"without {writes.median_seconds('plain') * 1000:.1f} ms; "
            f"catalog index {sum(sizes) / max(len(sizes), 1) / 1024:.1f} KiB per file (base64)"
        )
        print(
            figure_line(
                "build cost, file write with index / without", writes.ratio("indexed", "plain"), BUILD_TARGET
            )
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
