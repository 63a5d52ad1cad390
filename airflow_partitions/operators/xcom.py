"""XCom in, typed objects out: the one place the operators decode what upstream tasks returned.

The core takes `RefreshPlan`, `PartitionWorkItem`, `StageResult` and `PartitionResult` objects only; each
operator turns its XCom arguments into them here before calling it. A value of the wrong shape (usually a
DAG wired to the wrong task) is an `OrchestrationError` naming the argument.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import OrchestrationError

if TYPE_CHECKING:
    from airflow_partitions.refresh.plan import (
        PartitionResult,
        PartitionWorkItem,
        RefreshPlan,
        StageResult,
        WorkBatch,
    )


def plan_from_xcom(plan: Any, work_items: Sequence[Mapping[str, Any]] | None) -> RefreshPlan:
    """The refresh plan from the discovery's `plan` XCom (no items) and its returned work items (one per
    partition, or batches of them: `refresh.plan.mapped_work`)."""
    from airflow_partitions.refresh.plan import RefreshPlan, unbatched_items_json  # lazy: loads sqlglot

    if not isinstance(plan, Mapping):
        raise OrchestrationError(
            f"expected the discovery task's `plan` XCom (a JSON object), got {type(plan).__name__}; wire "
            "plan=discover.output['plan']"
        )
    return RefreshPlan.from_json({**plan, "items": unbatched_items_json(list(work_items or []))})


def work_item_from_xcom(work_item: Any) -> PartitionWorkItem:
    """One of the discovery's work items (what a mapped refresh task gets)."""
    from airflow_partitions.refresh.plan import PartitionWorkItem  # lazy: loads sqlglot

    if not isinstance(work_item, Mapping):
        raise OrchestrationError(
            f"work_item must be one discovery work item (a JSON object), got {type(work_item).__name__}"
        )
    return PartitionWorkItem.from_json(work_item)


def mapped_work_from_xcom(work_item: Any) -> PartitionWorkItem | WorkBatch:
    """What one mapped refresh task gets: one work item, or a batch of them (`refresh.plan.WorkBatch`)."""
    from airflow_partitions.refresh.plan import WorkBatch, is_batch_json  # lazy: loads sqlglot

    if is_batch_json(work_item):
        return WorkBatch.from_json(work_item)
    return work_item_from_xcom(work_item)


def stage_from_xcom(stage: Any) -> StageResult | str | None:
    """The stage task's result; a plain string is taken as the stage location, None as no shared stage."""
    from airflow_partitions.refresh.plan import StageResult  # lazy: loads sqlglot

    if stage is None or isinstance(stage, str):
        return stage
    if not isinstance(stage, Mapping):
        raise OrchestrationError(
            f"stage must be the stage task's result (a JSON object), got {type(stage).__name__}; wire "
            "stage=stage_task.output"
        )
    return StageResult.from_json(stage)


def partition_result_from_xcom(result: Any, *, argument: str = "partition_result") -> PartitionResult:
    """One refresh task's returned partition descriptor."""
    from airflow_partitions.refresh.plan import PartitionResult  # lazy: loads sqlglot

    if not isinstance(result, Mapping):
        raise OrchestrationError(
            f"{argument} must be the descriptor a SparkPartitionRefreshOperator returned, got "
            f"{type(result).__name__}"
        )
    return PartitionResult.from_json(result)


def partition_results_from_xcom(results: Iterable[Any] | None) -> list[PartitionResult]:
    """The refresh tasks' descriptors; a missing one (a failed or skipped task) is left out. A batch task
    returns a list of descriptors, one per partition: the lists are opened in order.

    When the mapped refresh ran one task instance, Airflow hands over that instance's value itself, not a
    one-element list (seen with `dag.test()` on Airflow 3.3): it is taken as the one descriptor (or, from
    a batch, its list).
    """
    if isinstance(results, Mapping):
        results = [results]
    values: list[Any] = []
    for value in results or []:
        if isinstance(value, list | tuple):
            values.extend(value)
        else:
            values.append(value)
    values = [r for r in values if r is not None]
    if not all(isinstance(r, Mapping) for r in values):
        raise OrchestrationError("results must be the partition descriptors returned by the refresh tasks")
    return [partition_result_from_xcom(r, argument="results") for r in values]
