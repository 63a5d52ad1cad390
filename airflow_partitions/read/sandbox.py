"""DuckDB databases for reads: a new in-memory connection with the package's settings (and the partition
transforms' functions when the SQL calls them), the limits one query runs under (`QueryLimits`), and a
reader's locked-down databases (`SandboxDatabases`).

Below both the scan (`read.scan`), which opens its databases here, and the sandboxed query
(`read.query`), which checks and runs a statement over the scan.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from airflow_partitions.exceptions import QueryLimitError
from airflow_partitions.pruning.expressions import quote_string
from airflow_partitions.pruning.limits import Budget, budget, size_in_bytes
from airflow_partitions.transforms.duckdb_functions import register_duckdb_functions

DISABLED_OPTIMIZERS = "statistics_propagation"

DEFAULT_QUERY_TIMEOUT_S = 300.0

DEFAULT_QUERY_MEMORY_BYTES = 4 * 1024**3  # capped at half the machine's memory (`default_memory_limit`)
MAX_QUERY_THREADS = 4

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)", re.IGNORECASE)


@dataclass(frozen=True)
class QueryLimits:
    """How long and how much memory one sandboxed query may use; None picks the default.

    `timeout_s`: wall-clock seconds (`DEFAULT_QUERY_TIMEOUT_S`); `memory_limit`: a DuckDB size such as
    "4GB" or a number of bytes (`default_memory_limit()`); `threads`: DuckDB threads (up to
    `MAX_QUERY_THREADS`).
    """

    timeout_s: float | None = None
    memory_limit: str | int | None = None
    threads: int | None = None

    def __post_init__(self) -> None:
        timeout = self.timeout_s
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < 1e9
        ):
            raise QueryLimitError(f"timeout_s must be a positive number of seconds, not {timeout!r}")
        memory = self.memory_limit
        if memory is not None and not _is_memory_size(memory):
            raise QueryLimitError(
                f"memory_limit must be a size such as '512MB' or '4GB', or a number of bytes, not {memory!r}"
            )
        threads = self.threads
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise QueryLimitError(f"threads must be a positive whole number, not {threads!r}")

    def merged(self, timeout_s: float | None = None, memory_limit: str | int | None = None) -> QueryLimits:
        """These limits with the given ones (when not None) in their place."""
        return replace(
            self,
            timeout_s=self.timeout_s if timeout_s is None else timeout_s,
            memory_limit=self.memory_limit if memory_limit is None else memory_limit,
        )

    def budget(self, hint: str) -> contextlib.AbstractContextManager[Budget]:
        """A budget of these limits for one call, from now (`pruning.limits`); `hint`: how to raise them."""
        return budget(self.seconds, size_in_bytes(self.memory), hint)

    @property
    def seconds(self) -> float:
        return float(self.timeout_s) if self.timeout_s is not None else DEFAULT_QUERY_TIMEOUT_S

    @property
    def memory(self) -> str:
        """The memory limit as DuckDB reads it."""
        memory = self.memory_limit if self.memory_limit is not None else default_memory_limit()
        return f"{memory}B" if isinstance(memory, int) else memory.strip()

    @property
    def thread_count(self) -> int:
        return self.threads if self.threads is not None else min(os.cpu_count() or 1, MAX_QUERY_THREADS)


def _is_memory_size(value: object) -> bool:
    """A positive number of bytes, or a positive size with a unit DuckDB reads ('512MB', '1.5 GiB')."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value > 0
    match = _SIZE.fullmatch(value.strip()) if isinstance(value, str) else None
    return match is not None and float(match.group(1)) > 0


def default_memory_limit() -> int:
    """`DEFAULT_QUERY_MEMORY_BYTES`, or half the machine's memory when that is less."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return DEFAULT_QUERY_MEMORY_BYTES
    return min(DEFAULT_QUERY_MEMORY_BYTES, max(physical // 2, 256 * 1024**2))


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
        register_duckdb_functions(connection)
    return connection


def needs_partition_functions(sql: str) -> bool:
    """Whether DuckDB SQL (after `executable_sql` / `duckdb_expression`) calls the transforms' UDFs."""
    lowered = sql.lower()
    return "ap_bucket_" in lowered or "ap_truncate_" in lowered or "ap_murmur3(" in lowered


class SandboxDatabases:
    """A reader's locked-down DuckDB databases for queries over a local data root, one per limits.

    Each is configured as a per-query sandbox would be, except that DuckDB may open any file under the
    dataset's directory (the view of one query names only its selected files, and the statement itself
    can name no file: `check_sandboxed`), and is locked before its first query. `cursor()` hands out a
    cursor of its own to each query.
    """

    def __init__(self, lock: threading.RLock) -> None:
        self._lock = lock
        self._databases: dict[tuple[str, int, tuple[str, ...]], Any] = {}

    def cursor(self, root: os.PathLike[str] | Sequence[os.PathLike[str]], limits: QueryLimits) -> Any:
        """A new cursor of the database for `limits`, which reads files under `root` only (or under
        any of several roots: the datasets of a multi-dataset query)."""
        roots = [root] if isinstance(root, os.PathLike) else list(root)
        directories = tuple(sorted(os.path.join(os.fspath(r), "") for r in roots))
        key = (limits.memory, limits.thread_count, directories)
        with self._lock:
            database = self._databases.get(key)
            if database is None:
                database = new_duckdb_connection(functions=True)
                allowed = ", ".join(quote_string(directory) for directory in directories)
                database.execute(f"SET allowed_directories = [{allowed}]")
                apply_limits(database, limits)
                lock_down(database)
                self._databases[key] = database
            return database.cursor()

    def close(self) -> None:
        with self._lock:
            databases, self._databases = list(self._databases.values()), {}
        for database in databases:
            database.close()


def apply_limits(connection: Any, limits: QueryLimits) -> None:
    """Memory limit (no spilling: the limit is the bound) and threads, set before the lock."""
    import duckdb

    try:
        connection.execute(f"SET memory_limit = {quote_string(limits.memory)}")
    except duckdb.Error as err:
        raise QueryLimitError(
            f"memory_limit must be a size DuckDB accepts, such as '512MB' or '4GB', not {limits.memory!r}",
            limit="memory",
        ) from err
    connection.execute("SET temp_directory = ''")
    connection.execute(f"SET threads = {limits.thread_count}")


def lock_down(connection: Any) -> None:
    """No file access but what `allowed_paths` / `allowed_directories` name, and no further SET."""
    connection.execute("SET enable_external_access = false")
    connection.execute("SET lock_configuration = true")
