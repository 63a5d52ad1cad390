"""`verify` of a whole dataset against DuckDB's count and hash aggregate over the source alone.

    python -m benchmarks.bench_verify            # 10,000,000 taxi rows, bucket(50, PULocationID), 3 rounds
    python -m benchmarks.bench_verify --quick    # 1,000,000 rows, 3 rounds

Data: the taxi-like rows of `bench_refresh` (`write_taxi_files`, 1M-row Parquet files), accelerated once
(parquet engine, `bucket(50, PULocationID)`, strategy arrow) before the timed rounds.

Contenders, in shuffled order per round (`benchmarks/pairing.py`):

* verify: `verify_dataset` of every partition: the source read as typed Arrow, each row's partition
  computed by the dataset's transform, count and row hash per partition in DuckDB; the acceleration's 50
  partitions read back from their files and hashed the same way, and compared with their certificates;
* anchor: one DuckDB query over the source files alone: `count(*)` and `sum(hash(row(<every column>)))`.

Figure: verify time / anchor time (goal <= 1.5 at 10M rows): what it costs to check both sides per
partition over one unpartitioned hash of one side.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import textwrap
from pathlib import Path
from typing import Any

from benchmarks.bench_refresh import write_taxi_files
from benchmarks.pairing import Target, figure_line, run_rounds

VERIFY_TARGET = Target("<=", 1.5)


def write_spec(root: Path, source: Path) -> Path:
    spec = root / "spec.yaml"
    spec.write_text(
        textwrap.dedent(
            f"""\
            accelerator_dir: {root / "acc"}
            datasets:
              - name: trips
                from: file:{source}
                params: {{file_format: parquet}}
                acceleration:
                  engine: parquet
                  partition_by:
                    - loc: "bucket(50, PULocationID)"
            """
        ),
        encoding="utf-8",
    )
    return spec


def run(rows: int, rounds: int) -> None:
    import duckdb
    import pyarrow.parquet as pq

    from airflow_partitions.quoting import quote_identifier
    from airflow_partitions.refresh import refresh_dataset
    from airflow_partitions.refresh.verify import verify_dataset

    scratch = Path(tempfile.mkdtemp(prefix="bench-verify-"))
    try:
        source = scratch / "taxi"
        write_taxi_files(source, rows)
        spec = write_spec(scratch, source)
        refresh_dataset(spec, "trips", strategy="arrow")
        columns = pq.read_schema(next(source.glob("*.parquet"))).names
        row = "hash(row(" + ", ".join(quote_identifier(c) for c in columns) + "))"
        anchor_sql = f"SELECT count(*), sum({row}) FROM read_parquet('{source}/*.parquet')"

        def verify() -> Any:
            return verify_dataset(spec, "trips", record=False)

        def anchor() -> Any:
            with duckdb.connect() as connection:
                return connection.execute(anchor_sql).fetchall()

        measured = run_rounds({"verify": verify, "anchor": anchor}, rounds)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report = measured.results["verify"]
    assert report.ok, "an unchanged dataset verifies clean"
    assert sum(c.source_rows for c in report.partitions) == rows == measured.results["anchor"][0][0]
    print(f"\n{rows:,} rows, bucket(50, PULocationID), parquet engine, {rounds} rounds (median)")
    print(f"  verify   {measured.median_seconds('verify'):8.3f} s  ({len(report.partitions)} partitions)")
    print(f"  anchor   {measured.median_seconds('anchor'):8.3f} s  (DuckDB count + hash over the source)")
    print()
    figure = "verify / DuckDB count(*) + hash aggregate over the source"
    print(figure_line(figure, measured.ratio("verify", "anchor"), VERIFY_TARGET))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000,000 rows, 3 rounds")
    parser.add_argument("--rows", type=int, default=None, help="source rows (default 10,000,000)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default 3)")
    args = parser.parse_args(argv)
    rows = args.rows or (1_000_000 if args.quick else 10_000_000)
    rounds = args.rounds or 3
    run(rows, rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
