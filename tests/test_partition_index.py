"""One planner over three sources of partitions: a catalog version, a manifest's entries, bare keys.

`PartitionIndex.from_keys` (what refresh `--where` and backfill select discovered keys with) must rule a
key out exactly when the catalog index of the same partitions rules it out on its key; indexes built for
selection also judge conditions on partition field names, with the result SQL gives on the partition
values themselves (DuckDB is the oracle here, never the planner's own output).
"""

from __future__ import annotations

import datetime as dt

import duckdb
import pyarrow as pa
import pytest
from test_pruning_support import Acceleration, build_acceleration

from airflow_partitions.exceptions import FilterError
from airflow_partitions.keys import PartitionKey
from airflow_partitions.pruning import PartitionIndex, PrunePlan, plan_partitions
from airflow_partitions.pruning.plan import CAUSE_STATISTICS
from airflow_partitions.transforms import parse_transform

PARTITION_BY = (("day", "date_trunc('day', ts)"), ("b", "bucket(4, id)"), ("region", "region"))
START = dt.datetime(2026, 3, 1)


@pytest.fixture(scope="module")
def acceleration(tmp_path_factory: pytest.TempPathFactory) -> Acceleration:
    """600 rows over 5 days, 4 buckets and 3 regions (one NULL), NULL timestamps in their own partitions."""
    rows = 600
    table = pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "ts": pa.array(
                [None if i % 41 == 0 else START + dt.timedelta(minutes=12 * i) for i in range(rows)],
                pa.timestamp("us"),
            ),
            "region": pa.array([["EU", "US", None][i % 3] for i in range(rows)], pa.string()),
            "amount": pa.array([float(i % 50) for i in range(rows)], pa.float64()),
        }
    )
    return build_acceleration(tmp_path_factory.mktemp("index"), table, PARTITION_BY)


def fields() -> list[tuple[str, str]]:
    return [(name, parse_transform(expression).canonical) for name, expression in PARTITION_BY]


def keys_of(acceleration: Acceleration) -> list[tuple[object, ...]]:
    snapshot = acceleration.snapshot()
    return [snapshot.partitions[path].key.values for path in sorted(snapshot.partitions)]


def keys_index(acceleration: Acceleration) -> PartitionIndex:
    return PartitionIndex.from_keys(fields(), acceleration.table.schema, keys_of(acceleration))


def selected(plan: PrunePlan) -> set[str]:
    return {partition.key_path for partition in plan.selected}


SOURCE_FILTERS = [
    "ts >= '2026-03-03 00:00:00'",
    "ts < '2026-03-02 12:00:00' OR ts IS NULL",
    "id = 42",
    "id IN (1, 2, 3) AND region = 'EU'",
    "bucket(4, id) = 2 AND region IS NULL",
    "NOT (region = 'US')",
    "date_trunc('day', ts) = TIMESTAMP '2026-03-04'",
    "amount > 40",  # statistics only: keys alone keep every partition
]


@pytest.mark.parametrize("where", SOURCE_FILTERS)
def test_keys_rule_out_exactly_what_the_catalog_index_rules_out_on_keys(
    acceleration: Acceleration, where: str
) -> None:
    schema = acceleration.table.schema
    catalog_plan = plan_partitions(PartitionIndex.from_snapshot(acceleration.snapshot(), schema), where)
    allowed_by_key = {d.key_path for d in catalog_plan.decisions if d.selected or d.cause == CAUSE_STATISTICS}
    keys_plan = plan_partitions(keys_index(acceleration), where)
    assert selected(keys_plan) == allowed_by_key, (
        "Should select a key exactly when the catalog index keeps its partition on partition values"
    )
    assert acceleration.matching_key_paths(where) <= selected(keys_plan), "never drop a matching key"
    assert all(partition.files == () for partition in keys_plan.selected), "an index of keys has no files"


def field_value_oracle(acceleration: Acceleration, where: str) -> set[str]:
    """Key paths whose partition values satisfy `where` (over field names), evaluated by DuckDB."""
    keys = keys_of(acceleration)
    names = [name for name, _ in PARTITION_BY]
    table = pa.table(
        {
            "day": pa.array([key[0] for key in keys], pa.timestamp("us")),
            "b": pa.array([key[1] for key in keys], pa.int32()),
            "region": pa.array([key[2] for key in keys], pa.string()),
            "__row": pa.array(range(len(keys)), pa.int64()),
        }
    )
    connection = duckdb.connect()
    try:
        connection.register("keys", table)
        rows = connection.execute(f"SELECT __row FROM keys WHERE {where}").fetchall()
    finally:
        connection.close()
    return {PartitionKey(tuple(keys[row])).path(names) for (row,) in rows}


FIELD_FILTERS = [
    "day < TIMESTAMP '2026-03-03'",
    "day >= '2026-03-04'",
    "day IS NULL",
    "b = 2",
    "b IN (0, 3) AND region = 'EU'",
    "NOT (b = 1) AND day BETWEEN '2026-03-02' AND '2026-03-03'",
    "b <> 1 OR region IS NULL",
    "day = '2026-03-02' AND ts >= '2026-03-02 12:00:00'",  # a field name next to a source column
]


@pytest.mark.parametrize("where", FIELD_FILTERS)
def test_selection_indexes_judge_partition_field_names_on_the_values(
    acceleration: Acceleration, where: str
) -> None:
    plan = plan_partitions(keys_index(acceleration), where)
    if "ts >=" in where:
        # Only the field-name part is exact on values; the source-column part prunes through the transform.
        expected = field_value_oracle(acceleration, "day = '2026-03-02'")
    else:
        expected = field_value_oracle(acceleration, where)
    assert selected(plan) == expected, "Should select exactly the keys whose values satisfy the condition"


def test_a_read_index_does_not_accept_field_names(acceleration: Acceleration) -> None:
    """A read applies its residual filter to data files, which hold no `day` column: refused up front."""
    index = PartitionIndex.from_snapshot(acceleration.snapshot(), acceleration.table.schema)
    with pytest.raises(FilterError, match="day"):
        plan_partitions(index, "day < TIMESTAMP '2026-03-03'")


@pytest.mark.parametrize("where", [*SOURCE_FILTERS, "amount < 3 AND region = 'US'"])
def test_manifest_entries_plan_like_their_catalog_version(acceleration: Acceleration, where: str) -> None:
    snapshot = acceleration.snapshot()
    schema = acceleration.table.schema
    entries = [snapshot.partitions[path] for path in sorted(snapshot.partitions)]
    from_entries = PartitionIndex.from_entries(
        snapshot.partition_spec, entries, schema, version=snapshot.version, origin="entries"
    )
    expected = plan_partitions(PartitionIndex.from_snapshot(snapshot, schema), where)
    plan = plan_partitions(from_entries, where)
    assert [(p.key_path, p.files, p.exact_files) for p in plan.selected] == [
        (p.key_path, p.files, p.exact_files) for p in expected.selected
    ], "Should select the same partitions, files and exactness (file statistics included)"


def test_an_index_of_no_keys_still_binds_the_filter() -> None:
    schema = pa.schema([("id", pa.int64())])
    empty = PartitionIndex.from_keys([("b", "bucket(4, id)")], schema, [])
    assert plan_partitions(empty, "b = 1").selected == ()
    with pytest.raises(FilterError, match="nope"):
        plan_partitions(empty, "nope = 1")
