"""Provider metadata Airflow reads through the `apache_airflow_provider` entry point."""

from __future__ import annotations

from typing import Any

from airflow_partitions import __version__


def get_provider_info() -> dict[str, Any]:
    """What this provider ships; grows as hooks, operators, sensors and connection types land."""
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
    }
