"""What every operator of a dataset shares: the spec file and dataset name, loaded when the task runs."""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_partitions.exceptions import OrchestrationError
from airflow_partitions.hooks.connections import install_connection_resolver, install_secret_masker
from airflow_partitions.hooks.snapshot_storage import SnapshotStorageHook

if TYPE_CHECKING:
    from airflow_partitions.catalog import Catalog
    from airflow_partitions.spec import DatasetSpec, ProjectSpec
    from airflow_partitions.table import DatasetHandle


class DatasetOperator(BaseOperator):
    """Base of the operators that act on one dataset of a spec file.

    The spec is re-read when the task runs (not when the DAG is parsed), so a task always works on the
    spec file as it is on the worker. `aws_conn_id` is the AWS connection of the dataset's object storage
    (a catalog on S3, snapshots); None means `[airflow_partitions] aws_conn_id`, else `aws_default`.
    """

    # `aws_conn_id` is a template field so that it is kept in the serialized DAG: the Partitions page
    # reads it there to open the dataset's catalog with the connection its tasks use.
    template_fields: Sequence[str] = ("spec_path", "dataset", "aws_conn_id")
    ui_color = "#e8f4fa"

    def __init__(
        self,
        *,
        spec_path: str | os.PathLike[str],
        dataset: str,
        aws_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not dataset:
            raise OrchestrationError(f"{type(self).__name__} {kwargs.get('task_id')!r} needs a dataset name")
        self.spec_path = os.fspath(spec_path)
        self.dataset = dataset
        self.aws_conn_id = aws_conn_id

    @cached_property
    def project(self) -> ProjectSpec:
        from airflow_partitions.spec import load_spec  # lazy: loads sqlglot

        install_secret_masker()
        return load_spec(self.spec_path)

    @cached_property
    def dataset_spec(self) -> DatasetSpec:
        return self.project.dataset(self.dataset)

    @cached_property
    def storage_hook(self) -> SnapshotStorageHook:

        return SnapshotStorageHook(aws_conn_id=self.aws_conn_id)

    def dataset_handle(self) -> DatasetHandle:
        """The dataset's handle; a catalog or files on S3 are reached with the settings of `aws_conn_id`."""
        from airflow_partitions.table import open_handle  # lazy: loads sqlglot

        settings = self.storage_hook.dataset_settings(self.project, self.dataset_spec)
        return open_handle(self.project, self.dataset_spec, s3_settings=settings)

    def open_catalog(self) -> Catalog:
        """The dataset's catalog; one on S3 is reached with the settings of `aws_conn_id`."""
        return self.dataset_handle().catalog

    @property
    def data_s3_settings(self) -> Any:
        """The S3 settings of `aws_conn_id` when partition files live on S3 (`accelerator_dir: s3://`)."""
        return None if self.dataset_handle().local_data else self.storage_hook.s3_settings

    def prepare_sources(self) -> None:
        """Let the dataset's source resolve Airflow connection ids (Postgres `params.connection_id`)."""

        install_connection_resolver()
