"""Spark joins of two datasets bucketed on the join key: `to_spark(bucketed=True)` frames vs plain frames.

    python -m benchmarks.bench_spark_joins            # 2,000,000 x 1,000,000 rows, bucket(16, key), 5 rounds
    python -m benchmarks.bench_spark_joins --quick    # 20,000 x 10,000 rows, 2 rounds

Both datasets are written once (parquet, `bucket(16, customer_id)`) and read with `to_spark`. Broadcast
joins are off (`spark.sql.autoBroadcastJoinThreshold = -1`): the case is two large sides, where Spark
shuffles both unless it knows their partitioning. Figures, per round in shuffled order:

* join: SUM over the inner join of the two `bucketed=True` frames (no Exchange: each is hash-partitioned
  by Spark and materialised once, when `to_spark` returns) / the same join of plain frames materialised
  the same way (`localCheckpoint`, no repartition), so both sides read from the same storage and the
  difference is the two shuffles the join no longer needs. Target ≤ 0.8.
* first join: `to_spark(bucketed=True)` of both datasets + the join / `to_spark()` of both + the join, each
  from the files: what one single join costs end to end. The bucketed frames pay their shuffle up front,
  so this only wins when a frame is joined (or grouped by its key) more than once; printed without target.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from benchmarks import load
from benchmarks.pairing import Target, figure_line, run_rounds

BUCKETS = 16


def make_tables(rows: int) -> tuple[pa.Table, pa.Table]:
    rng = np.random.default_rng(7)
    customers = rows // 2
    keys = rng.integers(0, customers, rows)
    orders = pa.table(
        {
            "order_id": pa.array(np.arange(rows), pa.int64()),
            "customer_id": pa.array(keys, pa.int64(), mask=rng.random(rows) < 0.01),
            "amount": pa.array(rng.integers(0, 10_000, rows), pa.int64()),
        }
    )
    people = pa.table(
        {
            "customer_id": pa.array(np.arange(customers), pa.int64()),
            "segment": pa.array(rng.integers(0, 10, customers), pa.int64()),
        }
    )
    return orders, people


def write_spec(directory: Path) -> Path:
    spec = directory / "spec.yaml"
    spec.write_text(
        textwrap.dedent(
            f"""\
            accelerator_dir: {directory / "acc"}
            datasets:
              - name: orders
                from: file:{directory / "absent-orders.parquet"}
                schema: {{order_id: int64, customer_id: int64, amount: int64}}
                acceleration:
                  engine: parquet
                  partition_by:
                    - cb: "bucket({BUCKETS}, customer_id)"
              - name: customers
                from: file:{directory / "absent-customers.parquet"}
                schema: {{customer_id: int64, segment: int64}}
                acceleration:
                  engine: parquet
                  partition_by:
                    - cb: "bucket({BUCKETS}, customer_id)"
            """
        ),
        encoding="utf-8",
    )
    return spec


def join_sum(left: Any, right: Any) -> tuple[int, int]:
    from pyspark.sql import functions as F

    row = left.join(right, "customer_id").agg(F.sum("amount"), F.sum("segment")).collect()[0]
    return int(row[0] or 0), int(row[1] or 0)


def run(rows: int, rounds: int) -> None:
    from airflow_partitions.read import PartitionedDatasetReader
    from airflow_partitions.refresh.spark_session import build_local_session
    from airflow_partitions.spec import load_spec
    from airflow_partitions.table import open_handle
    from airflow_partitions.write.commit import append

    scratch = Path(tempfile.mkdtemp(prefix="bench-spark-joins-"))
    try:
        orders, people = make_tables(rows)
        project = load_spec(write_spec(scratch))
        append(open_handle(project, project.dataset("orders")), orders)
        append(open_handle(project, project.dataset("customers")), people)
        spark = build_local_session(app_name="bench-spark-joins")
        spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")
        left_reader = PartitionedDatasetReader(project, "orders")
        right_reader = PartitionedDatasetReader(project, "customers")
        bucketed = (left_reader.to_spark(spark, bucketed=True), right_reader.to_spark(spark, bucketed=True))
        plain = (
            left_reader.to_spark(spark).localCheckpoint(eager=True),
            right_reader.to_spark(spark).localCheckpoint(eager=True),
        )
        plan = bucketed[0].join(bucketed[1], "customer_id")._jdf.queryExecution().executedPlan().toString()
        print(f"Spark join, {rows:,} x {rows // 2:,} rows, bucket({BUCKETS}, customer_id), {rounds} rounds")
        print(f"  Exchange in the bucketed join's plan: {'yes' if 'Exchange' in plan else 'no'}")
        joins = run_rounds(
            {"bucketed": lambda: join_sum(*bucketed), "plain": lambda: join_sum(*plain)}, rounds=rounds
        )
        if joins.results["bucketed"] != joins.results["plain"]:
            raise SystemExit(f"results differ: {joins.results}")
        first = run_rounds(
            {
                "bucketed": lambda: join_sum(
                    left_reader.to_spark(spark, bucketed=True), right_reader.to_spark(spark, bucketed=True)
                ),
                "plain": lambda: join_sum(left_reader.to_spark(spark), right_reader.to_spark(spark)),
            },
            rounds=rounds,
            warmup=False,
        )
        print(
            f"  plain join median {joins.median_seconds('plain'):.2f}s, bucketed "
            f"{joins.median_seconds('bucketed'):.2f}s"
        )
        print(
            figure_line(
                "join: bucketed frames / plain frames", joins.ratio("bucketed", "plain"), Target("<=", 0.8)
            )
        )
        print(
            figure_line("first join incl. to_spark: bucketed / plain", first.ratio("bucketed", "plain"), None)
        )
        left_reader.close()
        right_reader.close()
        spark.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="20,000 x 10,000 rows, 2 rounds")
    parser.add_argument("--rows", type=int, default=None, help="orders rows (customers: half as many)")
    args = load.parse_args(parser, argv)
    if args.quick:
        run(args.rows or 20_000, 2)
    else:
        run(args.rows or 2_000_000, 5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
