"""Postgres SQL of the built-in partition transforms and of values: identifiers, literals, and each built-in
transform whose Postgres meaning is ours (the session runs in UTC). Custom expressions build on these
(`pg_expressions`), and `pg_sql` serves both."""

from __future__ import annotations

import datetime as dt
import functools
import math
import uuid
from decimal import Decimal
from typing import Any

from airflow_partitions.exceptions import SourceError
from airflow_partitions.quoting import quote_identifier
from airflow_partitions.transforms import (
    DatePartTransform,
    DateTruncTransform,
    IdentityTransform,
    ModTransform,
    Transform,
    TruncateTransform,
)

# Postgres' date_trunc / extract use the same unit names; `week` is the ISO week in both.
_UNITS = frozenset({"year", "quarter", "month", "week", "day", "hour", "minute"})


def quote_ident(name: str) -> str:
    """A Postgres identifier that means exactly `name` (`quote_identifier`; a NUL is a `SourceError`)."""
    try:
        return quote_identifier(name)
    except ValueError as err:
        raise SourceError(f"identifier {name!r} contains a NUL byte") from err


def sql_literal(value: Any) -> str:
    """A Postgres literal for a partition or bound value (the session has standard_conforming_strings on)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "'NaN'::float8"
        if math.isinf(value):
            return "'Infinity'::float8" if value > 0 else "'-Infinity'::float8"
        return f"{value!r}::float8"
    if isinstance(value, Decimal):
        return f"'{value}'::numeric"
    if isinstance(value, str):
        if "\x00" in value:
            raise SourceError("a Postgres text value cannot contain a NUL byte")
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, bytes | bytearray | memoryview):
        return f"'\\x{bytes(value).hex()}'::bytea"
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None and value.utcoffset() is not None:
            return f"TIMESTAMPTZ '{value.isoformat()}'"
        return f"TIMESTAMP '{value.isoformat()}'"
    if isinstance(value, dt.date):
        return f"DATE '{value.isoformat()}'"
    if isinstance(value, uuid.UUID):
        return f"'{value}'::uuid"
    raise SourceError(f"no Postgres literal for {type(value).__name__} value {value!r}")


@functools.singledispatch
def builtin_sql(transform: Transform) -> str | None:
    """The partition value of a built-in `transform` as a Postgres expression, or None when not
    translatable (bucket: no Murmur3 in Postgres; a custom expression: see `pg_sql.partition_sql`)."""
    return None


@builtin_sql.register
def _identity_sql(transform: IdentityTransform) -> str | None:
    return quote_ident(transform.source_column)


@builtin_sql.register
def _date_trunc_sql(transform: DateTruncTransform) -> str | None:
    import pyarrow as pa

    if transform.unit not in _UNITS:
        return None
    expression = f"date_trunc('{transform.unit}', {quote_ident(transform.source_column)})"
    if transform.source_type is not None and pa.types.is_date(transform.source_type):
        return f"{expression}::date"
    return expression


@builtin_sql.register
def _date_part_sql(transform: DatePartTransform) -> str | None:
    if transform.unit not in _UNITS:
        return None
    return f"extract({transform.unit} FROM {quote_ident(transform.source_column)})::int"


@builtin_sql.register
def _mod_sql(transform: ModTransform) -> str | None:
    return f"({quote_ident(transform.source_column)} % {int(transform.modulus)})"


@builtin_sql.register
def _truncate_sql(transform: TruncateTransform) -> str | None:
    import pyarrow as pa

    source_type = transform.source_type
    if source_type is None:
        return None
    column = quote_ident(transform.source_column)
    width = int(transform.width)
    if pa.types.is_integer(source_type):
        wide = f"{column}::bigint"
        return f"({wide} - ((({wide} % {width}) + {width}) % {width}))"
    if pa.types.is_string(source_type) or pa.types.is_large_string(source_type):
        return f"left({column}, {width})"
    if pa.types.is_binary(source_type) or pa.types.is_large_binary(source_type):
        return f"substring({column} FROM 1 FOR {width})"
    return None
