"""Airflow operators of a partitioned refresh: discover, stage, refresh, snapshot, commit, vacuum, compact;
writes; verify; repartition; reading a run's partitions."""

from __future__ import annotations

from airflow_partitions.operators.commit import PartitionCommitOperator
from airflow_partitions.operators.compact import CompactOperator
from airflow_partitions.operators.discovery import PartitionDiscoveryOperator
from airflow_partitions.operators.read import ReadRunPartitionsOperator
from airflow_partitions.operators.refresh import SparkPartitionRefreshOperator, SparkStageOperator
from airflow_partitions.operators.repartition import RepartitionOperator
from airflow_partitions.operators.snapshots import (
    SnapshotBootstrapOperator,
    SnapshotPublishOperator,
    SnapshotUploadOperator,
    SnapshotVacuumOperator,
)
from airflow_partitions.operators.vacuum import VacuumOperator
from airflow_partitions.operators.verify import VerifyOperator
from airflow_partitions.operators.write import PartitionedDatasetWriteOperator

__all__ = [
    "CompactOperator",
    "PartitionCommitOperator",
    "PartitionDiscoveryOperator",
    "PartitionedDatasetWriteOperator",
    "ReadRunPartitionsOperator",
    "RepartitionOperator",
    "SnapshotBootstrapOperator",
    "SnapshotPublishOperator",
    "SnapshotUploadOperator",
    "SnapshotVacuumOperator",
    "SparkPartitionRefreshOperator",
    "SparkStageOperator",
    "VacuumOperator",
    "VerifyOperator",
]
