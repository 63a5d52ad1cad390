"""The one row hash: an order-independent count and hash of a set of rows, per partition, the same over a
source and over an acceleration.

Each row hashes to 64 bits: DuckDB's `hash()` of the row as one struct of its columns, in the dataset's
column order, over the values conformed to the dataset's declared schema (`row_expression`). A set of rows
hashes to the sum of its rows' hashes modulo 2**64: the order of rows and files does not matter, a
duplicated row is counted twice (a xor would cancel it), and the hash of a union is the sum of the parts'
(an appended partition's certificate is the old one plus the new files'). A float column also hashes a
flag that is true only for -0.0 (DuckDB hashes -0.0 as 0.0; the files keep the sign); every NaN is one
NaN; dictionary columns hash as their values. NULL, '' and 'NULL' hash differently; a timestamp with an
offset is the instant it stores.

DuckDB's `hash()` is deterministic across connections and processes; `ALGORITHM` names it with DuckDB's
minor version so a certificate recorded under another release is recognised as not comparable rather than
reported as drift.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_partitions.catalog.model import RowCertificate
from airflow_partitions.exceptions import PartitionExpressionError, StorageError
from airflow_partitions.keys import PartitionKey
from airflow_partitions.quoting import quote_identifier
from airflow_partitions.transforms.mod import ModTransform
from airflow_partitions.transforms.temporal import DatePartTransform, DateTruncTransform
from airflow_partitions.write.routing import partition_groups

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.storage import DataFile, PartitionStorage
    from airflow_partitions.transforms import Transform

MODULUS = 1 << 64
_GROUP_COLUMN = "__row_hash_group"
_TABLE = "__row_hash_rows"


def algorithm() -> str:
    """The name of the row hash (DuckDB's `hash()` of the row struct, DuckDB major.minor)."""
    import duckdb

    major_minor = ".".join(duckdb.__version__.split(".")[:2])
    return f"rowsum64/duckdb-{major_minor}"


class RowTally:
    """Running count and hash sum of one set of rows."""

    __slots__ = ("rows", "total")

    def __init__(self, rows: int = 0, total: int = 0) -> None:
        self.rows = rows
        self.total = total % MODULUS

    def add(self, rows: int, total: int) -> None:
        self.rows += rows
        self.total = (self.total + total) % MODULUS

    @property
    def row_hash(self) -> str:
        return f"{self.total:016x}"

    def certificate(self) -> RowCertificate:
        return RowCertificate(self.rows, self.row_hash, algorithm())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RowTally) and (self.rows, self.total) == (other.rows, other.total)

    def __hash__(self) -> int:
        return hash((self.rows, self.total))

    def __repr__(self) -> str:
        return f"RowTally(rows={self.rows}, row_hash={self.row_hash})"


def hash_ready(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table` as the hash reads it: exactly `schema`'s columns in its order and types, dictionaries
    decoded. A column the table lacks or cannot cast is a `StorageError` naming it (the rows cannot equal
    rows of `schema`)."""
    import pyarrow as pa

    columns: list[Any] = []
    fields: list[pa.Field] = []
    for target in schema:
        if target.name not in table.column_names:
            raise StorageError(f"column {target.name!r} is missing (the rows have {table.column_names})")
        column = table.column(target.name)
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        if column.type != target.type:
            try:
                column = column.cast(target.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
                raise StorageError(
                    f"column {target.name!r} is {column.type}, not {target.type}, and cannot be read as it: "
                    f"{err}"
                ) from err
        if pa.types.is_float16(column.type):
            column = column.cast(pa.float32())  # DuckDB has no half float
        columns.append(column)
        fields.append(pa.field(target.name, column.type))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def row_expression(schema: pa.Schema, columns: Sequence[str] | None = None) -> str:
    """The SQL of one row's hash over `schema`'s columns (`columns`: their SQL, default the quoted names).

    DuckDB's `hash` of a float takes -0.0 for 0.0 (and every NaN as one NaN): a float column adds a
    flag that is true only for -0.0, so the sign the files store is part of the row.
    """
    import pyarrow as pa

    parts: list[str] = []
    for index, field in enumerate(schema):
        column = columns[index] if columns is not None else quote_identifier(field.name)
        parts.append(column)
        if pa.types.is_floating(field.type):
            parts.append(f"({column} = 0 AND signbit({column}))")
    return "hash(row(" + ", ".join(parts) + "))"


def _row_expression(schema: pa.Schema) -> str:
    return row_expression(schema)


def hash_connection() -> Any:
    """A DuckDB connection for the row hash (a context manager); reuse one across many partitions."""
    import duckdb

    return duckdb.connect()


_per_thread = threading.local()


def _thread_connection() -> Any:
    """This thread's DuckDB connection for one-off tallies: a refresh certifies every partition it writes,
    and opening a connection per partition would cost more than hashing a small one."""
    # Keyed by process too: a connection inherited through fork() is not safe to use.
    owner, connection = getattr(_per_thread, "connection", (None, None))
    if connection is None or owner != os.getpid():
        connection = hash_connection()
        _per_thread.connection = (os.getpid(), connection)
    return connection


def tally_rows(table: pa.Table, schema: pa.Schema, connection: Any = None) -> RowTally:
    """The count and row hash of every row of `table` (conformed to `schema`)."""
    prepared = hash_ready(table, schema)
    if prepared.num_rows == 0:
        return RowTally()
    connection = connection or _thread_connection()
    try:
        connection.register(_TABLE, prepared)
        ((rows, total),) = connection.execute(
            f"SELECT count(*)::BIGINT, coalesce(sum({_row_expression(prepared.schema)}), 0)::HUGEINT "
            f"FROM {_TABLE}"
        ).fetchall()
    finally:
        connection.unregister(_TABLE)
    return RowTally(int(rows), int(total))


def tally_by_partition(
    table: pa.Table,
    schema: pa.Schema,
    transforms: Sequence[Transform],
    connection: Any = None,
    into: dict[PartitionKey, RowTally] | None = None,
) -> dict[PartitionKey, RowTally]:
    """Count and row hash per partition key of `table`'s rows, keys computed by the dataset's own
    `transforms` (as a refresh routes rows; NULL is a key like any other). Adds to `into` when given."""
    import pyarrow as pa

    out = into if into is not None else {}
    if table.num_rows == 0:
        return out
    groups, keys = partition_groups(table, transforms)
    prepared = hash_ready(table, schema)
    row_expression = _row_expression(prepared.schema)
    prepared = prepared.append_column(_GROUP_COLUMN, pa.array(groups, pa.int64()))
    connection = connection or _thread_connection()
    try:
        connection.register(_TABLE, prepared)
        result = connection.execute(
            f"SELECT {quote_identifier(_GROUP_COLUMN)}, count(*)::BIGINT, "
            f"sum({row_expression})::HUGEINT FROM {_TABLE} "
            f"GROUP BY {quote_identifier(_GROUP_COLUMN)}"
        ).fetchall()
    finally:
        connection.unregister(_TABLE)
    for group, rows, total in result:
        tally = out.setdefault(keys[int(group)], RowTally())
        tally.add(int(rows), int(total))
    return out


def tally_files(
    storage: PartitionStorage,
    data_root: str | Path,
    files: Sequence[DataFile],
    schema: pa.Schema | None = None,
    connection: Any = None,
) -> RowTally:
    """Count and row hash of the rows in a partition's files, read back from the files themselves."""
    if not files:
        return RowTally()
    table = storage.read(Path(data_root), files)
    return tally_rows(table, schema if schema is not None else table.schema, connection)


def certify_files(
    storage: PartitionStorage,
    data_root: str | Path,
    files: Sequence[DataFile],
    schema: pa.Schema | None = None,
) -> RowCertificate:
    """The certificate of a partition written as `files`, read back from the files."""
    return tally_files(storage, data_root, files, schema).certificate()


def certify_rows(table: pa.Table) -> RowCertificate:
    """The certificate of the rows a partition's files were just written from (in the dataset schema)."""
    return tally_rows(table, table.schema).certificate()


def files_digest(files: Sequence[DataFile]) -> str:
    """The digest binding a certificate to a partition's files: the sum modulo 2**256 of their SHA-256s
    (order-independent, as a partition's file list is a set)."""
    total = sum(int(file.checksum, 16) for file in files) % (1 << 256)
    return f"{total:064x}"


def bind_certificate(certificate: RowCertificate | None, files: Sequence[DataFile]) -> RowCertificate | None:
    """`certificate` bound to the files the commit publishes it with (None stays None)."""
    if certificate is None:
        return None
    return replace(certificate, files=files_digest(files))


def certificates_equal(recorded: RowCertificate | None, tally: RowTally) -> bool | None:
    """Whether `tally` matches `recorded` (None: no certificate, or one under another algorithm)."""
    if recorded is None or recorded.algorithm != algorithm():
        return None
    return recorded.rows == tally.rows and recorded.row_hash == tally.row_hash


def tallies_json(tallies: Mapping[str, RowTally]) -> dict[str, dict[str, Any]]:
    return {path: {"rows": t.rows, "row_hash": t.row_hash} for path, t in sorted(tallies.items())}


def tally_parquet_files(
    paths: Sequence[str], schema: pa.Schema, connection: Any = None
) -> dict[str, RowTally] | None:
    """Count and row hash per Parquet file, all files in one DuckDB scan (columns cast to the types the
    Arrow path hashes, a column a file lacks read as NULL); None when DuckDB cannot read them so (the
    caller reads the files through their engine instead)."""
    import duckdb

    if not paths:
        return {}
    connection = connection or _thread_connection()
    ready = hash_ready(schema.empty_table(), schema)
    try:
        connection.register(_TABLE, ready)
        try:
            described = connection.execute(f"DESCRIBE SELECT * FROM {_TABLE}").fetchall()
        finally:
            connection.unregister(_TABLE)
        types = [str(row[1]) for row in described]
        columns = [
            f"CAST({quote_identifier(name)} AS {sql_type})"
            for name, sql_type in zip(ready.schema.names, types, strict=True)
        ]
        listed = ", ".join("'" + path.replace("'", "''") + "'" for path in paths)
        file_column = quote_identifier(_GROUP_COLUMN)
        result = connection.execute(
            f"SELECT {file_column}, count(*)::BIGINT, sum({row_expression(ready.schema, columns)})::HUGEINT "
            f"FROM read_parquet([{listed}], filename='{_GROUP_COLUMN}', union_by_name=true) "
            f"GROUP BY {file_column}"
        ).fetchall()
    except duckdb.Error:
        return None
    tallies = {path: RowTally() for path in paths}
    for path, rows, total in result:
        if str(path) not in tallies:
            return None  # a file named otherwise than asked: do not guess which it is
        tallies[str(path)].add(int(rows), int(total))
    return tallies


# --- one DuckDB pass over a whole relation, grouped by partition -----------------------------------

_HASH_COLUMN = "__row_hash"
_ROWS_COLUMN = "__row_count"
_HIGH_COLUMN = "__row_hash_high"
_LOW_COLUMN = "__row_hash_low"


def duckdb_types(schema: pa.Schema, connection: Any = None) -> list[str]:
    """The DuckDB type of each column of `schema` as the hash reads it (`hash_ready`), in order."""
    connection = connection or _thread_connection()
    ready = hash_ready(schema.empty_table(), schema)
    connection.register(_TABLE, ready)
    try:
        described = connection.execute(f"DESCRIBE SELECT * FROM {_TABLE}").fetchall()
    finally:
        connection.unregister(_TABLE)
    return [str(row[1]) for row in described]


def _pre_key_sql(transform: Transform, column_sql: str) -> tuple[str, bool]:
    """What DuckDB groups by for one partition field, and whether that is already the key value.

    Calendar and mod transforms are computed in SQL (`duckdb_functions`: the same values; a timestamp
    column grouped by its raw values would make a group per row). Every other transform groups by the
    raw column and is applied afterwards, once per distinct value, by its own Arrow code: no Python UDF
    runs per row, and a transform with no DuckDB form is still exact."""
    from airflow_partitions.transforms.duckdb_functions import (  # lazy: pyarrow; tasks import write/ light
        duckdb_expression,
    )

    if isinstance(transform, DatePartTransform | DateTruncTransform | ModTransform):
        try:
            return duckdb_expression(transform, column_sql), True
        except PartitionExpressionError:
            pass
    return column_sql, False


def tally_relation_by_partition(
    relation: str,
    schema: pa.Schema,
    transforms: Sequence[Transform],
    connection: Any,
    column_sql: Sequence[str] | None = None,
) -> dict[PartitionKey, RowTally]:
    """Count and row hash per partition key of every row of `relation` (SQL of a DuckDB table or table
    function whose columns, `column_sql` or the quoted names of `schema`, read as `hash_ready(schema)`),
    in one streaming, multi-threaded DuckDB aggregate.

    DuckDB groups by each field's pre-key (`_pre_key_sql`); the few distinct pre-keys are then mapped to
    the partition keys by the dataset's transforms and summed per key in Arrow, so keys are the very
    values `tally_by_partition` (and a refresh) computes. Each row's 64-bit hash is summed as two 32-bit
    halves in BIGINTs (exact up to 2**31 rows per group), so no sum leaves 64 bits."""
    import pyarrow as pa

    ready = hash_ready(schema.empty_table(), schema).schema
    columns = list(column_sql) if column_sql is not None else [quote_identifier(n) for n in ready.names]
    position = {name: index for index, name in enumerate(ready.names)}
    # One pre-key per source column of a field over several columns (multi_bucket), grouped raw.
    pre_key_lists = [
        [_pre_key_sql(t, columns[position[t.source_columns[0]]])]
        if len(t.source_columns) == 1
        else [(columns[position[c]], False) for c in t.source_columns]
        for t in transforms
    ]
    pre_key_names = [
        [f"__key_{index}" if len(pre) == 1 else f"__key_{index}_{part}" for part in range(len(pre))]
        for index, pre in enumerate(pre_key_lists)
    ]
    flat_names = [name for names in pre_key_names for name in names]
    flat_sql = [sql for pre in pre_key_lists for sql, _ in pre]
    key_names = [f"__key_{index}" for index in range(len(transforms))]
    selected = [f"{sql} AS {name}" for sql, name in zip(flat_sql, flat_names, strict=True)]
    inner = ", ".join([*selected, f"{row_expression(ready, columns)} AS {_HASH_COLUMN}"])
    group_by = f" GROUP BY {', '.join(flat_names)}" if flat_names else ""
    result = connection.sql(
        f"SELECT {', '.join([*flat_names, ''])}count(*)::BIGINT AS {_ROWS_COLUMN}, "
        f"sum({_HASH_COLUMN} >> 32)::BIGINT AS {_HIGH_COLUMN}, "
        f"sum({_HASH_COLUMN} & 4294967295)::BIGINT AS {_LOW_COLUMN} "
        f"FROM (SELECT {inner} FROM {relation}){group_by}"
    ).to_arrow_table()
    out: dict[PartitionKey, RowTally] = {}
    if not transforms:
        ((rows, high, low),) = zip(
            *(result.column(c).to_pylist() for c in (_ROWS_COLUMN, _HIGH_COLUMN, _LOW_COLUMN)), strict=True
        )
        if rows:
            out[PartitionKey(())] = RowTally(int(rows), (int(high) << 32) + int(low))
        return out
    arrays: dict[str, Any] = {}
    for name, transform, pre, names in zip(key_names, transforms, pre_key_lists, pre_key_names, strict=True):
        if len(pre) == 1 and pre[0][1]:
            arrays[name] = result.column(names[0]).cast(transform.result_type)
            continue
        raw = [
            result.column(part).cast(schema.field(column).type)
            for part, column in zip(names, transform.source_columns, strict=True)
        ]
        arrays[name] = transform.apply_columns(raw)
    for name in (_ROWS_COLUMN, _HIGH_COLUMN, _LOW_COLUMN):
        arrays[name] = result.column(name)
    grouped = (
        pa.table(arrays)
        .group_by(key_names, use_threads=False)
        .aggregate([(c, "sum") for c in (_ROWS_COLUMN, _HIGH_COLUMN, _LOW_COLUMN)])
    )
    values = [grouped.column(name).to_pylist() for name in key_names]
    sums = [grouped.column(f"{c}_sum").to_pylist() for c in (_ROWS_COLUMN, _HIGH_COLUMN, _LOW_COLUMN)]
    for index, (rows, high, low) in enumerate(zip(*sums, strict=True)):
        key = PartitionKey(tuple(column[index] for column in values))
        out[key] = RowTally(int(rows), (int(high) << 32) + int(low))
    return out


def tally_table_by_partition(
    table: pa.Table | pa.RecordBatchReader,
    schema: pa.Schema,
    transforms: Sequence[Transform],
    connection: Any = None,
) -> dict[PartitionKey, RowTally]:
    """`tally_by_partition` in one DuckDB aggregate: a table, or a stream of batches already conformed
    to `hash_ready(schema)` (read once, never held whole)."""
    import pyarrow as pa

    if isinstance(table, pa.Table):
        if table.num_rows == 0:
            return {}
        table = hash_ready(table, schema)
    connection = connection or _thread_connection()
    connection.register(_TABLE, table)
    try:
        return tally_relation_by_partition(_TABLE, schema, transforms, connection)
    finally:
        connection.unregister(_TABLE)
