"""Helpers that start real Airflow for end-to-end tests and benchmarks: metadata DBs and a full stack."""

from __future__ import annotations

from .metadata_db import MetadataDatabase, create_database, drop_database, in_process_metadata_db
from .stack import COMPONENTS, AirflowStack, AirflowStackError, free_port, running_airflow

__all__ = [
    "COMPONENTS",
    "AirflowStack",
    "AirflowStackError",
    "MetadataDatabase",
    "create_database",
    "drop_database",
    "free_port",
    "in_process_metadata_db",
    "running_airflow",
]
