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

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import RefreshError
from airflow_partitions.keys import value_to_json
from airflow_partitions.refresh.plan import PartitionWorkItem, RefreshPlan
from airflow_partitions.sources.base import (
    RowsSince,
    Source,
    fingerprint_schema_tag,
    schema_tag,
    tagged_fingerprint,
)
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
    if mode is not RefreshMode.APPEND or plan.full or plan.replace_all or snapshot is None:
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


# --- refresh_mode: changes ----------------------------------------------------------------------


def changes_watermark(snapshot: Snapshot, column: str) -> Any:
    """The largest committed `column` value over every partition: where the next changes read starts."""
    best: Any = None
    for entry in snapshot.partitions.values():
        value = partition_watermark(entry, column)
        if value is not None and (best is None or value > best):
            best = value
    return best


def changes_fallback(
    dataset: DatasetSpec, source: Source, snapshot: Snapshot | None, *, selecting: bool, full: bool
) -> str | None:
    """Why a changes refresh rewrites partitions as a full one does (None: it can upsert changes)."""
    if dataset.acceleration.refresh.mode is not RefreshMode.CHANGES:
        return "not in changes mode"
    if getattr(source, "kind", None) != "postgres":
        raise RefreshError(
            f"dataset {dataset.name!r}: refresh_mode: changes reads Postgres sources only (rows changed "
            f"since the watermark, by primary key); {source.describe()} is not one. Use refresh_mode: "
            "append or full"
        )
    if full or selecting:
        return "--full / a selection of partitions rewrites them whole"
    if snapshot is None or not len(snapshot.partitions):
        return "no committed version yet: the first refresh reads every row"
    if snapshot.partition_spec.spec_id != dataset.acceleration.partition_spec_id:
        return "partition_by changed: every partition is rebuilt"
    tag = schema_tag(source.schema())
    table = snapshot.table
    tags = {fingerprint_schema_tag(fp) for fp in table.column("source_fingerprint").to_pylist()}
    if tags - {None, tag}:
        return "the source schema changed: every partition is rewritten under the new one"
    return None


def plan_changes(dataset: DatasetSpec, source: Source, snapshot: Snapshot) -> RefreshPlan:
    """The changes plan: the rows changed since the committed watermark (read once, keys and partition
    columns only), the partitions they land in now, and the partitions their keys may live in (file
    statistics of the first primary-key column; no statistics = might). Each item carries its committed
    files; the stage reads the changed rows once more, up to the highest value seen here.

    Ties: the read starts AT the watermark (`>=`), so rows updated within the same timestamp as the newest
    committed row are not lost; re-applying one already committed replaces it by key with itself.
    """
    import time

    import pyarrow.compute as pc

    from airflow_partitions.keys import PartitionKey
    from airflow_partitions.refresh.plan import Reason
    from airflow_partitions.sources.postgres import PostgresSource

    started = time.monotonic()
    acceleration = dataset.acceleration
    column = acceleration.refresh.watermark_column
    keys = acceleration.primary_key
    assert column is not None
    assert keys
    assert isinstance(source, PostgresSource)
    watermark = changes_watermark(snapshot, column)
    transforms = [f.transform for f in acceleration.partition_by]
    wanted = list(dict.fromkeys([*keys, *(t.source_column for t in transforms), column]))
    changed = source.read_changed(wanted, column, watermark)
    upper = pc.max(changed.column(column)).as_py() if changed.num_rows else None
    names = acceleration.partition_names
    landing: set[tuple[Any, ...]] = set()
    if changed.num_rows:
        values = [t.apply(changed.column(t.source_column)).to_pylist() for t in transforms]
        landing = set(zip(*values, strict=True))
    touched: dict[str, PartitionKey] = {PartitionKey(k).path(names): PartitionKey(k) for k in landing}
    if changed.num_rows:
        probe = KeyProbe.of(changed.column(keys[0]).to_pylist())
        for key_path, committed in snapshot.partitions.items():
            if key_path not in touched and probe.may_be_in(committed, keys[0]):
                touched[key_path] = committed.key
    tag = schema_tag(source.schema())
    fingerprint = tagged_fingerprint(tag, f"changes-{value_to_json(upper)}")
    items: list[PartitionWorkItem] = []
    for key_path in sorted(touched):
        entry = snapshot.partitions.get(key_path)
        items.append(
            PartitionWorkItem(
                key=tuple(touched[key_path].to_json()),
                key_path=key_path,
                reason=Reason.NEW if entry is None else Reason.CHANGED,
                fingerprint=fingerprint,
                changes=True,
                watermark=value_to_json(watermark),
                upper=value_to_json(upper),
                base_files=tuple(entry.files) if entry is not None else (),
            )
        )
    from airflow_partitions.refresh.plan import DiscoveryKind

    return RefreshPlan(
        dataset=dataset.name,
        spec_id=acceleration.partition_spec_id,
        partition_names=names,
        base_version=snapshot.version,
        items=tuple(items),
        removed=(),
        unchanged=len(snapshot.partitions) - sum(1 for i in items if i.reason is Reason.CHANGED),
        discovered=len(set(snapshot.partitions) | set(touched)),
        discovery=DiscoveryKind.DYNAMIC,
        fingerprint_granularity="partition",
        elapsed_s=time.monotonic() - started,
        notes=(f"{changed.num_rows} row(s) changed since {column} >= {watermark!r}",),
        refresh_mode=str(RefreshMode.CHANGES),
        watermark_column=column,
        changed_rows=changed.num_rows,
        changed_partitions=len(items),
    )


@dataclass(frozen=True)
class KeyProbe:
    """Changed key values of one column, to find the partitions that may hold their old rows, matched as
    the merge matches keys (`IS NOT DISTINCT FROM`): a NULL key may be in any file with a NULL, a NaN key
    in any file (statistics leave NaN out), -0.0 is 0.0."""

    values: tuple[Any, ...]  # sorted, without NULL and NaN
    has_null: bool
    has_nan: bool

    @classmethod
    def of(cls, keys: Sequence[Any]) -> KeyProbe:
        nan = [k for k in keys if isinstance(k, float) and math.isnan(k)]
        ordered = sorted(k for k in keys if k is not None and not (isinstance(k, float) and math.isnan(k)))
        return cls(tuple(ordered), has_null=any(k is None for k in keys), has_nan=bool(nan))

    def may_be_in(self, entry: PartitionEntry, column: str) -> bool:
        """Whether some file of the partition may hold one of the values of `column`."""
        import bisect

        for data_file in entry.files:
            stats = data_file.stats.get(column)
            if self.has_nan or stats is None:
                return True
            if self.has_null and stats.null_count > 0:
                return True
            if stats.min is None or stats.max is None:
                if stats.null_count >= data_file.rows:
                    continue  # every key NULL: no changed non-NULL key can be here
                return True
            try:
                at = bisect.bisect_left(self.values, stats.min)
            except TypeError:
                return True
            if at < len(self.values) and self.values[at] <= stats.max:
                return True
        return False
