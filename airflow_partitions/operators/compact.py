"""`CompactOperator`: merge each partition's small files into target-size files in one catalog commit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import OrchestrationError
from airflow_partitions.operators.base import DatasetOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

# The core's default (refresh/compaction.py), repeated so parsing a DAG imports no core module.
DEFAULT_TARGET_FILE_BYTES = 128 * 1024 * 1024


class CompactOperator(DatasetOperator):
    """Compact the dataset: in every partition (or those `where` / `partitions` select) holding two or more
    files smaller than `target_file_bytes`, merge them into target-size files, all partitions in one atomic
    commit (operation `compact`). `report_only=True` writes nothing and reports what would be merged. A
    refresh committing the same partition meanwhile fails the task with `CommitConflictError` and loses
    nothing; run it again."""

    template_fields: Sequence[str] = (*DatasetOperator.template_fields, "where", "partitions")
    ui_color = "#eef5e8"

    def __init__(
        self,
        *,
        target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES,
        target_rows: int | None = None,
        where: str | None = None,
        partitions: Sequence[str] | None = None,
        report_only: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        for name, value in (("target_file_bytes", target_file_bytes), ("target_rows", target_rows)):
            if value is None and name == "target_rows":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise OrchestrationError(f"{name} must be a positive integer, got {value!r}")
        self.target_file_bytes = target_file_bytes
        self.target_rows = target_rows
        self.where = where
        self.partitions = list(partitions) if partitions is not None else None
        self.report_only = report_only

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_partitions.refresh.compaction import compact_dataset  # lazy: loads sqlglot

        report = compact_dataset(
            self.project,
            self.dataset_spec,
            target_file_bytes=self.target_file_bytes,
            target_rows=self.target_rows,
            partitions=self.partitions,
            where=self.where or None,
            dry_run=self.report_only,
            catalog=self.open_catalog(),
            progress=self.log.info,
        )
        summary = report.to_json()
        # The per-partition list can be long; XCom gets the totals, the log gets the partitions.
        summary["partitions"] = len(report.partitions)
        self.log.info(
            "%s %s: %d of %d partition(s), %d -> %s file(s), version %s",
            "Compaction (dry run) of" if self.report_only else "Compacted",
            self.dataset,
            len(report.partitions),
            report.examined,
            report.files_before,
            report.files_after,
            report.version,
        )
        return summary
