"""Sandboxed SQL over a dataset: one read-only SELECT in a fresh, locked-down DuckDB database.

The dataset name is a view over the files the statement's WHERE clauses can need; external file access
is disabled except for those files, and the configuration is locked before the statement runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import FilterError
from airflow_partitions.pruning.expressions import quote_identifier, quote_string

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.read.scan import CallScope, DuckDBScanner
    from airflow_partitions.storage import DataFile


DISABLED_OPTIMIZERS = "statistics_propagation"


def new_duckdb_connection(*, functions: bool = True) -> Any:
    """An in-memory DuckDB database in UTC, with the partition transforms' UDFs when `functions`.

    Registering the UDFs costs far more than opening the database, so callers ask only when the SQL
    they will run calls them (`needs_partition_functions`).
    """
    import duckdb

    connection = duckdb.connect()
    connection.execute("SET GLOBAL TimeZone = 'UTC'")
    # Partition files are immutable (unique names, never rewritten): their footers can be cached.
    connection.execute("SET GLOBAL parquet_metadata_cache = true")
    # Parquet min / max leave NaN out, and DuckDB's statistics propagation folds a comparison the
    # statistics decide (`f < 'inf'` when max < inf) to TRUE, returning NaN rows the filter excludes;
    # no fence stops it (statistics pass through `OFFSET 0`), so the optimizer is off for our reads.
    connection.execute(f"SET GLOBAL disabled_optimizers = '{DISABLED_OPTIMIZERS}'")
    if functions:
        from airflow_partitions.transforms.duckdb_functions import register_duckdb_functions

        register_duckdb_functions(connection)
    return connection


def needs_partition_functions(sql: str) -> bool:
    """Whether DuckDB SQL (after `executable_sql` / `duckdb_expression`) calls the transforms' UDFs."""
    lowered = sql.lower()
    return "ap_bucket_" in lowered or "ap_truncate_" in lowered


def run_query(
    scanner: DuckDBScanner, dataset: str, files: Sequence[DataFile], schema: pa.Schema, statement: str
) -> pa.Table:
    """Run `statement` (checked read-only, made executable) where `dataset` is a view over `files`."""
    connection = new_duckdb_connection(functions=needs_partition_functions(statement))
    try:
        with scanner.call_scope(connection) as scope:
            return _run_sandboxed(scanner, connection, scope, dataset, files, schema, statement)
    finally:
        connection.close()


def _run_sandboxed(
    scanner: DuckDBScanner,
    connection: Any,
    scope: CallScope,
    dataset: str,
    files: Sequence[DataFile],
    schema: pa.Schema,
    statement: str,
) -> pa.Table:
    import duckdb

    if files:
        relation = scanner.relation(connection, scope, files, schema)
        connection.execute(f"CREATE TEMP VIEW {quote_identifier(dataset)} AS SELECT * FROM {relation}")
    else:
        connection.register(dataset, schema.empty_table())
    # Only the selected files DuckDB scans in place stay readable (other engines are attached or in memory).
    allowed = ", ".join(quote_string(path) for path in scope.local_files)
    connection.execute(f"SET allowed_paths = [{allowed}]")
    connection.execute("SET enable_external_access = false")
    connection.execute("SET lock_configuration = true")
    try:
        return connection.sql(statement).to_arrow_table()
    except duckdb.Error as err:
        raise FilterError(f"query failed: {str(err).strip()}") from err
