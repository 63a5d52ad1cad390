"""Refresh modes: which planned partitions an append refresh extends, and from which watermark.

`refresh_mode: full` (the default) rewrites each changed partition from all its source rows. `append`
keeps a committed partition's files and adds a file of the rows whose `watermark_column` is past the
partition's watermark. The watermark is not stored anywhere of its own: it is the largest value of the
column in the partition's committed files, read from their statistics (exact for the integer, date and
timestamp s / ms / us columns a watermark may be), so it can never drift from what a read returns.

A partition that is new, empty, re-partitioned or refreshed with `--full` is rewritten as in full mode.
Rows whose watermark is NULL are never past a watermark: an append refresh reads them only in a partition
it writes whole (a new one); later ones are left for a full refresh, and counted (`null_watermark_rows`).

Before an append, the rows it would not read are counted (`audit_appends`): per appending partition, the
source rows at or below its watermark (NULL watermarks included) against the rows the partition holds.
A difference means late rows (inserted below the watermark, or committed by a transaction that was open at
the last refresh), deleted rows, or rows whose watermark moved forward (appending them would duplicate
them); `refresh.late_rows` decides: `rewrite` (the default) rewrites those partitions whole in the same
commit, `report` appends and reports, `fail` refuses. The count is a cheap grouped count over the projected
partition and watermark columns; it cannot see a late row and a moved row of the same partition that
cancel out between two refreshes, nor an update in place that keeps the watermark (append reads only new
rows: use refresh_mode changes or full for updated sources).

`refresh_mode: changes` on a watermark is audited the same way (`audit_changes`): every partition's source
count against the rows it will hold once the changes are merged; a hard delete, a row written below the
watermark or with a NULL one makes them differ, and `refresh.late_rows` applies (`rewrite`: the pipeline
rewrites those partitions and the changed ones whole, `rewrite_late_partitions`).

Watermarks from the future are not trusted: values past now + `refresh.max_future_skew_s` are counted per
partition (`future_rows`), and a partition whose watermark lies there is rewritten whole (not appended
past that value), so a future-dated row cannot hold back the ordinary rows that come after it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import LateRowsError, RefreshError
from airflow_partitions.keys import PartitionKey, value_to_json
from airflow_partitions.refresh.plan import DiscoveryKind, PartitionWorkItem, Reason, RefreshPlan, key_digest
from airflow_partitions.sources.base import (
    RowsSince,
    Source,
    fingerprint_schema_tag,
    schema_tag,
    tagged_fingerprint,
)
from airflow_partitions.sources.postgres import PostgresSource
from airflow_partitions.sources.renamed import RenamedSource
from airflow_partitions.spec.model import LateRows, RefreshMode

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.catalog import PartitionEntry, Snapshot
    from airflow_partitions.spec.model import DatasetSpec
    from airflow_partitions.storage import DataFile
    from airflow_partitions.transforms import Transform


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


def apply_refresh_mode(
    plan: RefreshPlan,
    dataset: DatasetSpec,
    snapshot: Snapshot | None,
    source: Source | None = None,
    *,
    leave: Collection[str] = (),
) -> RefreshPlan:
    """`plan` under the dataset's refresh mode: in append mode each planned partition the catalog holds
    with rows becomes an append item carrying its watermark; `--full` and re-partitioning rewrite.

    With the `source`, the appends are audited first (`audit_appends`): partitions whose rows at or below
    the watermark differ from the source's, or whose watermark lies in the future, are handled as
    `refresh.late_rows` says, and reported in the plan (`late_rows`, `future_rows`). Only partitions of the
    current layout are audited, and not those in `leave` (during a re-partitioning: rows still in both
    layouts, audited across them by `refresh.layouts.settle_append_layouts`)."""
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
    appended = replace(plan, items=tuple(items), refresh_mode=str(mode), watermark_column=column)
    if source is None:
        return appended
    # Every committed partition is audited, not only the planned ones: a partition left as it was (its
    # fingerprint unchanged since a refresh that reported it) still lacks its late rows.
    planned = {item.key_path for item in items} | set(plan.removed)  # removed: gone from the source
    audited = [*appended.appending]
    for key_path, entry in sorted(snapshot.partitions.items()):
        if key_path in leave or entry.spec_id != plan.spec_id:
            continue
        if key_path not in planned and entry.rows:
            audited.append(
                PartitionWorkItem(
                    key=tuple(entry.key.to_json()),
                    key_path=key_path,
                    reason=Reason.FORCED,
                    fingerprint=entry.source_fingerprint or "",
                    append=True,
                    watermark=value_to_json(partition_watermark(entry, column)),
                )
            )
    return settle_late_rows(appended, dataset, audited, audit_appends(audited, dataset, source, snapshot))


@dataclass(frozen=True)
class AppendAudit:
    """What an append would not see, per partition key path.

    `late`: source rows at or below the partition's watermark (NULL ones included) minus the rows the
    committed partition holds; positive = rows the acceleration lacks (late, or from a transaction that
    was open at the last refresh), negative = rows it holds that the source no longer has there (deleted,
    or moved past the watermark: an append would hold them twice). Only partitions that differ.
    `future`: source rows whose watermark is past now + `max_future_skew_s`, per partition.
    `future_watermark`: appending partitions whose committed watermark is past that bound.
    `past`: source rows past the watermark (the rows the append reads), per partition that has any.
    """

    late: dict[str, int]
    future: dict[str, int]
    future_watermark: tuple[str, ...]
    past: dict[str, int] = field(default_factory=dict)  # source rows past the watermark (non-zero only)


def future_bound(arrow_type: pa.DataType, skew_s: float) -> Any:
    """now + `skew_s` as a value of a watermark column of `arrow_type`; None for integer watermarks (which
    are not times, so nothing is in their future)."""
    import datetime as dt

    import pyarrow as pa

    bound = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=skew_s)
    if pa.types.is_timestamp(arrow_type):
        # A naive timestamp column is read as UTC, as everywhere in the project.
        return bound if arrow_type.tz is not None else bound.replace(tzinfo=None)
    if pa.types.is_date(arrow_type):
        return bound.date()
    return None


def audit_appends(
    appending: Sequence[PartitionWorkItem],
    dataset: DatasetSpec,
    source: Source,
    snapshot: Snapshot,
    held: Mapping[str, int] | None = None,
) -> AppendAudit:
    """Count, per appending partition (`appending`: append items carrying their watermarks), the source
    rows the append would not read against the rows the partition holds, and the source rows with future
    watermarks (see `AppendAudit`).

    Postgres counts in SQL (`count_below_watermarks`: one GROUP BY of the partition expressions and of
    `width_bucket` of the watermark over every partition's watermark, so only counts cross the wire); other
    sources (and partition expressions Postgres cannot compute) give the partition and watermark columns
    only (`read_columns`). The per-partition comparison against each partition's own watermark is one
    DuckDB join either way. `held`: the rows each partition holds, when not its committed entry's alone
    (during a re-partitioning: its rows in both layouts).
    """
    import duckdb
    import pyarrow as pa

    column = dataset.acceleration.refresh.watermark_column
    if column is None or not appending:
        return AppendAudit({}, {}, ())
    transforms = [f.transform for f in dataset.acceleration.partition_by]
    names = dataset.acceleration.partition_names
    mark_type = source.schema().field(column).type
    bound = future_bound(mark_type, dataset.acceleration.refresh.max_future_skew_s)
    marks = [item.watermark_value for item in appending]
    # Counted in the source where it can: thresholds just past each watermark, so that "at or below W"
    # is "fewer thresholds at or below the value than below W's own" (`width_bucket` counts them).
    thresholds = sorted({_just_past(mark) for mark in marks if mark is not None})
    counter = getattr(source, "count_below_watermarks", None)
    rows = counter(transforms, column, thresholds, bound) if counter is not None else None
    if rows is None:
        # The same table, counted here: each value's bucket is the number of thresholds at or below it.
        wanted = list(dict.fromkeys([*(c for t in transforms for c in t.source_columns), column]))
        rows = bucketed_counts(source.read_columns(wanted), transforms, column, thresholds, bound)
    key_types = [rows.column(f"k{i}").type for i in range(len(transforms))]
    ranks = {threshold: index + 1 for index, threshold in enumerate(thresholds)}
    below = "(r.b IS NULL OR (b.rank IS NOT NULL AND r.b < b.rank))"
    key_names = [f"k{i}" for i in range(len(transforms))]
    bounds = pa.table(
        {
            **{
                name: pa.array([item.partition_key.values[i] for item in appending], type=key_types[i])
                for i, name in enumerate(key_names)
            },
            "i": pa.array(range(len(appending)), type=pa.int64()),
            "rank": pa.array(
                [ranks.get(_just_past(mark)) if mark is not None else None for mark in marks],
                type=pa.int64(),
            ),
        }
    )
    same_key = " AND ".join(f"r.{k} IS NOT DISTINCT FROM b.{k}" for k in key_names) or "TRUE"
    group = ", ".join(key_names)
    with duckdb.connect() as con:
        con.register("r", rows)
        con.register("b", bounds)
        unread = con.execute(
            f"SELECT b.i, sum(r.n) AS n FROM b JOIN r ON {same_key} AND {below} GROUP BY b.i"
        ).fetchall()
        total = con.execute(f"SELECT b.i, sum(r.n) AS n FROM b JOIN r ON {same_key} GROUP BY b.i").fetchall()
        future = con.sql(
            f"SELECT {group + ', ' if group else ''}sum(f) AS n FROM r"
            + (f" GROUP BY {group}" if group else "")
            + " HAVING sum(f) > 0"
        ).to_arrow_table()
    counted = {int(i): int(n) for i, n in unread}
    totals = {int(i): int(n) for i, n in total}
    late: dict[str, int] = {}
    past: dict[str, int] = {}
    for index, item in enumerate(appending):
        holds = held[item.key_path] if held is not None else snapshot.partitions[item.key_path].rows
        difference = counted.get(index, 0) - holds
        if difference:
            late[item.key_path] = difference
        if totals.get(index, 0) - counted.get(index, 0):
            past[item.key_path] = totals.get(index, 0) - counted.get(index, 0)
    future_rows: dict[str, int] = {}
    if future.num_rows:
        values = [future.column(k).cast(key_types[i]).to_pylist() for i, k in enumerate(key_names)]
        counts = future.column("n").to_pylist()
        for key, count in zip(zip(*values, strict=True), counts, strict=True):
            future_rows[PartitionKey(tuple(key)).path(names)] = int(count)
    ahead_marks: tuple[str, ...] = ()
    if bound is not None:
        ahead_marks = tuple(
            item.key_path
            for item in appending
            if item.watermark_value is not None and item.watermark_value > bound
        )
    return AppendAudit(late, dict(sorted(future_rows.items())), ahead_marks, past)


def bucketed_counts(
    projected: pa.Table, transforms: Sequence[Any], column: str, thresholds: Sequence[Any], bound: Any
) -> pa.Table:
    """`projected` source columns counted as Postgres' `count_below_watermarks` counts them: per partition
    value (`k0..`) and bucket `b` (the number of sorted `thresholds` at or below the row's `column`, NULL
    for a NULL value), the rows `n` and those past `bound` (`f`)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    values = projected.column(column)
    if bound is None:
        ahead = pa.array(np.zeros(projected.num_rows, dtype=np.int64))
    else:
        ahead = pc.fill_null(pc.greater(values, pa.scalar(bound, type=values.type)), False).cast(pa.int64())
    # Watermark types (integers, dates, timestamps) order as their integer storage does.
    storage = pa.int64() if not pa.types.is_date32(values.type) else pa.int32()
    numbers = values.cast(storage).cast(pa.int64())
    edges = pa.array(thresholds, type=values.type).cast(storage).cast(pa.int64()).to_numpy()
    filled = pc.fill_null(numbers, 0).to_numpy()
    buckets = pa.array(
        np.searchsorted(edges, filled, side="right").astype(np.int64),
        mask=pc.is_null(numbers).to_numpy(zero_copy_only=False),
    )
    keys = {f"k{i}": t.apply_table(projected) for i, t in enumerate(transforms)}
    table = pa.table({**keys, "b": buckets, "f": ahead})
    grouped = table.group_by([*keys, "b"], use_threads=False).aggregate([("f", "sum"), ("f", "count")])
    return pa.table(
        {
            **{name: grouped.column(name) for name in keys},
            "b": grouped.column("b"),
            "n": grouped.column("f_count").cast(pa.int64()),
            "f": grouped.column("f_sum").cast(pa.int64()),
        }
    )


def _just_past(value: Any) -> Any:
    """The smallest watermark value past `value` (microseconds, days, integers: the watermark types)."""
    import datetime as dt

    if isinstance(value, dt.datetime):
        return value + dt.timedelta(microseconds=1)
    if isinstance(value, dt.date):
        return value + dt.timedelta(days=1)
    return value + 1


def settle_late_rows(
    plan: RefreshPlan, dataset: DatasetSpec, audited: Sequence[PartitionWorkItem], audit: AppendAudit
) -> RefreshPlan:
    """`plan` after the audit of `audited`: under `late_rows: rewrite` the partitions that differ become
    whole rewrites (added to the plan when it did not hold them); `report` keeps them appending; `fail`
    raises `LateRowsError`. A partition whose watermark lies in the future is always rewritten whole
    (appending past it would skip the ordinary rows that follow)."""
    policy = dataset.acceleration.refresh.late_rows
    notes = late_rows_notes(
        dataset,
        audit.late,
        where="at or below their watermark",
        causes="late, deleted or moved rows",
        kept="appended as usual",
    )
    if audit.future:
        total = sum(audit.future.values())
        listing = ", ".join(f"{path} ({count:,})" for path, count in list(audit.future.items())[:10])
        notes.append(
            f"{total:,} source row(s) have a watermark past now + "
            f"{dataset.acceleration.refresh.max_future_skew_s:g} s: {listing}"
        )
    rewrite = set(audit.future_watermark)
    if audit.future_watermark:
        notes.append(
            f"{len(audit.future_watermark)} partition(s) have a watermark in the future, rewritten whole: "
            + ", ".join(audit.future_watermark[:10])
        )
    if policy is LateRows.REWRITE:
        rewrite |= set(audit.late)
    items = [
        replace(item, append=False, watermark=None) if item.append and item.key_path in rewrite else item
        for item in plan.items
    ]
    planned = {item.key_path for item in plan.items}
    added = [
        replace(item, append=False, watermark=None)
        for item in audited
        if item.key_path in rewrite and item.key_path not in planned
    ]
    return replace(
        plan,
        items=tuple(sorted([*items, *added], key=lambda item: item.key_path)) if added else tuple(items),
        unchanged=plan.unchanged - len(added),
        notes=(*plan.notes, *notes),
        late_rows=dict(audit.late),
        future_rows=dict(audit.future),
        late_rows_policy=str(policy),
    )


def late_rows_notes(
    dataset: DatasetSpec, late: Mapping[str, int], *, where: str, causes: str, kept: str
) -> list[str]:
    """The note naming the partitions a watermark mode found differing from the source (`late`: source
    minus acceleration, per key path), as `refresh.late_rows` handles them; `fail` raises
    `LateRowsError` naming them instead."""
    if not late:
        return []
    policy = dataset.acceleration.refresh.late_rows
    listing = ", ".join(f"{path} ({count:+,})" for path, count in list(late.items())[:10])
    more = f" and {len(late) - 10} more" if len(late) > 10 else ""
    if policy is LateRows.FAIL:
        raise LateRowsError(
            f"dataset {dataset.name!r}: {len(late)} partition(s) hold a different number of rows {where} "
            f"than the source ({causes}; source minus acceleration): {listing}{more}. Nothing was "
            "published. Refresh with --full, or set refresh.late_rows: rewrite to rewrite those "
            "partitions whole in the refresh",
            dict(late),
        )
    action = "rewritten whole" if policy is LateRows.REWRITE else f"{kept} (late_rows: report)"
    return [f"{len(late)} partition(s) differ from the source {where}, {action}: {listing}{more}"]


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


def changes_watermark(snapshot: Snapshot, column: str, bound: Any = None) -> Any:
    """The largest committed `column` value over every partition: where the next changes read starts.

    Values past `bound` (now + refresh.max_future_skew_s) are not trusted: a file whose maximum lies there
    gives its minimum instead (when that is below the bound), so one future-dated row cannot move the
    start past the ordinary rows that follow it. Starting lower only re-reads rows, which the upsert by
    primary key replaces with themselves.
    """
    best: Any = None
    for entry in snapshot.partitions.values():
        for data_file in entry.files:
            value = file_watermark(data_file, column, entry.key_path)
            if value is not None and bound is not None and value > bound:
                stats = data_file.stats.get(column)
                low = stats.min if stats is not None else None
                value = low if low is not None and low <= bound else None
            if value is not None and (best is None or value > best):
                best = value
    return best


def changes_fallback(
    dataset: DatasetSpec,
    source: Source,
    snapshot: Snapshot | None,
    *,
    selecting: bool,
    full: bool,
    migration: bool = False,
) -> str | None:
    """Why a changes refresh rewrites partitions as a full one does (None: it can upsert changes).
    `migration`: the caller handles a re-partitioning in progress (`refresh.layouts`), so it is no reason;
    else it is one."""
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
    if not migration and snapshot.other_layout(dataset.acceleration.partition_spec_id)[0]:
        return "a re-partitioning is in progress: every partition is rebuilt under the current partition_by"
    tag = schema_tag(source.schema())
    table = snapshot.table
    tags = {fingerprint_schema_tag(fp) for fp in table.column("source_fingerprint").to_pylist()}
    if tags - {None, tag}:
        return "the source schema changed: every partition is rewritten under the new one"
    return None


# How the note on a changes refresh's implied change detection starts (the CLI prints it).
DETECTION_NOTE = "change detection: "


def plan_changes(
    dataset: DatasetSpec,
    source: Source,
    snapshot: Snapshot,
    held: Callable[[PartitionEntry, Sequence[str]], pa.Table] | None = None,
    layouts: Any = None,
) -> RefreshPlan:
    """The changes plan: the rows changed since the committed watermark (read once, keys and partition
    columns only), the partitions they land in now, and the partitions their keys may live in (file
    statistics of the first primary-key column; no statistics = might). Each item carries its committed
    files; the stage reads the changed rows once more, up to the highest value seen here.

    Ties: the read starts AT the watermark (`>=`), so rows updated within the same timestamp as the newest
    committed row are not lost; re-applying one already committed replaces it by key with itself.

    During a re-partitioning (`layouts`, `refresh.layouts.ChangesLayouts`) the old partitions holding a
    changed key go to `migrate`, moved in the refresh's commit; the audit counts the old rows staying."""
    import time

    import pyarrow.compute as pc

    started = time.monotonic()
    acceleration = dataset.acceleration
    column = acceleration.refresh.watermark_column
    keys = acceleration.primary_key
    assert column is not None
    assert keys
    assert isinstance(source, PostgresSource | RenamedSource)  # `changes_fallback` refused the rest
    column_type = source.schema().field(column).type
    bound = future_bound(column_type, acceleration.refresh.max_future_skew_s)
    watermark = changes_watermark(snapshot, column, bound)
    transforms = [f.transform for f in acceleration.partition_by]
    wanted = list(dict.fromkeys([*keys, *(c for t in transforms for c in t.source_columns), column]))
    # A transaction still open may commit rows stamped before rows committed now (`ts = now()` is its
    # start): read only below the oldest open writer's start, so the next read still starts before them.
    open_since = source.oldest_open_write() if bound is not None else None
    changed = source.read_changed(wanted, column, watermark, read_cap(open_since, bound, column_type))
    names = acceleration.partition_names
    upper = pc.max(changed.column(column)).as_py() if changed.num_rows else None
    landing: set[tuple[Any, ...]] = set()
    if changed.num_rows:
        values = [t.apply_table(changed).to_pylist() for t in transforms]
        landing = set(zip(*values, strict=True))
    moving: set[str] = set()
    touched = changes_touched(
        snapshot,
        names,
        landing,
        keys[0],
        changed.column(keys[0]).to_pylist(),
        spec_id=acceleration.partition_spec_id,
        old_holds=layouts.holds if layouts is not None else None,
        moving=moving if layouts is not None else None,
    )
    future_rows = _future_rows(changed, column, column_type, bound, transforms, names)
    tag = schema_tag(source.schema())
    fingerprint = tagged_fingerprint(tag, f"changes-{value_to_json(upper)}")
    items = changes_items(
        snapshot, touched, fingerprint, watermark=value_to_json(watermark), upper=value_to_json(upper)
    )
    # What the changes cannot see (hard deletes, rows changed below the watermark): every partition's
    # source rows against the rows it will hold once the changes are merged.
    old_rows = _old_rows_staying(layouts, moving, changed.select(list(keys)))
    late, unaudited = audit_changes(dataset, source, snapshot, changed, touched, watermark, held, old_rows)
    audit_notes = _changes_audit_notes(dataset, late, unaudited)
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
        notes=_changes_notes(dataset, changed.num_rows, watermark, open_since, future_rows, audit_notes),
        future_rows=dict(sorted(future_rows.items())),
        late_rows=late,
        late_rows_policy=str(acceleration.refresh.late_rows),
        refresh_mode=str(RefreshMode.CHANGES),
        watermark_column=column,
        changed_rows=changed.num_rows,
        changed_partitions=len(items),
        changed_keys=key_digest(changed, keys),
        migrate=tuple(sorted(moving)),
    )


def _changes_audit_notes(
    dataset: DatasetSpec, late: Mapping[str, int], unaudited: Sequence[str]
) -> list[str]:
    """A changes plan's notes on its audit (`audit_changes`): the late rows, the partitions not audited."""
    notes = late_rows_notes(
        dataset,
        late,
        where="after the changes",
        causes="hard deletes, or rows inserted or changed below the watermark",
        kept="changes merged as usual",
    )
    if unaudited:
        notes.append(
            f"{len(unaudited)} changed partition(s) not audited for deletes and late rows (their "
            "committed files are not read in this process; `airflow-partitions refresh` or `verify` does): "
            + ", ".join(unaudited[:10])
        )
    return notes


def _old_rows_staying(layouts: Any, moving: Collection[str], key_rows: pa.Table) -> dict[str, int] | None:
    """Per current key path, its rows in old partitions once the commit moved `moving` (their rows of
    the changed keys leave with the move); None without a re-partitioning in progress."""
    if layouts is None:
        return None
    leaving = layouts.changed_rows(sorted(moving), key_rows)
    return {path: rows - leaving.get(path, 0) for path, rows in layouts.old_rows.items()}


def _changes_notes(
    dataset: DatasetSpec,
    changed: int,
    watermark: Any,
    open_since: Any,
    future_rows: Mapping[str, int],
    audit_notes: Sequence[str],
) -> tuple[str, ...]:
    """The notes of a changes plan: implied detection, rows read, rows from the future, audit findings."""
    acceleration = dataset.acceleration
    column = acceleration.refresh.watermark_column
    return (
        *(
            [f"{DETECTION_NOTE}{acceleration.refresh.detection_reason}"]
            if acceleration.refresh.change_detection is None
            else []
        ),
        f"{changed} row(s) changed since {column} >= {watermark!r}"
        + (f", up to before the oldest open transaction ({open_since.isoformat()})" if open_since else ""),
        *(
            [
                f"{sum(future_rows.values()):,} changed row(s) have a watermark past now + "
                f"{acceleration.refresh.max_future_skew_s:g} s (taken; the next read does not start "
                "there): " + ", ".join(f"{p} ({n:,})" for p, n in sorted(future_rows.items())[:10])
            ]
            if future_rows
            else []
        ),
        *audit_notes,
    )


def read_cap(open_since: Any, bound: Any, column_type: pa.DataType) -> Any:
    """Where a changes read stops: a transaction still open may commit rows stamped before rows committed
    now (`ts = now()` is its start), so read only below the oldest open writer's start (`open_since`),
    and the next read still starts before them. None: no open writer, read up to the newest."""
    import datetime as dt

    if open_since is None:
        return None
    cap = open_since - dt.timedelta(microseconds=1)
    if not isinstance(bound, dt.datetime):  # a date column: stop the day before
        return cap.date() - dt.timedelta(days=1)
    if getattr(column_type, "tz", None) is None:
        return cap.replace(tzinfo=None)
    return cap


def _future_rows(
    changed: pa.Table,
    column: str,
    column_type: pa.DataType,
    bound: Any,
    transforms: Sequence[Transform],
    names: Sequence[str],
) -> dict[str, int]:
    """Changed rows per partition whose watermark is past `bound` (now + the allowed skew)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    future_rows: dict[str, int] = {}
    if bound is None or not changed.num_rows:
        return future_rows
    ahead = pc.fill_null(pc.greater(changed.column(column), pa.scalar(bound, type=column_type)), False)
    later = changed.filter(ahead)
    later_keys = zip(*[t.apply_table(later).to_pylist() for t in transforms], strict=True)
    for key in later_keys:
        path = PartitionKey(tuple(key)).path(names)
        future_rows[path] = future_rows.get(path, 0) + 1
    return future_rows


def audit_changes(
    dataset: DatasetSpec,
    source: Source,
    snapshot: Snapshot,
    changed: pa.Table,
    touched: Mapping[str, PartitionKey],
    watermark: Any,
    held: Callable[[PartitionEntry, Sequence[str]], pa.Table] | None,
    old_rows: Mapping[str, int] | None = None,
) -> tuple[dict[str, int], list[str]]:
    """Per partition, the source's rows minus the rows the acceleration will hold once the `changed` rows
    are merged (only partitions that differ), and the changed partitions that could not be audited.

    The source side is one grouped count (in Postgres, `count_below_watermarks`; only counts cross the
    wire). A partition the changes do not touch will hold what it holds; a touched one holds its rows
    minus those whose key changed (read from its files' key columns through `held`) plus the changed
    rows landing in it. A difference is a hard delete, a row inserted or changed below the watermark, or
    a write that raced the refresh: the refresh cannot see it through the watermark. `old_rows`: rows of
    current key paths still in partitions of older specs (a re-partitioning in progress), held too."""
    import collections

    import duckdb

    acceleration = dataset.acceleration
    column = acceleration.refresh.watermark_column
    assert column is not None
    transforms = [f.transform for f in acceleration.partition_by]
    names = acceleration.partition_names
    thresholds = [_just_past(watermark)] if watermark is not None else []
    counter = getattr(source, "count_below_watermarks", None)
    rows = counter(transforms, column, thresholds, None) if counter is not None else None
    if rows is None:
        wanted = list(dict.fromkeys([*(c for t in transforms for c in t.source_columns), column]))
        rows = bucketed_counts(source.read_columns(wanted), transforms, column, thresholds, None)
    in_source: collections.Counter[str] = collections.Counter()
    key_values = [rows.column(f"k{i}").to_pylist() for i in range(len(transforms))]
    for key, count in zip(zip(*key_values, strict=True), rows.column("n").to_pylist(), strict=True):
        in_source[PartitionKey(tuple(key)).path(names)] += int(count)
    landing: collections.Counter[str] = collections.Counter()
    if changed.num_rows:
        values = [t.apply_table(changed).to_pylist() for t in transforms]
        for key in zip(*values, strict=True):
            landing[PartitionKey(tuple(key)).path(names)] += 1
    keys = list(acceleration.primary_key)
    unaudited: list[str] = []
    late: dict[str, int] = {}
    old_rows = old_rows or {}
    spec_id = acceleration.partition_spec_id
    current = {path for path, entry in snapshot.partitions.items() if entry.spec_id == spec_id}
    for key_path in sorted(set(in_source) | current | set(touched) | set(old_rows)):
        entry = snapshot.partitions.get(key_path)
        holds = (entry.rows if entry is not None else 0) + old_rows.get(key_path, 0)
        if key_path in touched and entry is not None and entry.rows:
            if held is None:
                unaudited.append(key_path)
                continue
            base = held(entry, keys).select(keys)
            quoted = ['"' + k.replace('"', '""') + '"' for k in keys]
            same = " AND ".join(f"c.{q} IS NOT DISTINCT FROM b.{q}" for q in quoted)
            with duckdb.connect() as con:
                con.register("b", base)
                con.register("c", changed.select(keys))
                found = con.execute(
                    f"SELECT count(*) FROM b WHERE EXISTS (SELECT 1 FROM c WHERE {same})"
                ).fetchone()
            holds -= int(found[0]) if found is not None else 0
        holds += landing.get(key_path, 0)
        difference = in_source.get(key_path, 0) - holds
        if difference:
            late[key_path] = difference
    return late, unaudited


def changes_touched(
    snapshot: Snapshot,
    names: Sequence[str],
    landing: Iterable[tuple[Any, ...]],
    key_column: str,
    changed_keys: Sequence[Any],
    *,
    spec_id: str | None = None,
    old_holds: Callable[[PartitionEntry, Sequence[Any]], bool] | None = None,
    moving: set[str] | None = None,
) -> dict[str, PartitionKey]:
    """The partitions a changes refresh rewrites, by key path: those the changed rows land in, and those
    whose files may hold one of the changed keys (its old row, to be replaced or deleted).

    `spec_id`: the current spec; a partition of an older spec holding a changed key (its statistics, then
    `old_holds`, exact) is added to `moving` (the refresh's commit moves it into the current layout,
    its rows of changed keys dropped, `RefreshPlan.migrate`); without `moving` it raises `RefreshError`."""
    touched = {PartitionKey(k).path(names): PartitionKey(k) for k in landing}
    if changed_keys:
        probe = KeyProbe.of(changed_keys)
        for key_path, committed in snapshot.partitions.items():
            if key_path in touched or not probe.may_be_in(committed, key_column):
                continue
            if spec_id is not None and committed.spec_id != spec_id:
                if old_holds is not None and not old_holds(committed, changed_keys):
                    continue
                if moving is not None:
                    moving.add(key_path)
                    continue
                raise RefreshError(
                    f"partition {key_path} of an older partition_by may hold a key changed since the "
                    "watermark, and was not moved into the current layout before the plan (a change "
                    "committed while planning); plan again"
                )
            touched[key_path] = committed.key
    return touched


def changes_items(
    snapshot: Snapshot,
    touched: Mapping[str, PartitionKey],
    fingerprint: str,
    *,
    watermark: Any = None,
    upper: Any = None,
) -> tuple[PartitionWorkItem, ...]:
    """One changes item per touched partition, in key path order, carrying its committed files."""
    items = []
    for key_path in sorted(touched):
        entry = snapshot.partitions.get(key_path)
        items.append(
            PartitionWorkItem(
                key=tuple(touched[key_path].to_json()),
                key_path=key_path,
                reason=Reason.NEW if entry is None else Reason.CHANGED,
                fingerprint=fingerprint,
                changes=True,
                watermark=watermark,
                upper=upper,
                base_files=tuple(entry.files) if entry is not None else (),
            )
        )
    return tuple(items)


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
