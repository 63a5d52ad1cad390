"""`PartitionCommitOperator`: publish refreshed partitions in one atomic commit, then emit asset events."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from airflow_partitions.exceptions import AirflowPartitionsError, CommitConflictError
from airflow_partitions.keys import AIRFLOW_KEY_LIMIT, PartitionKey, composite_key
from airflow_partitions.operators.base import DatasetOperator
from airflow_partitions.operators.metrics import record_cdc_lag, record_watermark_audit
from airflow_partitions.operators.xcom import partition_results_from_xcom, plan_from_xcom, stage_from_xcom

if TYPE_CHECKING:
    from airflow.sdk import Context

# Airflow stores an asset event's partition key in a 250-character column.
MAX_ASSET_PARTITION_KEY = AIRFLOW_KEY_LIMIT


def asset_partition_key(key: PartitionKey) -> str:
    """The partition key an asset event carries: Airflow's composite key (`EU|2026-01-01T00:00:00`).

    Its segments are the key's values in field order (`keys.composite_key`), as Airflow's partition
    mappers read them (`ProductMapper(IdentityMapper(), StartOfDayMapper())`); a key over 250 characters
    keeps a readable prefix and ends in `%H<digest>`.
    """
    return composite_key(key)


class PartitionCommitOperator(DatasetOperator):
    """Commit the refreshed partitions and the plan's removals as one new catalog version.

    Readers see the previous version or the new one, never a mix. Afterwards every `Asset` in `outlets`
    gets one event per refreshed partition carrying the partition's key in Airflow's composite-key
    convention (`EU|2026-01-01T00:00:00`), so partition-aware downstream DAGs (`PartitionedAssetTimetable`)
    run per partition. Skips when the plan has nothing to write or remove. A retried commit is idempotent.
    A commit since the plan's base that changed the same partitions (`CommitConflictError`: a write, a
    refresh, a re-partitioning batch) fails the task without retries, nothing published: the plan cannot
    commit any more, the next run plans again.
    """

    template_fields: Sequence[str] = (
        *DatasetOperator.template_fields,
        "plan",
        "work_items",
        "results",
        "stage",
    )
    ui_color = "#c9e7c0"

    def __init__(
        self,
        *,
        plan: Any,
        work_items: Any,
        results: Any,
        stage: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.plan = plan
        self.work_items = work_items
        self.results = results
        self.stage = stage

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_partitions.refresh.commit import commit_refresh  # lazy: loads sqlglot

        plan = plan_from_xcom(self.plan, self.work_items)
        record_watermark_audit(self.dataset, late_rows=plan.late_rows, future_rows=plan.future_rows)
        if plan.is_empty:
            raise AirflowSkipException(f"{self.dataset}: nothing changed in the source; no commit needed")
        results = partition_results_from_xcom(self.results)
        stage = stage_from_xcom(self.stage)
        handle = self.dataset_handle()
        try:
            commit = commit_refresh(handle, plan, results, stage=stage)
        except CommitConflictError as err:
            if not err.partitions:
                raise  # a race lost too often, or a vacuumed base: a retry may get through
            # Another commit changed these partitions since the plan's base version (a write, a refresh,
            # a re-partitioning batch): every retry of this plan would meet it again. The next run plans
            # from the newest version.
            message = f"{self.dataset}: {err} (the next run of this DAG plans again)"
            self.log.error("%s", message)
            raise AirflowFailException(message) from None
        self.log.info(
            "Committed %s version %s: %d partition(s) written (%d rows, %d bytes), %d removed",
            self.dataset,
            commit.version,
            commit.upserted,
            commit.rows,
            commit.bytes,
            commit.removed,
        )
        if commit.conservation is not None:
            # The counts the commit checked (also in the commit record and in the returned XCom).
            self.log.info("Row conservation of %s: %s", self.dataset, dict(commit.conservation))
        certificates = committed_certificates(
            handle.catalog, commit.version, [r.entry.key_path for r in results]
        )
        self.emit_asset_events(context, [r.entry.key for r in results], commit.to_json(), certificates)
        if plan.cdc is not None:
            self.emit_cdc_lag()
        return commit.to_json()

    def emit_cdc_lag(self) -> None:
        """The replication slot's lag after the commit advanced it (a failure to read it only logs)."""
        from airflow_partitions.refresh.cdc import change_stream  # lazy: loads sqlglot

        try:
            info = change_stream(self.project, self.dataset_spec).info()
        except AirflowPartitionsError as err:
            self.log.warning("Cannot read the replication slot of %s: %s", self.dataset, err)
            return
        if info is not None and info.lag_bytes is not None:
            self.log.info(
                "Replication slot %s of %s lags %d WAL bytes", info.slot, self.dataset, info.lag_bytes
            )
            record_cdc_lag(self.dataset, info.lag_bytes)

    def emit_asset_events(
        self,
        context: Context,
        keys: Sequence[PartitionKey],
        commit: Mapping[str, Any],
        certificates: Mapping[str, Any] | None = None,
    ) -> None:
        """One event per refreshed partition on each outlet asset (a removal-only commit: one plain event).

        The extra carries each partition's certificate by Airflow partition key (`certificates`), so a
        downstream DAG can check that what it reads is what the commit certified."""
        assets = [outlet for outlet in self.outlets if isinstance(outlet, Asset)]
        if not assets:
            return
        partition_keys = sorted({asset_partition_key(key) for key in keys})
        extra = {
            "dataset": self.dataset,
            "version": commit.get("version"),
            "partitions_refreshed": commit.get("upserted", 0),
            "partitions_removed": commit.get("removed", 0),
            "spec": os.path.abspath(self.spec_path),
        }
        if certificates:
            extra["certificates"] = dict(certificates)
        for asset in assets:
            accessor = context["outlet_events"][asset]
            accessor.extra = dict(extra)
            if partition_keys:
                accessor.add_partitions(partition_keys)


def committed_certificates(catalog: Any, version: int | None, key_paths: Sequence[str]) -> dict[str, Any]:
    """Airflow partition key -> the certificate JSON the committed version records for it (certified
    partitions only; an appended partition's is its old rows' plus the new ones')."""
    if version is None:
        return {}
    partitions = catalog.snapshot(version).partitions
    out: dict[str, Any] = {}
    for key_path in key_paths:
        entry = partitions.get(key_path)
        if entry is not None and entry.certificate is not None:
            out[asset_partition_key(entry.key)] = entry.certificate.to_json()
    return out
