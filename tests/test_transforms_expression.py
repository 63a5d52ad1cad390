"""Custom partition expressions: parsing, canonical strings, pruning properties and pruned plans."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from test_pruning_support import build_acceleration

from airflow_partitions.exceptions import PartitionExpressionError
from airflow_partitions.pruning.prefix import like_prefix, prefix_upper_bound
from airflow_partitions.transforms import (
    BucketTransform,
    DateTruncTransform,
    IdentityTransform,
    parse_transform,
)
from airflow_partitions.transforms.expression import ExpressionTransform

BAND = "CASE WHEN amount > 1000 THEN 'big' ELSE 'small' END"

CANONICAL = [
    ("LOWER(region)", "lower(region)"),
    ("substr(code, 1, 2)", "substring(code, 1, 2)"),
    (BAND, BAND),
    ("bucket(16, lower(email))", "bucket(16, lower(email))"),
    ("bucket(16::int32, lower(email))", "bucket(16::int32, lower(email))"),
    ("date_trunc('month', ts + INTERVAL 9 HOUR)", "date_trunc('month', ts + INTERVAL '9' HOUR)"),
    ("YEAR(ts - INTERVAL 1 DAY)", "date_part('year', ts - INTERVAL '1' DAY)"),
    ("(n + 1) % 16", "(n + 1) % 16"),
    ("truncate(2, upper(code))", "truncate(2, upper(code))"),
    ('lower("Region Name")', 'lower("Region Name")'),
    ("coalesce(region, 'none')", "coalesce(region, 'none')"),
    ("x::int * 2", "CAST(x AS INT) * 2"),
]


@pytest.mark.parametrize(("written", "canonical"), CANONICAL, ids=[w for w, _ in CANONICAL])
def test_expressions_round_trip_through_their_canonical_string(written: str, canonical: str) -> None:
    transform = parse_transform(written)
    assert isinstance(transform, ExpressionTransform)
    assert transform.canonical == canonical == str(transform)
    again = parse_transform(canonical)
    assert again == transform
    assert again.canonical == canonical


def test_built_ins_over_a_plain_column_stay_built_ins() -> None:
    assert isinstance(parse_transform("bucket(16, email)"), BucketTransform)
    assert isinstance(parse_transform("date_trunc('month', ts)"), DateTruncTransform)
    assert isinstance(parse_transform("region"), IdentityTransform)


def test_a_composed_transform_applies_the_built_in_to_the_expression_s_values() -> None:
    composed = parse_transform("bucket(16, lower(email))").bind(pa.string())
    plain = parse_transform("bucket(16, email)").bind(pa.string())
    values = pa.array(["A@X", "a@x", None, "ß"])
    assert composed.apply(values).to_pylist() == plain.apply(pa.array(["a@x", "a@x", None, "ß"])).to_pylist()
    assert composed.result_type == pa.int64()


@pytest.mark.parametrize(
    ("text", "column_type", "monotonic"),
    [
        ("left(s, 2)", pa.string(), True),
        ("substr(s, 1, 3)", pa.string(), True),
        ("substr(s, 2, 3)", pa.string(), False),
        ("lower(s)", pa.string(), False),
        ("i // 1000", pa.int64(), True),
        ("i * -2", pa.int64(), False),
        ("10 - i", pa.int64(), False),
        ("i + 5", pa.int64(), True),
        ("CAST(floor(i / 100) AS BIGINT)", pa.int64(), True),
        ("CAST(s AS BIGINT)", pa.string(), False),
        ("CAST(i AS VARCHAR)", pa.int64(), False),
        ("date_trunc('month', ts + INTERVAL 9 HOUR)", pa.timestamp("us"), True),
        ("bucket(4, i + 1)", pa.int64(), False),
    ],
)
def test_only_expressions_known_to_keep_order_are_monotonic(
    text: str, column_type: pa.DataType, monotonic: bool
) -> None:
    assert parse_transform(text).bind(column_type).monotonic is monotonic


@pytest.mark.parametrize(
    ("text", "preserving"),
    [
        ("lower(s)", True),
        ("left(s, 2)", True),
        ("CASE WHEN s > 'm' THEN 'late' ELSE 'early' END", False),
        ("coalesce(s, 'x')", False),
        ("nullif(s, '')", False),
        ("s IS NULL", False),
        ("s IN ('a', NULL)", False),
        ("concat(s, 'x')", False),
    ],
)
def test_null_preserving_is_false_wherever_null_may_change(text: str, preserving: bool) -> None:
    transform = parse_transform(text).bind(pa.string())
    assert transform.null_preserving is preserving
    if preserving:
        assert transform.apply_scalar(None) is None


def test_filter_terms_that_cannot_partition_stay_plain_sql() -> None:
    from airflow_partitions.pruning.filters import bind_filter

    schema = pa.schema([("amount", pa.int64())])
    predicate = bind_filter("amount * 1.5 > 10", schema)
    assert type(predicate).__name__ == "Opaque"


def test_like_prefixes() -> None:
    assert like_prefix("EU%") == "EU"
    assert like_prefix("EU%%") == "EU"
    assert like_prefix("E_%") is None
    assert like_prefix("%EU") is None
    assert like_prefix("EU") is None
    assert like_prefix("%") is None
    assert like_prefix("a\\%%") is None
    assert prefix_upper_bound("EU") == "EV"
    assert prefix_upper_bound("a\U0010ffff") == "b"
    assert prefix_upper_bound(
        "\ud7ff".encode("utf-16", "surrogatepass").decode("utf-16", "surrogatepass")
    ) == ("\ue000")
    assert prefix_upper_bound("\U0010ffff") is None


@pytest.fixture(scope="module")
def accelerations(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    regions = ["EU", "eu", "Eu", "US", "us", None, "", "ß", "İ", "APAC", "apac", "EU-West"] * 3
    amounts = [5, 2000, None, -3, 1001, 1000, 0, None, 7, 99999, -5000, 12] * 3
    table = pa.table(
        {
            "rid": pa.array(range(len(regions)), pa.int64()),
            "region": pa.array(regions, pa.string()),
            "amount": pa.array(amounts, pa.int64()),
            "ts": pa.array(
                [dt.datetime(2026, 1, 1) + dt.timedelta(hours=7 * n) for n in range(len(regions))]
            ),
        }
    )
    base: Path = tmp_path_factory.mktemp("expressions")
    lowered = build_acceleration(base / "lower", table, [("lo", "lower(region)")])
    band = build_acceleration(base / "band", table, [("band", BAND)])
    region = build_acceleration(base / "identity", table, [("r", "region")])
    readers = {"lower": lowered.reader(), "band": band.reader(), "identity": region.reader()}
    yield {"table": table, "readers": readers}
    for reader in readers.values():
        reader.close()


def _plan(accelerations: dict[str, Any], layout: str, where: str) -> tuple[list[Any], int, int]:
    plan = accelerations["readers"][layout].plan(where)
    rows = accelerations["readers"][layout].read(where, columns=["rid"]).column("rid").to_pylist()
    return sorted(rows), len(plan.selected), sum(p.exact for p in plan.selected)


def _expected(accelerations: dict[str, Any], where: str) -> list[int]:
    import duckdb

    connection = duckdb.connect()
    connection.register("t", accelerations["table"])
    return sorted(row[0] for row in connection.sql(f"SELECT rid FROM t WHERE {where}").fetchall())


@pytest.mark.parametrize(
    ("layout", "where", "partitions", "exact"),
    [
        ("lower", "lower(region) = 'eu'", 1, 1),
        ("lower", "region = 'EU'", 1, 0),  # the partition lower('EU') also holds 'eu' and 'Eu'
        ("lower", "region IN ('US', 'APAC')", 2, 0),
        ("lower", "region IS NULL", 1, 1),
        ("lower", "lower(region) IN ('eu', 'us')", 2, 2),
        ("band", "amount IS NULL", 1, 0),  # NULL amounts are in 'small', with others
        ("band", BAND + " = 'big'", 1, 1),
        ("band", "amount = 2000", 1, 0),
        ("band", "amount IN (5, 7)", 1, 0),
        ("identity", "region LIKE 'EU%'", 2, 2),
        ("identity", "starts_with(region, 'ap')", 1, 1),
        ("identity", "region NOT LIKE 'E%'", 8, 8),
    ],
)
def test_pruned_plans_select_only_what_can_match(
    accelerations: dict[str, Any], layout: str, where: str, partitions: int, exact: int
) -> None:
    rows, selected, exact_count = _plan(accelerations, layout, where)
    assert rows == _expected(accelerations, where)
    assert (selected, exact_count) == (partitions, exact)


def test_an_expression_whose_values_cannot_be_computed_says_which() -> None:
    transform = parse_transform("CAST(s AS INTEGER)").bind(pa.string())
    with pytest.raises(Exception, match="CAST") as caught:
        transform.apply(pa.array(["1", "x"]))
    assert "PartitionValueError" in type(caught.value).__name__
    with pytest.raises(PartitionExpressionError, match="not deterministic"):
        parse_transform("s || CAST(random() AS VARCHAR)")


# --- pruning through the expression a built-in wraps -------------------------------------------------

EMAILS = ["A@X.io", "a@x.io", "a@X.IO", "İx@y", "ix@y", "ß@z", "SS@z", "", None, "o'q@x", "p/q=r%@x", "🙂@x"]
BUCKETED = "bucket(16, lower(email))"
TOKYO_MONTH = "date_trunc('month', ts + INTERVAL 9 HOUR)"
TOKYO_MONTH_TZ = "date_trunc('month', tz + INTERVAL 9 HOUR)"


@pytest.fixture(scope="module")
def composed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    start = dt.datetime(2025, 11, 20, 3)
    count = 96
    moments: list[dt.datetime | None] = [start + dt.timedelta(hours=37 * n + n % 5) for n in range(count)]
    # Around the month edge Tokyo sees 9 hours early (15:00 UTC on the last day is the next month there).
    moments[:6] = [
        dt.datetime(2026, 1, 31, 14, 59, 59, 999_999),
        dt.datetime(2026, 1, 31, 15),
        None,
        dt.datetime(2025, 12, 31, 15),
        dt.datetime(2025, 12, 31, 14),
        None,
    ]
    table = pa.table(
        {
            "rid": pa.array(range(count), pa.int64()),
            "email": pa.array([EMAILS[n % len(EMAILS)] for n in range(count)], pa.string()),
            "ts": pa.array(moments, pa.timestamp("us")),
            "tz": pa.array(
                [None if m is None else m.replace(tzinfo=dt.UTC) for m in reversed(moments)],
                pa.timestamp("us", "UTC"),
            ),
        }
    )
    base: Path = tmp_path_factory.mktemp("composed")
    layouts = {
        "bucket": build_acceleration(base / "bucket", table, [("eb", BUCKETED)]),
        "month": build_acceleration(base / "month", table, [("tm", TOKYO_MONTH)]),
        "month_tz": build_acceleration(base / "month_tz", table, [("tm", TOKYO_MONTH_TZ)]),
    }
    readers = {name: layout.reader() for name, layout in layouts.items()}
    yield {"table": table, "layouts": layouts, "readers": readers}
    for reader in readers.values():
        reader.close()


def _composed_filters(table: pa.Table) -> dict[str, list[str]]:
    import random

    rng = random.Random(29)

    def quoted(text: str) -> str:
        return "'" + text.replace("'", "''") + "'"

    emails = [e for e in EMAILS if e is not None]
    on_email = ["email IS NULL", "email IS NOT NULL", "lower(email) IS NULL"]
    for value in emails:
        on_email += [
            f"email = {quoted(value)}",
            f"email = {quoted(value.upper())}",
            f"lower(email) = {quoted(value.lower())}",
            f"email <> {quoted(value)}",
            f"NOT (lower(email) = {quoted(value)})",
        ]
    for _ in range(12):
        chosen = ", ".join(quoted(v) for v in rng.sample(emails, 3))
        on_email += [
            f"email IN ({chosen})",
            f"lower(email) IN ({chosen})",
            f"email IN ({chosen}) OR email IS NULL",
        ]
    moments = [m for m in table.column("ts").to_pylist() if m is not None]
    on_time: list[str] = ["ts IS NULL", "ts IS NOT NULL"]
    for _ in range(12):
        low, high = sorted(rng.sample(moments, 2))
        low_sql, high_sql = f"TIMESTAMP '{low}'", f"TIMESTAMP '{high}'"
        on_time += [
            f"ts >= {low_sql} AND ts < {high_sql}",
            f"ts BETWEEN {low_sql} AND {high_sql}",
            f"ts < {low_sql}",
            f"ts > {high_sql} OR ts IS NULL",
            f"ts = {low_sql}",
            f"ts + INTERVAL 9 HOUR <= {high_sql}",
            f"{TOKYO_MONTH} = date_trunc('month', {low_sql} + INTERVAL 9 HOUR)",
        ]
    return {"email": on_email, "time": on_time}


def test_filters_prune_through_the_expression_a_built_in_wraps(composed: dict[str, Any]) -> None:
    """Every filter returns exactly DuckDB's rows over the source; the filters that name one value of the
    column or of the inner expression read one partition, and bounded ranges on `ts` read only the
    months they reach."""
    table = composed["table"]
    filters = _composed_filters(table)
    checked = 0
    for layout, kind in (("bucket", "email"), ("month", "time"), ("month_tz", "time")):
        for where in filters[kind]:
            if layout == "month_tz":
                where = where.replace("ts", "tz").replace("TIMESTAMP '", "TIMESTAMPTZ '")
            reader = composed["readers"][layout]
            got = sorted(reader.read(where, columns=["rid"]).column("rid").to_pylist())
            assert got == _expected({"table": table}, where), f"{layout}: {where}"
            checked += 1
    assert checked >= 200

    def selected(layout: str, where: str) -> int:
        return len(composed["readers"][layout].plan(where).selected)

    bucket_total = selected("bucket", "TRUE")
    assert bucket_total >= 6
    # Should read one partition: email = 'a@x.IO' lands where lower('a@x.IO') lands (no row holds it,
    # but its partition's min/max span it, so only the bucket decides).
    assert selected("bucket", "email = 'a@x.IO'") == 1
    assert selected("bucket", "lower(email) = 'a@x.io'") == 1
    assert selected("bucket", "lower(email) IN ('a@x.io', 'ix@y')") <= 2
    month_total = selected("month", "TRUE")
    assert month_total >= 6
    # Should read only Tokyo's February: 2026-01-31 15:00 UTC is 2026-02-01 00:00 in Tokyo.
    assert selected("month", "ts >= TIMESTAMP '2026-01-31 15:00:00' AND ts < TIMESTAMP '2026-02-10'") == 1
    assert selected("month", "ts = TIMESTAMP '2026-01-31 14:59:59.999999'") == 1
    assert selected("month", "ts < TIMESTAMP '2025-12-31 15:00:00'") < month_total - 2
    assert selected("month_tz", "tz >= TIMESTAMPTZ '2026-01-31 15:00:00+00'") < month_total
