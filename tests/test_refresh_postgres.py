"""Refreshing from the real Postgres: scan once through Spark JDBC, or push each partition's range down.

The issue's scenario: create a table, refresh, update rows in two partitions, refresh again, and exactly
those two partitions are rewritten.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import psycopg
import pytest

from airflow_partitions.catalog import open_catalog
from airflow_partitions.refresh import Reason, plan_refresh, refresh_dataset
from airflow_partitions.sources import open_source
from airflow_partitions.spec import load_spec
from airflow_partitions.spec.model import ProjectSpec
from airflow_partitions.storage import get_storage

pytestmark = pytest.mark.postgres


def create_orders(url: str, rows: int = 48) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE public.orders (id bigint PRIMARY KEY, customer text, total numeric(12, 2), "
            "placed_at timestamptz NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())"
        )
        conn.execute("CREATE INDEX orders_placed ON public.orders (placed_at)")
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO public.orders (id, customer, total, placed_at) VALUES (%s, %s, %s, %s)",
                [
                    (
                        i,
                        None if i % 7 == 0 else f"c'{i % 5}",
                        f"{i * 1.25:.2f}",
                        dt.datetime(2026, 2, 1 + i % 4, i % 24, tzinfo=dt.UTC),
                    )
                    for i in range(rows)
                ],
            )


def write_spec(tmp_path: Path, url: str, partition_by: str, *, reader: str = "jdbc") -> ProjectSpec:
    (tmp_path / "spec.yaml").write_text(
        "accelerator_dir: acc\n"
        "datasets:\n"
        "  - name: orders\n"
        "    from: postgres:public.orders\n"
        f"    params: {{url: '{url}', reader: {reader}}}\n"
        "    acceleration:\n"
        "      engine: parquet\n"
        f"      partition_by: [{partition_by}]\n"
        "      refresh: {check_column: updated_at}\n"
    )
    return load_spec(tmp_path / "spec.yaml")


def accelerated_rows(project: ProjectSpec) -> tuple[Any, list[dict[str, Any]]]:
    dataset = project.dataset("orders")
    catalog = open_catalog(project, dataset)
    snapshot = catalog.latest()
    assert snapshot is not None
    assert catalog.data_root is not None
    files = [f for entry in snapshot.partitions.values() for f in entry.files]
    table = get_storage(dataset.acceleration).read(catalog.data_root, files)
    return snapshot, sorted(table.to_pylist(), key=lambda r: r["id"])


def source_rows(project: ProjectSpec) -> list[dict[str, Any]]:
    return sorted(open_source(project.dataset("orders").source).read_all().to_pylist(), key=lambda r: r["id"])


@pytest.mark.spark
@pytest.mark.parametrize("reader", ["jdbc", "adbc"])
def test_update_in_two_partitions_rewrites_exactly_those(
    spark: Any, pg_database: str, tmp_path: Path, reader: str
) -> None:
    create_orders(pg_database)
    project = write_spec(tmp_path, pg_database, '{b: "bucket(6, id)"}', reader=reader)
    first = refresh_dataset(project, "orders", spark=spark)
    assert first.stage_mode == "written", "bucket has no range to push down: one Spark scan of the table"
    before, rows = accelerated_rows(project)
    assert rows == source_rows(project), "the acceleration equals the table row for row"

    dataset = project.dataset("orders")
    bucket = dataset.bind(open_source(dataset.source).schema()).partition_by[0].transform
    targets: dict[int, int] = {}
    for order_id in range(48):
        targets.setdefault(bucket.apply_scalar(order_id), order_id)
        if len(targets) == 2:
            break
    with psycopg.connect(pg_database, autocommit=True) as conn:
        for order_id in targets.values():
            conn.execute(
                "UPDATE public.orders SET total = total + 100, updated_at = now() + interval '1 minute' "
                "WHERE id = %s",
                (order_id,),
            )

    plan = plan_refresh(project, "orders")
    changed = {item.key_path for item in plan.items}
    assert changed == {f"b={b}" for b in targets}
    assert {item.reason for item in plan.items} == {Reason.CHANGED}
    assert plan.unchanged == 5, "the other 4 buckets and the NULL partition"

    refresh_dataset(project, "orders", spark=spark)
    after, rows = accelerated_rows(project)
    assert after.version == before.version + 1
    for key_path, entry in after.partitions.items():
        if key_path in changed:
            assert entry.files != before.partitions[key_path].files, f"{key_path} was updated in the source"
        else:
            assert entry.files == before.partitions[key_path].files, f"{key_path} must not be rewritten"
    assert rows == source_rows(project)


def test_indexed_range_partitions_are_read_by_pushdown(pg_database: str, tmp_path: Path) -> None:
    create_orders(pg_database)
    project = write_spec(tmp_path, pg_database, "{day: \"date_trunc('day', placed_at)\"}")
    summary = refresh_dataset(project, "orders")
    assert summary.stage_mode == "pushdown", "placed_at is indexed: each day is one range query, no Spark"
    assert summary.plan["new"] == 4
    before, rows = accelerated_rows(project)
    assert rows == source_rows(project)

    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO public.orders (id, customer, total, placed_at) "
            "VALUES (1000, 'new', 1.00, '2026-02-03 05:00:00+00')"
        )
        conn.execute("DELETE FROM public.orders WHERE placed_at < '2026-02-02'")
    plan = plan_refresh(project, "orders")
    assert [(i.key_path, i.reason) for i in plan.items] == [
        ("day=2026-02-03T00%3A00%3A00%2B00%3A00", Reason.CHANGED)
    ]
    assert plan.removed == ("day=2026-02-01T00%3A00%3A00%2B00%3A00",)
    refresh_dataset(project, "orders")
    after, rows = accelerated_rows(project)
    assert rows == source_rows(project)
    assert "day=2026-02-01T00%3A00%3A00%2B00%3A00" not in after.partitions
    unchanged = "day=2026-02-02T00%3A00%3A00%2B00%3A00"
    assert after.partitions[unchanged].files == before.partitions[unchanged].files


def test_multi_bucket_from_postgres_is_not_pushed_down_and_keeps_every_row(
    pg_database: str, tmp_path: Path
) -> None:
    """No Postgres form (no Murmur3 there): discovery groups by the raw columns and the survey says why;
    the refresh reads the table and routes the rows in process, each to the bucket every engine gives it."""
    create_orders(pg_database)
    project = write_spec(
        tmp_path,
        pg_database,
        '{mb: "multi_bucket(8, customer, id)"}, {day: "date_trunc(\'day\', placed_at)"}',
    )
    plan = plan_refresh(project, "orders")
    assert any("no Murmur3" in note for note in plan.notes), plan.notes
    summary = refresh_dataset(project, "orders", strategy="arrow")
    assert summary.stage_mode == "arrow"
    snapshot, rows = accelerated_rows(project)
    assert rows == source_rows(project)
    # Every partition holds exactly the rows whose bucket is its own (Arrow's kernel over the source).
    dataset = project.dataset("orders")
    source = open_source(dataset.source).read_all()
    bound = dataset.bind(source.schema).acceleration.partition_by[0].transform
    expected = sorted({f"mb={b}" for b in bound.apply_table(source).to_pylist()})
    assert sorted({key.split("/")[0] for key in snapshot.partitions}) == expected
