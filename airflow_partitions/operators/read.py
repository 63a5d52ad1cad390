"""Read this run's partitions in a task: `ReadRunPartitionsOperator` and the TaskFlow decorator
`@task.read_run_partitions` (registered in `provider_info.py`).

Both call a Python function with `rows`, the rows of exactly the partitions the run is for
(`PartitionedDatasetHook.run_partition_keys`: the keys of the dataset's asset events that triggered the run,
else the run's own partition key), as a pyarrow Table or (`rows_as="pandas"`) a pandas DataFrame; a
`partition_keys` parameter, when the function has one, receives those keys. A run that carries no key of the
dataset fails with `OrchestrationError` before the function is called. pyarrow and pandas load only when the
task runs.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk.bases.decorator import DecoratedOperator, task_decorator_factory

from airflow_partitions.exceptions import OrchestrationError
from airflow_partitions.hooks.partitioned_dataset import PartitionedDatasetHook

if TYPE_CHECKING:
    from airflow.sdk import Context
    from airflow.sdk.bases.decorator import TaskDecorator


OUTPUTS = ("arrow", "pandas")
ROWS_ARGUMENT = "rows"
KEYS_ARGUMENT = "partition_keys"


class ReadRunPartitionsOperator(PythonOperator):
    """Call `python_callable(rows=..., [partition_keys=...], *op_args, **op_kwargs)` with exactly this run's
    partitions of `dataset`; its return value is the task's XCom, as for `PythonOperator`.

    `columns` (default all) and `rows_as` ("arrow": a pyarrow Table, "pandas": a DataFrame) shape `rows`. The
    spec comes from `spec_path` or the `partitions_conn_id` connection, as for `PartitionedDatasetHook`.
    Schedule the DAG on the dataset's asset with a `PartitionedAssetTimetable` (the triggering events' keys
    are read) or trigger it with a partition key (the run's key is read).
    """

    template_fields: Sequence[str] = (*PythonOperator.template_fields, "dataset", "spec_path", "columns")
    ui_color = "#e3eefa"

    def __init__(
        self,
        *,
        dataset: str,
        python_callable: Callable[..., Any],
        spec_path: str | None = None,
        partitions_conn_id: str | None = None,
        columns: Sequence[str] | None = None,
        rows_as: str = "arrow",
        **kwargs: Any,
    ) -> None:
        if not isinstance(dataset, str) or not dataset:
            raise OrchestrationError(
                f"{type(self).__name__} needs dataset=<name of a dataset in the spec>, got {dataset!r}"
            )
        if rows_as not in OUTPUTS:
            raise OrchestrationError(
                f"{type(self).__name__}: rows_as={rows_as!r} is not one of {', '.join(OUTPUTS)}; "
                "'arrow' hands the function a pyarrow Table, 'pandas' a pandas DataFrame"
            )
        accepts_rows(python_callable)
        super().__init__(python_callable=python_callable, **kwargs)
        self.dataset = dataset
        self.spec_path = spec_path
        self.partitions_conn_id = partitions_conn_id
        self.columns = list(columns) if columns is not None else None
        self.rows_as = rows_as

    def hook(self) -> PartitionedDatasetHook:

        return PartitionedDatasetHook(
            dataset=self.dataset, spec_path=self.spec_path, partitions_conn_id=self.partitions_conn_id
        )

    def execute(self, context: Context) -> Any:
        hook = self.hook()
        try:
            keys = hook.run_partition_keys(context)
            table = hook.read_run_partitions(context, self.columns)
        finally:
            hook.close()
        self.log.info("Read %d row(s) of %s partition(s) %s", table.num_rows, self.dataset, ", ".join(keys))
        rows: Any = table.to_pandas() if self.rows_as == "pandas" else table
        self.op_kwargs = {**self.op_kwargs, ROWS_ARGUMENT: rows, KEYS_ARGUMENT: keys}
        return super().execute(context)


def accepts_rows(python_callable: Callable[..., Any]) -> None:
    """Refuse a function without a `rows` parameter (nor `**kwargs`), naming the fix."""
    parameters = inspect.signature(python_callable).parameters
    if ROWS_ARGUMENT in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    ):
        return
    name = getattr(python_callable, "__name__", repr(python_callable))
    raise OrchestrationError(
        f"{name}() reads the run's partitions but has no `{ROWS_ARGUMENT}` parameter to receive them; add "
        f"`{ROWS_ARGUMENT}` (and, to see which partitions, `{KEYS_ARGUMENT}`) to its parameters"
    )


class _ReadRunPartitionsDecoratedOperator(DecoratedOperator, ReadRunPartitionsOperator):
    """`@task.read_run_partitions(dataset=..., ...)`: `ReadRunPartitionsOperator` over a TaskFlow function."""

    template_fields: Sequence[str] = ReadRunPartitionsOperator.template_fields
    custom_operator_name = "@task.read_run_partitions"

    def __init__(
        self,
        *,
        python_callable: Callable[..., Any],
        op_args: Collection[Any] | None = None,
        op_kwargs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        accepts_rows(python_callable)
        # The function's signature is checked when the DAG is parsed: the parameters this operator fills
        # at run time get a placeholder there, and `execute` puts the rows and keys in their place.
        parameters = inspect.signature(python_callable).parameters
        op_kwargs = dict(op_kwargs or {})
        for name in (ROWS_ARGUMENT, KEYS_ARGUMENT):
            if name in op_kwargs:
                raise OrchestrationError(
                    f"{python_callable.__name__}(): `{name}` is filled with the run's partitions; do not "
                    "pass it when calling the task"
                )
            if name in parameters:
                op_kwargs[name] = None
        super().__init__(
            kwargs_to_upstream={
                "python_callable": python_callable,
                "op_args": op_args,
                "op_kwargs": op_kwargs,
            },
            python_callable=python_callable,
            op_args=op_args,
            op_kwargs=op_kwargs,
            **kwargs,
        )


def read_run_partitions_task(
    python_callable: Callable[..., Any] | None = None,
    multiple_outputs: bool | None = None,
    **kwargs: Any,
) -> TaskDecorator:
    """`@task.read_run_partitions(dataset="sales", spec_path=..., columns=[...], rows_as="arrow")`: a TaskFlow
    task whose function receives `rows` (and `partition_keys`) of exactly the run's partitions; see
    `ReadRunPartitionsOperator`."""
    return task_decorator_factory(
        python_callable=python_callable,
        multiple_outputs=multiple_outputs,
        decorated_operator_class=_ReadRunPartitionsDecoratedOperator,
        **kwargs,
    )
