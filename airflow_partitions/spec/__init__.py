"""The dataset spec: a YAML file of datasets and their partitioned accelerations, loaded into typed objects.

Importing this package is cheap (no pyarrow, duckdb or Spark): DAG files load specs at parse time.
"""

from __future__ import annotations

from airflow_partitions.spec.describe import describe_dataset, describe_project
from airflow_partitions.spec.loader import load_spec, parse_source_uri, parse_spec
from airflow_partitions.spec.model import (
    AccelerationSpec,
    DatasetSpec,
    Engine,
    FileFormat,
    Mode,
    PartitionField,
    PartitionMode,
    ProjectSpec,
    RefreshConfig,
    RefreshMode,
    SnapshotConfig,
    SnapshotMode,
    SourceRef,
    SourceScheme,
    validate_against_schema,
)

__all__ = [
    "AccelerationSpec",
    "DatasetSpec",
    "Engine",
    "FileFormat",
    "Mode",
    "PartitionField",
    "PartitionMode",
    "ProjectSpec",
    "RefreshConfig",
    "RefreshMode",
    "SnapshotConfig",
    "SnapshotMode",
    "SourceRef",
    "SourceScheme",
    "describe_dataset",
    "describe_project",
    "load_spec",
    "parse_source_uri",
    "parse_spec",
    "validate_against_schema",
]
