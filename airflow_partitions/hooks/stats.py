"""Airflow's Stats for this provider: the one client every metric goes through, and the read metrics.

`stats_client()` initialises Stats from `[metrics]` when nothing in the process has (`dag.test()`), and
`metric_name` builds `<metric>.<dataset>[.<part>...]` names. The refresh metrics are in
`operators/metrics.py`; the read metrics are here because the hook, the lowest Airflow layer, installs them
(`install_read_metrics`: every read statistics record of `read.read_stats` becomes metrics):

- `dataset_acceleration_read_duration.<dataset>` timer (ms): one read, query or Spark frame plan
- `dataset_acceleration_read_rows.<dataset>` counter: rows returned
- `dataset_acceleration_read_bytes.<dataset>` counter: bytes of the files selected
- `dataset_acceleration_read_partitions.<dataset>` / `..._read_partitions_total.<dataset>` counters:
  partitions selected, and the partitions of the version read (their ratio is the pruning rate)
- `dataset_acceleration_read_files.<dataset>` counter: files selected
- `dataset_acceleration_read_unpruned.<dataset>` counter: filtered reads that selected every partition
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_partitions.read.read_stats import ReadRecord

READ_PREFIX = "dataset_acceleration_read"
READ_DURATION = f"{READ_PREFIX}_duration"
READ_ROWS = f"{READ_PREFIX}_rows"
READ_BYTES = f"{READ_PREFIX}_bytes"
READ_PARTITIONS = f"{READ_PREFIX}_partitions"
READ_PARTITIONS_TOTAL = f"{READ_PREFIX}_partitions_total"
READ_FILES = f"{READ_PREFIX}_files"
READ_UNPRUNED = f"{READ_PREFIX}_unpruned"


def stats_client() -> Any:
    """Airflow's task-side Stats, initialised from `[metrics]` if this process has not done it yet.

    A task process started by an executor initialises Stats in Airflow's task runner; `dag.test()` runs
    tasks in the calling process, where nothing has, and Stats would drop every metric.
    """
    from airflow.sdk._shared.observability.metrics import stats as shared
    from airflow.sdk.observability import stats

    if getattr(shared, "_factory", None) is None:
        from airflow.sdk.configuration import conf
        from airflow.sdk.observability.metrics import stats_utils

        stats.initialize(
            factory=stats_utils.get_stats_factory(),
            export_legacy_names=conf.getboolean("metrics", "legacy_names_on", fallback=False),
        )
    return stats


def metric_name(metric: str, dataset: str, *parts: str) -> str:
    """`<metric>.<dataset>[.<part>...]` with the dataset made safe for metric names (`[a-zA-Z0-9_.-]`)."""
    from airflow.sdk.observability.stats import normalize_name_for_stats

    safe = normalize_name_for_stats(dataset, log_warning=False).replace(".", "_")
    return ".".join((metric, safe, *parts))


def record_read(record: ReadRecord) -> None:
    """The metrics of one read statistics record."""
    stats = stats_client()
    dataset = record.dataset
    tags = {"dataset": dataset, "kind": record.kind}
    stats.timing(metric_name(READ_DURATION, dataset), dt.timedelta(seconds=record.elapsed_s), tags=tags)
    if record.rows is not None:
        stats.incr(metric_name(READ_ROWS, dataset), count=record.rows, tags=tags)
    stats.incr(metric_name(READ_BYTES, dataset), count=record.bytes, tags=tags)
    stats.incr(metric_name(READ_PARTITIONS, dataset), count=record.partitions, tags=tags)
    stats.incr(metric_name(READ_PARTITIONS_TOTAL, dataset), count=record.partitions_total, tags=tags)
    stats.incr(metric_name(READ_FILES, dataset), count=record.files, tags=tags)
    if record.pruned_nothing:
        stats.incr(metric_name(READ_UNPRUNED, dataset), tags=tags)


def install_read_metrics() -> None:
    """Send every read statistics record of this process to Airflow's Stats (idempotent)."""
    from airflow_partitions.read.read_stats import add_metrics_sink  # lazy: loads numpy, pyarrow, sqlglot

    add_metrics_sink(record_read)
