"""Sandboxed SQL over a dataset: one read-only SELECT in a fresh, locked-down DuckDB database.

The dataset name is a view over the files the statement's WHERE clauses can need; external file access
is disabled except for those files, and the configuration is locked before the statement runs.

The statement, as DuckDB's own parser reads it (`json_serialize_sql`), may name only the dataset and the
CTEs in scope where a name stands (`_scoped_nodes`), call only table functions that generate rows
(`SANDBOX_TABLE_FUNCTIONS`) or describe the catalog (`read.catalog_tables`: tables the reader built and
registered), and read only the settings in `SANDBOX_VISIBLE_SETTINGS`: catalog functions,
`information_schema`, `SHOW TABLES` and the other databases attached for the scan (the shared
`_tables.duckdb` holds every version's tables) stay out of reach, and so do the local paths of the files
(which `allowed_paths` and the views' SQL hold). DuckDB's error messages have those paths replaced before
they are raised.

Limits (`QueryLimits`): a wall-clock timeout counted from the call (parsing and pruning included), DuckDB
interrupted when it is spent; a memory limit, with spilling to disk off, that also caps the process's
address space while DuckDB runs (`pruning.limits`); a bounded number of threads. Either limit reached
raises `QueryLimitError`.

Opening a DuckDB database costs ~10 ms, more than a pruned aggregate, and a fresh one has an empty Parquet
footer cache. So a reader whose files are local and scanned in place keeps one locked-down database per
(memory limit, threads) (`SandboxDatabases`): configured and locked once, external access only to the
dataset's directory, and each query runs on a cursor of its own, whose temporary views and registered
tables no other cursor sees. Concurrent queries of one reader share that memory limit. Engines that attach
files to the database (DuckDB files) and object-storage data roots get a fresh database per query.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import FilterError, StorageError, UnsafeQueryError
from airflow_partitions.pruning.expressions import quote_identifier, quote_string
from airflow_partitions.pruning.limits import check_budget, run_bounded
from airflow_partitions.read.catalog_tables import CATALOG_TABLE_FUNCTIONS, register_catalog_tables
from airflow_partitions.read.sandbox import (
    QueryLimits,
    apply_limits,
    lock_down,
    needs_partition_functions,
    new_duckdb_connection,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.read.scan import CallScope, DuckDBScanner
    from airflow_partitions.storage import DataFile


QUERY_HINT = (
    "query(sql, timeout_s=..., memory_limit='8GB'), airflow-partitions query --timeout SECONDS "
    "--memory-limit SIZE"
)
READ_HINT = "PartitionedDatasetReader(..., query_limits=QueryLimits(timeout_s=..., memory_limit='8GB'))"
# Table functions a sandboxed query may call: they generate rows and touch neither files nor the catalog.
SANDBOX_TABLE_FUNCTIONS = frozenset(
    {"range", "generate_series", "unnest", "repeat", "repeat_row", "json_each", "json_tree"}
)
# Settings `current_setting(...)` may read in a sandboxed query: none of them holds a path.
SANDBOX_VISIBLE_SETTINGS = frozenset(
    {"enable_external_access", "lock_configuration", "memory_limit", "threads", "timezone"}
)
# Scalar functions (and built-in macros over catalog functions) that read settings, variables or catalog
# entries; besides these, every function named `duckdb_*` or `pragma_*` is refused.
_REFUSED_FUNCTIONS = frozenset(
    {"current_setting", "getvariable", "getenv", "pg_get_viewdef", "pg_get_constraintdef", "get_block_size"}
)
_REFUSED_PREFIXES = ("duckdb_", "pragma_")
# `Did you mean "ap_part_3.p_..."?`: DuckDB suggesting a table of an attached file for a misspelt name.
_QUALIFIED_SUGGESTION = re.compile(r'\n?Did you mean "[^"]*\.[^"]*"\??')


def run_query(
    scanner: DuckDBScanner,
    dataset: str,
    files: Sequence[DataFile],
    schema: pa.Schema,
    statement: str,
    limits: QueryLimits | None = None,
    catalog_tables: Mapping[str, pa.Table] | None = None,
    *,
    renames: Sequence[tuple[str, str]] = (),
) -> pa.Table:
    """Run `statement` (checked read-only, made executable) where `dataset` is a view over `files`;
    `catalog_tables`: the tables of its catalog table function calls (`read.catalog_tables`).
    `renames`: `(stored, current)` column names the view presents under their current names."""
    limits = limits or QueryLimits()
    with limits.budget(QUERY_HINT):
        return _run_query(scanner, dataset, files, schema, statement, limits, catalog_tables or {}, renames)


def _run_query(
    scanner: DuckDBScanner,
    dataset: str,
    files: Sequence[DataFile],
    schema: pa.Schema,
    statement: str,
    limits: QueryLimits,
    catalog_tables: Mapping[str, pa.Table],
    renames: Sequence[tuple[str, str]] = (),
) -> pa.Table:
    root = scanner.sandbox_root
    if root is not None:
        # A cursor of the reader's locked database: its temporary view goes with the cursor.
        connection = scanner.sandboxes.cursor(root, limits)
        configure = False
    else:
        connection = new_duckdb_connection(functions=needs_partition_functions(statement))
        configure = True
    try:
        check_sandboxed(connection, statement, dataset)
        with scanner.call_scope(connection) as scope:
            register_catalog_tables(connection, catalog_tables)
            return _run_sandboxed(
                scanner,
                connection,
                scope,
                dataset,
                files,
                schema,
                statement,
                limits,
                configure=configure,
                renames=renames,
            )
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
    limits: QueryLimits,
    *,
    configure: bool,
    renames: Sequence[tuple[str, str]] = (),
) -> pa.Table:
    """Create the dataset's view over `files` and run `statement` under `limits`.

    `configure`: the connection is a fresh database, to be limited and locked here once the view exists
    (DuckDB may then open only the view's files); otherwise it is a cursor of a `SandboxDatabases`
    database, limited and locked already.
    """
    import duckdb

    try:
        present = [(old, new) for old, new in renames if old in schema.names]
        if files:
            relation = scanner.relation(connection, scope, files, schema)
            star = "*"
            if present:
                pairs = ", ".join(
                    f"{quote_identifier(old)} AS {quote_identifier(new)}" for old, new in present
                )
                star = f"* RENAME ({pairs})"
            connection.execute(
                f"CREATE TEMP VIEW {quote_identifier(dataset)} AS SELECT {star} FROM {relation}"
            )
        else:
            names = dict(present)
            connection.register(
                dataset, schema.empty_table().rename_columns([names.get(n, n) for n in schema.names])
            )
    except (duckdb.Error, StorageError) as err:
        # A file DuckDB cannot open is a StorageError of the scan; its DuckDB message names the local path.
        cause = err.__cause__ if isinstance(err.__cause__, duckdb.Error) else err
        raise FilterError(f"query failed: {_scrubbed(str(cause).strip(), connection, scope)}") from err
    if configure:
        # Only the selected files DuckDB scans in place stay readable (other engines are attached or in
        # memory).
        allowed = ", ".join(quote_string(path) for path in scope.local_files)
        connection.execute(f"SET allowed_paths = [{allowed}]")
        apply_limits(connection, limits)
        lock_down(connection)
    try:
        return run_bounded(
            connection, lambda: connection.sql(statement).to_arrow_table(), memory=limits.memory
        )
    except duckdb.Error as err:
        raise FilterError(f"query failed: {_scrubbed(str(err).strip(), connection, scope)}") from err


def check_sandboxed(connection: Any, statement: str, dataset: str | Sequence[str]) -> int:
    """Raise `UnsafeQueryError` unless `statement` reads only `dataset` (a name, or several: the datasets
    of a multi-dataset query), CTEs in scope and row generators; return how many of its names DuckDB
    resolves to one of them (`sandbox_reference_counts` counts them per name).

    The statement is judged on DuckDB's own parse of it, so what is checked is what runs, and names are
    resolved as DuckDB's binder resolves them (`_scoped_nodes`): a CTE's name means the CTE only inside
    the query that declares it, after its declaration; anywhere else DuckDB looks the name up in the
    catalog (`pg_settings`, `duckdb_settings`, ...), so there it must be the dataset or is refused.
    """
    return sum(_sandbox_reference_counts(connection, statement, dataset).values())


def _sandbox_reference_counts(
    connection: Any, statement: str, dataset: str | Sequence[str]
) -> dict[str, int]:
    import duckdb

    names = [dataset] if isinstance(dataset, str) else list(dataset)
    counts = {name.lower(): 0 for name in names}
    try:
        rows = connection.execute("SELECT json_serialize_sql(?)", [statement]).fetchall()
    except duckdb.Error as err:
        raise UnsafeQueryError(f"cannot parse the query: {str(err).strip().splitlines()[0]}") from err
    tree = json.loads(rows[0][0]) if rows else {"error": True, "error_message": "no statement"}
    if tree.get("error"):
        raise UnsafeQueryError(f"cannot check the query: {tree.get('error_message', 'unknown error')}")
    for node, ctes in _scoped_nodes(tree["statements"]):
        kind = node.get("type")
        if kind == "BASE_TABLE":
            name = _check_table(node, counts, ctes)
            if name is not None:
                counts[name] += 1
        elif kind == "TABLE_FUNCTION":
            name = str(node.get("function", {}).get("function_name", "")).lower()
            if name not in SANDBOX_TABLE_FUNCTIONS and name not in CATALOG_TABLE_FUNCTIONS:
                generators = ", ".join(sorted(SANDBOX_TABLE_FUNCTIONS))
                raise UnsafeQueryError(
                    f"table function {name}() is not available in a query (file and catalog access is "
                    f"disabled); read the dataset, the catalog with {', '.join(CATALOG_TABLE_FUNCTIONS)} "
                    f"('<dataset>'), or generate rows with {generators}"
                )
        elif kind == "SHOW_REF" and node.get("query") is None:
            raise UnsafeQueryError(
                "SHOW lists the database's tables, which a query cannot see; use DESCRIBE <dataset>"
            )
        if "function_name" in node:
            _check_function(node)
    return counts


def parsed_statement(statement: str) -> dict[str, Any]:
    """DuckDB's parse of `statement` (`json_serialize_sql`) on the process's parse-only connection."""
    global _parse_connection
    with _PARSE_LOCK:
        if _parse_connection is None:
            connection = new_duckdb_connection(functions=False)
            lock_down(connection)
            _parse_connection = connection
        rows = _parse_connection.execute("SELECT json_serialize_sql(?)", [statement]).fetchall()
    tree: dict[str, Any] = json.loads(rows[0][0]) if rows else {"error": True}
    return tree


def sandbox_references(statement: str, dataset: str) -> int:
    """`check_sandboxed` on a parse-only connection of the process (before any view exists)."""
    return sum(sandbox_reference_counts(statement, [dataset]).values())


def sandbox_reference_counts(statement: str, datasets: Sequence[str]) -> dict[str, int]:
    """`check_sandboxed` of a statement over several datasets: how many of its names DuckDB resolves to
    each (keyed by lower-cased name), on the process's parse-only connection."""
    global _parse_connection
    with _PARSE_LOCK:
        if _parse_connection is None:
            connection = new_duckdb_connection(functions=False)
            lock_down(connection)
            _parse_connection = connection
        return _sandbox_reference_counts(_parse_connection, statement, datasets)


def duckdb_expression_name(expression: str) -> str:
    """The column name DuckDB gives an unaliased select item (its own rendering: `sum(amount)`,
    `count_star()`), from the process's parse-only connection."""
    with _PARSE_LOCK:
        global _parse_connection
        if _parse_connection is None:
            connection = new_duckdb_connection(functions=False)
            lock_down(connection)
            _parse_connection = connection
        rows = _parse_connection.execute(
            "SELECT json_deserialize_sql(json_serialize_sql(?))", [f"SELECT {expression}"]
        ).fetchall()
    return str(rows[0][0]).removeprefix("SELECT ")


_PARSE_LOCK = threading.Lock()
_parse_connection: Any = None


def _check_table(node: dict[str, Any], datasets: Mapping[str, int], ctes: frozenset[str]) -> str | None:
    """The (lower-cased) dataset `node` names, None for a CTE in scope; `UnsafeQueryError` for anything
    else."""
    name = str(node.get("table_name", "")).lower()
    catalog = str(node.get("catalog_name", "")).lower()
    schema = str(node.get("schema_name", "")).lower()
    if not catalog and not schema and name in ctes:
        return None
    # A dataset is a temporary view: catalog `temp`, schema `main` (which `temp` alone also names).
    if name in datasets and (catalog, schema) in _DATASET_QUALIFIERS:
        return name
    dataset = ("dataset " if len(datasets) == 1 else "datasets ") + (
        ", ".join(map(repr, datasets)) or "(none)"
    )
    shown = ".".join(part for part in (catalog, schema, name) if part)
    if name in ctes:
        raise UnsafeQueryError(
            f"the query reads {shown!r}: a CTE's name is only its own when unqualified; a query sees only "
            f"the {dataset} and the CTEs in scope"
        )
    raise UnsafeQueryError(
        f"the query reads {shown!r}; a query sees only the {dataset} and the CTEs in scope "
        "(a CTE declared inside a subquery is not visible outside it)"
    )


_DATASET_QUALIFIERS = frozenset({("", ""), ("", "main"), ("", "temp"), ("temp", "main")})


def _check_function(node: dict[str, Any]) -> None:
    name = str(node["function_name"]).lower()
    if name == "current_setting":
        arguments = node.get("arguments") or node.get("children") or []
        setting = _constant_text(arguments[0]) if len(arguments) == 1 else None
        if setting is not None and setting.lower() in SANDBOX_VISIBLE_SETTINGS:
            return
        raise UnsafeQueryError(
            "current_setting() in a query reads only "
            f"{', '.join(sorted(SANDBOX_VISIBLE_SETTINGS))}, named by a string literal"
        )
    if name in _REFUSED_FUNCTIONS or name.startswith(_REFUSED_PREFIXES):
        raise UnsafeQueryError(
            f"{name}() reads the database's settings or catalog and is not available in a query"
        )


def _constant_text(argument: Any) -> str | None:
    expression = argument.get("expression", argument) if isinstance(argument, dict) else None
    if not isinstance(expression, dict) or expression.get("class") != "CONSTANT":
        return None
    literal = expression.get("literal") or expression.get("value") or {}
    text = literal.get("text") if isinstance(literal, dict) else None
    return text if isinstance(text, str) else None


def _scoped_nodes(tree: Any) -> Iterator[tuple[dict[str, Any], frozenset[str]]]:
    """Every JSON object of DuckDB's parse with the (lower-cased) CTE names in scope where it stands.

    DuckDB's rules: a query node's CTEs are visible in the whole node; a CTE's body sees the CTEs declared
    before it in the same WITH, not itself nor later ones (DuckDB looks those up in the catalog), except
    the recursive term of a recursive CTE, which sees its own name. Iterative: deep filters nest thousands
    of levels.
    """
    stack: list[tuple[Any, frozenset[str]]] = [(tree, frozenset())]
    visited = 0
    while stack:
        item, scope = stack.pop()
        if isinstance(item, list):
            stack.extend((child, scope) for child in item)
            continue
        if not isinstance(item, dict):
            continue
        yield item, scope
        visited += 1
        if visited % 1024 == 0:
            check_budget()
        cte_map = item.get("cte_map")
        entries = cte_map.get("map") if isinstance(cte_map, dict) else None
        inner = scope
        if entries:
            declared: list[str] = []
            for entry in entries:
                stack.append((entry.get("value"), scope | frozenset(declared)))
                declared.append(str(entry.get("key", "")).lower())
            inner = scope | frozenset(declared)
        if item.get("type") == "RECURSIVE_CTE_NODE":
            stack.append((item.get("right"), inner | {str(item.get("cte_name", "")).lower()}))
            skipped: tuple[str, ...] = ("cte_map", "right")
        else:
            skipped = ("cte_map",)
        stack.extend((value, inner) for key, value in item.items() if key not in skipped)


def _scrubbed(message: str, connection: Any, scope: CallScope) -> str:
    """`message` with the local paths the sandbox knows of (scanned files, attached databases, fetched
    copies) replaced: a file becomes its place in the dataset (`region=EU/part-0.parquet`), a directory
    `<data>`. DuckDB's suggestions of qualified names (tables of the attached files) are dropped."""
    import duckdb

    message = _QUALIFIED_SUGGESTION.sub("", message)
    paths = list(scope.local_files)
    with contextlib.suppress(duckdb.Error):
        rows = connection.execute("SELECT path FROM duckdb_databases() WHERE path IS NOT NULL").fetchall()
        paths.extend(row[0] for row in rows if row[0])
    root = getattr(scope.location, "root", None)
    directories = {str(root)} if isinstance(root, os.PathLike | str) else set()
    directories.update(os.path.dirname(path) for path in paths)
    # Shortest first: the dataset root goes before the partition directories under it.
    for prefix in sorted((d for d in directories if d and d != os.sep), key=len):
        message = message.replace(prefix + os.sep, "").replace(prefix, "<data>")
    return message
