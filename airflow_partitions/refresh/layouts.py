"""Watermark refreshes (`refresh_mode: append`, `changes`) while a re-partitioning is in progress.

During a migration a row of a current-layout partition K may still sit in a partition of an older spec.
A refresh must never leave a row in two layouts or in none, and must not rebuild everything either. The
rule is the same as for a refresh of selected partitions: planning judges the not-yet-moved version across
both layouts and names the old partitions the refresh needs in `RefreshPlan.migrate`; the refresh's own
commit moves them (`write.refresh_moves.moves_for_refresh`, checked across the layouts), so a refresh is
one catalog version and a failed or killed one leaves the version it started from. Every other old
partition is left.

Which current partitions a refresh changes is judged across both layouts (`old_holdings`: the source
columns of the current partition fields, and the watermark column, read from each old partition and routed
under the current spec):
- append: K's watermark is the largest over its current files and its rows in old partitions; K changes
  when the source has rows of K past it, or when the source's rows of K at or below it differ in number
  from the rows K holds in both layouts (late, deleted or moved rows, handled as `refresh.late_rows` says).
  Its old holders move in the commit: K's old rows join its appended entry, or are superseded by its
  rewrite;
- changes: the old partitions holding a changed key (the old position of an update, exact) move in the
  commit, their rows of changed keys dropped (the merge placed the changed rows) and the rest joining
  their partitions; the audit counts K's rows in both layouts, less those that leave.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from airflow_partitions.catalog.model import split_key_path
from airflow_partitions.keys import PartitionKey, value_to_json
from airflow_partitions.refresh.modes import (
    AppendAudit,
    KeyProbe,
    audit_appends,
    late_rows_notes,
    partition_watermark,
)
from airflow_partitions.refresh.plan import PartitionWorkItem, Reason, RefreshPlan
from airflow_partitions.spec.model import LateRows
from airflow_partitions.write.commit import open_write_target
from airflow_partitions.write.repartition import old_entries
from airflow_partitions.write.routing import route_to_paths

if TYPE_CHECKING:
    from airflow_partitions.catalog import Catalog, PartitionEntry, Snapshot
    from airflow_partitions.sources import Source
    from airflow_partitions.spec.model import DatasetSpec
    from airflow_partitions.table import DatasetHandle

OldPartition = tuple[str, str]  # (spec id, plain key path), as `repartition(only=...)` takes them


@dataclass
class Holding:
    """The rows of one current-layout partition still held by partitions of older specs."""

    key: PartitionKey
    partitions: set[OldPartition] = field(default_factory=set)
    paths: set[str] = field(default_factory=set)  # the same partitions' key paths in the catalog
    rows: int = 0
    watermark: Any = None  # the largest watermark of those rows (None: none asked, or all NULL)


def migration_in_progress(snapshot: Snapshot | None, dataset: DatasetSpec) -> bool:
    """Whether the version's current spec is the dataset's and partitions of older specs are left."""
    spec_id = dataset.acceleration.partition_spec_id
    return (
        snapshot is not None
        and snapshot.partition_spec.spec_id == spec_id
        and bool(snapshot.other_layout(spec_id)[0])
    )


def old_holdings(
    handle: DatasetHandle, catalog: Catalog, watermark_column: str | None = None
) -> dict[str, Holding]:
    """Per current key path, the old partitions holding its rows, how many, and their largest
    `watermark_column` value. Exact: each old partition's source columns of the current fields (and the
    watermark column) are read and routed under the current spec; no other column is read."""
    import pyarrow.compute as pc

    target = open_write_target(handle, catalog=catalog)
    holdings: dict[str, Holding] = {}
    if target.snapshot is None:
        return holdings
    columns = {c for t in target.transforms for c in t.source_columns}
    if watermark_column is not None:
        columns.add(watermark_column)
    for entry in old_entries(target.snapshot, target.spec_info.spec_id):
        if not entry.rows:
            continue
        rows = target.read(entry.files, sorted(columns))
        old = (entry.spec_id, split_key_path(entry.key_path)[1])
        routed = route_to_paths(rows, target.transforms, target.names, dataset=handle.dataset.name)
        for key_path, (key, part) in routed.items():
            holding = holdings.setdefault(key_path, Holding(key))
            holding.partitions.add(old)
            holding.paths.add(entry.key_path)
            holding.rows += part.num_rows
            if watermark_column is not None:
                mark = pc.max(part.column(watermark_column)).as_py()
                if mark is not None and (holding.watermark is None or mark > holding.watermark):
                    holding.watermark = mark
    return holdings


def still_split(holdings: Mapping[str, Holding], moved: Collection[OldPartition]) -> frozenset[str]:
    """Current key paths with rows left in old partitions once `moved` are moved."""
    gone = set(moved)
    return frozenset(path for path, holding in holdings.items() if holding.partitions - gone)


# --- append -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AppendLayouts:
    """An append refresh's view across both layouts: per current key path with rows in old partitions,
    the rows it holds in both and an append item carrying its watermark over both (`items`), the audit of
    those items against the source, and the current key paths the append changes."""

    holdings: dict[str, Holding]
    held: dict[str, int]
    items: dict[str, PartitionWorkItem]
    audit: AppendAudit
    changing: frozenset[str]

    @property
    def moving(self) -> tuple[str, ...]:
        """The old partitions (key paths in the base) holding a row of a partition the append changes:
        the refresh's commit moves them (`RefreshPlan.migrate`)."""
        return tuple(sorted({p for key_path in self.changing for p in self.holdings[key_path].paths}))

    def source_rows(self, key_path: str) -> int:
        """The source's rows of a held key path (below its watermark, past it: both audited)."""
        audit = self.audit
        return self.held[key_path] + audit.late.get(key_path, 0) + audit.past.get(key_path, 0)


def settle_append_layouts(
    handle: DatasetHandle, source: Source, catalog: Catalog, snapshot: Snapshot
) -> AppendLayouts:
    """Before an append refresh during a migration: which current partitions with rows in old partitions
    the append changes, judged across both layouts (see the module docstring). Nothing moves here (the
    refresh's commit does); under `late_rows: fail` differing partitions raise `LateRowsError` here."""
    dataset = handle.dataset
    column = dataset.acceleration.refresh.watermark_column
    assert column is not None  # append requires it
    holdings = old_holdings(handle, catalog, column)
    items: dict[str, PartitionWorkItem] = {}
    held: dict[str, int] = {}
    for key_path, holding in sorted(holdings.items()):
        entry = snapshot.partitions.get(key_path)
        marks = [holding.watermark]
        if entry is not None and entry.rows:
            marks.append(partition_watermark(entry, column))
        known = [mark for mark in marks if mark is not None]
        held[key_path] = holding.rows + (entry.rows if entry is not None else 0)
        items[key_path] = PartitionWorkItem(
            key=tuple(holding.key.to_json()),
            key_path=key_path,
            reason=Reason.FORCED,
            fingerprint="",
            append=True,
            watermark=value_to_json(max(known)) if known else None,
        )
    audit = audit_appends(list(items.values()), dataset, source, snapshot, held=held)
    if dataset.acceleration.refresh.late_rows is LateRows.FAIL:
        # Raises `LateRowsError` naming them, before anything is written.
        _late_rows_notes(dataset, audit.late)
    changing = frozenset(set(audit.late) | set(audit.past) | set(audit.future_watermark))
    return AppendLayouts(holdings, held, items, audit, changing)


def _late_rows_notes(dataset: DatasetSpec, late: Mapping[str, int]) -> list[str]:
    """`modes.late_rows_notes` for partitions audited across both layouts (`LateRowsError` under
    `late_rows: fail`)."""
    return late_rows_notes(
        dataset,
        late,
        where="at or below their watermark (rows in both layouts counted)",
        causes="late, deleted or moved rows",
        kept="appended as usual",
    )


def append_across_layouts(
    plan: RefreshPlan, found: RefreshPlan, dataset: DatasetSpec, snapshot: Snapshot, layouts: AppendLayouts
) -> RefreshPlan:
    """`plan` (the append plan of the partitions without rows in old ones) with the partitions that do:
    those the append changes become append items on their watermark over both layouts (their old rows
    join the appended entry in the commit), or whole rewrites (late rows under `rewrite`, a future
    watermark, no current entry yet; their old rows superseded), or, gone from the source, vanished keys
    (their old rows dropped); the others are left out. `found`: the discovery before the refresh mode."""
    audit = layouts.audit
    rewrite = set(audit.future_watermark)
    if dataset.acceleration.refresh.late_rows is LateRows.REWRITE:
        rewrite |= set(audit.late)
    discovered = {item.key_path: item for item in found.items}
    items = [item for item in plan.items if item.key_path not in layouts.holdings]
    vanished: list[str] = []
    for key_path in sorted(layouts.changing):
        if layouts.source_rows(key_path) == 0:
            if key_path not in plan.removed:
                vanished.append(key_path)
            continue
        item = discovered.get(key_path, layouts.items[key_path])
        entry = snapshot.partitions.get(key_path)
        if key_path in rewrite or entry is None or not entry.rows:
            items.append(replace(item, append=False, watermark=None))
        else:
            items.append(replace(item, append=True, watermark=layouts.items[key_path].watermark))
    notes = _late_rows_notes(dataset, audit.late)
    if audit.future_watermark:
        notes.append(
            f"{len(audit.future_watermark)} partition(s) with rows in both layouts have a watermark in the "
            "future, rewritten whole: " + ", ".join(audit.future_watermark[:10])
        )
    moving = layouts.moving
    left = still_split(
        layouts.holdings, {old for p in layouts.changing for old in layouts.holdings[p].partitions}
    )
    notes.append(
        f"re-partitioning in progress: {len(moving)} old partition(s) holding rows of the "
        f"{len(layouts.changing)} partition(s) this append changes move into the current layout in its "
        f"commit; {len(left)} partition(s) with rows still in both layouts have nothing to append and are "
        "left"
    )
    return replace(
        plan,
        items=tuple(sorted(items, key=lambda item: item.key_path)),
        unchanged=max(0, plan.unchanged + len(plan.items) - len(items)),
        notes=(*plan.notes, *notes),
        late_rows={**(plan.late_rows or {}), **audit.late},
        future_rows={**(plan.future_rows or {}), **audit.future},
        migrate=moving,
        vanished=(*plan.vanished, *vanished),
    )


def without_partitions(plan: RefreshPlan, left: Collection[str]) -> RefreshPlan:
    """`plan` without items for the key paths `left` (their rows are exact in both layouts)."""
    if not left:
        return plan
    kept = tuple(item for item in plan.items if item.key_path not in left)
    return replace(plan, items=kept, unchanged=plan.unchanged + len(plan.items) - len(kept))


# --- changes ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChangesLayouts:
    """What a changes plan needs of the old partitions: the rows each current key path still has there
    (its audit counts them as held), whether one of them holds a changed key (`holds`: the plan names it
    in `migrate`, the refresh's commit moves it), and, of the old partitions it moves, the rows of changed
    keys per current key path they route to (`changed_rows`: they leave with the move; the last answer is
    kept in `leaving`, for a rewrite of the late partitions, which must rewrite those key paths too)."""

    old_rows: dict[str, int]
    holds: Callable[[PartitionEntry, Sequence[Any]], bool]
    changed_rows: Callable[[Sequence[str], Any], dict[str, int]]
    leaving: dict[str, int] = field(default_factory=dict)


def changes_layouts(handle: DatasetHandle, catalog: Catalog, snapshot: Snapshot) -> ChangesLayouts:
    """For a changes refresh during a migration (see `ChangesLayouts`); nothing moves here."""
    holdings = old_holdings(handle, catalog)
    leaving: dict[str, int] = {}

    def changed_rows(paths: Sequence[str], key_rows: Any) -> dict[str, int]:
        leaving.clear()
        leaving.update(changed_rows_of(handle, catalog, snapshot, paths, key_rows))
        return dict(leaving)

    old_rows = {path: holding.rows for path, holding in holdings.items()}
    return ChangesLayouts(old_rows, key_holder(handle, catalog), changed_rows, leaving)


def changed_rows_of(
    handle: DatasetHandle, catalog: Catalog, snapshot: Snapshot, paths: Sequence[str], key_rows: Any
) -> dict[str, int]:
    """Per current key path, the rows of the old partitions `paths` (of `snapshot`) whose primary key is
    among `key_rows`' (matched as the merge matches them), routed under the current spec."""
    from airflow_partitions.write.merge import key_match_mask  # lazy: loads pyarrow

    target = open_write_target(handle, catalog=catalog)
    keys = list(handle.dataset.acceleration.primary_key)
    columns = sorted({c for t in target.transforms for c in t.source_columns} | set(keys))
    counts: dict[str, int] = {}
    if not paths or not key_rows.num_rows:
        return counts
    for path in paths:
        entry = snapshot.partitions[path]
        rows = target.read(entry.files, columns)
        rows = rows.filter(key_match_mask(rows, key_rows, keys))
        routed = route_to_paths(rows, target.transforms, target.names, dataset=handle.dataset.name)
        for key_path, (_key, part) in routed.items():
            counts[key_path] = counts.get(key_path, 0) + part.num_rows
    return counts


def key_holder(handle: DatasetHandle, catalog: Catalog) -> Callable[[PartitionEntry, Sequence[Any]], bool]:
    """Whether a partition holds one of some values of the first primary-key column: its statistics
    first (`KeyProbe`), then that column of its files (exact membership, NULL matching NULL; a
    floating-point key keeps the statistics' answer)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    key = handle.dataset.acceleration.primary_key[0]
    target = open_write_target(handle, catalog=catalog)

    def holds(entry: PartitionEntry, values: Sequence[Any]) -> bool:
        if not values or not KeyProbe.of(values).may_be_in(entry, key):
            return False
        column = target.read(entry.files, [key]).column(key)
        if pa.types.is_floating(column.type):
            return True
        wanted = pa.array(list(values), type=column.type)
        return bool(pc.any(pc.is_in(column, value_set=wanted)).as_py())

    return holds


def holders_of(holdings: Mapping[str, Holding], key_paths: Sequence[str]) -> set[str]:
    """The old partitions (key paths in the catalog) holding a row of one of `key_paths`."""
    return {old for path in key_paths if path in holdings for old in holdings[path].paths}
