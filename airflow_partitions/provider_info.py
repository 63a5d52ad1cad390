"""Provider metadata Airflow reads through the `apache_airflow_provider` entry point."""

from __future__ import annotations

from typing import Any

from airflow_partitions import __version__


def get_provider_info() -> dict[str, Any]:
    """What this provider ships: hooks, operators, sensors, triggers and its connection type."""
    return {
        "package-name": "airflow-partitions",
        "name": "Airflow Partitions",
        "description": "Keeps partitioned accelerations of source datasets fresh and serves pruned reads.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "Airflow Partitions",
                "external-doc-url": "https://pypi.org/project/airflow-partitions/",
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
                ],
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
        # `aws` and `spark` / `spark_connect` connections belong to their own providers; this one adds
        # a connection whose extra carries `spec_path` for PartitionedDatasetHook.
        "connection-types": [
            {
                "hook-class-name": "airflow_partitions.hooks.partitioned_dataset.PartitionedDatasetHook",
                "connection-type": "airflow_partitions",
            }
        ],
    }
