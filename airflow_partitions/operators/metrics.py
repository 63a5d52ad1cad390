"""Refresh metrics through Airflow's Stats: StatsD, OpenTelemetry or Datadog, as `[metrics]` configures.

Emitted by the operators only (the core knows nothing of Airflow). Names start with
`dataset_acceleration_refresh_` and end in the dataset (`.<dataset>`, made safe for metric names), so
plain StatsD, which has no tags, still tells datasets apart; backends with tags also get `dataset` (and
`outcome`) as tags. With `statsd_prefix` (default `airflow`) in front:

- `dataset_acceleration_refresh_rows.<dataset>` counter: rows written, per refreshed partition
- `dataset_acceleration_refresh_bytes.<dataset>` counter: bytes written, per refreshed partition
- `dataset_acceleration_refresh_duration.<dataset>` timer (ms): one partition task's refresh
- `dataset_acceleration_refresh_partitions.<dataset>.<outcome>` counter: partitions refreshed
  (`success`), refused by a conservation check (`conservation_refused`) or failed otherwise (`failed`)
- `dataset_acceleration_partitions_to_refresh.<dataset>` gauge: what a run's discovery planned (new,
  changed, re-partitioned), and `dataset_acceleration_stale_partitions.<dataset>` gauge: of those, the
  ones the catalog holds but whose source changed (or whose `partition_by` did); set by runs that survey
  the whole source (no `partitions` / `where`)
- `dataset_acceleration_freshness_overdue.<dataset>` gauge: partitions last refreshed longer ago than the
  dataset's `freshness` SLA (when the spec declares one), set by every discovery
- `dataset_acceleration_refresh_stage_duration.<dataset>` timer (ms) and
  `dataset_acceleration_refresh_stage_rows.<dataset>` counter: the shared Spark stage
- `dataset_acceleration_repartition_partitions_left.<dataset>` and
  `dataset_acceleration_repartition_rows_left.<dataset>` gauges: partitions (rows) still under an older
  `partition_by`, after each `RepartitionOperator` run (0 when none is left)
- `dataset_acceleration_refresh_cdc_lag_bytes.<dataset>` gauge: WAL bytes written since the position a
  change data capture dataset's replication slot confirmed, after each commit (`cdc status` shows it too)
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from enum import StrEnum

# One Stats client and one naming rule for every metric of the provider (read metrics: `hooks/stats.py`).
from airflow_partitions.hooks.stats import metric_name as metric_name
from airflow_partitions.hooks.stats import stats_client as _stats

METRIC_PREFIX = "dataset_acceleration_refresh"
ROWS = f"{METRIC_PREFIX}_rows"
BYTES = f"{METRIC_PREFIX}_bytes"
DURATION = f"{METRIC_PREFIX}_duration"
PARTITIONS = f"{METRIC_PREFIX}_partitions"
STAGE_DURATION = f"{METRIC_PREFIX}_stage_duration"
STAGE_ROWS = f"{METRIC_PREFIX}_stage_rows"
CDC_LAG = f"{METRIC_PREFIX}_cdc_lag_bytes"
# Watermark modes: source rows at or below a partition's watermark the acceleration lacked (or held extra,
# counted by absolute value) when the refresh was planned, and rows with a watermark in the future.
LATE_ROWS = f"{METRIC_PREFIX}_late_rows"
FUTURE_ROWS = f"{METRIC_PREFIX}_future_rows"
TO_REFRESH = "dataset_acceleration_partitions_to_refresh"
STALE = "dataset_acceleration_stale_partitions"
FRESHNESS_OVERDUE = "dataset_acceleration_freshness_overdue"
REPARTITION_PARTITIONS_LEFT = "dataset_acceleration_repartition_partitions_left"
REPARTITION_ROWS_LEFT = "dataset_acceleration_repartition_rows_left"


class Outcome(StrEnum):
    """How one partition's refresh ended."""

    SUCCESS = "success"
    CONSERVATION_REFUSED = "conservation_refused"
    FAILED = "failed"


def record_partition(
    dataset: str, outcome: Outcome, *, elapsed_s: float, rows: int | None = None, size: int | None = None
) -> None:
    """Metrics of one partition refresh: outcome and duration always, rows and bytes when it wrote them."""
    stats = _stats()
    tags = {"dataset": dataset, "outcome": str(outcome)}
    stats.incr(metric_name(PARTITIONS, dataset, str(outcome)), tags=tags)
    stats.timing(metric_name(DURATION, dataset), dt.timedelta(seconds=elapsed_s), tags=tags)
    if rows is not None:
        stats.incr(metric_name(ROWS, dataset), count=rows, tags={"dataset": dataset})
    if size is not None:
        stats.incr(metric_name(BYTES, dataset), count=size, tags={"dataset": dataset})


def record_stage(dataset: str, *, elapsed_s: float, source_rows: int | None) -> None:
    """Metrics of the shared stage: its duration and the source rows it read (when it counted them)."""
    stats = _stats()
    tags = {"dataset": dataset}
    stats.timing(metric_name(STAGE_DURATION, dataset), dt.timedelta(seconds=elapsed_s), tags=tags)
    if source_rows is not None:
        stats.incr(metric_name(STAGE_ROWS, dataset), count=source_rows, tags=tags)


def record_cdc_lag(dataset: str, lag_bytes: int) -> None:
    """The replication slot's lag of a change data capture dataset, in WAL bytes."""
    _stats().gauge(metric_name(CDC_LAG, dataset), lag_bytes, tags={"dataset": dataset})


def record_watermark_audit(
    dataset: str, *, late_rows: Mapping[str, int] | None, future_rows: Mapping[str, int] | None
) -> None:
    """Gauges of what a watermark mode could not see at planning (0 when it saw everything), so an alert
    can fire on drift: late rows summed by absolute value over partitions, and future-dated rows."""
    if late_rows is None and future_rows is None:
        return  # full mode: nothing audited
    stats = _stats()
    tags = {"dataset": dataset}
    stats.gauge(metric_name(LATE_ROWS, dataset), sum(abs(n) for n in (late_rows or {}).values()), tags=tags)
    stats.gauge(metric_name(FUTURE_ROWS, dataset), sum((future_rows or {}).values()), tags=tags)


def record_discovery(dataset: str, *, to_refresh: int | None, stale: int | None, overdue: int | None) -> None:
    """Gauges of a discovery: partitions to refresh and stale ones (whole-source surveys only) and, with a
    freshness SLA, partitions past it; a None is not emitted."""
    stats = _stats()
    tags = {"dataset": dataset}
    for metric, value in ((TO_REFRESH, to_refresh), (STALE, stale), (FRESHNESS_OVERDUE, overdue)):
        if value is not None:
            stats.gauge(metric_name(metric, dataset), value, tags=tags)


def record_repartition(dataset: str, *, partitions_left: int, rows_left: int) -> None:
    """Gauges of a re-partitioning's progress: partitions and rows still under an older partition_by."""
    stats = _stats()
    tags = {"dataset": dataset}
    stats.gauge(metric_name(REPARTITION_PARTITIONS_LEFT, dataset), partitions_left, tags=tags)
    stats.gauge(metric_name(REPARTITION_ROWS_LEFT, dataset), rows_left, tags=tags)
