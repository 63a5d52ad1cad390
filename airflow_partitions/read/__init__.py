"""Pruned reads of an acceleration: plan, read to Arrow, DuckDB SQL over the pruned partitions, Spark.

`PartitionedDatasetReader` (`read.reader`) is the Airflow-free core behind `PartitionedDatasetHook`.
Every call pins one catalog version (the newest unless `version=` is given), so it never mixes
partitions of two commits. It prunes with `pruning.plan_partitions`, then opens only the selected files:

* `read` scans them with DuckDB (`read.scan`; DuckDB pushes the projection and the residual filter into
  the scan), applying the residual only to files that are not exact, and returns exactly the asked
  columns with the dataset's Arrow types;
* `query` runs one read-only SELECT in a fresh, locked-down DuckDB database where the dataset name is a
  view over the files its WHERE clauses can need (`read.query`; external file access disabled except
  those files, the statement limited to the dataset and its own CTEs, time and memory bounded by
  `QueryLimits`);
* a `query` naming several datasets of the spec (`read.multi`, opened over a spec by `datasets_query`;
  `query_datasets`) makes each a view over its pruned files, at its own version or as of one time, and
  runs joins of datasets partitioned compatibly on the join key partition by partition (`read.joins`);
* `to_spark` returns a Spark DataFrame over the same files, with the residual as a Spark condition.

How each format is scanned, and whether Spark reads it natively, is the storage class's business
(`storage.PartitionStorage.duckdb_relation`, `spark_frame`): nothing here depends on the format.
Files under an `s3://` data root are read through a pyarrow `FileSystem` (`read.remote`; DuckDB cannot
open remote files here): files scanned in place (Parquet) come from a bounded local cache keyed by
checksum (`read.cache`: fetched whole once, one request each, concurrently, verified, evicted least
recently used, never while a call holds them); others (Arrow IPC, DuckDB) are copied to a local tree
keyed by path and checksum.

Versions are immutable, so the pruning index of a version and the plan of a (version, filter) are cached
per reader: repeated reads pay only for resolving the newest version and scanning.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_partitions.read.reader import (
    PartitionedDatasetReader,
    dataset_named_in,
    datasets_query,
    open_project,
    query_datasets,
)
from airflow_partitions.read.sandbox import QueryLimits, needs_partition_functions, new_duckdb_connection

if TYPE_CHECKING:
    from airflow_partitions.read.multi import DatasetQuery, DatasetQueryPlan


def __getattr__(name: str) -> Any:
    # Multi-dataset queries parse SQL (sqlglot): loaded on first use, not by every read.
    if name in ("DatasetQuery", "DatasetQueryPlan"):
        from airflow_partitions.read import multi  # lazy: sqlglot

        return getattr(multi, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DatasetQuery",
    "DatasetQueryPlan",
    "PartitionedDatasetReader",
    "QueryLimits",
    "dataset_named_in",
    "datasets_query",
    "needs_partition_functions",
    "new_duckdb_connection",
    "open_project",
    "query_datasets",
]
