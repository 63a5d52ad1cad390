"""`to_spark(bucketed=True)`: two bucketed datasets join in Spark without an Exchange, with the same rows
as DuckDB joining the sources."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from test_pruning_support import build_acceleration

from airflow_partitions.exceptions import SparkLayoutError

pytestmark = pytest.mark.spark


def orders(rows: int) -> pa.Table:
    return pa.table(
        {
            "order_id": pa.array(range(rows), pa.int64()),
            "customer_id": pa.array(
                [None if i % 17 == 0 else (i * 7) % 150 for i in range(rows)], pa.int64()
            ),
            "note": pa.array([["a/b", "k=v", "Zürich", "", None][i % 5] for i in range(rows)], pa.string()),
        }
    )


def customers(rows: int) -> pa.Table:
    return pa.table(
        {
            "customer_id": pa.array([None if i % 23 == 0 else i for i in range(rows)], pa.int64()),
            "name": pa.array([f"c{i} '%'" for i in range(rows)], pa.string()),
        }
    )


@contextlib.contextmanager
def no_broadcast(spark: Any) -> Iterator[None]:
    """Small test frames would be broadcast (a BroadcastExchange); the test is about shuffles."""
    previous = spark.conf.get("spark.sql.autoBroadcastJoinThreshold")
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")
    try:
        yield
    finally:
        spark.conf.set("spark.sql.autoBroadcastJoinThreshold", previous)


def physical_plan(frame: Any) -> str:
    return str(frame._jdf.queryExecution().executedPlan().toString())


def test_bucketed_frames_join_without_an_exchange(tmp_path: Path, spark: Any) -> None:
    left_source, right_source = orders(3000), customers(200)
    left = build_acceleration(
        tmp_path / "orders", left_source, [("cb", "bucket(8, customer_id)")], dataset="orders"
    )
    right = build_acceleration(
        tmp_path / "customers", right_source, [("cb", "bucket(8, customer_id)")], dataset="customers"
    )
    with left.reader() as orders_reader, right.reader() as customers_reader, no_broadcast(spark):
        frame_o = orders_reader.to_spark(spark, bucketed=True)
        frame_c = customers_reader.to_spark(spark, bucketed=True)
        assert frame_o.rdd.getNumPartitions() == 8, "one Spark partition per bucket"
        joined = frame_o.join(frame_c, "customer_id")
        plain = orders_reader.to_spark(spark).join(customers_reader.to_spark(spark), "customer_id")
        assert "Exchange" not in physical_plan(joined), physical_plan(joined)
        assert "Sort " not in physical_plan(joined), "each partition is already sorted by the key"
        assert "Exchange" in physical_plan(plain), "the same join of plain frames shuffles both sides"
        outer = frame_o.join(frame_c, "customer_id", "left")
        assert "Exchange" not in physical_plan(outer)
        got = sorted(tuple(row) for row in joined.select("order_id", "customer_id", "name").collect())
        got_outer = sorted(
            (row[0], row[1], row[2] or "")
            for row in outer.select("order_id", "customer_id", "name").collect()
        )
    reference = duckdb.connect()
    reference.register("o", left_source)
    reference.register("c", right_source)
    expected = sorted(
        reference.sql("SELECT order_id, customer_id, name FROM o JOIN c USING (customer_id)").fetchall()
    )
    expected_outer = sorted(
        (row[0], row[1], row[2] or "")
        for row in reference.sql(
            "SELECT o.order_id, o.customer_id, c.name FROM o LEFT JOIN c USING (customer_id)"
        ).fetchall()
    )
    assert got == expected, "inner join rows equal DuckDB over the sources (NULL keys match nothing)"
    assert got_outer == expected_outer, "every order kept by the left join, NULL keys included"


def test_bucketed_needs_a_bucket_field(tmp_path: Path, spark: Any) -> None:
    acc = build_acceleration(tmp_path, orders(50), [("note", "note")], dataset="orders")
    with acc.reader() as reader, pytest.raises(SparkLayoutError, match="no bucket"):
        reader.to_spark(spark, bucketed=True)
    bucketed = build_acceleration(tmp_path / "b", orders(50), [("cb", "bucket(4, customer_id)")])
    with bucketed.reader() as reader, pytest.raises(SparkLayoutError, match="include it in columns"):
        reader.to_spark(spark, bucketed=True, columns=["order_id"])
