"""The pruning matrix, one test per cell, over real accelerations (storage writes + a catalog commit).

Every test states what must (not) be read and why. Each check also asserts soundness against DuckDB:
every partition holding a matching row is selected. Expected selections are computed from the partition
values (with the real transforms), never copied from the planner's output.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from test_pruning_support import Acceleration, build_acceleration

from airflow_partitions.keys import PartitionKey
from airflow_partitions.pruning import MAX_RANGE_ENUMERATION, PrunePlan
from airflow_partitions.pruning.plan import CAUSE_KEY
from airflow_partitions.transforms import parse_transform

ROWS = 2000
REGIONS = ["EU", "US", "APAC", None, "é-ü", "NULL"]
START = dt.datetime(2025, 12, 20)


def make_table() -> pa.Table:
    """2,000 rows spanning 2025-12-20 .. 2026-04-03 every 75 minutes, with NULLs in every column kind."""
    ids = [i - 100 for i in range(ROWS)]
    user_ids = [None if i % 97 == 0 else (i * 7) % 1000 for i in range(ROWS)]
    regions = [REGIONS[i % len(REGIONS)] for i in range(ROWS)]
    amounts = [Decimal((i * 1301) % 100_000 - 20_000).scaleb(-2) for i in range(ROWS)]
    stamps = [None if i % 101 == 0 else START + dt.timedelta(minutes=75 * i) for i in range(ROWS)]
    aware = [None if s is None else s.replace(tzinfo=dt.UTC) for s in stamps]
    days = [dt.date(2025, 12, 25) + dt.timedelta(days=i // 20) for i in range(ROWS)]
    scores = [i * 0.5 for i in range(ROWS)]
    names = [f"{'abcxyz'[i % 6]}{'klm'[i % 3]}-{i}" for i in range(ROWS)]
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "user_id": pa.array(user_ids, pa.int64()),
            "region": pa.array(regions, pa.string()),
            "amount": pa.array(amounts, pa.decimal128(12, 2)),
            "ts": pa.array(stamps, pa.timestamp("us")),
            "ts_tz": pa.array(aware, pa.timestamp("us", "UTC")),
            "d": pa.array(days, pa.date32()),
            "score": pa.array(scores, pa.float64()),
            "name": pa.array(names, pa.string()),
        }
    )


LAYOUTS: dict[str, list[tuple[str, str]]] = {
    "identity": [("region", "region")],
    "bucket": [("user_bucket", "bucket(16, user_id)")],
    "truncate": [("id_range", "truncate(100, id)")],
    "truncate_decimal": [("amount_range", "truncate(1000, amount)")],
    "truncate_string": [("prefix", "truncate(1, name)")],
    "day": [("day", "date_trunc('day', ts)")],
    "month": [("month", "date_trunc('month', ts)")],
    "month_tz": [("month", "date_trunc('month', ts_tz)")],
    "year": [("year", "date_part('year', ts)")],
    "year_month": [("year", "date_part('year', ts)"), ("month", "date_part('month', ts)")],
    "month_only": [("month", "date_part('month', ts)")],
    "mod": [("id_mod", "id % 8")],
    "composite": [("region", "region"), ("user_bucket", "bucket(4, user_id)")],
    "date_year": [("year", "date_part('year', d)")],
}


@pytest.fixture(scope="module")
def accelerations(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Acceleration]:
    table = make_table()
    base = tmp_path_factory.mktemp("matrix")
    built = {name: build_acceleration(base / name, table, fields) for name, fields in LAYOUTS.items()}
    built["zone_maps"] = build_acceleration(
        base / "zone_maps", table, [("region", "region")], max_rows_per_file=50
    )
    return built


def key(layout: str, *values: Any) -> str:
    """The key path of the partition with `values` in layout `layout`."""
    names = [name for name, _ in LAYOUTS[layout]]
    return PartitionKey(tuple(values)).path(names)


def image(expression: str, value: Any, column_type: pa.DataType) -> Any:
    """The partition value of `value` under `expression` (computed by the transform itself)."""
    transform = parse_transform(expression)
    return transform.bind(column_type).apply_scalar(value)


def selected_paths(plan: PrunePlan) -> set[str]:
    return {p.key_path for p in plan.selected}


def exact_paths(plan: PrunePlan) -> set[str]:
    return {p.key_path for p in plan.selected if p.exact}


def check(
    acceleration: Acceleration,
    where: str,
    expected: set[str],
    intent: str,
    *,
    exact: set[str] | None = None,
    **options: Any,
) -> PrunePlan:
    """Plan `where`; assert it reads exactly `expected` (and never less than DuckDB's matches)."""
    plan = acceleration.plan(where, **options)
    chosen = selected_paths(plan)
    matching = acceleration.matching_key_paths(where)
    missed = matching - chosen
    assert not missed, f"{where}: dropped partitions holding matching rows {sorted(missed)}"
    assert chosen == expected, (
        f"{intent}\n  filter: {where}\n  unexpected reads: {sorted(chosen - expected)}\n"
        f"  missing reads: {sorted(expected - chosen)}"
    )
    if exact is not None:
        assert exact_paths(plan) == exact, (
            f"{where}: exact partitions {sorted(exact_paths(plan))}, expected {sorted(exact)}"
        )
    return plan


def check_key_keeps(
    acceleration: Acceleration, where: str, kept_by_key: set[str], intent: str, **options: Any
) -> PrunePlan:
    """Assert the partition values alone rule out exactly the partitions outside `kept_by_key`.

    For cells where the key cannot prune (e.g. `!=` through a hash): file statistics may still skip a
    partition, and that is fine, but the key must not.
    """
    plan = acceleration.plan(where, **options)
    missed = acceleration.matching_key_paths(where) - selected_paths(plan)
    assert not missed, f"{where}: dropped partitions holding matching rows {sorted(missed)}"
    by_key = {d.key_path for d in plan.decisions if d.cause == CAUSE_KEY}
    assert by_key == acceleration.all_key_paths - kept_by_key, (
        f"{intent}\n  filter: {where}\n  ruled out by key: {sorted(by_key)}\n"
        f"  expected: {sorted(acceleration.all_key_paths - kept_by_key)}"
    )
    return plan


def non_null(acceleration: Acceleration, layout: str) -> set[str]:
    """Key paths of every partition whose key holds no NULL."""
    return {p for p in acceleration.all_key_paths if "%NULL" not in p}


# --- plain column (identity) ---------------------------------------------------------------------


def test_identity_equality_reads_one_partition(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["identity"]
    eu = key("identity", "EU")
    check(
        acc, "region = 'EU'", {eu}, "should read only region=EU: no other partition can hold 'EU'", exact={eu}
    )


def test_identity_in_list(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["identity"]
    wanted = {key("identity", "EU"), key("identity", "US")}
    check(acc, "region IN ('EU', 'US')", wanted, "should read only the two listed regions", exact=wanted)


def test_identity_or_of_equalities(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["identity"]
    wanted = {key("identity", "EU"), key("identity", "é-ü")}
    check(acc, "region = 'EU' OR region = 'é-ü'", wanted, "should read only EU and é-ü", exact=wanted)


def test_identity_not_equal_prunes_the_value_and_null(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["identity"]
    wanted = non_null(acc, "identity") - {key("identity", "EU")}
    check(
        acc,
        "region != 'EU'",
        wanted,
        "should not read region=EU (every row is 'EU') nor the NULL partition (NULL != 'EU' is NULL)",
        exact=wanted,
    )


def test_identity_not_in(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["identity"]
    wanted = non_null(acc, "identity") - {key("identity", "EU"), key("identity", "US")}
    check(acc, "region NOT IN ('EU', 'US')", wanted, "should skip EU, US and NULL partitions", exact=wanted)


def test_identity_range_on_strings(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["identity"]
    wanted = {key("identity", "US"), key("identity", "é-ü")}
    check(
        acc,
        "region > 'NULL'",
        wanted,
        "should read only regions sorting after 'NULL' ('US', 'é-ü')",
        exact=wanted,
    )


def test_identity_is_null_reads_only_the_null_partition(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["identity"]
    null = key("identity", None)
    check(
        acc,
        "region IS NULL",
        {null},
        "should read only the NULL partition, not the 'NULL' string one",
        exact={null},
    )
    text = key("identity", "NULL")
    check(acc, "region = 'NULL'", {text}, "the string 'NULL' is its own partition, distinct from NULL")


def test_identity_is_not_null(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["identity"]
    wanted = non_null(acc, "identity")
    check(acc, "region IS NOT NULL", wanted, "should skip only the NULL partition", exact=wanted)


# --- bucket ----------------------------------------------------------------------------------------


def bucket_of(value: int, buckets: int = 16) -> int:
    return int(image(f"bucket({buckets}, user_id)", value, pa.int64()))


def test_bucket_equality_substitutes_the_literal(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["bucket"]
    target = bucket_of(42)
    plan = check(
        acc,
        "user_id = 42",
        {key("bucket", target)},
        f"should read only bucket {target}: every other bucket cannot hold user_id 42",
        exact=set(),
    )
    skipped = [d for d in plan.decisions if not d.selected]
    assert skipped, "fifteen buckets cannot hold 42"
    assert all(f"42 -> {target}" in d.reason for d in skipped), (
        "each skipped bucket should explain that bucket(16, 42) is " + str(target)
    )


def test_bucket_in_list(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["bucket"]
    wanted = {key("bucket", bucket_of(v)) for v in (1, 2, 3)}
    check(acc, "user_id IN (1, 2, 3)", wanted, "should read only the buckets of 1, 2 and 3")


def test_bucket_or_of_equalities(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["bucket"]
    wanted = {key("bucket", bucket_of(v)) for v in (5, 700)}
    check(acc, "user_id = 5 OR user_id = 700", wanted, "should read only the buckets of 5 and 700")


def test_bucket_not_equal_does_not_prune_values(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["bucket"]
    wanted = non_null(acc, "bucket")
    check_key_keeps(
        acc, "user_id != 42", wanted, "a bucket holds many ids: != prunes nothing (NULLs never match)"
    )
    check_key_keeps(acc, "user_id NOT IN (1, 2)", wanted, "NOT IN prunes nothing through a hash")


def test_bucket_bounded_range_is_enumerated(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["bucket"]
    wanted = {key("bucket", bucket_of(v)) for v in range(40, 44)}
    check(acc, "user_id BETWEEN 40 AND 43", wanted, "should read only the buckets of 40..43")
    check(
        acc,
        "user_id > 39 AND user_id < 44",
        wanted,
        "a range written as two comparisons is merged, then enumerated",
    )


def test_bucket_open_range_and_range_over_the_cap_do_not_prune(
    accelerations: dict[str, Acceleration],
) -> None:
    acc = accelerations["bucket"]
    wanted = non_null(acc, "bucket")
    check_key_keeps(
        acc, "user_id > 10", wanted, "an open-ended range cannot be enumerated: every bucket may match"
    )
    check_key_keeps(
        acc,
        "user_id BETWEEN 40 AND 43",
        wanted,
        "4 candidates exceed a cap of 3: the range prunes nothing",
        max_enumeration=3,
    )
    assert MAX_RANGE_ENUMERATION >= 1000, "the documented enumeration cap allows realistic ranges"


def test_bucket_partition_expression_equality(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["bucket"]
    seven = key("bucket", 7)
    check(acc, "bucket(16, user_id) = 7", {seven}, "should read only bucket 7", exact={seven})
    check(acc, "bucket(16, user_id) IN (2, 3)", {key("bucket", 2), key("bucket", 3)}, "only buckets 2 and 3")


def test_bucket_is_null(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["bucket"]
    null = key("bucket", None)
    check(
        acc, "user_id IS NULL", {null}, "NULL user_ids live only in the NULL bucket partition", exact={null}
    )
    check(acc, "user_id IS NOT NULL", non_null(acc, "bucket"), "only the NULL partition is skipped")


# --- truncate --------------------------------------------------------------------------------------


def test_truncate_equality_and_in(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["truncate"]
    check(acc, "id = 250", {key("truncate", 200)}, "should read only [200, 300): 250 lies there")
    check(acc, "id IN (-5, 1250)", {key("truncate", -100), key("truncate", 1200)}, "-5 floors to -100")


def test_truncate_range_is_exact_inside(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["truncate"]
    check(
        acc,
        "id BETWEEN 250 AND 420",
        {key("truncate", v) for v in (200, 300, 400)},
        "should read [200,300), [300,400), [400,500) only",
        exact={key("truncate", 300)},
    )
    below = {key("truncate", v) for v in (-100, 0, 100, 200)}
    check(acc, "id < 300", below, "ids below 300 live in the four lowest ranges", exact=below)


def test_truncate_not_equal_does_not_prune(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["truncate"]
    check_key_keeps(acc, "id != 250", acc.all_key_paths, "truncate is not one-to-one: != prunes nothing")


def test_truncate_partition_expression(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["truncate"]
    high = {key("truncate", v) for v in range(1500, 1900, 100)}
    check(acc, "truncate(100, id) >= 1500", high, "should read only ranges from 1500", exact=high)


def test_truncate_decimal_partition_expression(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["truncate_decimal"]
    kind = pa.decimal128(12, 2)
    wanted = {p for p in acc.all_key_paths if "%NULL" not in p and Decimal(p.split("=")[1]) >= Decimal("20")}
    check(
        acc,
        "truncate(1000, amount) >= 20",
        wanted,
        "should read ranges whose floor is at least 20.00",
        exact=wanted,
    )
    one = key("truncate_decimal", image("truncate(1000, amount)", Decimal("123.45"), kind))
    check(acc, "amount = 123.45", {one}, "123.45 lies in exactly one 10.00-wide range")


def test_truncate_string_prefix_ranges(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["truncate_string"]
    check(acc, "name = 'bl-1'", {key("truncate_string", "b")}, "'bl-1' starts with 'b'")
    wanted = {key("truncate_string", c) for c in "xyz"}
    check(acc, "name >= 'x'", wanted, "names from 'x' live under prefixes x, y, z", exact=wanted)


# --- date_trunc ------------------------------------------------------------------------------------


def day_key(layout: str, *parts: int, tz: bool = False) -> str:
    moment = dt.datetime(*parts)  # type: ignore[misc]
    return key(layout, moment.replace(tzinfo=dt.UTC) if tz else moment)


def test_date_trunc_week_range_reads_seven_exact_days(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["day"]
    week = {day_key("day", 2026, 1, d) for d in range(1, 8)}
    check(acc, "ts >= '2026-01-01' AND ts < '2026-01-08'", week, "a one-week range reads 7 days", exact=week)


def test_date_trunc_partial_days_are_inexact(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["day"]
    days = {day_key("day", 2026, 1, 31), day_key("day", 2026, 2, 1)}
    check(
        acc,
        "ts BETWEEN '2026-01-31 12:00' AND '2026-02-01 06:00'",
        days,
        "the range touches two days, neither entirely",
        exact=set(),
    )


def test_date_trunc_point_and_expression(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["day"]
    day = day_key("day", 2026, 1, 5)
    check(acc, "ts = '2026-01-05 10:00:00'", {day}, "a timestamp lies in one day")
    check(acc, "date_trunc('day', ts) = '2026-01-05'", {day}, "the partition expression itself", exact={day})
    check_key_keeps(
        acc,
        "ts != '2026-01-05 10:00:00'",
        non_null(acc, "day"),
        "a day holds many instants: != prunes nothing",
    )


def test_date_trunc_month_uses_calendar_month_lengths(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["month"]
    january, february = day_key("month", 2026, 1, 1), day_key("month", 2026, 2, 1)
    check(
        acc,
        "ts >= '2026-01-01' AND ts < '2026-03-01'",
        {january, february},
        "January (31 days) and February (28 days in 2026) exactly; March must not be read",
        exact={january, february},
    )
    check(
        acc,
        "ts > '2026-02-28 23:59:59.999999'",
        {day_key("month", 2026, m, 1) for m in (3, 4)},
        "February 2026 ends on the 28th: its last microsecond is excluded, so February is skipped",
    )


def test_date_trunc_tz_aware_converts_offsets_to_utc(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["month_tz"]
    march, april = day_key("month_tz", 2026, 3, 1, tz=True), day_key("month_tz", 2026, 4, 1, tz=True)
    # 01:00+01:00 is midnight UTC: the range starts exactly at March; 02:00+02:00 on 1 April too.
    check(
        acc,
        "ts_tz >= '2026-03-01 01:00:00+01:00' AND ts_tz < '2026-04-01 02:00:00+02:00'",
        {march},
        "offsets convert to UTC: exactly March UTC, April untouched",
        exact={march},
    )
    check(
        acc,
        "ts_tz >= '2026-03-29 01:00:00+01:00'",
        {march, april},
        "after the EU daylight-saving change (29 March 01:00 UTC) only March and April can match",
    )


# --- date_part -------------------------------------------------------------------------------------


def test_date_part_year_prunes_timestamp_ranges(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["year"]
    y2026 = key("year", 2026)
    check(
        acc,
        "ts >= '2026-01-01'",
        {y2026},
        "a range on the column prunes through date_part('year')",
        exact={y2026},
    )
    check(
        acc,
        "ts < '2026-01-01'",
        {key("year", 2025)},
        "everything before 2026 is in year 2025",
        exact={key("year", 2025)},
    )
    check(acc, "date_part('year', ts) = 2026", {y2026}, "equality on the expression", exact={y2026})
    check(acc, "YEAR(ts) = 2025", {key("year", 2025)}, "YEAR() is date_part('year')")


def test_date_part_year_on_a_date_column(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["date_year"]
    check(
        acc, "d BETWEEN '2025-12-01' AND '2025-12-31'", {key("date_year", 2025)}, "December 2025 is year 2025"
    )


def test_year_month_composite_prunes_jointly(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["year_month"]
    feb, mar = key("year_month", 2026, 2), key("year_month", 2026, 3)
    check(
        acc,
        "ts >= '2026-02-15' AND ts < '2026-03-10'",
        {feb, mar},
        "(year, month) pins each partition to one month: only February and March 2026",
        exact=set(),
    )
    check(
        acc,
        "ts < '2026-01-01'",
        {key("year_month", 2025, 12)},
        "before 2026 means December 2025",
        exact={key("year_month", 2025, 12)},
    )
    whole = {key("year_month", 2026, 1), feb}
    check(acc, "ts >= '2026-01-01' AND ts < '2026-03-01'", whole, "whole months are exact", exact=whole)
    check(acc, "date_part('month', ts) = 2", {feb}, "the month expression alone", exact={feb})


def test_month_alone_prunes_bounded_ranges_by_enumeration(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["month_only"]
    check(
        acc,
        "ts BETWEEN '2026-01-20' AND '2026-02-10'",
        {key("month_only", 1), key("month_only", 2)},
        "month is not monotonic, but a 3-week range only reaches months 1 and 2",
    )
    check_key_keeps(
        acc, "ts >= '2026-01-20'", non_null(acc, "month_only"), "an open range reaches every month"
    )


# --- mod -------------------------------------------------------------------------------------------


def test_mod_equality_in_and_expression(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["mod"]
    check(acc, "id = 13", {key("mod", 5)}, "13 % 8 = 5")
    check(acc, "id = -13", {key("mod", -5)}, "SQL remainder keeps the sign: -13 % 8 = -5")
    check(acc, "id IN (1, 9, 2)", {key("mod", 1), key("mod", 2)}, "1 and 9 share remainder 1")
    check(acc, "id % 8 = 3", {key("mod", 3)}, "the expression itself", exact={key("mod", 3)})


def test_mod_ranges(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["mod"]
    check(acc, "id BETWEEN 3 AND 4", {key("mod", 3), key("mod", 4)}, "a bounded range is enumerated")
    check_key_keeps(acc, "id > 3", acc.all_key_paths, "an open range reaches every remainder by key")


# --- composite keys and boolean structure ----------------------------------------------------------


def composite(region: str | None, bucket: int | None) -> str:
    return key("composite", region, bucket)


def composite_bucket(value: int) -> int:
    return bucket_of(value, 4)


def test_composite_and_prunes_on_both_axes(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["composite"]
    check(
        acc,
        "region = 'EU' AND user_id = 42",
        {composite("EU", composite_bucket(42))},
        "should read only (EU, bucket of 42)",
    )


def test_composite_or_unions_both_axes(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["composite"]
    target = composite_bucket(42)
    wanted = {
        p for p in acc.all_key_paths if p.startswith("region=EU/") or p.endswith(f"user_bucket={target}")
    }
    check(acc, "region = 'EU' OR user_id = 42", wanted, "EU partitions plus every partition of 42's bucket")


def test_composite_not(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["composite"]
    wanted = {p for p in acc.all_key_paths if not p.startswith(("region=EU/", "region=%NULL/"))}
    check(acc, "NOT (region = 'EU')", wanted, "NOT keeps every non-EU, non-NULL region", exact=wanted)
    eu = {p for p in acc.all_key_paths if p.startswith("region=EU/") and "%NULL" not in p}
    check_key_keeps(
        acc, "region = 'EU' AND NOT (user_id = 42)", eu, "NOT of a hashed equality prunes no bucket"
    )


def test_composite_expression_and_or(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["composite"]
    wanted = {composite("EU", 1), composite("US", 1)}
    check(
        acc,
        "(region = 'EU' OR region = 'US') AND bucket(4, user_id) = 1",
        wanted,
        "two regions times one bucket",
        exact=wanted,
    )


# --- zone maps and exactness -----------------------------------------------------------------------


def test_zone_maps_prune_files_on_a_non_partition_column(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["zone_maps"]
    plan = acc.plan("score < 25")
    total_files = sum(len(e.files) for e in acc.snapshot().partitions.values())
    assert len(plan.files) < total_files / 4, "most files hold only scores >= 25 and must not be read"
    for file in plan.files:
        assert file.stats["score"].min < 25, (
            f"should not read {file.path}: its scores start at {file.stats['score'].min}"
        )
    matching = acc.matching_key_paths("score < 25")
    assert {p.key_path for p in plan.selected} == matching, (
        "partitions are read iff they hold a score below 25"
    )
    skipped = [d for d in plan.decisions if not d.selected]
    assert any("file statistics" in d.reason for d in skipped) or not skipped


def test_zone_maps_make_whole_files_exact(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["zone_maps"]
    plan = acc.plan("score >= 0")
    assert plan.residual is None, "every score is >= 0 and none is NULL: no residual filter is needed"
    assert len(plan.selected) == plan.total


def test_exact_partitions_skip_the_residual(accelerations: dict[str, Acceleration]) -> None:
    acc = accelerations["identity"]
    plan = acc.plan("region = 'EU' OR (region = 'US' AND score > 100)")
    eu, us = key("identity", "EU"), key("identity", "US")
    assert selected_paths(plan) == {eu, us}
    assert exact_paths(plan) == {eu}, "EU satisfies the OR entirely; US rows need the score check"
    assert plan.inexact_files
    assert all(f.path.startswith(us) for f in plan.inexact_files)
    assert plan.residual_sql is not None
    assert "score" in plan.residual_sql
