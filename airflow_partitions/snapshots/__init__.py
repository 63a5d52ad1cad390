"""Snapshots: upload partition files and catalog manifests to S3, and bootstrap local datasets from them.

Nothing here imports boto3 at module import, so the Airflow layer can import this package while parsing.
"""

from __future__ import annotations

# Re-export (documented import path): snapshot functions take these; they live in `objectstore`.
from airflow_partitions.objectstore import (
    S3Location,
    S3Settings,
    create_s3_client,
    parse_s3_location,
    parse_s3_uri,
)
from airflow_partitions.snapshots.bootstrap import (
    BootstrapResult,
    KeySelector,
    bootstrap_snapshot,
    select_where,
)
from airflow_partitions.snapshots.manifest import (
    ManifestUploadResult,
    SnapshotManifest,
    list_snapshot_versions,
    read_snapshot_manifest,
    upload_snapshot_manifest,
)
from airflow_partitions.snapshots.modes import SNAPSHOT_ACTIONS, SnapshotActions, snapshot_actions
from airflow_partitions.snapshots.upload import (
    FileUploadOutcome,
    SnapshotUploadResult,
    UploadAction,
    upload_partition_snapshot,
)
from airflow_partitions.snapshots.vacuum import SnapshotVacuumReport, vacuum_snapshots

__all__ = [
    "SNAPSHOT_ACTIONS",
    "BootstrapResult",
    "FileUploadOutcome",
    "KeySelector",
    "ManifestUploadResult",
    "S3Location",
    "S3Settings",
    "SnapshotActions",
    "SnapshotManifest",
    "SnapshotUploadResult",
    "SnapshotVacuumReport",
    "UploadAction",
    "bootstrap_snapshot",
    "create_s3_client",
    "list_snapshot_versions",
    "parse_s3_location",
    "parse_s3_uri",
    "read_snapshot_manifest",
    "select_where",
    "snapshot_actions",
    "upload_partition_snapshot",
    "upload_snapshot_manifest",
    "vacuum_snapshots",
]
