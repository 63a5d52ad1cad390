"""Provider metadata Airflow reads through the `apache_airflow_provider` entry point."""

from __future__ import annotations

import copy
from typing import Any

from airflow_partitions import __version__

# Where the providers page and `[project.urls]` Documentation point (pyproject.toml repeats it; a test
# keeps the two equal): the README, served by the provider's own Partitions plugin on the Airflow
# api-server (`plugins/partitions_api.py`, `DOCUMENTATION_PATH`), at Airflow's default address. The
# package has no public home; Airflow takes this link from the distribution's metadata, which must hold
# an absolute URL. On another address the same page is `<api-server>/partitions/docs`.
DOCUMENTATION_PATH = "/partitions/docs"
DOCUMENTATION_URL = f"http://localhost:8080{DOCUMENTATION_PATH}"

# The connection form of PartitionedDatasetHook, declared here so Airflow builds it without importing the
# hook: only the extra matters, each key of it a field of its own.
PARTITIONS_CONNECTION: dict[str, Any] = {
    "hook-class-name": "airflow_partitions.hooks.partitioned_dataset.PartitionedDatasetHook",
    "hook-name": "Airflow Partitions",
    "connection-type": "airflow_partitions",
    "ui-field-behaviour": {
        "hidden-fields": ["host", "schema", "login", "password", "port"],
        "relabeling": {},
        "placeholders": {},
    },
    "conn-fields": {
        "spec_path": {
            "label": "Spec path",
            "description": "The datasets spec (YAML) the hook reads, as the workers see it, e.g. "
            "/opt/airflow/dags/datasets.yaml. Used when the hook gets no spec_path argument.",
            "schema": {"type": ["string", "null"]},
        },
        "data_root": {
            "label": "Data root",
            "description": "Where the partition files live when not under the spec's accelerator_dir, "
            "e.g. s3://bucket/prefix/<dataset> (a snapshot location). Empty: the spec's.",
            "schema": {"type": ["string", "null"]},
        },
        "aws_conn_id": {
            "label": "AWS connection id",
            "description": "The AWS connection of an s3:// data root or catalog. Empty: aws_default, else "
            "boto3's default credential chain.",
            "schema": {"type": ["string", "null"]},
        },
        "cache_dir": {
            "label": "Cache directory",
            "description": "Where files fetched from S3 are kept, by checksum. Empty: a temporary "
            "directory of the process.",
            "schema": {"type": ["string", "null"]},
        },
        "cache_max_bytes": {
            "label": "Cache size (bytes)",
            "description": "Most bytes the cache keeps. Empty: 2 GiB or a tenth of the free space, "
            "whichever is less.",
            "schema": {"type": ["integer", "null"], "minimum": 1},
        },
    },
}


# What this provider ships: hooks, operators, sensors, triggers and its connection type (built once;
# `get_provider_info` hands out copies).
PROVIDER_INFO: dict[str, Any] = {
    "package-name": "airflow-partitions",
    "name": "Airflow Partitions",
    "description": "Keeps partitioned accelerations of source datasets fresh and serves pruned reads.",
    "versions": [__version__],
    "integrations": [
        {
            "integration-name": "Airflow Partitions",
            "external-doc-url": DOCUMENTATION_URL,
            "tags": ["software"],
        }
    ],
    "hooks": [
        {
            "integration-name": "Airflow Partitions",
            "python-modules": [
                "airflow_partitions.hooks.partitioned_dataset",
                "airflow_partitions.hooks.snapshot_storage",
                "airflow_partitions.hooks.spark_refresh",
            ],
        }
    ],
    "operators": [
        {
            "integration-name": "Airflow Partitions",
            "python-modules": [
                "airflow_partitions.operators.discovery",
                "airflow_partitions.operators.refresh",
                "airflow_partitions.operators.snapshots",
                "airflow_partitions.operators.commit",
                "airflow_partitions.operators.vacuum",
                "airflow_partitions.operators.write",
                "airflow_partitions.operators.verify",
                "airflow_partitions.operators.repartition",
                "airflow_partitions.operators.read",
            ],
        }
    ],
    # `@task.read_run_partitions(dataset=...)`: a TaskFlow task handed exactly its run's partitions.
    "task-decorators": [
        {
            "name": "read_run_partitions",
            "class-name": "airflow_partitions.operators.read.read_run_partitions_task",
        }
    ],
    "sensors": [
        {
            "integration-name": "Airflow Partitions",
            "python-modules": ["airflow_partitions.sensors.partitions"],
        }
    ],
    "triggers": [
        {
            "integration-name": "Airflow Partitions",
            "python-modules": ["airflow_partitions.triggers.partitions"],
        }
    ],
    # No "plugins" entry: Airflow loads provider plugins only with [core] lazy_load_providers = False;
    # the Partitions page registers through the `airflow.plugins` entry point instead, which every
    # Airflow process loads (a second registration would be refused as a duplicate).
    # No "cli" entry: Airflow 3.3 already defines an `airflow partitions` command group, and a provider
    # redefining it breaks the whole `airflow` CLI; use `airflow-partitions backfill` instead.
    "config": {
        "airflow_partitions": {
            "description": "Defaults of the refresh DAGs.",
            "options": {
                "spark_conn_id": {
                    "description": "Connection the refresh Spark work runs on (type spark or "
                    "spark_connect); empty: in-process local Spark.",
                    "version_added": "0.1.0",
                    "type": "string",
                    "example": "spark_connect_default",
                    "default": "",
                },
                "arrow_memory_budget": {
                    "description": "Memory the in-process Arrow refresh may use (bytes, or with a "
                    "unit: 4GiB, 512MB); strategy auto runs Spark when a source's estimate exceeds "
                    "it. 0: always Spark. Empty: a quarter of the worker's memory. The environment "
                    "variable AP_ARROW_MEMORY_BUDGET overrides it.",
                    "version_added": "0.1.0",
                    "type": "string",
                    "example": "4GiB",
                    "default": "",
                },
                "aws_conn_id": {
                    "description": "AWS connection of snapshot uploads and bootstraps; empty: "
                    "aws_default, else boto3's default credential chain.",
                    "version_added": "0.1.0",
                    "type": "string",
                    "example": "minio",
                    "default": "",
                },
                "max_mapped_tasks": {
                    "description": "Most mapped partition.refresh tasks one refresh run creates. A run "
                    "with more partitions than this (or than [core] max_map_length, if smaller) "
                    "refreshes them in that many balanced batches of contiguous partitions, one task "
                    "per batch. Raise both options together to map more tasks.",
                    "version_added": "0.1.0",
                    "type": "integer",
                    "example": "256",
                    "default": "1024",
                },
                "spark_master_timeout": {
                    "description": "Seconds a refresh waits for its Spark master (spark://) or Spark "
                    "Connect server to accept a connection before failing with SparkUnreachableError.",
                    "version_added": "0.1.0",
                    "type": "float",
                    "example": "30",
                    "default": "60",
                },
                "preload_specs": {
                    "description": "Spec files (comma-separated paths) whose refresh DAGs the preload "
                    "of airflow_local_settings.py parses and builds when an Airflow process starts, so "
                    "task processes forked from it skip that work while a spec is unchanged. Empty: "
                    "$AIRFLOW_PARTITIONS_SPEC, else datasets.yaml in [core] dags_folder if it exists.",
                    "version_added": "0.1.0",
                    "type": "string",
                    "example": "/opt/airflow/dags/datasets.yaml",
                    "default": "",
                },
                "spark_executor_timeout": {
                    "description": "Seconds a refresh on a cluster master waits for its first executor "
                    "(a worker with free cores and memory) before failing with SparkNoExecutorsError; "
                    "not checked with dynamic allocation.",
                    "version_added": "0.1.0",
                    "type": "float",
                    "example": "300",
                    "default": "120",
                },
            },
        }
    },
    # `aws` and `spark` / `spark_connect` connections belong to their own providers; this one adds
    # a connection whose extra carries `spec_path` for PartitionedDatasetHook.
    "connection-types": [PARTITIONS_CONNECTION],
}


def get_provider_info() -> dict[str, Any]:
    """What this provider ships: hooks, operators, sensors, triggers and its connection type.

    A deep copy of `PROVIDER_INFO`, so a caller that changes what it gets changes nothing for the next."""
    return copy.deepcopy(PROVIDER_INFO)
