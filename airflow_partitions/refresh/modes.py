"""Refresh modes: which planned partitions an append refresh extends, and from which watermark.

`refresh_mode: full` (the default) rewrites each changed partition from all its source rows. `append`
keeps a committed partition's files and adds a file of the rows whose `watermark_column` is past the
partition's watermark. The watermark is not stored anywhere of its own: it is the largest value of the
column in the partition's committed files, read from their statistics (exact for the integer, date and
timestamp s / ms / us columns a watermark may be), so it can never drift from what a read returns.

A partition that is new, empty, re-partitioned or refreshed with `--full` is rewritten as in full mode.
Rows whose watermark is NULL are never past a watermark: an append refresh reads them only in a partition
it writes whole (a new one); later ones are left for a full refresh, and counted (`null_watermark_rows`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import RefreshError
from airflow_partitions.keys import value_to_json
from airflow_partitions.refresh.plan import PartitionWorkItem, RefreshPlan
from airflow_partitions.sources.base import RowsSince
from airflow_partitions.spec.model import RefreshMode

if TYPE_CHECKING:
    from airflow_partitions.catalog import PartitionEntry, Snapshot
    from airflow_partitions.spec.model import DatasetSpec
    from airflow_partitions.storage import DataFile


def partition_watermark(entry: PartitionEntry, column: str) -> Any:
    """The largest non-NULL `column` value in the partition's committed files (None: all NULL).

    Taken from the files' statistics, which are exact for watermark types. A file without statistics for
    the column (written before the column existed) has no usable watermark: `RefreshError`.
    """
    best: Any = None
    for data_file in entry.files:
        value = file_watermark(data_file, column, entry.key_path)
        if value is not None and (best is None or value > best):
            best = value
    return best


def file_watermark(data_file: DataFile, column: str, key_path: str) -> Any:
    stats = data_file.stats.get(column)
    if stats is not None and stats.max is not None:
        return stats.max
    if stats is not None and stats.null_count >= data_file.rows:
        return None  # every value NULL: no watermark from this file
    raise RefreshError(
        f"partition {key_path}: file {data_file.path} records no maximum of watermark column {column!r}, "
        "so the rows already committed cannot be told from new ones; run a full refresh "
        "(`airflow-partitions refresh SPEC DATASET --full`) to rewrite the partition"
    )


def apply_refresh_mode(plan: RefreshPlan, dataset: DatasetSpec, snapshot: Snapshot | None) -> RefreshPlan:
    """`plan` under the dataset's refresh mode: in append mode each planned partition the catalog holds
    with rows becomes an append item carrying its watermark; `--full` and re-partitioning rewrite."""
    refresh = dataset.acceleration.refresh
    mode = refresh.mode
    if mode is RefreshMode.CHANGES:
        raise RefreshError(
            f"dataset {dataset.name!r}: refresh_mode: changes is not available in this version; use "
            "refresh_mode: append (new rows past the watermark) or full"
        )
    if mode is RefreshMode.FULL or plan.full or plan.replace_all or snapshot is None:
        return replace(plan, refresh_mode=str(RefreshMode.FULL), watermark_column=refresh.watermark_column)
    column = refresh.watermark_column
    assert column is not None  # the spec requires it for append
    items: list[PartitionWorkItem] = []
    for item in plan.items:
        entry = snapshot.partitions.get(item.key_path)
        if entry is None or entry.rows == 0:
            items.append(item)  # new or empty: written whole, NULL watermarks included
            continue
        watermark = partition_watermark(entry, column)
        items.append(replace(item, append=True, watermark=value_to_json(watermark)))
    return replace(plan, items=tuple(items), refresh_mode=str(mode), watermark_column=column)


def rows_since(dataset: DatasetSpec, item: PartitionWorkItem) -> RowsSince | None:
    """What an item reads: the rows past its watermark (append), or None for all its rows."""
    if not item.append:
        return None
    column = dataset.acceleration.refresh.watermark_column
    if column is None:
        raise RefreshError(
            f"partition {item.key_path} was planned as an append, but dataset {dataset.name!r} no longer "
            "names a refresh.watermark_column; plan again"
        )
    return RowsSince(column, item.watermark_value)


def lowest_since(dataset: DatasetSpec, items: Sequence[PartitionWorkItem]) -> RowsSince | None:
    """One condition every planned row meets, for a source read shared by all items: past the lowest
    watermark when every item appends, else None (some partition needs all its rows)."""
    sinces = [rows_since(dataset, item) for item in items]
    if not sinces or any(since is None for since in sinces):
        return None
    afters = [since.after for since in sinces if since is not None]
    column = sinces[0].column if sinces[0] is not None else ""
    if any(after is None for after in afters):
        return RowsSince(column, None)
    return RowsSince(column, min(afters))
