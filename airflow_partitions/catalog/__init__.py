"""Versioned partition catalog: atomic OCC commits, time travel, vacuum; stores on a local disk or S3.

Importing this package is cheap (no pyarrow or boto3): both load when a catalog is first read.
"""

from __future__ import annotations

from airflow_partitions.catalog.catalog import Catalog
from airflow_partitions.catalog.model import (
    PartitionEntry,
    PartitionFieldInfo,
    PartitionSpecInfo,
    RowCertificate,
    VacuumReport,
    VersionInfo,
    WrittenBy,
    qualified_key_path,
    split_key_path,
)
from airflow_partitions.catalog.open import (
    catalog_location,
    dataset_directory,
    needs_s3_settings,
    open_catalog,
    partition_spec_info,
)
from airflow_partitions.catalog.state import PartitionMap, Snapshot

# Re-export (documented import path): the stores a `Catalog` is built on live in `objectstore`.
from airflow_partitions.objectstore import LocalStore, ObjectInfo, ObjectStore, S3Store

__all__ = [
    "Catalog",
    "LocalStore",
    "ObjectInfo",
    "ObjectStore",
    "PartitionEntry",
    "PartitionFieldInfo",
    "PartitionMap",
    "PartitionSpecInfo",
    "RowCertificate",
    "S3Store",
    "Snapshot",
    "VacuumReport",
    "VersionInfo",
    "WrittenBy",
    "catalog_location",
    "dataset_directory",
    "needs_s3_settings",
    "open_catalog",
    "partition_spec_info",
    "qualified_key_path",
    "split_key_path",
]
