"""A plain-dict summary of a loaded spec, for `airflow-partitions validate --json`, logs and DAG docs."""

from __future__ import annotations

from typing import Any

from airflow_partitions.spec.masking import masked_params
from airflow_partitions.spec.model import DatasetSpec, PartitionField, ProjectSpec


def describe_field(partition_field: PartitionField) -> dict[str, Any]:
    result_type = partition_field.result_type
    columns = partition_field.source_columns
    types = partition_field.source_types
    return {
        "name": partition_field.name,
        "expression": partition_field.expression,
        "canonical": partition_field.canonical,
        "transform": partition_field.transform.name,
        # One column for every transform but multi_bucket, which reads several (`source_columns`).
        "source_column": columns[0] if len(columns) == 1 else None,
        "source_columns": list(columns),
        "source_type": None if partition_field.source_type is None else str(partition_field.source_type),
        "source_types": None if types is None else [str(t) for t in types],
        "result_type": None if result_type is None else str(result_type),
    }


def describe_dataset(dataset: DatasetSpec) -> dict[str, Any]:
    source = dataset.source
    acceleration = dataset.acceleration
    return {
        "name": dataset.name,
        "source": {
            "scheme": source.scheme.value,
            "location": source.location,
            "uri": source.uri,
            "file_format": None if source.file_format is None else source.file_format.value,
            # Summaries get printed and logged: a URL password or secret key must not go with them.
            "params": masked_params(source.params),
        },
        "schema": dict(dataset.declared_columns) or None,
        "acceleration": {
            "enabled": acceleration.enabled,
            "engine": acceleration.engine.value,
            "mode": acceleration.mode.value,
            "partition_mode": acceleration.partition_mode.value,
            "params": dict(acceleration.params),
            "partition_spec_id": acceleration.partition_spec_id,
            "partition_by": [describe_field(f) for f in acceleration.partition_by],
            "refresh": {
                "schedule": acceleration.refresh.schedule,
                "check_column": acceleration.refresh.check_column,
                "discovery_timeout_s": acceleration.refresh.discovery_timeout_s,
                "max_partitions": acceleration.refresh.max_partitions,
                "late_rows": str(acceleration.refresh.late_rows),
                "max_future_skew_s": acceleration.refresh.max_future_skew_s,
                "refresh_mode": str(acceleration.refresh.mode),
                "change_detection": (
                    str(acceleration.refresh.detection) if acceleration.refresh.detection else None
                ),
                "change_detection_reason": acceleration.refresh.detection_reason,
            },
            "snapshots": {
                "mode": acceleration.snapshots.mode.value,
                "location": acceleration.snapshots.location,
            },
        },
    }


def describe_project(project: ProjectSpec) -> dict[str, Any]:
    """JSON-ready summary (params keep the YAML's scalar types, secrets masked; dump with `default=str`)."""
    return {
        "path": None if project.path is None else str(project.path),
        "accelerator_dir": project.accelerator_url or str(project.accelerator_dir),
        # With an s3:// accelerator_dir: this worker's private scratch (catalog cache, local stage).
        **({"local_scratch_dir": str(project.accelerator_dir)} if project.remote else {}),
        "datasets": [describe_dataset(d) for d in project.datasets],
    }
