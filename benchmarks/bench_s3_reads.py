"""Cold point reads with the partition files on S3 (a moto server over HTTP), first and repeat reads.

    python -m benchmarks.bench_s3_reads            # 2,000,000 rows, 50 bucket files
    python -m benchmarks.bench_s3_reads --quick    # 300,000 rows

Data: rows with a skewed key (`zone`): one cold value holds a few hundred rows. The acceleration is
`bucket(50, zone)`, written with the real Parquet engine and committed to the real catalog, then uploaded
to the moto server (its own process, as a real endpoint would be).

Measured, each against the anchor in the same run: a full scan of the same files on S3 through pyarrow's
`S3FileSystem` with DuckDB's filter pushdown (`read_parquet` cannot open remote files here; DuckDB scans
the pyarrow dataset, reading footers and only the row groups the filter keeps, ranged requests).

* first read: `reader.read("zone = <cold>")` on a reader with an empty file cache and no footer kept in
  the process (`forget_footers`): the one selected file is fetched with one GET, verified and cached; vs
  the anchor on a fresh connection: target >= 4x;
* first read by ranges: the same first read with every file over the ranged-read threshold
  (`ranged_read_min_bytes=0`): the footer and the row groups the filter may need, not the whole file,
  by ranged GETs of the catalog's sizes (the reader's own S3 settings; files of 8 MiB or more record
  their layout when written, so the footer and the row groups go out in one round and the schema needs
  no GET: at 10M rows in 5 files that is one GET, where the anchor sends 8 GETs and 6 HEADs); in the same
  rounds, `ranged, pyarrow` reads the same ranges through a given pyarrow S3 filesystem (`filesystem=`);
* repeat read: the same read again (the file comes from the local cache, its footer from DuckDB's
  metadata cache: no request at all) vs the anchor repeating its read too, on one connection and one
  pyarrow dataset kept across reads (as `bench_pruning` measures it; a fresh anchor connection per read
  would flatter ours): target >= 10x. Each sample is ten reads back to back on each side.

Each sample runs ours and the anchor in a shuffled order; the figure is the anchor's time over ours per
pair: median and min-max.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_partitions.catalog import Catalog, LocalStore, PartitionEntry, PartitionSpecInfo
from airflow_partitions.keys import PartitionKey
from airflow_partitions.objectstore import S3Settings
from airflow_partitions.read import PartitionedDatasetReader, new_duckdb_connection
from airflow_partitions.storage import get_storage
from airflow_partitions.storage.parquet import forget_footers
from airflow_partitions.transforms import parse_transform
from benchmarks import load
from benchmarks.pairing import Ratio, Target, repeated, run_rounds
from benchmarks.support import moto_server

BUCKETS = 50
COLD_ZONE = 264
ZONES = 265
SEED = 11
TARGETS = {
    "first read": Target(">=", 4),
    "first, ranged": Target(">=", 4),
    "ranged, pyarrow": Target(">=", 4),
    "repeat read": Target(">=", 10),
}


def make_rows(rows: int) -> pa.Table:
    """`rows` rows whose `zone` is Zipf-like over 264 values; the cold zone holds one in 10,000."""
    rng = np.random.default_rng(SEED)
    cold = max(50, rows // 10_000)
    others = np.array([zone for zone in range(1, ZONES + 1) if zone != COLD_ZONE])
    weights = 1.0 / np.arange(1, len(others) + 1) ** 0.8
    zones = np.concatenate(
        [np.full(cold, COLD_ZONE), rng.choice(others, size=rows - cold, p=weights / weights.sum())]
    )
    rng.shuffle(zones)
    return pa.table(
        {
            "id": pa.array(np.arange(rows), pa.int64()),
            "zone": pa.array(zones, pa.int64()),
            "amount": pa.array(np.round(rng.exponential(20.0, size=rows), 2), pa.float64()),
            "distance": pa.array(rng.random(rows) * 30, pa.float64()),
            "flag": pa.array(np.where(rng.random(rows) < 0.01, "Y", "N"), pa.string()),
        }
    )


def build(base: Path, table: pa.Table, buckets: int = BUCKETS) -> tuple[Catalog, Path, Path]:
    """The bucketed acceleration under `base/points`, its catalog and its spec file."""
    expression = f"bucket({buckets}, zone)"
    bound = parse_transform(expression).bind(pa.int64())
    codes = pc.dictionary_encode(bound.apply(table.column("zone"))).combine_chunks()
    indices = codes.indices.to_numpy(zero_copy_only=False)
    spec = PartitionSpecInfo.from_fields([("zone_bucket", bound.canonical)])
    # As a refresh writes them: sorted by the bucket's source column, 32k-row groups.
    storage = get_storage("parquet", sort_by=("zone",))
    root = base / "points"
    entries = []
    for code in np.unique(indices):
        key = PartitionKey((codes.dictionary[int(code)].as_py(),))
        written = storage.write(
            table.take(pa.array(np.flatnonzero(indices == code))), root, key.path(["zone_bucket"])
        )
        entries.append(PartitionEntry.from_files(key, spec, written))
    catalog = Catalog(LocalStore(base), "points", storage=storage)
    catalog.commit(base_version=None, upserts=entries, partition_spec=spec)
    source = base / "source.parquet"
    import pyarrow.parquet as pq

    pq.write_table(table.slice(0, 1), source)
    spec_path = base / "datasets.yaml"
    spec_path.write_text(
        textwrap.dedent(
            f"""\
            accelerator_dir: {base}
            datasets:
              - name: points
                from: file:{source}
                acceleration:
                  engine: parquet
                  partition_by:
                    - zone_bucket: "{expression}"
            """
        ),
        encoding="utf-8",
    )
    return catalog, root, spec_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="rows of the dataset")
    parser.add_argument("--samples", type=int, default=15, help="paired samples per case")
    parser.add_argument("--buckets", type=int, default=BUCKETS, help="bucket files (fewer: larger files)")
    parser.add_argument("--quick", action="store_true", help="300,000 rows, 7 samples")
    args = load.parse_args(parser, argv)
    rows, samples = (300_000, 7) if args.quick else (args.rows, args.samples)
    base = Path(tempfile.mkdtemp(prefix="bench-s3-reads-"))
    try:
        run(base, rows, samples, args.buckets)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


def run(base: Path, rows: int, samples: int, buckets: int = BUCKETS) -> None:
    import boto3
    import pyarrow.dataset as ds

    print(f"generating and writing {rows:,} rows in {buckets} bucket files ...", flush=True)
    catalog, root, spec_path = build(base, make_rows(rows), buckets)
    local_files = sorted(path for path in root.rglob("*.parquet"))
    where = f"zone = {COLD_ZONE}"
    results: dict[str, Ratio] = {}
    times: dict[str, str] = {}  # per case: median wall and CPU seconds of each side
    with moto_server() as settings:
        client: Any = boto3.client("s3", **settings)  # type: ignore[call-overload]
        client.create_bucket(Bucket="lake")
        for path in local_files:
            client.upload_file(str(path), "lake", f"points/{path.relative_to(root).as_posix()}")
        filesystem = S3Settings.from_mapping(settings).arrow_filesystem()
        remote = [f"lake/points/{path.relative_to(root).as_posix()}" for path in local_files]

        def reader(
            cache: Path, ranged_from: int | None = None, *, through_pyarrow: bool = False
        ) -> PartitionedDatasetReader:
            return PartitionedDatasetReader(
                spec_path,
                "points",
                catalog=catalog,
                data_root="s3://lake/points",
                # The reader's own S3 reads (ranged GETs of known size), or a given pyarrow filesystem.
                s3_settings=settings,
                filesystem=filesystem if through_pyarrow else None,
                cache_dir=cache,
                ranged_read_min_bytes=ranged_from,  # None: whole files only
            )

        def anchor() -> pa.Table:
            connection = new_duckdb_connection(functions=False)  # cold: no footer cached
            try:
                connection.register("all_files", ds.dataset(remote, filesystem=filesystem, format="parquet"))
                return connection.sql(f"SELECT * FROM all_files WHERE {where}").to_arrow_table()
            finally:
                connection.close()

        expected = anchor()
        # Readers built beforehand (loading the spec is not the read); each reads once, cache empty.
        fresh_readers = iter([reader(base / f"first-{n}") for n in range(samples + 1)])

        def first_read() -> pa.Table:
            forget_footers()  # a first read: no footer kept from an earlier sample of this process
            with next(fresh_readers) as fresh:
                return fresh.read(where)

        got = first_read()
        assert got.num_rows == expected.num_rows, f"first read: {got.num_rows} rows vs {expected.num_rows}"
        # Both sides were just run once: no warm-up round (it would use up a fresh reader).
        rounds = run_rounds({"ours": first_read, "anchor": anchor}, samples, warmup=False, seed=SEED)
        results["first read"] = rounds.ratio("anchor", "ours")
        times["first read"] = f"{rounds.describe('ours')}; {rounds.describe('anchor')}"

        ranged_readers = iter([reader(base / f"ranged-{n}", 0) for n in range(samples + 1)])

        def ranged_read() -> pa.Table:
            forget_footers()
            with next(ranged_readers) as fresh:
                return fresh.read(where)

        # The same ranged read through a caller's pyarrow S3 filesystem (HEAD, pyarrow's pre-buffered
        # ranged reads through its Python file wrapper), in the same rounds.
        pyarrow_readers = iter(
            [reader(base / f"pyarrow-{n}", 0, through_pyarrow=True) for n in range(samples + 1)]
        )

        def pyarrow_read() -> pa.Table:
            forget_footers()
            with next(pyarrow_readers) as fresh:
                return fresh.read(where)

        for read in (ranged_read, pyarrow_read):
            got = read()
            assert got.sort_by("id").equals(expected.select(got.column_names).sort_by("id"))
        rounds = run_rounds(
            {"ours": ranged_read, "pyarrow": pyarrow_read, "anchor": anchor}, samples, warmup=False, seed=SEED
        )
        results["first, ranged"] = rounds.ratio("anchor", "ours")
        times["first, ranged"] = f"{rounds.describe('ours')}; {rounds.describe('anchor')}"
        results["ranged, pyarrow"] = rounds.ratio("anchor", "pyarrow")
        times["ranged, pyarrow"] = f"{rounds.describe('pyarrow')} (a given pyarrow filesystem)"

        warm = reader(base / "warm")
        got = warm.read(where)
        assert got.sort_by("id").equals(expected.select(got.column_names).sort_by("id"))
        # Both sides repeat: the anchor keeps its connection and dataset (what it caches) across reads.
        warm_anchor = new_duckdb_connection(functions=False)
        warm_anchor.register("all_files", ds.dataset(remote, filesystem=filesystem, format="parquet"))
        sql = f"SELECT * FROM all_files WHERE {where}"
        warm_anchor.sql(sql).to_arrow_table()

        rounds = run_rounds(
            {
                "ours": repeated(lambda: warm.read(where)),
                "anchor": repeated(lambda: warm_anchor.sql(sql).to_arrow_table()),
            },
            samples,
            warmup=False,
            seed=SEED,
        )
        results["repeat read"] = rounds.ratio("anchor", "ours")
        times["repeat read"] = f"{rounds.describe('ours')}; {rounds.describe('anchor')}"
        warm_anchor.close()
        warm.close()

    print()
    print(f"cold point read ({where}) vs a full scan of {len(remote)} files on S3 with pushdown:")
    print(f"{'case':14} anchor/ours median [min-max]")
    for case, ratio in results.items():
        print(f"{case:14} {ratio.format(TARGETS[case])}  ({expected.num_rows} rows, {samples} pairs)")
        print(f"{'':14} {times[case]} (CPU of this process; the S3 server runs in its own)")


if __name__ == "__main__":
    raise SystemExit(main())
