"""Partition pruning: filters (SQL WHERE or DNF) -> predicate -> the partitions and files a read opens.

`plan_partitions(index, where)` returns a `PrunePlan`: `.selected` partitions with the files to read,
`.total`, `.decisions` (kept or skipped, reason, exact), `.explain()` and `.to_json()`. The
`PartitionIndex` comes from a catalog version, a manifest's entries or bare partition keys (`index.py`).
See `evaluator.py` for how partitions are judged and `filters.py` for the filter language.
"""

from __future__ import annotations

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
from airflow_partitions.pruning.query import check_read_only, dataset_filter, executable_sql

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
