"""Partition pruning: filters (SQL WHERE or DNF) -> predicate -> the partitions and files a read opens.

`plan_partitions(index, where)` returns a `PrunePlan`: `.selected` partitions with the files to read,
`.total`, `.decisions` (kept or skipped, reason, exact), `.explain()` and `.to_json()`. The
`PartitionIndex` comes from a catalog version, a manifest's entries or bare partition keys (`index.py`).
See `evaluator.py` for how partitions are judged and `filters.py` for the filter language.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_partitions.pruning.evaluator import (
    MAX_RANGE_ENUMERATION,
    ROWS_CANNOT_MATCH,
    ROWS_MIGHT_MATCH,
    ROWS_MUST_MATCH,
    Evaluator,
    Outcome,
)
from airflow_partitions.pruning.expressions import Op, Predicate
from airflow_partitions.pruning.filters import FilterBinder, FilterInput, bind_filter
from airflow_partitions.pruning.index import BoundField, PartitionIndex, bind_fields
from airflow_partitions.pruning.plan import (
    PartitionDecision,
    PrunePlan,
    SelectedPartition,
    plan_partitions,
)

if TYPE_CHECKING:
    from airflow_partitions.pruning.query import check_read_only, dataset_filter, executable_sql

# The query side parses SQL (sqlglot): loaded on first use, so a plain read or a DAG file does not pay for it.
_QUERY_NAMES = ("check_read_only", "dataset_filter", "executable_sql")


def __getattr__(name: str) -> Any:
    if name in _QUERY_NAMES:
        from airflow_partitions.pruning import query  # lazy: sqlglot

        return getattr(query, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "MAX_RANGE_ENUMERATION",
    "ROWS_CANNOT_MATCH",
    "ROWS_MIGHT_MATCH",
    "ROWS_MUST_MATCH",
    "BoundField",
    "Evaluator",
    "FilterBinder",
    "FilterInput",
    "Op",
    "Outcome",
    "PartitionDecision",
    "PartitionIndex",
    "Predicate",
    "PrunePlan",
    "SelectedPartition",
    "bind_fields",
    "bind_filter",
    "check_read_only",
    "dataset_filter",
    "executable_sql",
    "plan_partitions",
]
