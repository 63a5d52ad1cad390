"""`PartitionDiscoveryOperator`: which partitions to refresh, as the list a mapped task group expands."""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException

from airflow_partitions.exceptions import FilterError, OrchestrationError
from airflow_partitions.hooks.partitioned_dataset import run_partition_key
from airflow_partitions.keys import partition_label
from airflow_partitions.operators.base import DatasetOperator
from airflow_partitions.operators.metrics import record_discovery
from airflow_partitions.operators.run_conf import RefreshRunConf

if TYPE_CHECKING:
    from airflow.sdk import Context

PLAN_XCOM_KEY = "plan"
CONFIG_SECTION = "airflow_partitions"
# The provider's own cap on mapped refresh tasks per run, below Airflow's `[core] max_map_length`.
DEFAULT_MAX_MAPPED_TASKS = 1024


def max_mapped_tasks() -> int:
    """How many mapped refresh tasks one run may have: the smaller of Airflow's `[core] max_map_length`
    (a longer mapped input fails the run) and `[airflow_partitions] max_mapped_tasks`."""
    from airflow.configuration import conf

    limits = {
        "[core] max_map_length": conf.getint("core", "max_map_length", fallback=1024),
        f"[{CONFIG_SECTION}] max_mapped_tasks": conf.getint(
            CONFIG_SECTION, "max_mapped_tasks", fallback=DEFAULT_MAX_MAPPED_TASKS
        ),
    }
    for name, value in limits.items():
        if value < 1:
            raise OrchestrationError(f"{name} must be a positive number of mapped tasks, got {value}")
    return min(limits.values())


@dataclass(frozen=True)
class FreshnessMiss:
    """What an `on_freshness_miss` callback is told: partitions of the newest version last refreshed longer
    ago than the dataset's freshness SLA, when a discovery starts."""

    dataset: str
    sla: dt.timedelta
    # The catalog version they were read from.
    version: int
    # Labels (`region=EU/day=2026-01-01`), oldest refresh first.
    overdue: tuple[str, ...]
    oldest_refreshed_at: dt.datetime

    def describe(self) -> str:
        age = dt.datetime.now(dt.UTC) - self.oldest_refreshed_at
        shown = ", ".join(self.overdue[:10]) + (
            f" and {len(self.overdue) - 10} more" if len(self.overdue) > 10 else ""
        )
        return (
            f"{len(self.overdue)} partition(s) of {self.dataset} miss the freshness SLA of {self.sla} "
            f"(version {self.version}; the oldest was refreshed {age} ago): {shown}"
        )


# Called with the miss and the discovery task's context; its return value is ignored.
FreshnessMissCallback = Callable[[FreshnessMiss, "Context"], Any]


class PartitionDiscoveryOperator(DatasetOperator):
    """Discover the dataset's partitions, diff them against the catalog, return the work items.

    Returns one JSON work item per partition to refresh (`key`, `key_path`, `reason`, `fp`): the input of
    `.expand()`. When there are more partitions than a run may map (`max_mapped_tasks()`: the smaller of
    `[core] max_map_length` and `[airflow_partitions] max_mapped_tasks`), it returns exactly that many
    balanced batches of contiguous work items instead (`refresh.plan.WorkBatch`), each refreshed by one
    task. The rest of the plan (catalog base version, removed partitions, counts) is pushed as the
    XCom `plan` for the stage and commit tasks. The run's params decide the selection: `partitions`
    (canonical keys, refreshed even if unchanged), `where` (a filter on partition values) and
    `full_refresh`; explicit arguments here win over the run's params. A run that carries Airflow's
    `partition_key` refreshes exactly that partition (`RefreshRunConf.for_partition_key`).

    `on_freshness_miss`: with a `freshness` SLA in the spec, called as `callback(miss, context)` when
    partitions of the newest version are older than the SLA as the discovery starts (`FreshnessMiss`); a
    callback that raises is logged and the refresh goes on, since the refresh is what cures the miss.
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
        on_freshness_miss: FreshnessMissCallback | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(spec_path=spec_path, dataset=dataset, **kwargs)
        self.partitions = partitions
        self.where = where
        self.full_refresh = full_refresh
        self.discovery_timeout_s = discovery_timeout_s
        self.on_freshness_miss = on_freshness_miss

    def execute(self, context: Context) -> list[dict[str, Any]]:
        from airflow_partitions.refresh.pipeline import plan_refresh  # lazy: loads sqlglot
        from airflow_partitions.refresh.plan import mapped_work  # lazy: loads sqlglot

        run = RefreshRunConf.from_context(
            context, partitions=self.partitions, where=self.where, full_refresh=self.full_refresh
        ).for_partition_key(run_partition_key(context))
        run.check_partitions(self.dataset, self.dataset_spec.acceleration.partition_names)
        miss = self.freshness_miss()
        self.prepare_sources()
        try:
            plan = plan_refresh(
                self.project,
                self.dataset_spec,
                partitions=run.partitions,
                where=run.where,
                full=run.full_refresh,
                timeout_s=self.discovery_timeout_s,
                catalog=self.open_catalog(),
            )
        except FilterError as err:
            # A bad `where` is the run's input: its message says what to fix, no retry can help, and the
            # pruning internals' frames under it would only bury the message in the task log.
            message = f"where {run.where!r}: {type(err).__name__}: {err}"
            self.log.error("%s", message)
            raise AirflowFailException(message) from None
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
        self.record_gauges(plan, whole_source=not run.partitions and not run.where, miss=miss)
        if miss is not None:
            self.report_freshness_miss(miss, context)
        context["ti"].xcom_push(key=PLAN_XCOM_KEY, value=plan.without_items().to_json())
        limit = max_mapped_tasks()
        work = mapped_work(plan.items, limit)
        if len(plan.items) > limit:
            self.log.info(
                "%d partitions are more than the %d mapped tasks a run may have ([core] max_map_length, "
                "[%s] max_mapped_tasks): %d batches of %d to %d partitions each",
                len(plan.items),
                limit,
                CONFIG_SECTION,
                len(work),
                min(len(batch["items"]) for batch in work),
                max(len(batch["items"]) for batch in work),
            )
        return work

    def freshness_miss(self) -> FreshnessMiss | None:
        """The partitions of the newest version past the dataset's freshness SLA, or None: no SLA, or
        none past it (an empty catalog misses nothing: discovery finds its partitions missing)."""

        freshness = self.dataset_spec.freshness
        if freshness is None:
            return None
        snapshot = self.open_catalog().latest()
        if snapshot is None:
            return None
        now = dt.datetime.now(dt.UTC)
        overdue = sorted(
            (entry for entry in snapshot.partitions.values() if now - entry.refreshed_at > freshness),
            key=lambda entry: (entry.refreshed_at, entry.key_path),
        )
        if not overdue:
            return None
        names = snapshot.partition_spec.names
        return FreshnessMiss(
            dataset=self.dataset,
            sla=freshness,
            version=snapshot.version,
            overdue=tuple(partition_label(names, entry.key) for entry in overdue),
            oldest_refreshed_at=overdue[0].refreshed_at,
        )

    def report_freshness_miss(self, miss: FreshnessMiss, context: Context) -> None:
        """Log the miss and call `on_freshness_miss`; a failing callback is logged, not raised."""
        self.log.warning("Freshness SLA missed: %s", miss.describe())
        if self.on_freshness_miss is None:
            return
        try:
            self.on_freshness_miss(miss, context)
        except Exception:
            self.log.exception("on_freshness_miss callback of %s failed; the refresh goes on", self.dataset)

    def record_gauges(self, plan: Any, *, whole_source: bool, miss: FreshnessMiss | None = None) -> None:
        """Partitions to refresh and stale ones (only a survey of the whole source counts them all) and,
        with a freshness SLA, partitions of the newest version past it (`miss`, 0 when none is)."""
        from airflow_partitions.refresh.plan import Reason  # lazy: loads sqlglot

        overdue = None
        if self.dataset_spec.freshness is not None:
            overdue = len(miss.overdue) if miss is not None else 0
        stale = sum(1 for item in plan.items if item.reason in (Reason.CHANGED, Reason.RESPEC))
        record_discovery(
            self.dataset,
            to_refresh=len(plan.items) if whole_source else None,
            stale=stale if whole_source else None,
            overdue=overdue,
        )
