"""Partition transforms: parsing, Iceberg vectors, Arrow vs scalar evaluation, types, pruning metadata."""

from __future__ import annotations

import datetime as dt
import struct
import subprocess
import sys
import uuid
from decimal import Decimal
from typing import Any

import mmh3
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_partitions.exceptions import PartitionExpressionError, PartitionValueError
from airflow_partitions.transforms import (
    BucketTransform,
    DatePartTransform,
    DateTruncTransform,
    IdentityTransform,
    Interval,
    ModTransform,
    Transform,
    TruncateTransform,
    arrow_hash,
    murmur3,
    parse_transform,
)

UTC = dt.UTC
NEW_YORK = pytest.importorskip("zoneinfo").ZoneInfo("America/New_York")
HYPOTHESIS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- Iceberg spec, Appendix B -----------------------------------------------------------------------

HASH_VECTORS = [
    # (value, arrow type, expected 32-bit hash)
    (34, pa.int32(), 2017239379),
    (34, pa.int64(), 2017239379),
    (34, pa.uint16(), 2017239379),
    (Decimal("14.20"), pa.decimal128(4, 2), -500754589),
    (Decimal("14.20"), pa.decimal128(38, 2), -500754589),
    (Decimal("14.20"), pa.decimal256(40, 2), -500754589),
    (dt.date(2017, 11, 16), pa.date32(), -653330422),
    (dt.datetime(2017, 11, 16, 22, 31, 8), pa.timestamp("us"), -2047944441),
    (dt.datetime(2017, 11, 16, 22, 31, 8), pa.timestamp("ms"), -2047944441),
    (dt.datetime(2017, 11, 16, 22, 31, 8), pa.timestamp("ns"), -2047944441),
    (
        dt.datetime(2017, 11, 16, 14, 31, 8, tzinfo=dt.timezone(dt.timedelta(hours=-8))),
        pa.timestamp("us", "UTC"),
        -2047944441,
    ),
    (
        dt.datetime(2017, 11, 16, 14, 31, 8, tzinfo=dt.timezone(dt.timedelta(hours=-8))),
        pa.timestamp("s", "America/Los_Angeles"),
        -2047944441,
    ),
    ("iceberg", pa.string(), 1210000089),
    ("iceberg", pa.large_string(), 1210000089),
    (uuid.UUID("f79c3e09-677c-4bbd-a479-3f349cb785e7"), pa.uuid(), 1488055340),
    (bytes([0, 1, 2, 3]), pa.binary(), -188683207),
    (bytes([0, 1, 2, 3]), pa.large_binary(), -188683207),
    (bytes([0, 1, 2, 3]), pa.binary(4), -188683207),
]


def _arrow_value(value: Any, arrow_type: pa.DataType) -> pa.Array:
    if isinstance(arrow_type, pa.UuidType):
        return pa.array([value.bytes], arrow_type)
    return pa.array([value], arrow_type)


@pytest.mark.parametrize(
    ("value", "arrow_type", "expected"), HASH_VECTORS, ids=[f"{t}-{v}" for v, t, _ in HASH_VECTORS]
)
def test_iceberg_hash_vectors_scalar_and_vectorised(
    value: Any, arrow_type: pa.DataType, expected: int
) -> None:
    bucket = BucketTransform("c", 16).bind(arrow_type)
    assert bucket.hash_scalar(value) == expected, "scalar hash must match Iceberg's Appendix B"
    vectorised = bucket.hash_array(_arrow_value(value, arrow_type)).to_pylist()
    assert vectorised == [expected], "vectorised hash must match Iceberg's Appendix B"


@pytest.mark.parametrize(
    ("expression", "value", "arrow_type", "expected"),
    [
        ("bucket(16, c)", 34, pa.int64(), 3),
        ("bucket(100, c)", 34, pa.int64(), 79),
        ("bucket(16, c)", "iceberg", pa.string(), 9),
        ("bucket(16::int32, c)", 34, pa.int32(), 3),
    ],
)
def test_iceberg_bucket_vectors(expression: str, value: Any, arrow_type: pa.DataType, expected: int) -> None:
    transform = parse_transform(expression)
    assert transform.apply_scalar(value) == expected
    assert transform.apply(pa.array([value], arrow_type)).to_pylist() == [expected]


def test_bucket_result_type_follows_the_literal() -> None:
    assert parse_transform("bucket(50, c)").result_type == pa.int64()
    assert parse_transform("bucket(50::int32, c)").result_type == pa.int32()
    assert parse_transform("bucket(CAST(50 AS INT), c)").result_type == pa.int32()
    assert parse_transform("bucket(50::bigint, c)").result_type == pa.int64()
    assert parse_transform("bucket(50::int32, c)").apply(pa.array([1, 2])).type == pa.int32()


# --- Murmur3 against an independent implementation -------------------------------------------------


@given(st.binary(max_size=64))
@HYPOTHESIS
def test_scalar_murmur3_matches_mmh3(data: bytes) -> None:
    assert murmur3.hash_bytes(data) == mmh3.hash(data)


def test_vectorised_murmur3_matches_mmh3_on_ragged_and_long_strings() -> None:
    rng = np.random.default_rng(7)
    # Mostly short strings, a few very long ones: exercises the per-row Python tail of the kernel.
    lengths = np.concatenate([rng.integers(0, 40, 5000), [1000, 4097, 30_001], rng.integers(0, 9, 50)])
    blobs = [rng.bytes(int(n)) for n in lengths]
    array = pa.array(blobs, pa.binary())
    expected = [mmh3.hash(b) for b in blobs]
    assert BucketTransform("c", 16).hash_array(array).to_pylist() == expected
    ints = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, 70_000, dtype=np.int64)
    unsigned = arrow_hash.hash_int64(ints)
    assert unsigned.tolist()[:2000] == [
        mmh3.hash(struct.pack("<q", v), signed=False) for v in ints.tolist()[:2000]
    ]


@pytest.mark.parametrize(
    ("iceberg_type", "arrow_type", "values"),
    [
        ("long", pa.int64(), [0, -1, 1, 2**63 - 1, -(2**62), -123456789012]),
        ("string", pa.string(), ["", "a", "é😀", "null", "x" * 100]),
        ("binary", pa.binary(), [b"", b"\xff\xfe", b"abcdefgh" * 9]),
        (
            "decimal",
            pa.decimal128(20, 3),
            [Decimal("0.000"), Decimal("-0.001"), Decimal("-128.000"), Decimal("99999999999999999.999")],
        ),
        ("date", pa.date32(), [0, -1, 17000, -719162, 2932896]),
        ("timestamp", pa.timestamp("us"), [0, -1, 1510871468000000, -62135596800000000]),
    ],
)
def test_bucket_and_truncate_agree_with_pyiceberg(
    iceberg_type: str, arrow_type: pa.DataType, values: list[Any]
) -> None:
    from pyiceberg import transforms as iceberg
    from pyiceberg import types as itypes

    source = {
        "long": itypes.LongType(),
        "string": itypes.StringType(),
        "binary": itypes.BinaryType(),
        "decimal": itypes.DecimalType(20, 3),
        "date": itypes.DateType(),
        "timestamp": itypes.TimestampType(),
    }[iceberg_type]
    array = pa.array(
        values,
        pa.int32() if iceberg_type == "date" else pa.int64() if iceberg_type == "timestamp" else arrow_type,
    )
    array = array.cast(arrow_type) if iceberg_type in ("date", "timestamp") else array
    for buckets in (1, 7, 1000):
        ours = parse_transform(f"bucket({buckets}, c)").apply(array).to_pylist()
        theirs = [iceberg.BucketTransform(buckets).transform(source)(v) for v in values]
        assert ours == theirs, f"bucket[{buckets}] over {iceberg_type} disagrees with pyiceberg"
    if iceberg_type in ("long", "string", "binary", "decimal"):
        for width in (1, 3, 10):
            ours = parse_transform(f"truncate({width}, c)").apply(array).to_pylist()
            theirs = [iceberg.TruncateTransform(width).transform(source)(v) for v in values]
            assert ours == theirs, f"truncate[{width}] over {iceberg_type} disagrees with pyiceberg"


# --- parsing ----------------------------------------------------------------------------------------

ACCEPTED = [
    ("bucket(16, user_id)", "bucket(16, user_id)", BucketTransform),
    ("BUCKET(16, user_id)", "bucket(16, user_id)", BucketTransform),
    ("bucket(16::int32, user_id)", "bucket(16::int32, user_id)", BucketTransform),
    ("bucket(CAST(16 AS INT), user_id)", "bucket(16::int32, user_id)", BucketTransform),
    ("bucket(16::bigint, user_id)", "bucket(16, user_id)", BucketTransform),
    ('bucket(50, "PULocationID")', "bucket(50, PULocationID)", BucketTransform),
    ("truncate(1000, amount)", "truncate(1000, amount)", TruncateTransform),
    ("date_part('year', created_at)", "date_part('year', created_at)", DatePartTransform),
    ("DATE_PART('YEAR', created_at)", "date_part('year', created_at)", DatePartTransform),
    ("date_part(month, created_at)", "date_part('month', created_at)", DatePartTransform),
    ("YEAR(created_at)", "date_part('year', created_at)", DatePartTransform),
    ("QUARTER(created_at)", "date_part('quarter', created_at)", DatePartTransform),
    ("MONTH(created_at)", "date_part('month', created_at)", DatePartTransform),
    ("WEEK(created_at)", "date_part('week', created_at)", DatePartTransform),
    ("DAY(created_at)", "date_part('day', created_at)", DatePartTransform),
    ("HOUR(created_at)", "date_part('hour', created_at)", DatePartTransform),
    ("MINUTE(created_at)", "date_part('minute', created_at)", DatePartTransform),
    ("extract(year from created_at)", "date_part('year', created_at)", DatePartTransform),
    ("date_trunc('day', ts)", "date_trunc('day', ts)", DateTruncTransform),
    ("date_trunc('QUARTER', ts)", "date_trunc('quarter', ts)", DateTruncTransform),
    ("date_trunc('week', ts)", "date_trunc('week', ts)", DateTruncTransform),
    ("date_trunc('minute', ts)", "date_trunc('minute', ts)", DateTruncTransform),
    ("id % 16", "id % 16", ModTransform),
    ("(id % 16)", "id % 16", ModTransform),
    ("mod(id, 16)", "id % 16", ModTransform),
    ("region", "region", IdentityTransform),
    ('"Region Name"', '"Region Name"', IdentityTransform),
    ('"select"', '"select"', IdentityTransform),
    ('"a""b"', '"a""b"', IdentityTransform),
]


@pytest.mark.parametrize(("expression", "canonical", "kind"), ACCEPTED, ids=[e for e, _, _ in ACCEPTED])
def test_accepted_expressions_round_trip(expression: str, canonical: str, kind: type[Transform]) -> None:
    transform = parse_transform(expression)
    assert isinstance(transform, kind)
    assert transform.canonical == canonical == str(transform)
    again = parse_transform(transform.canonical)
    assert again == transform
    assert hash(again) == hash(transform)
    assert again.canonical == canonical, "the canonical string must be a fixed point"


def test_transform_names_and_parameters() -> None:
    assert [
        parse_transform(e).name
        for e in ("c", "bucket(2, c)", "truncate(2, c)", "YEAR(c)", "date_trunc('day', c)", "c % 2")
    ] == [
        "identity",
        "bucket",
        "truncate",
        "date_part",
        "date_trunc",
        "mod",
    ]
    bucket = parse_transform("bucket(16::int32, c)")
    assert isinstance(bucket, BucketTransform)
    assert (bucket.num_buckets, bucket.result_bits) == (16, 32)
    truncate = parse_transform("truncate(7, c)")
    assert isinstance(truncate, TruncateTransform)
    assert truncate.width == 7
    modulo = parse_transform("c % 9")
    assert isinstance(modulo, ModTransform)
    assert modulo.modulus == 9


def test_column_names_keep_their_case_and_are_case_sensitive() -> None:
    quoted, bare = parse_transform('bucket(50, "PULocationID")'), parse_transform("bucket(50, PULocationID)")
    assert quoted.source_column == bare.source_column == "PULocationID"
    assert quoted == bare
    assert parse_transform("pulocationid").source_column == "pulocationid"
    assert bare.resolve_source_column(["VendorID", "PULocationID"]) == "PULocationID"
    with pytest.raises(PartitionExpressionError, match=r"case-sensitive — did you mean 'PULocationID'"):
        parse_transform("bucket(50, pulocationid)").resolve_source_column(["PULocationID"])
    with pytest.raises(PartitionExpressionError, match=r"unknown column 'zone'; known columns: a, b"):
        parse_transform("zone").resolve_source_column(["a", "b"])


REJECTED = [
    # (expression, a fragment of the message that says what is wrong, a fragment saying how to fix it)
    ("(SELECT max(id) FROM t)", "contains a subquery", "partition by a column"),
    ("id IN (SELECT id FROM t)", "contains a subquery", "partition by a column"),
    ("max(id)", "aggregate function MAX()", "partition by the column itself"),
    ("count(*)", "aggregate function COUNT()", "partition by the column itself"),
    ("row_number() OVER (ORDER BY id)", "window function", "partition by a column"),
    ("sum(id) OVER ()", "window function", "partition by a column"),
    ("unnest(tags)", "contains UNNEST", "one value per row"),
    ("EXISTS (SELECT 1)", "contains EXISTS", "partition by a column"),
    ("bucket(?, id)", "placeholder ?", "write the literal value"),
    ("id % $1", "placeholder $1", "write the literal value"),
    ("bucket(:n, id)", "placeholder :n", "write the literal value"),
    ("id AS key", "aliases its result (id AS key)", '- key: "id"'),
    ("bucket(16, id) AS b", "aliases its result", '- b: "bucket(16, id)"'),
    ("42", "references no column", "exactly one column"),
    ("current_date", "which is not deterministic", "a function of the column's value only"),
    ("id + random()", "calls RANDOM(), which is not deterministic", "a function of the column's value"),
    ("date_trunc('day', now()) + id", "calls NOW(), which is not deterministic", "column's value only"),
    ("uuid() || region", "not deterministic", "column's value only"),
    ("md5(region)", "uses MD5(region), which is not in the partition expression function set", "lower,"),
    ("lower(region) COLLATE nocase", "not in the partition expression function set", "use one of"),
    ("bucket(16, 42)", "references no column", "exactly one column"),
    ("a + b", "references 2 columns (a, b)", "one partition_by entry per column"),
    ("bucket(16, a || b)", "references 2 columns", "one partition_by entry per column"),
    ("bucket(0, id)", "bucket N = 0", "positive integer literal ≤ 1,000,000"),
    ("bucket(-4, id)", "bucket N = -4", "positive integer literal ≤ 1,000,000"),
    ("bucket(1000001, id)", "bucket N = 1000001", "positive integer literal ≤ 1,000,000"),
    ("bucket(2.5, id)", "bucket N = 2.5", "positive integer literal ≤ 1,000,000"),
    ("bucket('16', id)", "bucket N = '16'", "positive integer literal ≤ 1,000,000"),
    ("bucket(id, 16)", "(the arguments are bucket(N, column))", "positive integer literal"),
    ("bucket(16::smallint, id)", "casts bucket's N to SMALLINT", "16::int32"),
    ("bucket(16)", "references no column", "exactly one column"),
    ("bucket(16, id, 3)", "calls bucket with 3 argument(s)", "bucket takes 2"),
    ("truncate(0, amount)", "truncate width W = 0", "positive integer literal"),
    ("truncate(amount, 10)", "(the arguments are truncate(W, column))", "positive integer literal"),
    ("truncate(1.5, amount)", "truncate width W = 1.5", "positive integer literal"),
    ("truncate(amount)", "calls truncate with 1 argument", "truncate(W, column)"),
    (
        "date_part('fortnight', ts)",
        "date_part unit 'fortnight'",
        "'year', 'quarter', 'month', 'week', 'day', 'hour', 'minute'",
    ),
    ("date_trunc('second', ts)", "date_trunc unit 'second'", "'year', 'quarter', 'month'"),
    ("id % 0", "modulus N = 0", "positive integer literal"),
    ("id % -3", "modulus N = -3", "positive integer literal"),
    ("id % 2.5", "modulus N = 2.5", "positive integer literal"),
    ("t.id", "qualified column t.id", "write just the column name (id)"),
    ("*", "contains *", "exactly one column by name"),
    ("DROP TABLE t", "is a SQL statement", "write one of"),
    ("id; id", "must be exactly one SQL expression", "single expression"),
    ("bucket(16, id", "is not valid SQL", "write a SQL expression"),
    ("   ", "is empty", "e.g. bucket(16, user_id)"),
]


@pytest.mark.parametrize(("expression", "problem", "fix"), REJECTED, ids=[e for e, _, _ in REJECTED])
def test_rejected_expressions_say_what_and_how(expression: str, problem: str, fix: str) -> None:
    with pytest.raises(PartitionExpressionError) as caught:
        parse_transform(expression)
    message = str(caught.value)
    assert repr(expression.strip()) in message or "is empty" in message, (
        "the message must quote the expression"
    )
    assert problem in message
    assert fix in message


# --- binding and result types -----------------------------------------------------------------------

RESULT_TYPES = [
    ("c", pa.int16(), pa.int16()),
    ("c", pa.string(), pa.string()),
    ("c", pa.large_string(), pa.large_string()),
    ("c", pa.string_view(), pa.string()),
    ("c", pa.bool_(), pa.bool_()),
    ("c", pa.date32(), pa.date32()),
    ("c", pa.date64(), pa.date32()),
    ("c", pa.timestamp("ns"), pa.timestamp("ns")),
    ("c", pa.timestamp("ms", "Europe/Berlin"), pa.timestamp("ms", "UTC")),
    ("c", pa.dictionary(pa.int32(), pa.string()), pa.string()),
    ("bucket(8, c)", pa.string(), pa.int64()),
    ("bucket(8::int32, c)", pa.decimal128(9, 3), pa.int32()),
    ("truncate(8, c)", pa.uint32(), pa.uint32()),
    ("truncate(8, c)", pa.decimal128(9, 3), pa.decimal128(9, 3)),
    ("truncate(8, c)", pa.large_binary(), pa.large_binary()),
    ("date_part('year', c)", pa.date32(), pa.int32()),
    ("date_part('hour', c)", pa.timestamp("s", "UTC"), pa.int32()),
    ("date_trunc('day', c)", pa.date32(), pa.date32()),
    ("date_trunc('day', c)", pa.timestamp("ns"), pa.timestamp("us")),
    ("date_trunc('hour', c)", pa.timestamp("s", "Asia/Kolkata"), pa.timestamp("us", "UTC")),
    ("c % 8", pa.int8(), pa.int8()),
    ("c % 8", pa.uint64(), pa.uint64()),
]


@pytest.mark.parametrize(
    ("expression", "source", "result"), RESULT_TYPES, ids=[f"{e}-{s}" for e, s, _ in RESULT_TYPES]
)
def test_result_types(expression: str, source: pa.DataType, result: pa.DataType) -> None:
    transform = parse_transform(expression)
    bound = transform.bind(source)
    assert bound.result_type == result == transform.result_type_for(source)
    assert bound.source_type == source
    assert bound.is_bound
    assert not transform.is_bound
    assert bound == transform, "binding does not change what the transform is"


BIND_ERRORS = [
    ("truncate(10, c)", pa.float64(), "truncate accepts integer, decimal, string and binary columns"),
    ("date_part('year', c)", pa.string(), "date_part accepts date and timestamp columns"),
    ("date_trunc('day', c)", pa.int64(), "date_trunc accepts date and timestamp columns"),
    ("bucket(4, c)", pa.bool_(), "bucket accepts integer, date, timestamp, string, binary, decimal and UUID"),
    ("bucket(4, c)", pa.float32(), "bucket accepts integer"),
    ("c % 4", pa.decimal128(5, 2), "mod accepts integer columns"),
    (
        "c",
        pa.float64(),
        "gives double values, but partition values must be string, integer, boolean, date or timestamp",
    ),
    ("c", pa.decimal128(5, 2), "partition values must be string, integer"),
    ("c", pa.binary(), "partition values must be string, integer"),
    ("c", pa.list_(pa.int32()), "partition values must be string, integer"),
    ("date_part('hour', c)", pa.date32(), "whose hour is always 0"),
    ("date_trunc('minute', c)", pa.date32(), "whose minute is always 0"),
]


@pytest.mark.parametrize(
    ("expression", "source", "message"), BIND_ERRORS, ids=[f"{e}-{s}" for e, s, _ in BIND_ERRORS]
)
def test_bind_rejects_types_with_a_clear_message(expression: str, source: pa.DataType, message: str) -> None:
    with pytest.raises(
        PartitionExpressionError, match=message.replace("(", r"\(").replace(")", r"\)")
    ) as caught:
        parse_transform(expression).bind(source)
    assert repr(parse_transform(expression).canonical) in str(caught.value)
    assert str(source) in str(caught.value)


def test_unbound_result_type_is_known_only_when_input_independent() -> None:
    assert parse_transform("bucket(4, c)").result_type == pa.int64()
    assert parse_transform("MONTH(c)").result_type == pa.int32()
    for expression in ("c", "truncate(4, c)", "c % 4", "date_trunc('day', c)"):
        with pytest.raises(PartitionExpressionError, match=r"depends on the type of column 'c'; call \.bind"):
            _ = parse_transform(expression).result_type


# --- pruning metadata -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "monotonic", "one_to_one"),
    [
        ("c", True, True),
        ("truncate(10, c)", True, False),
        ("date_trunc('month', c)", True, False),
        ("date_part('year', c)", True, False),
        ("date_part('month', c)", False, False),
        ("date_part('day', c)", False, False),
        ("date_part('hour', c)", False, False),
        ("bucket(16, c)", False, False),
        ("c % 16", False, False),
    ],
)
def test_pruning_flags(expression: str, monotonic: bool, one_to_one: bool) -> None:
    transform = parse_transform(expression)
    assert (transform.monotonic, transform.one_to_one) == (monotonic, one_to_one)


PREIMAGES = [
    (
        "date_trunc('month', c)",
        pa.timestamp("us"),
        dt.datetime(2026, 1, 1),
        Interval(dt.datetime(2026, 1, 1), dt.datetime(2026, 2, 1)),
    ),
    (
        "date_trunc('month', c)",
        pa.date32(),
        dt.date(2024, 2, 1),
        Interval(dt.date(2024, 2, 1), dt.date(2024, 3, 1)),
    ),
    (
        "date_trunc('month', c)",
        pa.date32(),
        dt.date(2025, 12, 1),
        Interval(dt.date(2025, 12, 1), dt.date(2026, 1, 1)),
    ),
    (
        "date_trunc('quarter', c)",
        pa.date32(),
        dt.date(2025, 10, 1),
        Interval(dt.date(2025, 10, 1), dt.date(2026, 1, 1)),
    ),
    (
        "date_trunc('week', c)",
        pa.date32(),
        dt.date(2024, 12, 30),
        Interval(dt.date(2024, 12, 30), dt.date(2025, 1, 6)),
    ),
    (
        "date_trunc('year', c)",
        pa.date32(),
        dt.date(2024, 1, 1),
        Interval(dt.date(2024, 1, 1), dt.date(2025, 1, 1)),
    ),
    (
        "date_trunc('day', c)",
        pa.timestamp("us", "UTC"),
        dt.datetime(2024, 2, 29, tzinfo=UTC),
        Interval(dt.datetime(2024, 2, 29, tzinfo=UTC), dt.datetime(2024, 3, 1, tzinfo=UTC)),
    ),
    (
        "date_trunc('hour', c)",
        pa.timestamp("us"),
        dt.datetime(1969, 12, 31, 23),
        Interval(dt.datetime(1969, 12, 31, 23), dt.datetime(1970, 1, 1)),
    ),
    ("date_trunc('year', c)", pa.date32(), dt.date(9999, 1, 1), Interval(dt.date(9999, 1, 1), None)),
    (
        "date_part('year', c)",
        pa.timestamp("us"),
        2026,
        Interval(dt.datetime(2026, 1, 1), dt.datetime(2027, 1, 1)),
    ),
    (
        "date_part('year', c)",
        pa.timestamp("ns", "UTC"),
        2026,
        Interval(dt.datetime(2026, 1, 1, tzinfo=UTC), dt.datetime(2027, 1, 1, tzinfo=UTC)),
    ),
    ("date_part('year', c)", pa.date32(), 2026, Interval(dt.date(2026, 1, 1), dt.date(2027, 1, 1))),
    ("truncate(10, c)", pa.int64(), 20, Interval(20, 30)),
    ("truncate(10, c)", pa.int64(), -10, Interval(-10, 0)),
    ("truncate(50, c)", pa.decimal128(6, 2), Decimal("10.50"), Interval(Decimal("10.50"), Decimal("11.00"))),
    ("truncate(2, c)", pa.string(), "ab", Interval("ab", "ac")),
    ("truncate(2, c)", pa.string(), "a", Interval("a", "a", True, True)),
    ("truncate(2, c)", pa.string(), "a\U0010ffff", Interval("a\U0010ffff", "b")),
    ("truncate(2, c)", pa.string(), "\U0010ffff\U0010ffff", Interval("\U0010ffff\U0010ffff", None)),
    ("truncate(2, c)", pa.string(), "a\ud7ff", Interval("a\ud7ff", "a\ue000")),
    ("truncate(2, c)", pa.binary(), b"a\xff", Interval(b"a\xff", b"b")),
    ("c", pa.int32(), 7, Interval(7, 7, True, True)),
    (
        "c",
        pa.timestamp("us", "UTC"),
        dt.datetime(2024, 1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1))),
        Interval(dt.datetime(2024, 1, 1, tzinfo=UTC), dt.datetime(2024, 1, 1, tzinfo=UTC), True, True),
    ),
]


@pytest.mark.parametrize(
    ("expression", "source", "value", "interval"), PREIMAGES, ids=[f"{e}-{v!r}" for e, _, v, _ in PREIMAGES]
)
def test_preimage_of_monotonic_transforms(
    expression: str, source: pa.DataType, value: Any, interval: Interval
) -> None:
    assert parse_transform(expression).bind(source).preimage(value) == interval


def test_no_preimage_for_many_to_one_non_monotonic_transforms_or_null() -> None:
    assert parse_transform("bucket(4, c)").preimage(1) is None
    assert parse_transform("c % 4").preimage(1) is None
    assert parse_transform("MONTH(c)").bind(pa.date32()).preimage(3) is None
    assert parse_transform("truncate(4, c)").preimage(None) is None
    with pytest.raises(PartitionValueError, match="is not the start of a month"):
        parse_transform("date_trunc('month', c)").bind(pa.date32()).preimage(dt.date(2024, 1, 15))
    with pytest.raises(PartitionExpressionError, match=r"call \.bind"):
        parse_transform("YEAR(c)").preimage(2024)


def test_interval_contains() -> None:
    half_open = Interval(10, 20)
    assert half_open.contains(10)
    assert half_open.contains(19)
    assert not half_open.contains(20)
    assert not half_open.contains(None)
    assert not half_open.contains(9)
    assert Interval(None, 5, upper_inclusive=True).contains(-(10**30))
    assert Interval(None, 5, upper_inclusive=True).contains(5)
    assert Interval("ab", None).contains("zz")
    assert not Interval("ab", None, lower_inclusive=False).contains("ab")


# --- Arrow and scalar evaluation agree -------------------------------------------------------------

INT_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]
TEXT = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=12)


def _int_strategy(arrow_type: pa.DataType) -> st.SearchStrategy[int]:
    info = np.iinfo(arrow_type.to_pandas_dtype())
    return st.integers(int(info.min), int(info.max)) | st.sampled_from(
        [int(info.min), int(info.max), 0, -1 if info.min else 1]
    )


AWARE = st.datetimes(
    min_value=dt.datetime(1, 1, 2),
    max_value=dt.datetime(9999, 12, 30),
    timezones=st.sampled_from([UTC, NEW_YORK]),
)
NAIVE = st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31, 23, 59, 59))
NANO_RANGE = st.datetimes(min_value=dt.datetime(1678, 1, 1), max_value=dt.datetime(2261, 12, 31))
SOURCES: list[tuple[pa.DataType, st.SearchStrategy[Any], list[str]]] = [
    *[
        (t, _int_strategy(t), ["c", "bucket(97, c)", "bucket(3::int32, c)", "truncate(7, c)", "c % 5"])
        for t in INT_TYPES
    ],
    (
        pa.date32(),
        st.dates(),
        ["c", "bucket(97, c)"]
        + [f"date_part('{u}', c)" for u in ("year", "quarter", "month", "week", "day")]
        + [f"date_trunc('{u}', c)" for u in ("year", "quarter", "month", "week", "day")],
    ),
    *[
        (
            t,
            strategy,
            ["c", "bucket(97, c)"]
            + [f"date_part('{u}', c)" for u in ("year", "quarter", "month", "week", "day", "hour", "minute")]
            + [
                f"date_trunc('{u}', c)" for u in ("year", "quarter", "month", "week", "day", "hour", "minute")
            ],
        )
        for t, strategy in [
            (pa.timestamp("us"), NAIVE),
            (pa.timestamp("ms"), NAIVE),
            (pa.timestamp("s"), NAIVE),
            (pa.timestamp("ns"), NANO_RANGE),
            (pa.timestamp("us", "UTC"), AWARE),
            (pa.timestamp("us", "America/New_York"), AWARE),
        ]
    ],
    (pa.string(), TEXT, ["c", "bucket(97, c)", "truncate(1, c)", "truncate(3, c)"]),
    (pa.large_string(), TEXT, ["c", "bucket(97, c)", "truncate(3, c)"]),
    (pa.binary(), st.binary(max_size=12), ["bucket(97, c)", "truncate(3, c)"]),
    (
        pa.decimal128(9, 2),
        st.decimals(min_value=Decimal("-9999999.99"), max_value=Decimal("9999999.99"), places=2),
        ["bucket(97, c)", "truncate(10, c)"],
    ),
    (
        pa.decimal128(38, 4),
        st.decimals(min_value=Decimal("-1e30"), max_value=Decimal("1e30"), places=4),
        ["bucket(97, c)", "truncate(10, c)"],
    ),
    (pa.bool_(), st.booleans(), ["c"]),
]


def _comparable(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return (
            value.utcoffset() is None,
            value.replace(tzinfo=None) if value.utcoffset() is None else value.astimezone(UTC),
        )
    if isinstance(value, Decimal):
        return str(value)
    return value


@pytest.mark.parametrize(
    ("arrow_type", "strategy", "expressions"), SOURCES, ids=[str(t) for t, _, _ in SOURCES]
)
def test_apply_and_apply_scalar_agree(
    arrow_type: pa.DataType, strategy: st.SearchStrategy[Any], expressions: list[str]
) -> None:
    @given(st.lists(st.none() | strategy, max_size=40))
    @HYPOTHESIS
    def check(values: list[Any]) -> None:
        array = pa.array(values, arrow_type)
        for expression in expressions:
            transform = parse_transform(expression).bind(arrow_type)
            try:
                vectorised = transform.apply(array).to_pylist()
            except PartitionValueError:
                # Overflow (truncate below the type's minimum): the scalar path must refuse too.
                with pytest.raises(PartitionValueError):
                    _ = [transform.apply_scalar(value) for value in array.to_pylist()]
                continue
            scalar = [transform.apply_scalar(value) for value in array.to_pylist()]
            assert [_comparable(v) for v in vectorised] == [_comparable(v) for v in scalar], expression

    check()


def test_truncate_overflow_is_an_error_not_a_wraparound() -> None:
    transform = parse_transform("truncate(10, c)")
    with pytest.raises(PartitionValueError, match="truncating -128 gives a value below the smallest int8"):
        transform.apply(pa.array([5, None, -128], pa.int8()))
    with pytest.raises(PartitionValueError, match="below the smallest int8"):
        transform.bind(pa.int8()).apply_scalar(-128)
    with pytest.raises(PartitionValueError, match="below the smallest int64"):
        transform.apply(pa.array([-(2**63)], pa.int64()))
    # Values under NULL slots are never checked: a NULL -128 is just NULL.
    masked = pa.array([-128, 3], pa.int8(), mask=np.array([True, False]))
    assert transform.apply(masked).to_pylist() == [None, 0]
    with pytest.raises(PartitionValueError, match="decimal"):
        transform.apply(pa.array([Decimal("-9.99")], pa.decimal128(3, 2)))


def test_timestamps_beyond_microsecond_range_are_rejected() -> None:
    huge = pa.array([2**62], pa.timestamp("s"))
    with pytest.raises(PartitionValueError, match="outside the range of microsecond timestamps"):
        parse_transform("bucket(4, c)").apply(huge)


# --- NULLs, offsets, chunking, dictionaries --------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "values", "arrow_type"),
    [
        ("bucket(8, c)", list(range(-20, 20)), pa.int32()),
        ("bucket(8, c)", [f"v{i}" for i in range(40)], pa.string()),
        ("bucket(8, c)", [Decimal(i).scaleb(-2) for i in range(-20, 20)], pa.decimal128(6, 2)),
        ("truncate(3, c)", list(range(-20, 20)), pa.int16()),
        ("truncate(2, c)", [f"w{i}x" for i in range(40)], pa.large_string()),
        ("c % 3", list(range(-20, 20)), pa.int64()),
        (
            "date_trunc('week', c)",
            [dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(40)],
            pa.date32(),
        ),
        (
            "date_part('day', c)",
            [dt.datetime(2024, 2, 20, i % 24) + dt.timedelta(days=i) for i in range(40)],
            pa.timestamp("us", "UTC"),
        ),
        ("c", [dt.datetime(2024, 2, 20, i % 24) for i in range(40)], pa.timestamp("ms", "Europe/Paris")),
    ],
)
def test_nulls_and_sliced_arrays(expression: str, values: list[Any], arrow_type: pa.DataType) -> None:
    mask = np.array([i % 3 == 0 for i in range(len(values))])
    array = pa.array(values, arrow_type, mask=mask)
    transform = parse_transform(expression)
    full = transform.apply(array).to_pylist()
    assert [v is None for v in full] == mask.tolist(), "NULL in must give NULL out, nowhere else"
    # Bit offsets (3, 11) and byte offsets (8) into the validity bitmap must not shift values or NULLs.
    for start in (3, 8, 11):
        assert transform.apply(array.slice(start, 20)).to_pylist() == full[start : start + 20]
    chunked = pa.chunked_array([array.slice(0, 7), array.slice(7)])
    result = transform.apply(chunked)
    assert isinstance(result, pa.ChunkedArray)
    assert result.to_pylist() == full
    assert transform.apply(array.dictionary_encode()).to_pylist() == full
    assert transform.apply(pa.array([], arrow_type)).to_pylist() == []
    assert transform.apply(pa.nulls(3, arrow_type)).to_pylist() == [None, None, None]


def test_null_partition_is_distinct_from_null_like_strings() -> None:
    values = pa.array(["null", None, "None", "NULL", ""])
    assert parse_transform("c").apply(values).to_pylist() == ["null", None, "None", "NULL", ""]
    buckets = parse_transform("bucket(1000000, c)").apply(values).to_pylist()
    assert buckets[1] is None
    assert all(isinstance(b, int) for i, b in enumerate(buckets) if i != 1)
    assert parse_transform("bucket(4, c)").apply_scalar(None) is None


def test_apply_accepts_numpy_ranges_for_bucket_enumeration() -> None:
    candidates = np.arange(-1000, 1000, dtype=np.int64)
    transform = parse_transform("bucket(16, c)")
    buckets = transform.apply(candidates)
    assert buckets.type == pa.int64()
    assert len(buckets) == 2000
    assert buckets.to_pylist() == [transform.apply_scalar(int(v)) for v in candidates]
    assert set(buckets.to_pylist()) == set(range(16))


# --- semantics ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "value", "expected"),
    [
        ("c % 3", -7, -1),
        ("c % 3", 7, 1),
        ("truncate(10, c)", -1, -10),
        ("truncate(10, c)", 10, 10),
        ("truncate(3, c)", "é😀ab", "é😀a"),
        ("truncate(2, c)", b"\x00\xff\x01", b"\x00\xff"),
        ("truncate(50, c)", Decimal("10.65"), Decimal("10.50")),
        ("truncate(10, c)", Decimal("-0.05"), Decimal("-0.10")),
        ("date_part('week', c)", dt.date(2021, 1, 3), 53),
        ("date_part('week', c)", dt.date(2024, 12, 30), 1),
        ("date_part('quarter', c)", dt.date(2024, 8, 31), 3),
        ("date_part('year', c)", dt.datetime(2025, 12, 31, 23, 30, tzinfo=NEW_YORK), 2026),
        ("date_part('hour', c)", dt.datetime(2024, 3, 10, 3, 30, tzinfo=NEW_YORK), 7),
        ("date_trunc('quarter', c)", dt.date(2024, 8, 31), dt.date(2024, 7, 1)),
        ("date_trunc('week', c)", dt.datetime(2024, 3, 3, 23, 59), dt.datetime(2024, 2, 26)),
        (
            "date_trunc('day', c)",
            dt.datetime(2024, 11, 3, 1, 30, tzinfo=NEW_YORK),
            dt.datetime(2024, 11, 3, tzinfo=UTC),
        ),
        (
            "date_trunc('minute', c)",
            dt.datetime(1969, 12, 31, 23, 59, 59, 999999),
            dt.datetime(1969, 12, 31, 23, 59),
        ),
    ],
)
def test_partition_value_semantics(expression: str, value: Any, expected: Any) -> None:
    transform = parse_transform(expression)
    result = transform.apply_scalar(value)
    assert result == expected
    assert type(result) is type(expected)
    if isinstance(expected, dt.datetime):
        assert (result.utcoffset() is None) == (expected.utcoffset() is None)


def test_bound_scalars_are_checked_against_the_column_type() -> None:
    with pytest.raises(PartitionValueError, match=r"expected an int \(column type int64\)"):
        parse_transform("bucket(4, c)").bind(pa.int64()).apply_scalar("12")
    with pytest.raises(PartitionValueError, match=r"expected a datetime\.date"):
        parse_transform("c").bind(pa.date32()).apply_scalar(dt.datetime(2024, 1, 1))
    with pytest.raises(PartitionValueError, match="more than 2 fractional digits"):
        parse_transform("bucket(4, c)").bind(pa.decimal128(5, 2)).apply_scalar(Decimal("1.234"))
    # A date compared against a timestamp column means its midnight; decimals take the column's scale.
    on_timestamps = parse_transform("date_trunc('day', c)").bind(pa.timestamp("us", "UTC"))
    assert on_timestamps.apply_scalar(dt.date(2024, 5, 1)) == dt.datetime(2024, 5, 1, tzinfo=UTC)
    decimal_bucket = parse_transform("bucket(1000, c)").bind(pa.decimal128(6, 2))
    assert decimal_bucket.apply_scalar(Decimal("14.2")) == decimal_bucket.apply_scalar(Decimal("14.20"))
    assert decimal_bucket.apply_scalar(14) == decimal_bucket.apply_scalar(Decimal("14.00"))


@given(
    st.lists(NAIVE, min_size=1, max_size=30),
    st.sampled_from(["year", "quarter", "month", "week", "day", "hour", "minute"]),
)
@HYPOTHESIS
def test_date_trunc_is_monotonic_and_its_preimage_is_exact(values: list[dt.datetime], unit: str) -> None:
    transform = parse_transform(f"date_trunc('{unit}', c)").bind(pa.timestamp("us"))
    ordered = sorted(values)
    results = transform.apply(pa.array(ordered, pa.timestamp("us"))).to_pylist()
    assert results == sorted(results), "date_trunc must be non-decreasing"
    for value, start in zip(ordered, results, strict=True):
        interval = transform.preimage(start)
        assert interval is not None
        assert interval.contains(value)
        assert interval.lower == start
        if interval.upper is not None:
            assert transform.apply_scalar(interval.upper) != start
            assert transform.apply_scalar(interval.upper - dt.timedelta(microseconds=1)) == start


@given(st.lists(st.integers(-(10**12), 10**12), min_size=1, max_size=30), st.integers(1, 10**6))
@HYPOTHESIS
def test_truncate_integers_is_monotonic_and_its_preimage_is_exact(values: list[int], width: int) -> None:
    transform = parse_transform(f"truncate({width}, c)").bind(pa.int64())
    ordered = sorted(values)
    results = transform.apply(pa.array(ordered, pa.int64())).to_pylist()
    assert results == sorted(results)
    for value, floor in zip(ordered, results, strict=True):
        interval = transform.preimage(floor)
        assert interval is not None
        assert interval.contains(value)
        assert transform.apply_scalar(interval.upper) == floor + width
        assert transform.apply_scalar(interval.upper - 1) == floor


@given(st.lists(TEXT, min_size=1, max_size=30), st.integers(1, 4))
@HYPOTHESIS
def test_truncate_strings_is_monotonic_and_its_preimage_is_exact(values: list[str], width: int) -> None:
    transform = parse_transform(f"truncate({width}, c)").bind(pa.string())
    ordered = sorted(values)
    results = transform.apply(pa.array(ordered)).to_pylist()
    assert results == sorted(results)
    for value, prefix in zip(ordered, results, strict=True):
        interval = transform.preimage(prefix)
        assert interval is not None
        assert interval.contains(value)
    for other in values:
        for prefix in set(results):
            interval = transform.preimage(prefix)
            assert interval is not None
            assert interval.contains(other) == (transform.apply_scalar(other) == prefix)


# --- import hygiene -------------------------------------------------------------------------------


def test_importing_transforms_loads_no_heavy_modules() -> None:
    """The spec imports this package at DAG-parse time: pyarrow, numpy, pyspark, duckdb must stay out."""
    code = (
        "import sys; from airflow_partitions.transforms import parse_transform; "
        't = parse_transform("bucket(50, PULocationID)"); t.canonical; t.monotonic; '
        "heavy = ('pyarrow', 'numpy', 'pyspark', 'duckdb', 'pandas', 'airflow'); "
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert output.strip() == "[]", f"heavy modules imported at parse time: {output}"


@pytest.mark.parametrize(
    ("expr", "value"),
    [("truncate(1000, x)", 7), ("truncate(10, x)", -5), ("truncate(2, x)", "abc")],
)
def test_truncate_has_no_preimage_for_values_it_cannot_produce(expr: str, value: object) -> None:
    """Should not claim a source range for 7 under truncate(1000): no value truncates to 7."""
    import pyarrow as pa

    source = pa.string() if isinstance(value, str) else pa.int64()
    assert parse_transform(expr).bind(source).preimage(value) is None
