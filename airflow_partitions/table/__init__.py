"""A dataset of a project, resolved once: spec, catalog, storage engine, object store and scratch.

`refresh/`, `write/`, `read/` and the Airflow layer take a `DatasetHandle` instead of threading
`(project, dataset, s3_settings, catalog, storage)` through every call.
"""

from __future__ import annotations

from airflow_partitions.table.handle import DatasetHandle, open_handle

__all__ = ["DatasetHandle", "open_handle"]
