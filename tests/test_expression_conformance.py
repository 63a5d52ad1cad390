"""Conformance: every function of the partition expression set gives the same value in every engine.

Over hostile values (NULLs, '', 'ß', 'İ', emoji, '/', '=', '%', quotes, negative numbers, zero, int64
extremes, timestamps around midnight and with offsets), each expression is evaluated

* as DuckDB evaluates the text as written over the source (the reference: reads are checked against it),
* vectorised over Arrow (`apply`), on each value (`apply_scalar`),
* in Spark local mode (`to_spark`, one query per function group),
* through a Postgres source (the partition values its discovery reports, real server),
* in Postgres itself, row for row: the pushdown form (`sources.pg_expressions`) of every expression that
  has one, over a text column with a linguistic collation; the others are refused with their reason,

and compared row for row. A row that two engines would route to two partitions fails here.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from airflow_partitions.exceptions import PartitionExpressionError, PartitionValueError
from airflow_partitions.pruning import executable_sql
from airflow_partitions.read import new_duckdb_connection
from airflow_partitions.transforms import parse_transform
from airflow_partitions.transforms.expression import ExpressionTransform
from airflow_partitions.write.routing import partition_groups

UTC = dt.UTC
STRINGS = [
    None,
    "",
    "EU",
    "eu",
    "ß",
    "İstanbul",
    "ﬁ",
    "🙂x",
    "a/b=c",
    "100%",
    "it's",
    '"q"',
    "  pad  ",
    "x" * 70,
    "Ab/Cd/Ef",
    "42",
    "-7",
    "日本語",
    "é",
    "e\u0301",
]
INTS = [
    None,
    0,
    1,
    -1,
    7,
    -7,
    1000,
    1001,
    -1000,
    2**63 - 1,
    -(2**63),
    123_456_789,
    -5,
    5,
    6,
    -6,
    2,
    -2,
    3,
    999,
]
SMALL = [None, 0, 1, -1, 7, -7, 3, -3, 100, -100, 2, -2, 5, -5, 6, 4, 9, -9, 10, 11]
TIMES = [
    None,
    dt.datetime(2026, 1, 31, 14, 59, 59, 999_999),
    dt.datetime(2026, 1, 31, 15, 0),
    dt.datetime(2026, 12, 31, 23, 30),
    dt.datetime(1969, 12, 31, 23, 59, 59),
    dt.datetime(2024, 2, 29, 12, 0),
    dt.datetime(2026, 3, 29, 1, 0),
    dt.datetime(2000, 1, 1),
    dt.datetime(2026, 6, 15, 8, 45, 30, 1),
    dt.datetime(2026, 10, 25, 0, 59),
] * 2
AWARE = [
    None if moment is None else moment.replace(tzinfo=dt.timezone(dt.timedelta(hours=offset)))
    for moment, offset in zip(TIMES, [0, 9, -5, 2, 0, -8, 1, 5, -3, 14] * 2, strict=True)
]
DATES = [None if moment is None else moment.date() for moment in TIMES]

TABLE = pa.table(
    {
        "s": pa.array(STRINGS, pa.string()),
        "i": pa.array(INTS, pa.int64()),
        "k": pa.array(SMALL, pa.int32()),
        "ts": pa.array(TIMES, pa.timestamp("us")),
        "tz": pa.array(AWARE, pa.timestamp("us", "UTC")),
        "d": pa.array(DATES, pa.date32()),
    }
)

# Function group -> expressions as a user writes them (each over one column of TABLE).
GROUPS: dict[str, list[str]] = {
    "string": [
        "lower(s)",
        "upper(s)",
        "substr(s, 0, 2)",
        "substr(s, 2)",
        "substring(s, -2, 5)",
        "substr(s, 100, 2)",
        "left(s, 2)",
        "right(s, 2)",
        "left(s, -1)",
        "trim(s)",
        "ltrim(s)",
        "rtrim(s)",
        "length(s)",
        "replace(s, '/', '=')",
        "split_part(s, '/', 2)",
        "split_part(s, '/', 0)",
        "concat(s, '%')",
        "s || ''''",
        "regexp_extract(s, '([a-z]+)', 1)",
        "starts_with(s, 'E')",
        "s LIKE '%/%'",
        "s > 'm'",
        "greatest(s, 'Z')",
        "s BETWEEN 'a' AND 'z'",
        "bucket(16, lower(s))",
        "truncate(2, upper(s))",
        "TRY_CAST(s AS BIGINT)",
    ],
    "numeric": [
        "i // 7",
        "i // -7",
        "i % 7 - 1",
        "abs(i % 7)",
        "(i % 7) % 3",
        "CAST(i / 4 AS BIGINT)",
        "CAST(floor(i / 4) AS BIGINT)",
        "CAST(ceil(i / 4) AS BIGINT)",
        "round(k, -1)",
        "greatest(i, 0)",
        "least(i, 10)",
        "CAST(i AS VARCHAR)",
        "k * 3 + 1",
        "abs(k)",
        "-k",
        "k - 2",
        "CAST(round(k / 2) AS INTEGER)",
        "CAST(k / 2 AS INTEGER)",
        "k // 2",
        "CAST(k AS TINYINT)",
        "bucket(8, k * 2)",
    ],
    "conditional": [
        "CASE WHEN i > 1000 THEN 'big' WHEN i < 0 THEN 'negative' ELSE 'small' END",
        "CASE WHEN s IS NULL THEN 'null' WHEN s = '' THEN 'empty' ELSE left(s, 1) END",
        "coalesce(s, 'none')",
        "coalesce(k, -1)",
        "nullif(s, '')",
        "nullif(k, 0)",
        "if(k > 0, 1, 0)",
        "CASE k WHEN 1 THEN 'one' WHEN -1 THEN 'minus one' END",
    ],
    "boolean": [
        "i > 1000",
        "i BETWEEN -5 AND 5",
        "s IN ('EU', 'ß')",
        "k IN (1, NULL)",
        "i IS NULL",
        "i > 0 OR i IS NULL",
        "NOT (k > 0) AND k IS NOT NULL",
        "s <> ''",
    ],
    "date": [
        "date_trunc('month', ts + INTERVAL 9 HOUR)",
        "CAST(date_trunc('day', tz) AS DATE)",
        "date_trunc('month', tz - INTERVAL 5 HOUR)",
        "date_part('hour', tz + INTERVAL 30 MINUTE)",
        "year(d + INTERVAL 1 DAY)",
        "CAST(ts AS DATE)",
        "CAST(tz AS DATE)",
        "month(d) * 100 + day(d)",
        "date_trunc('week', d + 3)",
        "CAST(date_part('year', ts) AS VARCHAR)",
        "d + 1",
        "hour(ts) + 1",
        "CAST(extract(minute FROM tz) AS VARCHAR)",
    ],
}
ALL = [(group, text) for group, texts in GROUPS.items() for text in texts]


def as_comparable(value: Any) -> Any:
    """Instants as naive UTC (Spark and Arrow label zones differently), the rest as is."""
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(UTC).replace(tzinfo=None)
    return value


def column_of(text: str) -> str:
    transform = parse_transform(text)
    return transform.source_column


def bound(text: str) -> ExpressionTransform:
    transform = parse_transform(text)
    assert isinstance(transform, ExpressionTransform), text
    return transform.bind(TABLE.schema.field(transform.source_column).type)


@pytest.fixture(scope="module")
def reference() -> Iterator[dict[str, list[Any]]]:
    """DuckDB over the source, the expression as written (a reader's connection, TimeZone UTC)."""
    connection = new_duckdb_connection()
    connection.register("source_rows", TABLE)
    values: dict[str, list[Any]] = {}
    for _, text in ALL:
        # Through the reader's rewrite (built-ins such as date_trunc get their partition semantics).
        sql = executable_sql(f"SELECT ({text}) FROM source_rows", TABLE.schema)
        rows = connection.sql(sql).fetchall()
        values[text] = [as_comparable(row[0]) for row in rows]
    yield values
    connection.close()


@pytest.mark.parametrize(("group", "text"), ALL, ids=[text for _, text in ALL])
def test_arrow_and_scalar_equal_duckdb_over_the_source(
    reference: dict[str, list[Any]], group: str, text: str
) -> None:
    transform = bound(text)
    column = TABLE.column(transform.source_column)
    arrow = [as_comparable(v) for v in transform.apply(column).to_pylist()]
    scalar = [as_comparable(transform.apply_scalar(v)) for v in column.to_pylist()]
    assert arrow == scalar, f"{text}: Arrow and scalar disagree"
    assert arrow == reference[text], f"{text}: Arrow disagrees with DuckDB over the source"
    assert parse_transform(transform.canonical) == transform


@pytest.mark.parametrize("group", list(GROUPS))
def test_spark_equals_arrow(spark: Any, group: str) -> None:
    """One Spark query per group: every expression of the group is a column of one select."""
    from pyspark.sql import functions as F

    transforms = [bound(text) for text in GROUPS[group]]
    frame = spark.createDataFrame(TABLE)
    columns = [t.to_spark(F.col(t.source_column)).alias(f"e{n}") for n, t in enumerate(transforms)]
    computed = frame.select(*columns).toArrow()
    for number, transform in enumerate(transforms):
        expected = [
            as_comparable(v) for v in transform.apply(TABLE.column(transform.source_column)).to_pylist()
        ]
        got = [as_comparable(v) for v in computed.column(f"e{number}").to_pylist()]
        assert got == expected, f"{transform.canonical}: Spark disagrees with Arrow"


# The same select through Spark Connect (the run's shared server): a Connect client cannot share this
# process with the classic session, so a child process runs it and hands the values back as Arrow IPC.
CONNECT_CLIENT = """
import sys
sys.path.insert(0, sys.argv[3])
import pyarrow as pa
from pyspark.sql import SparkSession, functions as F
import test_expression_conformance as conformance
spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
frame = spark.createDataFrame(conformance.TABLE)
transforms = [conformance.bound(text) for _, text in conformance.ALL]
columns = [t.to_spark(F.col(t.source_column)).alias(f"e{n}") for n, t in enumerate(transforms)]
computed = frame.select(*columns).toArrow()
with pa.OSFile(sys.argv[2], "wb") as sink, pa.ipc.new_file(sink, computed.schema) as writer:
    writer.write_table(computed)
spark.stop()
"""


def run_connect_client(script: str, spark_connect_server: dict[str, Any], out: Any) -> pa.Table:
    """Run `script` in a process of its own (a Connect session cannot share this process with the
    classic session) with the server's URL, `out` and the tests directory as arguments; the Arrow file
    it wrote to `out`."""
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).resolve().parent
    completed = subprocess.run(
        [sys.executable, "-c", script, spark_connect_server["url"], str(out), str(tests)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tests.parent,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    with pa.memory_map(str(out)) as source:
        return pa.ipc.open_file(source).read_all()


@pytest.mark.scale
def test_spark_connect_equals_arrow(spark_connect_server: dict[str, Any], tmp_path: Any) -> None:
    """Every expression of every group through Spark Connect equals Arrow. In the scale lane: a client
    process plus the server's Python workers for the Arrow UDFs took 145 s on a loaded 2-core machine
    (load ~20), beyond what the default suite can spend on it."""
    computed = run_connect_client(CONNECT_CLIENT, spark_connect_server, tmp_path / "values.arrow")
    for number, (_, text) in enumerate(ALL):
        transform = bound(text)
        expected = [
            as_comparable(v) for v in transform.apply(TABLE.column(transform.source_column)).to_pylist()
        ]
        got = [as_comparable(v) for v in computed.column(f"e{number}").to_pylist()]
        assert got == expected, f"{transform.canonical}: Spark Connect disagrees with Arrow"


def _load_postgres(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE hostile (s text, i bigint, k integer, ts timestamp, tz timestamptz, d date)"
        )
        with conn.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO hostile VALUES (%s, %s, %s, %s, %s, %s)",
                [tuple(row.values()) for row in TABLE.to_pylist()],
            )


@pytest.mark.parametrize("group", list(GROUPS))
def test_postgres_discovery_equals_arrow(pg_module_database: str, group: str) -> None:
    """A Postgres source reports the partition values Arrow computes, NULL partitions included."""
    import psycopg

    from airflow_partitions.sources.base import Deadline
    from airflow_partitions.sources.postgres import PostgresSource

    with psycopg.connect(pg_module_database, autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass('public.hostile') IS NOT NULL").fetchone()
    if not exists or not exists[0]:
        _load_postgres(pg_module_database)
    source = PostgresSource("public", "hostile", url=pg_module_database)
    schema = source.schema()
    for text in GROUPS[group]:
        transform = parse_transform(text).bind(schema.field(column_of(text)).type)
        survey = source.survey([transform], need_keys=True, check_column=None, deadline=Deadline(60))
        assert survey.keys is not None
        got = sorted({as_comparable(key[0]) for key in survey.keys}, key=repr)
        expected_values = transform.apply(TABLE.column(transform.source_column)).to_pylist()
        expected = sorted({as_comparable(v) for v in expected_values}, key=repr)
        assert got == expected, f"{text}: Postgres discovery disagrees with Arrow"


# Expressions of the suite without a Postgres form, and a word of the reason each gives.
POSTGRES_REFUSED = {
    "lower(s)": "LC_CTYPE",
    "upper(s)": "LC_CTYPE",
    "bucket(16, lower(s))": "LC_CTYPE",
    "truncate(2, upper(s))": "LC_CTYPE",
    "substring(s, -2, 5)": "negative or computed start",
    "split_part(s, '/', 0)": "position below 1",
    "regexp_extract(s, '([a-z]+)', 1)": "no regexp_extract",
    "TRY_CAST(s AS BIGINT)": "no TRY_CAST",
    "round(k, -1)": "half to even",
    "CAST(round(k / 2) AS INTEGER)": "half to even",
    "bucket(8, k * 2)": "no Murmur3",
}


@pytest.fixture(scope="module")
def postgres_rows(pg_module_database: str) -> str:
    """The hostile rows in Postgres with their row number; text under a linguistic (ICU) collation when
    the server has one, so only an explicit code point order makes comparisons agree with DuckDB."""
    import psycopg

    with psycopg.connect(pg_module_database, autocommit=True) as conn:
        icu = conn.execute("SELECT 1 FROM pg_collation WHERE collname = 'und-x-icu'").fetchone()
        collate = ' COLLATE "und-x-icu"' if icu else ""
        conn.execute(
            f"CREATE TABLE hostile_rows (rid int, s text{collate}, i bigint, k integer, ts timestamp, "
            "tz timestamptz, d date)"
        )
        with conn.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO hostile_rows VALUES (%s, %s, %s, %s, %s, %s, %s)",
                [(rid, *row.values()) for rid, row in enumerate(TABLE.to_pylist())],
            )
    return pg_module_database


def _plain(value: Any) -> Any:
    """Postgres numbers (numeric, double) as the integers they hold; instants as naive UTC."""
    from decimal import Decimal

    if isinstance(value, Decimal | float) and value == int(value):
        return int(value)
    return as_comparable(value)


@pytest.mark.parametrize("group", list(GROUPS))
def test_the_postgres_form_equals_arrow_row_for_row(postgres_rows: str, group: str) -> None:
    """Each expression's Postgres form, evaluated by Postgres, gives every row Arrow's value; an
    expression without one is refused with the reason, and only the known disagreements are."""
    import psycopg

    from airflow_partitions.sources.pg_expressions import postgres_expression

    with psycopg.connect(postgres_rows, autocommit=True) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        for text in GROUPS[group]:
            transform = bound(text)
            form = postgres_expression(transform)
            if text in POSTGRES_REFUSED:
                assert form.sql is None, f"{text}: expected no Postgres form"
                assert form.refused is not None
                assert POSTGRES_REFUSED[text] in form.refused, form.refused
                continue
            assert form.sql is not None, f"{text}: refused for Postgres: {form.refused}"
            rows = conn.execute(f"SELECT {form.sql} FROM hostile_rows ORDER BY rid").fetchall()
            got = [_plain(row[0]) for row in rows]
            expected = [_plain(v) for v in transform.apply(TABLE.column(transform.source_column)).to_pylist()]
            assert got == expected, f"{text}: Postgres ({form.sql}) disagrees with Arrow"


def test_without_the_code_point_order_postgres_would_disagree(postgres_rows: str) -> None:
    """The collation normalisation is what makes `s > 'm'` agree: the column's own collation does not."""
    import psycopg

    with psycopg.connect(postgres_rows, autocommit=True) as conn:
        icu = conn.execute("SELECT 1 FROM pg_collation WHERE collname = 'und-x-icu'").fetchone()
        if not icu:
            pytest.skip("the server has no ICU collation to disagree with")
        native = [row[0] for row in conn.execute("SELECT s > 'm' FROM hostile_rows ORDER BY rid")]
    assert native != bound("s > 'm'").apply(TABLE.column("s")).to_pylist()


@pytest.mark.parametrize("ansi", ["true", "false"])
def test_native_spark_arithmetic_fails_on_overflow_as_duckdb_does(spark: Any, ansi: str) -> None:
    """Checked in the expression's own type: Spark's long arithmetic would wrap around without ANSI mode
    and route the row to a partition no other engine gives it."""
    from pyspark.sql import functions as F

    previous = spark.conf.get("spark.sql.ansi.enabled")
    spark.conf.set("spark.sql.ansi.enabled", ansi)
    try:
        for text, column_type, values in (
            ("i * 2", pa.int64(), [1, 2**62]),
            ("k + 1", pa.int32(), [1, 2**31 - 1]),
            ("-i", pa.int64(), [1, -(2**63)]),
        ):
            transform = parse_transform(text).bind(column_type)
            assert "evaluate_batch" not in str(transform.to_spark(F.col("x"))), text
            frame = spark.createDataFrame(pa.table({transform.source_column: pa.array(values, column_type)}))
            with pytest.raises(Exception, match="overflow"):
                frame.select(transform.to_spark(F.col(transform.source_column))).collect()
            with pytest.raises(PartitionValueError):
                transform.apply(pa.array(values, column_type))
    finally:
        spark.conf.set("spark.sql.ansi.enabled", previous)


ARROW_NATIVE = [
    "CASE WHEN i > 1000 THEN 'big' WHEN i < 0 THEN 'negative' ELSE 'small' END",
    "CASE WHEN s IS NULL THEN 'null' WHEN s = '' THEN 'empty' ELSE 'other' END",
    "left(s, 2)",
    "substr(s, 1, 3) = 'ab' OR s IS NULL",
    "NOT (k > 0) AND k IS NOT NULL",
    "s > 'm'",
    "CASE WHEN k >= 5 THEN 1 WHEN k < -5 THEN -1 END",
    "lower(s)",
    "upper(s)",
    "upper(left(s, 3)) = 'EU'",
    "CASE WHEN lower(s) = 'eu' THEN 'eu' ELSE 'other' END",
    "CASE WHEN i > 1000 THEN 'big' ELSE 'small' END",
    "CASE WHEN s > 'm' THEN 'late' END",
    "CASE WHEN k > 0 THEN 'x' WHEN k IS NULL THEN 'y' WHEN k < -5 THEN 'x' ELSE 'z' END",
    "CASE WHEN k > 0 THEN 'same' ELSE 'same' END",
]
# The string CASEs route on indices into their literals (`arrow_native.encoded_kernel`).
ARROW_ENCODED = [text for text in ARROW_NATIVE if text.startswith("CASE") and "THEN '" in text]


@pytest.mark.parametrize("text", ARROW_NATIVE)
def test_arrow_kernels_give_duckdb_s_values(text: str) -> None:
    """The Arrow compute path (no DuckDB round trip) is taken for these, and gives DuckDB's values on the
    hostile rows and on random unicode strings (surrogate-free code points, combining marks, emoji)."""
    import random

    from airflow_partitions.transforms.arrow_native import evaluate
    from airflow_partitions.transforms.duckdb_eval import evaluate_sql

    transform = bound(text)
    assert transform._native is not None, f"{text}: not evaluated by Arrow kernels"
    rng = random.Random(29)
    # With code points Arrow's and DuckDB's case mappings treat differently (one of each block).
    alphabet = [
        chr(c)
        for c in (
            *range(0x20, 0x7F),
            *(0xDF, 0x130, 0x301, 0x1F642, 0xFB01, 0x10FFFF, 0x3A3),
            *(0x19B, 0x264, 0x1C89, 0xA7CB, 0xAB6C, 0x10D50, 0x10D70, 0x16EA0, 0x1DF40, 0x1DF7F),
        )
    ]
    column = TABLE.column(transform.source_column).combine_chunks()
    samples = [column]
    if pa.types.is_string(column.type):
        words = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6))) for _ in range(2000)]
        samples.append(pa.array([None if n % 17 == 0 else w for n, w in enumerate(words)], pa.string()))
    for values in samples:
        native = evaluate(transform._native, values)
        assert native is not None
        inner = transform.inner_result_type()
        duckdb_values = evaluate_sql(transform.sql, transform.source_column, values, inner, text)
        assert native.cast(inner).to_pylist() == duckdb_values.to_pylist(), text
        if text in ARROW_ENCODED:
            assert transform._encoded is not None, f"{text}: not routed on its literals' indices"
            encoded = transform.routing_values(pa.table({transform.source_column: values}))
            assert pa.types.is_dictionary(encoded.type), text
            assert encoded.to_pylist() == duckdb_values.to_pylist(), text
            # Routing on the indices puts each row in the partition of DuckDB's value.
            group, keys = partition_groups(pa.table({transform.source_column: values}), [transform])
            routed = [keys[code].values[0] for code in group.to_pylist()]
            assert routed == duckdb_values.to_pylist(), text
        else:
            assert transform._encoded is None, text


@pytest.fixture(scope="module")
def own_differing_code_points() -> dict[str, set[int]]:
    """Measured here, not by the package: each code point alone, Arrow's kernel against DuckDB's SQL."""
    import duckdb
    import pyarrow.compute as pc

    points = pa.array([p for p in range(0x110000) if not 0xD800 <= p <= 0xDFFF], pa.int64())
    values = pa.array([chr(p) for p in points.to_pylist()], pa.string())
    connection = duckdb.connect()
    connection.register("points", pa.table({"s": values}))
    measured = {}
    for function in ("lower", "upper"):
        result = connection.sql(f"SELECT {function}(s) AS v FROM points").to_arrow_table()
        same = pc.equal(result.column("v").cast(pa.string()), getattr(pc, f"utf8_{function}")(values))
        measured[function] = set(points.filter(pc.invert(same)).to_pylist())
    connection.close()
    return measured


@pytest.mark.parametrize("function", ["lower", "upper"])
def test_the_code_points_where_arrow_case_mapping_differs_are_all_known(
    own_differing_code_points: dict[str, set[int]], function: str
) -> None:
    """The fast path corrects exactly these; an engine upgrade that changes them fails here first."""
    from airflow_partitions.transforms import case_mapping

    measured = own_differing_code_points[function]
    assert len(measured) > 0  # today 75 each: Arrow maps newer Unicode letters DuckDB leaves as they are
    assert case_mapping.differing(function) == measured
    if function == "lower":  # the package's own measurement, used under versions other than VERIFIED_WITH
        assert case_mapping.measure_differing(function) == measured


def test_lower_and_upper_take_the_arrow_path_and_equal_duckdb_on_every_code_point() -> None:
    """Every code point, in runs of 61 and shuffled among the differing ones, through `apply` (Arrow's
    kernel plus the corrected rows) against DuckDB's SQL over the same rows."""
    import random

    import duckdb

    from airflow_partitions.transforms import case_mapping

    rng = random.Random(2029)
    points = case_mapping.all_code_points()
    special = sorted(case_mapping.differing("lower") | case_mapping.differing("upper"))
    rows: list[str | None] = ["".join(map(chr, points[n : n + 61])) for n in range(0, len(points), 61)]
    rows += [
        "".join(chr(rng.choice(special) if rng.random() < 0.3 else rng.choice(points)) for _ in range(5))
        for _ in range(3000)
    ]
    rows += [*STRINGS, "ΟΔΟΣ", "ΑΣ Α", "ǅ", "İı", chr(0x1C89) + "EU", "eu" + chr(0xA7CB)]
    rng.shuffle(rows)
    connection = duckdb.connect()
    for kind, sample in ((pa.string(), rows), (pa.large_string(), rows[:2000])):
        column = pa.array(sample, kind).slice(3)  # an offset into the buffers, as a batch slice has
        connection.register("rows", pa.table({"s": column}))
        for function in ("lower", "upper"):
            transform = parse_transform(f"{function}(s)").bind(kind)
            assert transform._native is not None
            expected = [r[0] for r in connection.sql(f"SELECT {function}(s) FROM rows").fetchall()]
            assert transform.apply(column).to_pylist() == expected, (function, kind)
        connection.unregister("rows")
    connection.close()


# Strings where Spark's own case mapping (ICU or the JVM) is not DuckDB's: 1:many mappings ('İ' -> 'i̇',
# 'ß' -> 'SS', ligatures, 'ŉ', 'ǰ', Greek with iota subscript), the final sigma (context), letters beside
# ASCII (a row is ASCII or not as a whole), supplementary letters (Deseret, Adlam, Osage), and the usual
# hostile values. Each is also checked to have a code point of the measured differing sets below.
CASE_MAPPING_STRINGS = [
    None,
    "",
    "EU/eu=100%",
    'it\'s "q"',
    "İ",
    "İstanbul",
    "DİYARBAKIR",
    "ß",
    "STRAßE",
    "ẞ",
    "ΟΔΟΣ",
    "ΟΔΟΣ ΑΣ",
    "ΣΑ",
    "xΣ.",
    "ς",
    "ﬁ",
    "ﬀ",
    "ﬃx",
    "ŉ",
    "ǰ",
    "ᾳ",
    "ᾼ",
    "ΐ",
    "ǅ",
    "ı",
    "K",
    "Å",
    "𐐀𐐨",
    "𞤀𞤢",
    "𐒰𐓘",
    "🙂EU",
    "e\u0301",
    "EU" + chr(0x1C89),
    chr(0xA7CB) + "eu",
    chr(0x10D50) + chr(0x10D70),
]


def test_spark_lower_and_upper_are_native_and_equal_duckdb_on_every_code_point(spark: Any) -> None:
    """Every code point (in runs of 61), then the hostile strings above and random strings over the code
    points of the runs Spark's own mapping gets wrong, through `to_spark`: native columns (no Arrow UDF),
    equal to DuckDB row for row. Spark's own `lower` / `upper` disagree with DuckDB on runs and on the
    hostile strings, so the check is not vacuous."""
    import random

    import duckdb
    from pyspark.sql import functions as F

    from airflow_partitions.transforms import case_mapping

    connection = duckdb.connect()
    columns = []
    for function in ("lower", "upper"):
        column = bound(f"{function}(s)").to_spark(F.col("s"))
        assert "evaluate_batch" not in str(column), f"{function}: not a native Spark column"
        columns += [column.alias(function), getattr(F, function)("s").alias(f"spark_{function}")]

    def compare(rows: list[str | None]) -> dict[str, list[str | None]]:
        """The rows Spark's own mapping gets wrong, per function (after checking ours gets none wrong)."""
        table = pa.table({"s": pa.array(rows, pa.string())})
        computed = spark.createDataFrame(table).select(*columns).toArrow()
        connection.register("rows", table)
        own_wrong = {}
        for function in ("lower", "upper"):
            expected = [r[0] for r in connection.sql(f"SELECT {function}(s) FROM rows").fetchall()]
            got = computed.column(function).to_pylist()
            wrong = [(row, g, e) for row, g, e in zip(rows, got, expected, strict=True) if g != e]
            assert not wrong, f"{function}: {len(wrong)} rows differ from DuckDB, e.g. {wrong[:3]}"
            own = computed.column(f"spark_{function}").to_pylist()
            own_wrong[function] = [row for row, o, e in zip(rows, own, expected, strict=True) if o != e]
        connection.unregister("rows")
        return own_wrong

    points = case_mapping.all_code_points()
    runs: list[str | None] = ["".join(map(chr, points[n : n + 61])) for n in range(0, len(points), 61)]
    wrong_runs = compare(runs)
    assert wrong_runs["lower"], "Spark's own lower equals DuckDB's: the check would be vacuous"
    assert wrong_runs["upper"], "Spark's own upper equals DuckDB's: the check would be vacuous"
    special = sorted({c for run in wrong_runs["lower"] + wrong_runs["upper"] if run for c in run} | {"Σ"})
    rng = random.Random(2930)
    mixed: list[str | None] = [
        "".join(rng.choice(special) if rng.random() < 0.4 else rng.choice("aZ Σ/=%'🙂") for _ in range(7))
        for _ in range(2000)
    ]
    own_wrong = compare([*CASE_MAPPING_STRINGS, *mixed])
    for function in ("lower", "upper"):
        assert set(own_wrong[function]) & set(CASE_MAPPING_STRINGS), f"Spark's own {function}: vacuous"
    connection.close()


CONNECT_CASE_CLIENT = """
import sys
sys.path.insert(0, sys.argv[3])
import pyarrow as pa
from pyspark.sql import SparkSession, functions as F
import test_expression_conformance as conformance
spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
frame = spark.createDataFrame(conformance.case_mapping_rows())
columns = []
for function in ("lower", "upper"):
    column = conformance.bound(function + "(s)").to_spark(F.col("s"))
    assert "evaluate_batch" not in str(column), column
    columns.append(column.alias(function))
computed = frame.select(*columns).toArrow()
with pa.OSFile(sys.argv[2], "wb") as sink, pa.ipc.new_file(sink, computed.schema) as writer:
    writer.write_table(computed)
spark.stop()
"""


def case_mapping_rows() -> pa.Table:
    """Every code point in runs of 61, then the hostile case mapping strings."""
    from airflow_partitions.transforms import case_mapping

    points = case_mapping.all_code_points()
    runs: list[str | None] = ["".join(map(chr, points[n : n + 61])) for n in range(0, len(points), 61)]
    return pa.table({"s": pa.array([*runs, *CASE_MAPPING_STRINGS], pa.string())})


def test_spark_connect_lower_and_upper_equal_duckdb_on_every_code_point(
    spark_connect_server: dict[str, Any], tmp_path: Any
) -> None:
    """The native `lower` / `upper` (a `translate` with DuckDB's table) through Spark Connect, on every
    code point and the hostile strings, equal DuckDB row for row."""
    import duckdb

    computed = run_connect_client(CONNECT_CASE_CLIENT, spark_connect_server, tmp_path / "case.arrow")
    rows = case_mapping_rows()
    connection = duckdb.connect()
    connection.register("rows", rows)
    for function in ("lower", "upper"):
        expected = [r[0] for r in connection.sql(f"SELECT {function}(s) FROM rows").fetchall()]
        got = computed.column(function).to_pylist()
        wrong = [
            (s, g, e) for s, g, e in zip(rows.column("s").to_pylist(), got, expected, strict=True) if g != e
        ]
        assert not wrong, (
            f"{function}: {len(wrong)} rows differ from DuckDB through Connect, e.g. {wrong[:3]}"
        )
    connection.close()


def test_overflow_is_a_typed_error_not_a_wrapped_value() -> None:
    """int64 + 1 at the maximum has no value: the refresh stops with an error naming the expression."""
    transform = parse_transform("i + 1").bind(pa.int64())
    with pytest.raises(PartitionValueError, match=r"'\(?i \+ 1"):
        transform.apply(pa.array([1, 2**63 - 1], pa.int64()))


def test_unicode_case_mapping_is_duckdb_s_in_every_engine() -> None:
    """Spark's own lower('İ') is 'i̇' and upper('ß') is 'SS': partition values follow DuckDB instead."""
    lower, upper = bound("lower(s)"), bound("upper(s)")
    assert lower.apply_scalar("İ") == "i"
    assert upper.apply_scalar("ß") == "ẞ"


@pytest.mark.parametrize(
    ("text", "column_type", "problem"),
    [
        ("s / 2", pa.string(), "does not apply to column 's'"),
        ("i / 2", pa.int64(), "gives double values"),
        ("CAST(i AS DECIMAL(10, 2))", pa.int64(), "CAST(floor(amount / 100) AS BIGINT)"),
    ],
)
def test_a_result_type_that_cannot_partition_is_refused_when_bound(
    text: str, column_type: pa.DataType, problem: str
) -> None:
    with pytest.raises(PartitionExpressionError, match=None) as caught:
        parse_transform(text).bind(column_type)
    assert problem in str(caught.value)
    assert repr(text) in str(caught.value) or text in str(caught.value)


# --- randomised: expressions drawn from the grammar --------------------------------------------------


class ExpressionGrammar:
    """Seeded random expressions over one column (a string column `s` or an integer column `k` by
    default), nested up to `depth` levels."""

    def __init__(self, seed: int, string_column: str = "s", integer_column: str = "k") -> None:
        import random

        self.rng = random.Random(seed)
        self.string_column = string_column
        self.integer_column = integer_column

    def _literal_string(self) -> str:
        return self.rng.choice(["''", "'a'", "'/'", "'%'", "'ß'", "'İ'", "'x=y'", "''''"])

    def string(self, column: str, depth: int) -> str:
        rng = self.rng
        if depth <= 0:
            if column == self.string_column:
                return column
            return f"CAST({self.integer(column, 0)} AS VARCHAR)"
        inner = self.string(column, depth - 1)
        n, m = rng.randint(-2, 4), rng.randint(0, 5)
        return rng.choice(
            [
                f"lower({inner})",
                f"upper({inner})",
                f"left({inner}, {n})",
                f"right({inner}, {m})",
                f"substr({inner}, {n}, {m})",
                f"trim({inner})",
                f"replace({inner}, 'a', '/')",
                f"concat({inner}, {self._literal_string()})",
                f"{inner} || {self._literal_string()}",
                f"coalesce({inner}, 'none')",
                f"nullif({inner}, '')",
                f"split_part({inner}, '/', {m})",
                f"CASE WHEN {self.boolean(column, depth - 1)} THEN {inner} ELSE 'other' END",
                f"greatest({inner}, 'm')",
            ]
        )

    def integer(self, column: str, depth: int) -> str:
        rng = self.rng
        if depth <= 0:
            return column if column == self.integer_column else f"length({self.string_column})"
        inner = self.integer(column, depth - 1)
        c = rng.choice([1, 2, 3, 7, -1, -3, 10])
        return rng.choice(
            [
                f"({inner} + {c})",
                f"({inner} - {c})",
                f"({inner} * {c})",
                f"({inner} // {c})",
                f"({inner} % {c})",
                f"abs({inner})",
                f"(-{inner})",
                f"greatest({inner}, {c})",
                f"least({inner}, {c})",
                f"coalesce({inner}, {c})",
                f"nullif({inner}, {c})",
                f"length({self.string(column, depth - 1)})",
                f"CAST(round({inner} / {abs(c) + 1}) AS INTEGER)",
                f"CASE WHEN {self.boolean(column, depth - 1)} THEN {inner} ELSE {c} END",
            ]
        )

    def boolean(self, column: str, depth: int) -> str:
        rng = self.rng
        integer, string = self.integer(column, max(depth, 0)), self.string(column, max(depth, 0))
        leaf = rng.choice(
            [
                f"{integer} > {rng.randint(-3, 5)}",
                f"{integer} BETWEEN -2 AND 2",
                f"{string} = {self._literal_string()}",
                f"{string} IS NULL",
                f"{integer} IN (0, 1, 7)",
                f"{string} LIKE 'a%'",
            ]
        )
        if depth > 0 and rng.random() < 0.3:
            return f"NOT ({leaf})"
        return leaf

    def draw(self) -> str:
        return self.draw_over(self.rng.choice([self.string_column, self.integer_column]))

    def draw_over(self, column: str) -> str:
        """One expression over `column` (one of the grammar's two columns)."""
        depth = self.rng.randint(1, 3)
        kind = self.rng.choice(["string", "integer", "boolean"])
        return str(getattr(self, kind)(column, depth))


GRAMMAR = ExpressionGrammar(seed=29)
RANDOM_EXPRESSIONS = list(dict.fromkeys(GRAMMAR.draw() for _ in range(60)))


def test_random_expressions_agree_in_arrow_scalar_duckdb_and_spark(spark: Any) -> None:
    """Expressions drawn from the grammar: the same values in every engine, or the same refusal."""
    from pyspark.sql import functions as F

    connection = new_duckdb_connection()
    connection.register("source_rows", TABLE)
    checked: list[ExpressionTransform] = []
    expected: list[list[Any]] = []
    try:
        for text in RANDOM_EXPRESSIONS:
            try:
                reference = [
                    as_comparable(row[0])
                    for row in connection.sql(f"SELECT ({text}) FROM source_rows").fetchall()
                ]
            except Exception:  # DuckDB cannot evaluate it (overflow, a bad cast): neither may we
                with pytest.raises((PartitionValueError, PartitionExpressionError)):
                    bound(text).apply(TABLE.column(column_of(text)))
                continue
            refusal = ""
            try:
                transform = bound(text)
            except PartitionExpressionError as err:
                refusal = str(err)
            if refusal:
                # Only a result type that cannot partition may be refused here (a double, a decimal).
                assert "double" in refusal or "decimal" in refusal, f"{text}: {refusal}"
                continue
            values = transform.apply(TABLE.column(transform.source_column)).to_pylist()
            assert [as_comparable(v) for v in values] == reference, f"{text}: Arrow disagrees with DuckDB"
            scalars = [transform.apply_scalar(v) for v in TABLE.column(transform.source_column).to_pylist()]
            assert [as_comparable(v) for v in scalars] == reference, f"{text}: scalar disagrees"
            checked.append(transform)
            expected.append(reference)
    finally:
        connection.close()
    assert len(checked) >= 30, f"too few random expressions evaluate: {len(checked)}"
    frame = spark.createDataFrame(TABLE)
    columns = [t.to_spark(F.col(t.source_column)).alias(f"e{n}") for n, t in enumerate(checked)]
    computed = frame.select(*columns).toArrow()
    for number, transform in enumerate(checked):
        got = [as_comparable(v) for v in computed.column(f"e{number}").to_pylist()]
        assert got == expected[number], f"{transform.canonical}: Spark disagrees"


@pytest.mark.parametrize(
    ("text", "native"),
    [
        ("CASE WHEN i > 1000 THEN 'big' WHEN i < 0 THEN 'negative' ELSE 'small' END", True),
        ("left(s, 2)", True),
        ("substr(s, 1, 3) = 'ab' OR s IS NULL", True),
        ("i BETWEEN -5 AND 5", False),
        ("lower(s)", True),
        ("upper(left(s, 3)) = 'EU'", True),
        ("lower(CAST(i AS VARCHAR))", False),
        ("substr(s, 0, 2)", False),
        ("k * 3 + 1", True),
        ("(i // 1000) * 1000", True),
        ("abs(i % 7) - 1", True),
        ("i // 0", False),
        ("i / 4", False),
        ("CASE WHEN k > 0 THEN 1 ELSE 'x' END", False),
    ],
)
def test_spark_runs_only_the_shared_subset_natively(spark: Any, text: str, native: bool) -> None:
    """Comparisons, boolean logic, CASE over literals, code point prefixes, `lower` / `upper` of a string
    and checked integer arithmetic are native Spark; the rest (`/`, substr from 0, casts, ...) runs the
    DuckDB evaluation as an Arrow UDF."""
    from pyspark.sql import functions as F

    try:
        transform = bound(text)
    except PartitionExpressionError:
        assert not native
        return
    column = transform.to_spark(F.col(transform.source_column))
    assert ("evaluate_batch" not in str(column)) is native, str(column)


# --- multi_bucket(N, a, b, ...) ---------------------------------------------------------------------
#
# The Lance spec's hash of several columns, in every engine, against an independent implementation: the
# `mmh3` package (checked first against Murmur3's published vectors) over bytes this test builds itself
# with `struct`, following the documented encoding, never through the package's code.

MB_STRINGS = [None, "", "EU", "ß", "🙂x", "a/b=c", "it's", "日本語", "e\u0301", None, "x" * 70, "%", "", None]
MB_ROWS = len(MB_STRINGS)
MB_TABLE = pa.table(
    {
        "s": pa.array(MB_STRINGS, pa.string()),
        "i8": pa.array([None, -128, 127, 0, -1, None, 5, 1, None, -7, 3, None, 0, None], pa.int8()),
        "i16": pa.array([1, None, -32768, 32767, -1, 0, None, 2, None, 9, -9, None, 0, None], pa.int16()),
        "i32": pa.array([None, 0, -(2**31), 2**31 - 1, -1, 7, None, -5, None, 1, 2, 3, 0, None], pa.int32()),
        "i64": pa.array(
            [2**63 - 1, -(2**63), None, 0, -1, 42, None, -42, None, 10**12, -(10**12), 1, 0, None], pa.int64()
        ),
        "f64": pa.array(
            [0.0, -0.0, float("nan"), 1.5, None, -2.25, 1e300, None, None, -1e-300, 3.0, 0.1, None, None],
            pa.float64(),
        ),
        "f32": pa.array(
            [-0.0, 0.5, None, float("nan"), 1.25, None, -3.0, 0.0, None, 65504.0, None, 2.0**-20, None, None],
            pa.float32(),
        ),
        "d": pa.array(
            [
                *(dt.date(2026, 1, 31), None, dt.date(1969, 12, 31), dt.date(1, 1, 1), dt.date(9999, 12, 31)),
                *(dt.date(2000, 2, 29), None, dt.date(1970, 1, 1), None, dt.date(2024, 6, 1)),
                *(None, dt.date(1999, 1, 1), None, None),
            ],
            pa.date32(),
        ),
        "ts": pa.array(
            [TIMES[i] for i in range(1, 11)]
            + [None, dt.datetime(1969, 12, 31, 23, 59, 59, 999_999), None, None],
            pa.timestamp("us"),
        ),
        "tz": pa.array(
            [AWARE[i] for i in range(1, 11)] + [None, None, dt.datetime(2026, 3, 29, 1, tzinfo=UTC), None],
            pa.timestamp("us", "UTC"),
        ),
        "b": pa.array(
            [
                b"",
                b"\x00",
                None,
                b"\xff\xfe",
                b"abc",
                None,
                b"/",
                None,
                None,
                b"\x00" * 9,
                b"",
                None,
                b"z",
                None,
            ],
            pa.binary(),
        ),
    }
)
# The last row is NULL in every column: the only row with the NULL bucket.
MULTI_BUCKETS = [
    "multi_bucket(8, s, i32)",
    "multi_bucket(16, i8, i16, i32, i64)",
    "multi_bucket(7, s, ts, tz, d)",
    "multi_bucket(1000, f64, s, b, f32)",
    "multi_bucket(3, tz, s)",
    "multi_bucket(1, i64, s)",
    "multi_bucket(1000000, b, d, i8)",
]
MB_FORMATS = {"i8": "<b", "i16": "<h", "i32": "<i", "i64": "<q", "d": "<i", "ts": "<q", "tz": "<q"}


def _independent_bytes(column: str, value: Any) -> bytes:
    import math
    import struct

    if column == "s":
        return bytes(value, "utf-8")
    if column == "b":
        return bytes(value)
    if column == "f64":
        if math.isnan(value):
            return bytes.fromhex("000000000000f87f")
        return struct.pack("<d", 0.0 if value == 0 else value)
    if column == "f32":
        if math.isnan(value):
            return bytes.fromhex("0000c07f")
        return struct.pack("<f", 0.0 if value == 0 else value)
    if column == "d":
        return struct.pack("<i", (value - dt.date(1970, 1, 1)).days)
    if column in ("ts", "tz"):
        moment = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        delta = moment - dt.datetime(1970, 1, 1, tzinfo=UTC)
        return struct.pack("<q", (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds)
    return struct.pack(MB_FORMATS[column], value)


def _independent_buckets(text: str) -> list[int | None]:
    import mmh3

    transform = parse_transform(text)
    count = int(text.split("(")[1].split(",")[0])
    out: list[int | None] = []
    for row in MB_TABLE.to_pylist():
        present = [(c, row[c]) for c in transform.source_columns if row[c] is not None]
        if not present:
            out.append(None)
            continue
        signed = mmh3.hash(b"".join(_independent_bytes(c, v) for c, v in present), 0, signed=True)
        out.append(abs(signed) % count)
    return out


def mb_bound(text: str) -> Any:
    transform = parse_transform(text)
    return transform.bind_columns([MB_TABLE.schema.field(c).type for c in transform.source_columns])


def test_the_independent_murmur3_gives_the_published_vectors() -> None:
    import mmh3

    from airflow_partitions.transforms import murmur3

    vectors = [
        (b"", 0),
        (b"\x00", 0x514E28B7),
        (b"\xff", 0xFD6CF10D),
        (b"Hello", 0x12DA77C8),
        (b"Hello, world!", 0xC0363E43),
        (b"test", 0xBA6BD213),
        (b"The quick brown fox jumps over the lazy dog", 0x2E4FF723),
    ]
    for data, expected in vectors:
        assert mmh3.hash(data, 0, signed=False) == expected, data
        assert murmur3.hash_bytes_unsigned(data) == expected, data


def test_multi_bucket_has_the_lance_sign_rule() -> None:
    """`abs(h) % N` without overflow: the int32 minimum, whose abs overflows int32, gives 2**31 % N."""
    import numpy as np

    from airflow_partitions.transforms.multi_bucket import bucket_of_hash, buckets_of_hashes

    hashes = np.array([-(2**31), -1, 0, 2**31 - 1, -7], dtype=np.int32)
    for n in (1, 3, 7, 8, 1000):
        expected = [2**31 % n, 1 % n, 0, (2**31 - 1) % n, 7 % n]
        assert [bucket_of_hash(int(h), n) for h in hashes] == expected
        assert buckets_of_hashes(hashes, n).tolist() == expected


@pytest.fixture(scope="module")
def mb_duckdb() -> Iterator[dict[str, list[Any]]]:
    """DuckDB over the source: `multi_bucket(...)` as a reader's query writes it."""
    connection = new_duckdb_connection()
    connection.register("mb_rows", MB_TABLE)
    values: dict[str, list[Any]] = {}
    for text in MULTI_BUCKETS:
        sql = executable_sql(f"SELECT ({text}) FROM mb_rows", MB_TABLE.schema)
        values[text] = [row[0] for row in connection.sql(sql).fetchall()]
    yield values
    connection.close()


@pytest.mark.parametrize("text", MULTI_BUCKETS)
def test_multi_bucket_in_arrow_scalar_and_duckdb_equals_the_independent_hash(
    mb_duckdb: dict[str, list[Any]], text: str
) -> None:
    transform = mb_bound(text)
    expected = _independent_buckets(text)
    rows = [[row[c] for c in transform.source_columns] for row in MB_TABLE.to_pylist()]
    # NULL exactly where every field is NULL; rows with some NULL fields still have a bucket.
    assert [b is None for b in expected] == [all(v is None for v in row) for row in rows]
    assert any(b is not None and None in row for b, row in zip(expected, rows, strict=True))
    assert transform.apply_table(MB_TABLE).to_pylist() == expected, f"{text}: Arrow"
    assert [transform.apply_row(row) for row in rows] == expected, f"{text}: scalar"
    assert mb_duckdb[text] == expected, f"{text}: DuckDB"
    # Chunked and sliced inputs (offsets into the buffers) give the same buckets.
    sliced = MB_TABLE.slice(3, 7)
    assert transform.apply_table(sliced).to_pylist() == expected[3:10]
    assert parse_transform(transform.canonical) == transform


def test_multi_bucket_in_spark_equals_the_independent_hash(spark: Any) -> None:
    """Spark hands the UDF its own types (int8 as BYTE, naive timestamps as TIMESTAMP_NTZ); one query."""
    transforms = [mb_bound(text) for text in MULTI_BUCKETS]
    frame = spark.createDataFrame(MB_TABLE)
    computed = frame.select(*[t.spark_value().alias(f"e{n}") for n, t in enumerate(transforms)]).toArrow()
    for number, text in enumerate(MULTI_BUCKETS):
        assert computed.column(f"e{number}").to_pylist() == _independent_buckets(text), f"{text}: Spark"


def test_multi_bucket_from_postgres_equals_the_independent_hash(pg_module_database: str) -> None:
    """No pushdown (no Murmur3 in Postgres, said in the survey's notes): discovery groups by the raw
    columns and hashes them here, so its partitions are exactly the independent hash's."""
    import psycopg

    from airflow_partitions.sources.base import Deadline
    from airflow_partitions.sources.pg_sql import partition_sql
    from airflow_partitions.sources.postgres import PostgresSource

    pg_columns = (
        "s text, i8 smallint, i16 smallint, i32 integer, i64 bigint, f64 double precision, f32 real, "
    )
    pg_columns += "d date, ts timestamp, tz timestamptz, b bytea"
    with psycopg.connect(pg_module_database, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE mb_rows ({pg_columns})")
        with conn.cursor() as cursor:
            cursor.executemany(
                f"INSERT INTO mb_rows VALUES ({', '.join(['%s'] * MB_TABLE.num_columns)})",
                [tuple(row.values()) for row in MB_TABLE.to_pylist()],
            )
    source = PostgresSource("public", "mb_rows", url=pg_module_database)
    schema = source.schema()
    for text in MULTI_BUCKETS:
        if "i8" in text:
            continue  # Postgres has no int8 (one byte) type: the width, hence the bytes, would differ
        transform = parse_transform(text)
        transform = transform.bind_columns([schema.field(c).type for c in transform.source_columns])
        assert partition_sql(transform) is None
        survey = source.survey([transform], need_keys=True, check_column=None, deadline=Deadline(60))
        assert survey.keys is not None
        assert sorted({k[0] for k in survey.keys}, key=repr) == sorted(
            set(_independent_buckets(text)), key=repr
        ), text
        assert any("no Murmur3" in note for note in survey.notes), survey.notes


def test_multi_bucket_hashes_each_integer_at_its_own_width() -> None:
    """The bytes follow the column's type: 5 as int32 and 5 as int64 are different fields (the width is
    part of the spec), so a multi_bucket column's type must not change under a dataset."""
    import mmh3

    narrow = parse_transform("multi_bucket(1000, a, b)").bind_columns([pa.int32(), pa.string()])
    wide = parse_transform("multi_bucket(1000, a, b)").bind_columns([pa.int64(), pa.string()])
    assert narrow.apply_row([5, "x"]) == abs(mmh3.hash(b"\x05\x00\x00\x00x", 0, signed=True)) % 1000
    assert wide.apply_row([5, "x"]) == abs(mmh3.hash(b"\x05" + b"\x00" * 7 + b"x", 0, signed=True)) % 1000
    # An engine handing a wider array (Spark's SHORT for uint8) is brought back to the bound width.
    unsigned = parse_transform("multi_bucket(1000, a, b)").bind_columns([pa.uint8(), pa.string()])
    widened = unsigned.apply_columns([pa.array([200], pa.int16()), pa.array(["x"])]).to_pylist()
    assert widened == [abs(mmh3.hash(b"\xc8x", 0, signed=True)) % 1000]
