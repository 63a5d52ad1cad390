"""Airflow operators of a partitioned refresh: discover, stage, refresh, snapshot, commit, vacuum, compact."""

from __future__ import annotations

from airflow_partitions.operators.commit import PartitionCommitOperator
from airflow_partitions.operators.compact import CompactOperator
from airflow_partitions.operators.discovery import PartitionDiscoveryOperator
from airflow_partitions.operators.refresh import SparkPartitionRefreshOperator, SparkStageOperator
from airflow_partitions.operators.snapshots import (
    SnapshotBootstrapOperator,
    SnapshotPublishOperator,
    SnapshotUploadOperator,
    SnapshotVacuumOperator,
)
from airflow_partitions.operators.vacuum import VacuumOperator

__all__ = [
    "CompactOperator",
    "PartitionCommitOperator",
    "PartitionDiscoveryOperator",
    "SnapshotBootstrapOperator",
    "SnapshotPublishOperator",
    "SnapshotUploadOperator",
    "SnapshotVacuumOperator",
    "SparkPartitionRefreshOperator",
    "SparkStageOperator",
    "VacuumOperator",
]
