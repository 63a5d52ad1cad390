"""`RepartitionOperator`: move a bounded batch of partitions of an older partition_by into the current one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import OrchestrationError
from airflow_partitions.operators.base import DatasetOperator
from airflow_partitions.operators.metrics import record_repartition

if TYPE_CHECKING:
    from airflow.sdk import Context


class RepartitionOperator(DatasetOperator):
    """After a `partition_by` change, move at most `max_partitions` old partitions (or partitions holding at
    most `max_rows` rows) into the current layout in one atomic commit (operation `repartition`), with rows
    removed = rows added checked per new partition and in total. Schedule it (e.g. after each refresh) until
    it reports `done`; reads prune each partition under its own spec meanwhile. Sets the gauges
    `dataset_acceleration_repartition_partitions_left.<dataset>` and `..._rows_left.<dataset>`."""

    ui_color = "#f3ece1"

    def __init__(
        self,
        *,
        max_partitions: int | None = None,
        max_rows: int | None = None,
        report_only: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        for name, value in (("max_partitions", max_partitions), ("max_rows", max_rows)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise OrchestrationError(f"{name} must be a positive integer, got {value!r}")
        if max_partitions is not None and max_rows is not None:
            raise OrchestrationError("give max_partitions or max_rows, not both")
        self.max_partitions = max_partitions
        self.max_rows = max_rows
        self.report_only = report_only

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_partitions.write.repartition import repartition  # lazy: loads sqlglot

        handle = self.dataset_handle()
        report = repartition(
            handle,
            max_partitions=self.max_partitions,
            max_rows=self.max_rows,
            dry_run=self.report_only,
            catalog=handle.catalog,
        )
        self.log.info("%s", report.describe())
        record_repartition(self.dataset, partitions_left=report.partitions_left, rows_left=report.rows_left)
        summary = report.to_json()
        summary["moved_partitions"] = len(report.moved)  # XCom gets counts, the log the key paths
        summary["written_partitions"] = len(report.written)
        return summary
