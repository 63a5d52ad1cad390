"""`verify` of a whole dataset against DuckDB's count and hash aggregate over the source alone.

    python -m benchmarks.bench_verify            # 10,000,000 taxi rows, bucket(50, PULocationID), 3 rounds
    python -m benchmarks.bench_verify --quick    # 1,000,000 rows, 3 rounds

Data: the taxi-like rows of `bench_refresh` (`write_taxi_files`, 1M-row Parquet files), accelerated once
(parquet engine, `bucket(50, PULocationID)`, strategy arrow) before the timed rounds.

Contenders, in shuffled order per round (`benchmarks/pairing.py`):

* verify: `verify_dataset` of every partition: the source read by DuckDB itself in one aggregate
  grouped by partition (count and row hash per `PULocationID`, mapped to the 50 buckets afterwards); the
  acceleration's 50 partitions known by their certificates once their files' bytes match the SHA-256s
  the catalog records (read while DuckDB aggregates the source);
* verify --deep: the same, every partition's files read back and hashed instead;
* anchor: one DuckDB query over the source files alone: `count(*)` and the sum of the project's row
  hash (`row_hash.row_expression`: `hash(row(...))` with the -0.0 flag of each float column), what any
  check of the source against a certificate must compute;
* plain: the same with `sum(hash(row(<every column>)))`, no -0.0 flags (not the project's hash: a
  floor, printed for comparison).

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

from benchmarks import load
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
    from airflow_partitions.write.row_hash import row_expression

    scratch = Path(tempfile.mkdtemp(prefix="bench-verify-"))
    try:
        source = scratch / "taxi"
        write_taxi_files(source, rows)
        spec = write_spec(scratch, source)
        refresh_dataset(spec, "trips", strategy="arrow")
        file_schema = pq.read_schema(next(source.glob("*.parquet")))
        plain_row = "hash(row(" + ", ".join(quote_identifier(c) for c in file_schema.names) + "))"
        files = f"read_parquet('{source}/*.parquet')"
        anchor_sql = f"SELECT count(*), sum({row_expression(file_schema)}::HUGEINT) FROM {files}"
        plain_sql = f"SELECT count(*), sum({plain_row}::HUGEINT) FROM {files}"

        def verify() -> Any:
            return verify_dataset(spec, "trips", record=False)

        def deep() -> Any:
            return verify_dataset(spec, "trips", record=False, deep=True)

        def query(sql: str) -> Any:
            with duckdb.connect() as connection:
                return connection.execute(sql).fetchall()

        measured = run_rounds(
            {
                "verify": verify,
                "deep": deep,
                "anchor": lambda: query(anchor_sql),
                "plain": lambda: query(plain_sql),
            },
            rounds,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report = measured.results["verify"]
    assert report.ok, "an unchanged dataset verifies clean"
    assert measured.results["deep"].ok
    assert sum(c.source_rows for c in report.partitions) == rows == measured.results["anchor"][0][0]
    checked = report.checked_by()
    print(f"\n{rows:,} rows, bucket(50, PULocationID), parquet engine, {rounds} rounds (median)")
    print(
        f"  verify   {measured.median_seconds('verify'):8.3f} s  ({len(report.partitions)} partitions, "
        f"{checked['certificate']} by certificate, source read: {report.source_read})"
    )
    print(f"  --deep   {measured.median_seconds('deep'):8.3f} s  (every partition's files read and hashed)")
    print(f"  anchor   {measured.median_seconds('anchor'):8.3f} s  (DuckDB count + row hash over the source)")
    print(f"  plain    {measured.median_seconds('plain'):8.3f} s  (DuckDB count + plain hash(row(...)))")
    print()
    figure = "verify / DuckDB count(*) + hash aggregate over the source"
    print(figure_line(figure, measured.ratio("verify", "anchor"), VERIFY_TARGET))
    print(figure_line("verify --deep / the same anchor", measured.ratio("deep", "anchor"), None))
    print(figure_line("verify / plain hash(row(...)) aggregate", measured.ratio("verify", "plain"), None))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000,000 rows, 3 rounds")
    parser.add_argument("--rows", type=int, default=None, help="source rows (default 10,000,000)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default 3)")
    args = load.parse_args(parser, argv)
    rows = args.rows or (1_000_000 if args.quick else 10_000_000)
    rounds = args.rounds or 3
    run(rows, rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
