"""`VacuumOperator`: expire old catalog versions and delete partition files no retained version uses."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import OrchestrationError
from airflow_partitions.operators.base import DatasetOperator

if TYPE_CHECKING:
    from airflow.sdk import Context


def check_retention(
    retain_versions: int | None, older_than: dt.timedelta | None, grace: dt.timedelta | None
) -> None:
    """The retention arguments of the vacuum operators, checked when the DAG is built."""
    if retain_versions is not None and (
        isinstance(retain_versions, bool) or not isinstance(retain_versions, int) or retain_versions < 1
    ):
        raise OrchestrationError(f"retain_versions must be a positive integer, got {retain_versions!r}")
    for name, value in (("older_than", older_than), ("grace", grace)):
        if value is not None and (not isinstance(value, dt.timedelta) or value < dt.timedelta(0)):
            raise OrchestrationError(f"{name} must be a non-negative timedelta, got {value!r}")


class RetentionOptions:
    """The retention arguments both vacuum operators take: `retain_versions`, `older_than`, `grace`, and
    `report_only` (delete nothing, report what a vacuum would remove).

    A mixin without `__init__` (Airflow's operator metaclass wraps each operator's own `__init__`): the
    operators call `set_retention` from theirs.
    """

    retain_versions: int | None
    older_than: dt.timedelta | None
    grace: dt.timedelta | None
    report_only: bool

    def set_retention(
        self,
        retain_versions: int | None,
        older_than: dt.timedelta | None,
        grace: dt.timedelta | None,
        report_only: bool,
    ) -> None:
        check_retention(retain_versions, older_than, grace)
        self.retain_versions = retain_versions
        self.older_than = older_than
        self.grace = grace
        self.report_only = report_only

    def retention(self) -> dict[str, Any]:
        """Keyword arguments of `Catalog.vacuum` / `vacuum_snapshots` (their default grace when unset)."""
        options: dict[str, Any] = {"retain_versions": self.retain_versions, "older_than": self.older_than}
        if self.grace is not None:
            options["grace"] = self.grace
        return options


class VacuumOperator(RetentionOptions, DatasetOperator):
    """Vacuum the dataset's catalog: keep the newest `retain_versions` and/or versions younger than
    `older_than`, delete unreferenced files and stages of killed runs older than `grace`.
    `report_only=True` deletes nothing and reports what a vacuum would remove."""

    template_fields: Sequence[str] = (*DatasetOperator.template_fields, "retain_versions")
    ui_color = "#eeeeee"

    def __init__(
        self,
        *,
        retain_versions: int | None = None,
        older_than: dt.timedelta | None = None,
        grace: dt.timedelta | None = None,
        report_only: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.set_retention(retain_versions, older_than, grace, report_only)

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_partitions.refresh.leftovers import sweep_dataset_staging  # lazy: loads sqlglot

        catalog = self.open_catalog()
        report = catalog.vacuum(dry_run=self.report_only, **self.retention())
        staging = sweep_dataset_staging(self.dataset_handle(), grace=self.grace, dry_run=self.report_only)
        summary = {**report.to_json(), "staging": staging.to_json()}
        # The file list can be long; XCom gets the count, the log gets the names.
        summary["removed_files"] = len(report.removed_files)
        for removed in report.removed_files:
            self.log.debug("vacuum: %s (%d bytes)", removed.path, removed.bytes)
        self.log.info(
            "%s %s: %d version(s), %d file(s) (%d bytes), %d stage(s) (staging %d -> %d bytes) %s",
            "Vacuum (dry run) of" if self.report_only else "Vacuumed",
            self.dataset,
            len(report.removed_versions),
            len(report.removed_files),
            report.bytes_freed,
            len(staging.removed),
            staging.bytes_before,
            staging.bytes_after,
            "would be removed" if self.report_only else "removed",
        )
        return summary
