"""`PartitionDiscoveryOperator`: which partitions to refresh, as the list a mapped task group expands."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_partitions.operators.base import DatasetOperator
from airflow_partitions.operators.run_conf import RefreshRunConf, run_partition_key

if TYPE_CHECKING:
    from airflow.sdk import Context

PLAN_XCOM_KEY = "plan"


class PartitionDiscoveryOperator(DatasetOperator):
    """Discover the dataset's partitions, diff them against the catalog, return the work items.

    Returns one JSON work item per partition to refresh (`key`, `key_path`, `reason`, `fp`): the input of
    `.expand()`. The rest of the plan (catalog base version, removed partitions, counts) is pushed as the
    XCom `plan` for the stage and commit tasks. The run's params decide the selection: `partitions`
    (canonical keys, refreshed even if unchanged), `where` (a filter on partition values) and
    `full_refresh`; explicit arguments here win over the run's params. A run that carries Airflow's
    `partition_key` refreshes exactly that partition (`RefreshRunConf.for_partition_key`).
    """

    template_fields: Sequence[str] = (*DatasetOperator.template_fields, "partitions", "where")
    ui_color = "#d5ecf7"

    def __init__(
        self,
        *,
        spec_path: str | os.PathLike[str],
        dataset: str,
        partitions: Sequence[str] | None = None,
        where: str | None = None,
        full_refresh: bool | None = None,
        discovery_timeout_s: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(spec_path=spec_path, dataset=dataset, **kwargs)
        self.partitions = partitions
        self.where = where
        self.full_refresh = full_refresh
        self.discovery_timeout_s = discovery_timeout_s

    def execute(self, context: Context) -> list[dict[str, Any]]:
        from airflow_partitions.refresh.pipeline import plan_refresh

        run = RefreshRunConf.from_context(
            context, partitions=self.partitions, where=self.where, full_refresh=self.full_refresh
        ).for_partition_key(run_partition_key(context))
        run.check_partitions(self.dataset, self.dataset_spec.acceleration.partition_names)
        self.prepare_sources()
        plan = plan_refresh(
            self.project,
            self.dataset_spec,
            partitions=run.partitions,
            where=run.where,
            full=run.full_refresh,
            timeout_s=self.discovery_timeout_s,
            catalog=self.open_catalog(),
        )
        counts = ", ".join(f"{name} {count}" for name, count in plan.counts().items() if count)
        self.log.info(
            "Dataset %s: %d partition(s) to refresh, %d to remove (%s; %s discovery in %.2fs)",
            self.dataset,
            len(plan.items),
            len(plan.removed),
            counts or "nothing discovered",
            plan.discovery,
            plan.elapsed_s,
        )
        for note in plan.notes:
            self.log.info("Discovery note: %s", note)
        context["ti"].xcom_push(key=PLAN_XCOM_KEY, value=plan.without_items().to_json())
        return plan.items_json()
