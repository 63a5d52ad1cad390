"""Discovery and change detection on real files and a real catalog (no Spark: Hive sources push down).

Static keys, dynamic SELECT DISTINCT, composites, the partition cap, timeouts, the diff against the
catalog (new / changed / unchanged / removed), selections, re-partitioning, and the XCom size of a plan.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_partitions.catalog import open_catalog
from airflow_partitions.exceptions import DiscoveryError, DiscoveryTimeoutError, TooManyPartitionsError
from airflow_partitions.refresh import Reason, RefreshPlan, plan_refresh, refresh_dataset
from airflow_partitions.refresh.discovery import discover, static_keys
from airflow_partitions.refresh.pipeline import bind_dataset
from airflow_partitions.sources import open_source
from airflow_partitions.spec import load_spec
from airflow_partitions.spec.model import ProjectSpec


def write_spec(
    tmp_path: Path, partition_by: list[str], *, source: str = "src", refresh: str = ""
) -> ProjectSpec:
    """A one-dataset spec; `name: expr` entries become the `{name: expr}` form."""
    fields = []
    for entry in partition_by:
        name, sep, expr = entry.partition(": ")
        fields.append(
            f"        - {{{name}: {json.dumps(expr)}}}" if sep else f"        - {json.dumps(entry)}"
        )
    lines = [
        "accelerator_dir: acc",
        "datasets:",
        "  - name: sales",
        f"    from: file:{source}",
        "    params: {file_format: parquet}",
        "    acceleration:",
        "      engine: parquet",
        "      partition_by:",
        *fields,
    ]
    if refresh:
        lines.append(f"      refresh: {refresh}")
    path = tmp_path / "spec.yaml"
    path.write_text("\n".join(lines) + "\n")
    return load_spec(path)


def rows(start: int, count: int, region: str | None) -> pa.Table:
    ids = list(range(start, start + count))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "amount": pa.array([float(i) for i in ids]),
            "ts": pa.array([dt.datetime(2026, 3, 1 + i % 3, 8) for i in ids], pa.timestamp("us")),
            "region": pa.array([region] * count, pa.string()),
        }
    )


def write_hive(root: Path, regions: dict[str, int]) -> None:
    """`root/region=<r>/part.parquet` with `count` rows each (region stays out of the file, as Hive does)."""
    start = 0
    for region, count in regions.items():
        directory = root / f"region={region}"
        directory.mkdir(parents=True, exist_ok=True)
        pq.write_table(rows(start, count, region).drop_columns(["region"]), directory / "part-0.parquet")
        start += count


def plan_for(project: ProjectSpec, **kwargs: object) -> RefreshPlan:
    return plan_refresh(project, "sales", **kwargs)  # type: ignore[arg-type]


# --- static and dynamic discovery -------------------------------------------------------------------


def test_static_buckets_expand_without_reading_rows(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    pq.write_table(rows(0, 5, "EU"), tmp_path / "src" / "a.parquet")
    project = write_spec(tmp_path, ["bucket(16, id)", "bucket(2, region)"])
    plan = plan_for(project)
    assert plan.discovery == "static"
    assert plan.discovered == 17 * 3, "every bucket combination (NULL too) is a partition, even empty ones"
    assert {item.reason for item in plan.items} == {Reason.NEW}
    assert plan.items[0].key == (0, 0)
    assert plan.items[0].key_path == "expr0=0/expr1=0"
    assert "expr0=%NULL/expr1=%NULL" in {item.key_path for item in plan.items}


def test_static_cap_is_checked_before_expanding() -> None:
    with pytest.raises(TooManyPartitionsError, match=r"make 1002001 partitions.*max_partitions \(10\)"):
        static_keys([1000, 1000], 10)


def test_dynamic_discovery_finds_distinct_values_including_null(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    pq.write_table(pa.concat_tables([rows(0, 4, "EU"), rows(4, 2, None)]), tmp_path / "src" / "a.parquet")
    project = write_spec(tmp_path, ["region: region", "day: date_trunc('day', ts)"])
    plan = plan_for(project)
    assert plan.discovery == "dynamic"
    keys = {item.partition_key.values for item in plan.items}
    assert keys == {
        ("EU", dt.datetime(2026, 3, 1)),
        ("EU", dt.datetime(2026, 3, 2)),
        ("EU", dt.datetime(2026, 3, 3)),
        (None, dt.datetime(2026, 3, 2)),
        (None, dt.datetime(2026, 3, 3)),
    }
    assert "region=%NULL/day=2026-03-02T00%3A00%3A00" in {item.key_path for item in plan.items}


def test_bucket_with_dynamic_field_keeps_only_combinations_with_rows(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    pq.write_table(pa.concat_tables([rows(0, 3, "EU"), rows(3, 1, "US")]), tmp_path / "src" / "a.parquet")
    project = write_spec(tmp_path, ["bucket(64, id)", "region"])
    plan = plan_for(project)
    assert plan.discovery == "dynamic"
    assert plan.discovered == 4, "4 rows with distinct ids: at most 4 of the 64 x 2 combinations hold rows"


def test_dynamic_cap_raises_too_many_partitions(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    pq.write_table(rows(0, 30, "EU"), tmp_path / "src" / "a.parquet")
    project = write_spec(tmp_path, ["id"], refresh="{max_partitions: 10}")
    with pytest.raises(TooManyPartitionsError, match=r"found 30 partitions.*max_partitions \(10\)"):
        plan_for(project)


def test_discovery_timeout_raises_a_typed_error(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    pq.write_table(rows(0, 30, "EU"), tmp_path / "src" / "a.parquet")
    project = write_spec(tmp_path, ["region"])
    with pytest.raises(DiscoveryTimeoutError, match="discovery_timeout"):
        plan_for(project, timeout_s=0.0)


def test_unknown_partition_column_is_reported_against_the_real_schema(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    pq.write_table(rows(0, 3, "EU"), tmp_path / "src" / "a.parquet")
    project = write_spec(tmp_path, ["regoin"])
    with pytest.raises(Exception, match=r"unknown column 'regoin' \(did you mean 'region'\?\)"):
        plan_for(project)


# --- the diff against the catalog --------------------------------------------------------------------


def test_incremental_refresh_rewrites_only_changed_hive_partitions(tmp_path: Path) -> None:
    write_hive(tmp_path / "src", {"EU": 4, "US": 3, "APAC": 2})
    project = write_spec(tmp_path, ["region: region"])
    first = refresh_dataset(project, "sales")
    assert first.stage_mode == "pushdown", "every field is a Hive column: partitions are read directly"
    assert first.plan["new"] == 3
    dataset = project.dataset("sales")
    before = open_catalog(project, dataset).latest()
    assert before is not None

    again = plan_for(project)
    assert again.items == ()
    assert again.unchanged == 3
    assert again.is_empty

    pq.write_table(
        rows(100, 5, "US").drop_columns(["region"]), tmp_path / "src" / "region=US" / "part-0.parquet"
    )
    os.utime(tmp_path / "src" / "region=US" / "part-0.parquet", ns=(5, 5))
    shutil.rmtree(tmp_path / "src" / "region=APAC")
    (tmp_path / "src" / "region=LATAM").mkdir()
    pq.write_table(
        rows(200, 1, "LATAM").drop_columns(["region"]), tmp_path / "src" / "region=LATAM" / "p.parquet"
    )

    plan = plan_for(project)
    assert {(i.key_path, i.reason) for i in plan.items} == {
        ("region=US", Reason.CHANGED),
        ("region=LATAM", Reason.NEW),
    }
    assert plan.removed == ("region=APAC",)
    summary = refresh_dataset(project, "sales")
    after = open_catalog(project, dataset).latest()
    assert after is not None
    assert after.version == before.version + 1
    assert set(after.partitions) == {"region=EU", "region=US", "region=LATAM"}, "APAC disappeared"
    assert after.partitions["region=EU"].files == before.partitions["region=EU"].files, "EU was not rewritten"
    assert after.partitions["region=US"].files != before.partitions["region=US"].files
    assert after.partitions["region=US"].rows == 5
    assert summary.refreshed == 2
    assert summary.removed == 1


def test_selection_forces_partitions_and_rejects_unknown_ones(tmp_path: Path) -> None:
    write_hive(tmp_path / "src", {"EU": 2, "US": 2, "a b": 1})
    project = write_spec(tmp_path, ["region: region"])
    refresh_dataset(project, "sales")
    plan = plan_for(project, partitions=["region=EU", "region=a b"])
    assert [(i.key_path, i.reason) for i in plan.items] == [
        ("region=EU", Reason.FORCED),
        ("region=a%20b", Reason.FORCED),
    ], "canonical key strings and name=value text both name a partition"
    assert plan_for(project, full=True).counts()["forced"] == 3
    by_where = plan_for(project, where="region IN ('US', 'a b')")
    assert {i.key_path for i in by_where.items} == {"region=US", "region=a%20b"}
    with pytest.raises(DiscoveryError, match=r"no partition 'region=XX'.*such as region=EU"):
        plan_for(project, partitions=["region=XX"])


def test_where_on_a_source_column_prunes_through_the_transform(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    pq.write_table(rows(0, 9, "EU"), tmp_path / "src" / "a.parquet")
    project = write_spec(tmp_path, ["day: date_trunc('day', ts)"])
    plan = plan_for(project, where="ts >= '2026-03-02 00:00:00'")
    assert [i.key_path for i in plan.items] == [
        "day=2026-03-02T00%3A00%3A00",
        "day=2026-03-03T00%3A00%3A00",
    ], "the 2026-03-01 partition cannot hold rows at or after 2026-03-02"
    by_field = plan_for(project, where="day < TIMESTAMP '2026-03-02'")
    assert [i.key_path for i in by_field.items] == ["day=2026-03-01T00%3A00%3A00"]


def test_changed_partition_spec_replaces_everything(tmp_path: Path) -> None:
    write_hive(tmp_path / "src", {"EU": 2, "US": 2})
    project = write_spec(tmp_path, ["region: region"])
    refresh_dataset(project, "sales")
    project = write_spec(tmp_path, ["area: region"])
    plan = plan_for(project)
    assert plan.replace_all
    assert {i.reason for i in plan.items} == {Reason.RESPEC}
    refresh_dataset(project, "sales")
    latest = open_catalog(project, project.dataset("sales")).latest()
    assert latest is not None
    assert set(latest.partitions) == {"area=EU", "area=US"}


def test_plan_for_ten_thousand_partitions_fits_in_xcom(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    pq.write_table(rows(0, 10, "EU"), tmp_path / "src" / "a.parquet")
    project = write_spec(tmp_path, ["bucket(9999, id)"])
    plan = plan_for(project)
    items = json.dumps(plan.items_json(), separators=(",", ":"))
    whole = plan.dumps()
    assert len(plan.items) == 10_000, "9,999 buckets and the NULL partition"
    # ~75 bytes per work item: 10,000 partitions are well under a megabyte of XCom.
    assert len(items.encode()) < 1_000_000, f"work items take {len(items)} bytes"
    assert RefreshPlan.from_json(json.loads(whole)).items == plan.items


def test_discover_needs_a_bound_dataset(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    pq.write_table(rows(0, 3, "EU"), tmp_path / "src" / "a.parquet")
    project = write_spec(tmp_path, ["region"])
    dataset = project.dataset("sales")
    source = open_source(dataset.source)
    with pytest.raises(DiscoveryError, match="must be bound"):
        discover(dataset, source, None)
    assert discover(bind_dataset(dataset, source), source, None).discovered == 1
