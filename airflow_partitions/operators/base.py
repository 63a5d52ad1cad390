"""What every operator of a dataset shares: the spec file and dataset name, loaded when the task runs."""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_partitions.exceptions import OrchestrationError

if TYPE_CHECKING:
    from airflow_partitions.spec import DatasetSpec, ProjectSpec


class DatasetOperator(BaseOperator):
    """Base of the operators that act on one dataset of a spec file.

    The spec is re-read when the task runs (not when the DAG is parsed), so a task always works on the
    spec file as it is on the worker.
    """

    template_fields: Sequence[str] = ("spec_path", "dataset")
    ui_color = "#e8f4fa"

    def __init__(self, *, spec_path: str | os.PathLike[str], dataset: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not dataset:
            raise OrchestrationError(f"{type(self).__name__} {kwargs.get('task_id')!r} needs a dataset name")
        self.spec_path = os.fspath(spec_path)
        self.dataset = dataset

    @cached_property
    def project(self) -> ProjectSpec:
        from airflow_partitions.spec import load_spec

        return load_spec(self.spec_path)

    @cached_property
    def dataset_spec(self) -> DatasetSpec:
        return self.project.dataset(self.dataset)

    def prepare_sources(self) -> None:
        """Let the dataset's source resolve Airflow connection ids (Postgres `params.connection_id`)."""
        from airflow_partitions.hooks.connections import install_connection_resolver

        install_connection_resolver()
