"""Discovery, change detection and the Spark refresh pipeline: plan -> stage -> finalize -> commit.

The four steps are separate calls so Airflow can run them as separate tasks (one mapped finalize task per
partition); `refresh_dataset` composes them in one process. Importing this package loads no pyarrow,
pyspark or database driver.
"""

from __future__ import annotations

from airflow_partitions.refresh.commit import commit_refresh
from airflow_partitions.refresh.discovery import discover
from airflow_partitions.refresh.finalize import finalize_partition
from airflow_partitions.refresh.pipeline import (
    RefreshProgress,
    RefreshSummary,
    plan_refresh,
    refresh_dataset,
)
from airflow_partitions.refresh.plan import (
    CommitResult,
    PartitionResult,
    PartitionWorkItem,
    Reason,
    RefreshPlan,
    StageMode,
    StageResult,
)
from airflow_partitions.refresh.stage import stage_refresh

__all__ = [
    "CommitResult",
    "PartitionResult",
    "PartitionWorkItem",
    "Reason",
    "RefreshPlan",
    "RefreshProgress",
    "RefreshSummary",
    "StageMode",
    "StageResult",
    "commit_refresh",
    "discover",
    "finalize_partition",
    "plan_refresh",
    "refresh_dataset",
    "stage_refresh",
]
