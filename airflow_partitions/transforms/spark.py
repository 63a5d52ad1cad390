"""Spark column expressions for the transforms: the same partition values as `Transform.apply`, in Spark.

Native Spark expressions are used where their semantics provably match ours (integer floors via `pmod`,
`%`, `substring` on code points / bytes, calendar fields of a UTC date). Timestamps are handled as
microseconds since the epoch (`unix_micros`), which does not depend on the session time zone for
tz-aware columns; naive timestamps are UTC wall time, so they need a UTC session (checked here).
`bucket` of integers, dates and timestamps is native: Spark's own `hash()` is Murmur3 x86_32, and
Iceberg's bucket hashes these values as one 64-bit long with seed 0 (see `_bucket`). Strings, binary,
UUIDs, decimals and uint64 (whose canonical bytes Spark's `hash()` does not produce) run our own
vectorised Murmur3 as an Arrow UDF, so the hash has one definition there. Decimals of precision 38 go
through the same Arrow UDF route, because Spark's decimal arithmetic would round them. Imported lazily:
it loads pyspark and pyarrow.

Each builder takes plain values (the column, its normalised Arrow type, the transform's parameters and,
where the values run through our own kernel, the transform's `apply`), so this module imports no
transform class: each transform picks its builder in `_spark_form`, and `Transform.to_spark` is the one
entry point.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any, cast

import pyarrow as pa
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T
from sqlglot import exp

from airflow_partitions.exceptions import PartitionExpressionError, PartitionValueError
from airflow_partitions.transforms import arrow_support as support
from airflow_partitions.transforms import case_mapping
from airflow_partitions.transforms.arrow_native import prefix_count

# A transform's own kernel over one Arrow array (`Transform.apply`), shipped to Spark's Arrow batches.
ArrayKernel = Callable[[pa.Array], pa.Array]
# The canonical SQL and DuckDB's Arrow result type of one sub-expression (raises when it has none).
TypeOfPart = Callable[[exp.Expr], tuple[str, pa.DataType]]

MICROS_PER_MINUTE = 60 * 1_000_000
MICROS_PER_HOUR = 60 * MICROS_PER_MINUTE
MICROS_PER_DAY = 24 * MICROS_PER_HOUR
_SPARK_INT_MAX = (1 << 31) - 1
# Spark widens `d - pmod(d, w)` by one digit; beyond 37 digits it would have to round.
_EXACT_DECIMAL_PRECISION = 37
_SPARK_MAX_DECIMAL_DIGITS = 38


def spark_type_for(arrow_type: pa.DataType) -> T.DataType:
    """The Spark type a column of `arrow_type` has in Spark (what `to_spark` expects to receive)."""
    source = support.normalize_type(arrow_type)
    if support.is_boolean(source):
        return T.BooleanType()
    if support.is_signed_integer(source):
        return {8: T.ByteType(), 16: T.ShortType(), 32: T.IntegerType(), 64: T.LongType()}[source.bit_width]
    if support.is_unsigned_integer(source):
        # Spark has no unsigned types: widen to the next signed type that holds every value.
        return {8: T.ShortType(), 16: T.IntegerType(), 32: T.LongType(), 64: T.DecimalType(20, 0)}[
            source.bit_width
        ]
    if support.is_string(source):
        return T.StringType()
    if support.is_binary(source) or support.is_fixed_binary(source) or support.is_uuid(source):
        return T.BinaryType()
    if support.is_decimal(source):
        if source.precision > _SPARK_MAX_DECIMAL_DIGITS:
            raise PartitionExpressionError(
                f"Arrow type {arrow_type} has more digits than Spark decimals hold "
                f"({_SPARK_MAX_DECIMAL_DIGITS}); cast the column to decimal(38, s) in the source"
            )
        return T.DecimalType(source.precision, source.scale)
    if support.is_date(source):
        return T.DateType()
    if support.is_timestamp(source):
        return T.TimestampType() if source.tz is not None else T.TimestampNTZType()
    raise PartitionExpressionError(f"no Spark type for Arrow type {arrow_type}")


def require_utc_session(canonical: str, source_columns: Sequence[str]) -> None:
    """Fail when the active Spark session would read naive timestamps (UTC wall time) in another zone."""
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    if session is None:
        return
    zone = session.conf.get("spark.sql.session.timeZone")
    if zone not in ("UTC", "Etc/UTC", "GMT", "Z", "+00:00"):
        raise PartitionExpressionError(
            f"partition expression {canonical!r}: column(s) {', '.join(source_columns)} "
            "hold naive "
            f"timestamps (UTC wall time), but the Spark session time zone is {zone}; set "
            "spark.sql.session.timeZone=UTC (the package's session builders do)"
        )


def binary_collation(column: Column) -> Column:
    """A string column with Spark's default UTF8_BINARY collation, whatever collation it has.

    Spark 4 strings may carry a collation (`CAST(s AS STRING COLLATE UTF8_LCASE)`, a table or view
    declared so); under a case- or accent-insensitive one Spark's `=`, `<`, `CASE`, `translate`,
    `replace`, `LIKE`, grouping and joins ignore case ('AB' = 'ab'), where DuckDB and Arrow compare bytes.
    Every string a transform reads goes through this first, so its values, and the join that routes rows
    to partition keys, are the byte-wise ones of the other engines. A cast to the plain `StringType()`
    (UTF8_BINARY in Spark 4.2, also with `spark.sql.session.collation.default` set): Spark drops it on a
    column that is already UTF8_BINARY, so a filter on it still reaches the Parquet scan, where an explicit
    `collate(c, 'UTF8_BINARY')` stays in the plan and keeps the filter from being pushed down.
    """
    return column.cast(T.StringType())


# --- builders, one per transform type --------------------------------------------------------------


def identity_column(column: Column, source: pa.DataType) -> Column:
    if support.is_timestamp(source) and source.tz is None:
        return column.cast(T.TimestampNTZType())
    return column


# Spark's `hash(a, b)` is Murmur3 x86_32 of `b` seeded with Murmur3 of `a` seeded with 42, and an int `a`
# hashes with `hashInt`. This int is the one whose `hashInt(_, 42)` is 0 (Murmur3 of one 4-byte block is a
# bijection, so exactly one exists; found by inverting its steps), so `hash(int(this), long v)` is
# Murmur3 x86_32 of v's 8 little-endian bytes with seed 0: Iceberg's hash of an integer, date (days) or
# timestamp (microseconds). tests/test_transforms_spark.py checks the zero and every bucket against Arrow.
SEED_ZERO_PREFIX = -1693959553
_INT32_MASK = 0x7FFFFFFF


def bucket_column(
    column: Column, source: pa.DataType, num_buckets: int, result_bits: int, apply: ArrayKernel
) -> Column:
    result_type = T.LongType() if result_bits == 64 else T.IntegerType()
    long_value = _bucket_long(column, source)
    if long_value is None:
        return arrow_udf(apply, column, source, result_type)
    # Native: about as cheap as reading the column, where the Arrow UDF ships it to Python and back.
    hashed = F.hash(F.lit(SEED_ZERO_PREFIX).cast(T.IntegerType()), long_value)
    bucket = hashed.bitwiseAND(F.lit(_INT32_MASK)) % F.lit(num_buckets)
    # Spark's hash skips NULL arguments; a NULL value has no bucket.
    return F.when(long_value.isNotNull(), bucket.cast(result_type))


def _bucket_long(column: Column, source: pa.DataType) -> Column | None:
    """The 64-bit value Iceberg's bucket hashes, as a Spark long; None where Spark's hash() would not see
    the canonical bytes (uint64, held as DECIMAL(20,0); strings, binary, UUIDs and decimals)."""
    if support.is_signed_integer(source) or (support.is_unsigned_integer(source) and source.bit_width < 64):
        return column.cast(T.LongType())
    if support.is_date(source):
        return F.unix_date(column).cast(T.LongType())
    if support.is_timestamp(source):
        return _micros(column)
    return None


def arrow_udf(apply: ArrayKernel, column: Column, source: pa.DataType, result_type: T.DataType) -> Column:
    """Evaluate a transform's `apply` on Spark's Arrow batches: one definition, vectorised."""
    needs_uint64 = support.is_unsigned_integer(source) and source.bit_width == 64

    def transform_batch(values: pa.Array) -> pa.Array:
        if needs_uint64:
            # Spark holds uint64 as DECIMAL(20,0); the transform is defined on the uint64 value.
            values = values.cast(pa.uint64())
        result: pa.Array = apply(values)
        if needs_uint64 and pa.types.is_unsigned_integer(result.type):
            result = result.cast(pa.decimal128(20, 0))
        return result

    # The overloads of arrow_udf do not cover a plain function plus a return type; the call is valid.
    make_udf = cast(Any, F.arrow_udf)
    return make_udf(transform_batch, result_type)(column)


def multi_bucket_column(
    apply_columns: Callable[[list[pa.Array]], pa.Array], columns: Sequence[Column]
) -> Column:
    """`multi_bucket(N, a, b, ...)` over Spark columns: the Arrow kernel on Spark's Arrow batches."""

    def bucket_batch(*arrays: pa.Array) -> pa.Array:
        return apply_columns(list(arrays))

    make_udf = cast(Any, F.arrow_udf)
    return make_udf(bucket_batch, T.IntegerType())(*columns)


def _floor_of(column: Column, step: Any) -> Column:
    """The largest multiple of `step` not above the value (`step` > 0): `v - pmod(v, step)`."""
    return column - F.pmod(column, F.lit(step))


def truncate_column(
    column: Column, source: pa.DataType, width: int, decimal_step: Decimal | None, apply: ArrayKernel
) -> Column:
    """`truncate(width, c)`; `decimal_step` is the width in the column's decimal scale (decimals only)."""
    spark_type = spark_type_for(source)
    if support.is_string(source) or support.is_binary(source):
        return F.substring(column, 1, min(width, _SPARK_INT_MAX))
    if support.is_decimal(source):
        if source.precision > _EXACT_DECIMAL_PRECISION or decimal_step is None:
            return arrow_udf(apply, column, source, spark_type)
        return _floor_of(column, decimal_step).cast(spark_type)
    if support.is_unsigned_integer(source) and source.bit_width == 64:
        return _floor_of(column, Decimal(width)).cast(spark_type)
    return _floor_of(column, width).cast(spark_type)


def mod_column(column: Column, source: pa.DataType, modulus: int) -> Column:
    # Spark's % keeps the dividend's sign, like ours (SQL).
    divisor: Any = modulus
    if support.is_unsigned_integer(source) and source.bit_width == 64:
        divisor = Decimal(modulus)
    return (column % F.lit(divisor)).cast(spark_type_for(source))


def _micros(column: Column) -> Column:
    # Casting to TIMESTAMP is a no-op for instants; TIMESTAMP_NTZ is read in the (UTC) session zone.
    return F.unix_micros(column.cast(T.TimestampType()))


def _integer_divide(numerator: Column, divisor: int) -> Column:
    """Exact `numerator / divisor` for a numerator known to be a multiple of `divisor`."""
    return F.call_function("div", numerator, F.lit(divisor))


def _utc_date(micros: Column) -> Column:
    days = _integer_divide(_floor_of(micros, MICROS_PER_DAY), MICROS_PER_DAY)
    return F.date_from_unix_date(days.cast(T.IntegerType()))


def date_part_column(column: Column, source: pa.DataType, unit: str) -> Column:
    if support.is_timestamp(source):
        micros = _micros(column)
        if unit == "hour":
            of_day = F.pmod(micros, F.lit(MICROS_PER_DAY))
            return _integer_divide(_floor_of(of_day, MICROS_PER_HOUR), MICROS_PER_HOUR).cast(T.IntegerType())
        if unit == "minute":
            of_hour = F.pmod(micros, F.lit(MICROS_PER_HOUR))
            return _integer_divide(_floor_of(of_hour, MICROS_PER_MINUTE), MICROS_PER_MINUTE).cast(
                T.IntegerType()
            )
        day = _utc_date(micros)
    else:
        day = column
    fields = {
        "year": F.year,
        "quarter": F.quarter,
        "month": F.month,
        # Spark's weekofyear is the ISO week (weeks start on Monday, week 1 holds the first Thursday).
        "week": F.weekofyear,
        "day": F.dayofmonth,
    }
    return fields[unit](day).cast(T.IntegerType())


def date_trunc_column(column: Column, source: pa.DataType, unit: str) -> Column:
    if support.is_date(source):
        return column if unit == "day" else F.trunc(column, unit)
    micros = _micros(column)
    periods = {"minute": MICROS_PER_MINUTE, "hour": MICROS_PER_HOUR, "day": MICROS_PER_DAY}
    if unit in periods:
        start = _floor_of(micros, periods[unit])
    elif unit == "week":
        # 1970-01-01 was a Thursday: shift by three days so that weeks start on Monday.
        start = micros - F.pmod(micros + F.lit(3 * MICROS_PER_DAY), F.lit(7 * MICROS_PER_DAY))
    else:
        first_day = F.trunc(_utc_date(micros), unit)
        start = F.unix_date(first_day).cast(T.LongType()) * F.lit(MICROS_PER_DAY)
    result = F.timestamp_micros(start)
    if source.tz is None:
        return result.cast(T.TimestampNTZType())
    return result


def expression_column(
    column: Column,
    source: pa.DataType,
    *,
    result_type: pa.DataType,
    native_tree: exp.Expr | None,
    type_of: TypeOfPart,
    apply: ArrayKernel,
) -> Column:
    """An expression transform; `native_tree` is the tree to try natively (None: always the Arrow UDF)."""
    # The expression's one definition is DuckDB's; Spark's own lower/upper, integer division, substr
    # and casts differ on hostile values, so the workers run the same evaluation over Arrow batches,
    # except for the few forms whose Spark meaning is provably DuckDB's (`_native_expression`).
    from pyspark.sql.pandas.types import to_arrow_type

    spark_result = spark_type_for(result_type)
    if native_tree is not None:
        native = _native_expression(native_tree, column, source, type_of)
        if native is not None:
            return native.cast(spark_result)
    arrow_result = to_arrow_type(spark_result, timezone="UTC")

    def evaluate_batch(values: pa.Array) -> pa.Array:
        result: pa.Array = apply(values)
        return result.cast(arrow_result)

    make_udf = cast(Any, F.arrow_udf)
    return make_udf(evaluate_batch, spark_result)(column)


# Comparisons, boolean logic, CASE and IS NULL over integers, booleans and strings with non-NULL literal
# operands, and string prefixes: three-valued logic, integer and byte-wise string order, and code point
# prefixes are the same in Spark and DuckDB. No arithmetic (overflow), no casts, no case mapping.
_NATIVE_COMPARISONS: dict[type[exp.Expr], Any] = {
    exp.EQ: lambda left, right: left == right,
    exp.NEQ: lambda left, right: left != right,
    exp.LT: lambda left, right: left < right,
    exp.LTE: lambda left, right: left <= right,
    exp.GT: lambda left, right: left > right,
    exp.GTE: lambda left, right: left >= right,
}


def _native_literal(node: exp.Expr) -> Column | None:
    if isinstance(node, exp.Paren):
        return _native_literal(node.this)
    if isinstance(node, exp.Boolean):
        return F.lit(bool(node.this))
    if isinstance(node, exp.Literal):
        if node.is_string:
            return F.lit(str(node.this))
        text = str(node.this)
        if text.isdigit() and int(text) < 2**31:
            return F.lit(int(text))
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
        text = str(node.this.this)
        if text.isdigit() and int(text) < 2**31:
            return F.lit(-int(text))
    return None


def _native_expression(
    node: exp.Expr, column: Column, source: pa.DataType, type_of: TypeOfPart
) -> Column | None:
    """`node` as a native Spark column when every part of it is in the shared subset; else None."""
    comparable = support.is_signed_integer(source) or support.is_string(source) or support.is_boolean(source)
    if not comparable:
        return None

    def convert(part: exp.Expr) -> Column | None:
        if isinstance(part, exp.Paren):
            return convert(part.this)
        if isinstance(part, exp.Column):
            return column
        literal = _native_literal(part)
        if literal is not None:
            return literal
        if isinstance(part, _NATIVE_ARITHMETIC) and support.is_signed_integer(source):
            return _native_arithmetic(part, convert, type_of)
        if type(part) in _NATIVE_COMPARISONS:
            left, right = convert(part.this), convert(part.expression)
            if left is None or right is None or not _one_literal(part.this, part.expression):
                return None
            return cast(Column, _NATIVE_COMPARISONS[type(part)](left, right))
        if isinstance(part, exp.And | exp.Or):
            left, right = convert(part.this), convert(part.expression)
            if left is None or right is None:
                return None
            return left & right if isinstance(part, exp.And) else left | right
        if isinstance(part, exp.Not):
            inner = convert(part.this)
            return None if inner is None else ~inner
        if isinstance(part, exp.Is) and isinstance(part.expression, exp.Null):
            inner = convert(part.this)
            return None if inner is None else inner.isNull()
        if isinstance(part, exp.Case) and part.this is None:
            return _native_case(part, convert)
        if isinstance(part, exp.Left | exp.Substring) and support.is_string(source):
            return _native_prefix(part, convert)
        if isinstance(part, exp.Lower | exp.Upper):
            return _native_case_mapping(part, convert, type_of)
        return None

    return convert(node)


def _native_case_mapping(part: exp.Lower | exp.Upper, convert: Any, type_of: TypeOfPart) -> Column | None:
    """DuckDB's `lower` / `upper` of a string: Spark's own on pure ASCII rows, else DuckDB's table.

    Spark's `lower` / `upper` differ from DuckDB's beyond ASCII ('İ', 'ß', a final 'Σ', letters of newer
    Unicode versions; which ones depends on the JVM and `spark.sql.icu.caseMappings.enabled`), but on a
    pure ASCII string they map A-Z / a-z byte by byte, as DuckDB does. Every other row goes through
    `translate` with DuckDB's whole mapping (`case_mapping.translation`, code point by code point, as
    DuckDB maps), so no row depends on Spark's tables. A row is pure ASCII when its length in code points
    is its length in bytes.
    """
    function = "lower" if isinstance(part, exp.Lower) else "upper"
    try:
        _, inner_type = type_of(part.this)
    except (PartitionExpressionError, PartitionValueError):
        return None
    table = case_mapping.translation(function)
    inner = convert(part.this)
    if inner is None or table is None or not support.is_string(inner_type):
        return None
    sources, images = table
    builtin = F.lower(inner) if function == "lower" else F.upper(inner)
    ascii_only = F.length(inner) == F.octet_length(inner)
    return cast(Column, F.when(ascii_only, builtin).otherwise(F.translate(inner, sources, images)))


# Integer arithmetic with integer literals, in Spark's own integer types: `try_add` / `try_subtract` /
# `try_multiply` give NULL on overflow whatever spark.sql.ansi.enabled says, which fails the job (as the
# overflow fails DuckDB), and every node's value is checked against the range of the type DuckDB gives it
# (the engines type literals differently). `//` is Spark's `div` (truncates toward zero, as DuckDB's) and
# `%` keeps the dividend's sign in both; the divisor must be a non-zero literal (DuckDB gives NULL for a
# zero divisor) and MIN // -1 fails as an overflow.
_NATIVE_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.IntDiv, exp.Mod, exp.Neg, exp.Abs)
_INTEGER_BITS = {pa.int8(): 8, pa.int16(): 16, pa.int32(): 32, pa.int64(): 64}


def _native_arithmetic(part: exp.Expr, convert: Any, type_of: TypeOfPart) -> Column | None:
    try:
        text, result_type = type_of(part)
    except (PartitionExpressionError, PartitionValueError):
        return None
    bits = _INTEGER_BITS.get(result_type)
    if bits is None:
        return None
    wide = T.LongType()
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    if isinstance(part, exp.Neg | exp.Abs):
        inner = convert(part.this)
        if inner is None:
            return None
        a = inner.cast(wide)
        negated = F.try_subtract(F.lit(0).cast(wide), a)
        value = negated if isinstance(part, exp.Neg) else F.when(a < 0, negated).otherwise(a)
        overflow = value.isNull() & a.isNotNull()
    else:
        left, right = convert(part.this), convert(part.expression)
        if left is None or right is None:
            return None
        a, b = left.cast(wide), right.cast(wide)
        if isinstance(part, exp.IntDiv | exp.Mod):
            divisor = _literal_value(part.expression)
            if _native_literal(part.expression) is None or divisor is None or divisor == 0:
                return None
            if isinstance(part, exp.Mod):
                value = a % b
                overflow = F.lit(False)
            else:
                value = F.call_function("div", a, b)
                overflow = (a == F.lit(-(1 << 63))) & F.lit(divisor == -1)
        else:
            if isinstance(part, exp.Add):
                value = F.try_add(a, b)
            elif isinstance(part, exp.Sub):
                value = F.try_subtract(a, b)
            else:
                value = F.try_multiply(a, b)
            overflow = value.isNull() & a.isNotNull() & b.isNotNull()
    message = f"partition expression {text}: the value is out of the range of {result_type} (overflow)"
    out_of_range = overflow | (value < F.lit(low)) | (value > F.lit(high))
    checked = F.when(out_of_range, F.raise_error(F.lit(message))).otherwise(value)
    return cast(Column, checked.cast(spark_type_for(result_type)))


def _literal_value(node: exp.Expr) -> int | None:
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Neg):
        inner = _literal_value(node.this)
        return None if inner is None else -inner
    if isinstance(node, exp.Literal) and not node.is_string and str(node.this).isdigit():
        return int(node.this)
    return None


def _one_literal(left: exp.Expr, right: exp.Expr) -> bool:
    """A comparison of a value with a literal (two literals would be typed by each engine its own way)."""
    return (_native_literal(left) is None) != (_native_literal(right) is None)


def _native_case(node: exp.Case, convert: Any) -> Column | None:
    branches = node.args.get("ifs") or []
    default = node.args.get("default")
    values = [branch.args.get("true") for branch in branches] + ([default] if default is not None else [])
    if len({isinstance(value, exp.Literal) and value.is_string for value in values}) != 1:
        return None  # mixed result kinds: each engine would coerce them its own way
    result: Any = F
    for branch in branches:
        condition, value = convert(branch.this), _native_literal(branch.args.get("true"))
        if condition is None or value is None:
            return None
        result = result.when(condition, value)
    if default is None:
        return cast(Column, result)
    otherwise = _native_literal(default)
    return None if otherwise is None else cast(Column, result.otherwise(otherwise))


def _native_prefix(node: exp.Left | exp.Substring, convert: Any) -> Column | None:
    """`left(s, n)` / `substr(s, 1, n)` with n > 0: the first n code points in both engines."""
    inner = convert(node.this)
    count = prefix_count(node)
    if inner is None or count is None:
        return None
    return F.substring(inner, 1, count)
