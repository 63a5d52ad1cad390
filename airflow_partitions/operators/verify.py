"""`VerifyOperator`: prove a dataset's acceleration still equals its source (and repair it on request)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import OrchestrationError, VerifyDriftError
from airflow_partitions.operators.base import DatasetOperator

if TYPE_CHECKING:
    from airflow.sdk import Context


class VerifyOperator(DatasetOperator):
    """Compare every partition (or those `partitions` / `where` select) of the dataset with its source: row
    counts and row hashes on both sides, and the files against their commit's certificate. With `repair`,
    the partitions that differ are refreshed in one commit and verified again. The task fails with
    `VerifyDriftError` when a partition still differs (`fail_on_drift=False`: it succeeds and the XCom
    says `"ok": false`). XCom: the report's totals and the differing partitions.

    `deep` (templated: a bool, or a rendered "true"/"false") reads and hashes every partition's files, even
    those whose certificate is bound to files that still hash as the catalog records (`verify --deep`)."""

    template_fields: Sequence[str] = (*DatasetOperator.template_fields, "where", "partitions", "deep")
    ui_color = "#eaf7ee"

    def __init__(
        self,
        *,
        where: str | None = None,
        partitions: Sequence[str] | None = None,
        repair: bool = False,
        fail_on_drift: bool = True,
        strategy: str = "auto",
        deep: bool | str = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if where and partitions:
            raise OrchestrationError("VerifyOperator takes `where` or `partitions`, not both")
        self.where = where
        self.partitions = list(partitions) if partitions is not None else None
        self.repair = repair
        self.fail_on_drift = fail_on_drift
        self.strategy = strategy
        self.deep = deep

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_partitions.refresh.verify import verify_dataset  # lazy: loads sqlglot

        self.prepare_sources()
        report = verify_dataset(
            self.project,
            self.dataset_spec,
            partitions=self.partitions,
            where=self.where or None,
            repair=self.repair,
            catalog=self.open_catalog(),
            strategy=self.strategy,
            deep=_flag("deep", self.deep),
        )
        summary = report.to_json()
        final = report.after_repair or report
        # XCom gets the totals and the partitions that differ, not every partition's line.
        summary["partitions"] = [c.to_json() for c in report.differing]
        held = summary["old_layout"]["partitions_with_old_rows"]  # every partition, early in a migration
        summary["old_layout"]["partitions_with_old_rows"] = held[:50]
        if summary["after_repair"] is not None:
            summary["after_repair"]["partitions"] = [c.to_json() for c in final.differing]
        for check in report.differing:
            self.log.warning("%s: %s %s: %s", self.dataset, check.verdict, check.key_path, check.reason)
        self.log.info(
            "Verify of %s (version %s): %s %s", self.dataset, report.version, report.result, report.counts()
        )
        if not report.ok and self.fail_on_drift:
            raise VerifyDriftError(
                f"{self.dataset}: {len(final.differing)} partition(s) differ from the source "
                f"({', '.join(c.key_path for c in final.differing[:5])}); run `airflow-partitions verify "
                f"{self.spec_path} {self.dataset} --repair` or set repair=True"
            )
        return summary


def _flag(name: str, value: bool | str) -> bool:
    """A boolean argument as given, or as a template rendered it (`"True"`, `"false"`)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", "", "none"):
        return False
    raise OrchestrationError(f"VerifyOperator: {name} must be true or false, got {value!r}")
