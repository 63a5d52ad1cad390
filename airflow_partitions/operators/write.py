"""`PartitionedDatasetWriteOperator`: append, upsert or delete rows of a dataset through the hook."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_partitions.exceptions import OrchestrationError
from airflow_partitions.hooks.partitioned_dataset import PartitionedDatasetHook

if TYPE_CHECKING:
    from airflow.sdk import Context


WRITE_MODES = ("append", "upsert", "delete")


class PartitionedDatasetWriteOperator(BaseOperator):
    """Write to `dataset` in one atomic commit; returns the write's result (version, partitions, rows) as
    its XCom.

    `mode` append / upsert: the rows of `source_path` (a local parquet, csv or jsonl file; `file_format`
    when its extension does not say) are routed to their partitions; upsert replaces rows with the same
    `keys` (default the spec's `acceleration.primary_key`). `mode` delete: the rows matching
    `where` (a SQL condition) are deleted. `write_through` (append / upsert, Postgres sources) writes the
    rows to the source table in one transaction first. The spec comes from `spec_path` or the
    `partitions_conn_id` connection, as for `PartitionedDatasetHook`.

    The write's commit id is derived from the task instance (DAG, run, task, map index; not the try): a
    retry after a try whose commit landed but whose response was lost returns that version instead of
    writing the rows a second time. Clearing the task re-runs it the same way; to write again, trigger a
    new run.
    """

    template_fields: Sequence[str] = ("spec_path", "dataset", "source_path", "where", "keys")
    ui_color = "#e3f2e1"

    def __init__(
        self,
        *,
        dataset: str,
        mode: str,
        spec_path: str | None = None,
        source_path: str | None = None,
        file_format: str | None = None,
        keys: Sequence[str] | None = None,
        where: str | None = None,
        write_through: bool = False,
        partitions_conn_id: str | None = None,
        aws_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        task = kwargs.get("task_id")
        if mode not in WRITE_MODES:
            raise OrchestrationError(
                f"write task {task!r}: mode must be one of {', '.join(WRITE_MODES)}, not {mode!r}"
            )
        if mode == "delete":
            if not where or source_path:
                raise OrchestrationError(
                    f"write task {task!r}: mode delete takes where=<SQL condition> and no source_path"
                )
            if write_through:
                raise OrchestrationError(
                    f"write task {task!r}: write_through covers append and upsert; delete in the source "
                    "and refresh instead"
                )
        elif not source_path or where:
            raise OrchestrationError(
                f"write task {task!r}: mode {mode} takes source_path=<file of rows> and no where"
            )
        if keys is not None and mode != "upsert":
            raise OrchestrationError(f"write task {task!r}: keys apply to mode upsert only")
        if isinstance(keys, str):
            keys = [keys]
        self.dataset = dataset
        self.mode = mode
        self.spec_path = spec_path
        self.source_path = source_path
        self.file_format = file_format
        self.keys = list(keys) if keys is not None else None
        self.where = where
        self.write_through = write_through
        self.partitions_conn_id = partitions_conn_id
        self.aws_conn_id = aws_conn_id

    @cached_property
    def hook(self) -> PartitionedDatasetHook:

        return PartitionedDatasetHook(
            dataset=self.dataset,
            spec_path=self.spec_path,
            partitions_conn_id=self.partitions_conn_id,
            aws_conn_id=self.aws_conn_id,
        )

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_partitions.write.rows import RowsFile  # lazy: loads sqlglot

        commit_id = task_commit_id(context)
        if self.mode == "delete":
            assert self.where is not None
            result = self.hook.delete(self.where, commit_id=commit_id)
        else:
            assert self.source_path is not None
            rows = RowsFile(self.source_path, self.file_format)
            if self.mode == "upsert":
                result = self.hook.upsert(
                    rows, self.keys, write_through=self.write_through, commit_id=commit_id
                )
            else:
                result = self.hook.append(rows, write_through=self.write_through, commit_id=commit_id)
        self.log.info("%s", result.describe())
        return result.to_json()


def task_commit_id(context: Context) -> str:
    """`airflow:<dag>:<task>:<map index>:<run>`: the same for every try of one task instance (DAG and task
    ids hold no `:`, so the run id, which may, goes last and the id stays unambiguous)."""
    ti = context["ti"]
    return f"airflow:{ti.dag_id}:{ti.task_id}:{ti.map_index}:{ti.run_id}"
