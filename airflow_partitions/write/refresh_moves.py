"""A refresh of selected partitions during a re-partitioning: which old-layout partitions hold rows of the
selection, and the changes that move them into the current layout inside the refresh's own commit.

The search (`old_partitions_holding`) is exact and reads as little as it can. The wanted current keys
become a filter on the source columns (`f(c) = v` for each field, `c IS NULL` for a NULL value; bucket
fields also pin the buckets of another bucket count on the same column that their rows can fall in), and
the pruning planner judges every old partition under its own spec and by its files' statistics, as a read
would: only the partitions it keeps are read (their partition source columns), and their rows routed with
the current transforms. A field the filter cannot express is left out of it, so the candidates are always
a superset of the partitions holding rows of the keys.

The refresh's commit (`refresh.commit.commit_refresh`) then adds `moves_for_refresh`: the old partitions
are read (rows counted against their entries) and routed; rows routing to a partition the refresh rewrites
from the source are superseded by it (not written twice); the others are appended to their current-layout
partitions (a new file each), with conservation checked across the layouts before anything is published.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import (
    CatalogError,
    ConservationError,
    FilterError,
    PartitionSpecError,
    RefreshError,
)
from airflow_partitions.keys import PartitionKey
from airflow_partitions.table.publish import CommitBuilder
from airflow_partitions.transforms.bucket import BucketTransform
from airflow_partitions.transforms.parse import plain_transform
from airflow_partitions.write.commit import (
    PartitionChange,
    WriteOperation,
    prepare_changes,
)
from airflow_partitions.write.merge import delete_rows_by_key
from airflow_partitions.write.repartition import check_moved_rows, moved_changes, old_entries, open_stored
from airflow_partitions.write.routing import partition_groups

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.catalog import Catalog, PartitionEntry, Snapshot
    from airflow_partitions.table import DatasetHandle
    from airflow_partitions.write.commit import WriteTarget


@dataclass(frozen=True)
class HoldingSearch:
    """The old partitions holding rows of the wanted keys, and what the search read to find them."""

    version: int | None  # the catalog version searched
    holding: tuple[PartitionEntry, ...]
    old_partitions: int  # old-layout partitions in the version (with rows)
    read: int  # of them, the candidates whose rows were read and routed

    @property
    def key_paths(self) -> tuple[str, ...]:
        return tuple(entry.key_path for entry in self.holding)


def old_partitions_holding(
    handle: DatasetHandle,
    keys: Sequence[PartitionKey],
    *,
    catalog: Catalog | None = None,
    snapshot: Snapshot | None = None,
    prune: bool = True,
) -> HoldingSearch:
    """The partitions of older specs in the catalog version `snapshot` (default: the newest) holding a
    row that routes to one of `keys` (keys of the current partition_by). Exact: the candidates the pruning
    keeps are read (the partition source columns only) and routed; `prune=False` reads every old
    partition."""

    target = stored_at(handle, catalog, snapshot)
    snapshot = target.snapshot
    if snapshot is None:
        return HoldingSearch(None, (), 0, 0)
    old = [entry for entry in old_entries(snapshot, target.spec_info.spec_id) if entry.rows]
    if not keys or not old:
        return HoldingSearch(snapshot.version, (), len(old), 0)
    candidates, implied = holding_candidates(target, old, keys) if prune else (old, set())
    names = target.names
    wanted = {key.path(names) for key in keys}
    columns = sorted({c for t in target.transforms for c in t.source_columns})
    holding = []
    read = 0
    for entry in candidates:
        if entry.key_path in implied:
            # Its key implies a wanted key for every row (and it has rows): nothing to read.
            holding.append(entry)
            continue
        read += 1
        if routes_to_any(target.read(entry.files, columns), target.transforms, names, wanted):
            holding.append(entry)
    return HoldingSearch(snapshot.version, tuple(holding), len(old), read)


# Rows of an old partition the holding search routes before it looks for a wanted key; doubled each time
# none was found.
FIRST_SLICE_ROWS = 64 * 1024


def routes_to_any(rows: pa.Table, transforms: Sequence[Any], names: Sequence[str], wanted: set[str]) -> bool:
    """Whether a row of `rows` routes to a key path in `wanted` (its keys as routing computes them,
    `partition_groups`). Slices of growing size, so a partition holding one stops at the first slice that
    has one; one without is routed whole."""
    start, size = 0, FIRST_SLICE_ROWS
    while start < rows.num_rows:
        _groups, found = partition_groups(rows.slice(start, size), transforms)
        if any(key.path(names) in wanted for key in found):
            return True
        start, size = start + size, size * 2
    return False


def old_rows_the_source_lost(
    handle: DatasetHandle,
    where: str,
    selects: Callable[[Sequence[tuple[Any, ...]]], Sequence[bool]],
    known: Collection[str],
    *,
    catalog: Catalog | None = None,
    snapshot: Snapshot | None = None,
) -> tuple[HoldingSearch, tuple[str, ...]]:
    """For a refresh selecting by `where` during a re-partitioning: the current keys its selection covers
    (`selects`, the refresh's key selector) that rows of old partitions route to but the refresh neither
    writes nor removes (`known`: its key paths), i.e. keys the source no longer has. Their rows must go
    with the refresh, as a partition of the current layout the source lost is removed. The old partitions
    that may hold rows matching `where` (judged under their own specs and file statistics) are read (the
    partition source columns) and routed. (The old partitions holding such keys, the keys' paths.)"""
    from airflow_partitions.pruning import (  # lazy: loads pyarrow
        PartitionIndex,
        plan_partitions,
    )

    target = stored_at(handle, catalog, snapshot)
    snapshot = target.snapshot
    if snapshot is None:
        return HoldingSearch(None, (), 0, 0), ()
    old = [entry for entry in old_entries(snapshot, target.spec_info.spec_id) if entry.rows]
    try:
        chosen = {
            s.key_path
            for s in plan_partitions(PartitionIndex.from_snapshot(snapshot, target.schema), where).selected
        }
        candidates = [entry for entry in old if entry.key_path in chosen]
    except (FilterError, PartitionSpecError, CatalogError):
        candidates = old
    names = target.names
    columns = sorted({c for t in target.transforms for c in t.source_columns})
    unseen: dict[str, PartitionKey] = {}
    held: dict[str, list[PartitionEntry]] = {}
    for entry in candidates:
        _groups, found = partition_groups(target.read(entry.files, columns), target.transforms)
        for key in found:
            path = key.path(names)
            if path not in known:
                unseen[path] = key
                held.setdefault(path, []).append(entry)
    paths = sorted(unseen)
    covered = selects([unseen[path].values for path in paths]) if paths else []
    vanished = tuple(path for path, hit in zip(paths, covered, strict=True) if hit)
    holding = {entry.key_path: entry for path in vanished for entry in held[path]}
    search = HoldingSearch(snapshot.version, tuple(holding.values()), len(old), len(candidates))
    return search, vanished


def stored_at(handle: DatasetHandle, catalog: Catalog | None, snapshot: Snapshot | None) -> WriteTarget:
    """The write target (`open_stored`) on `snapshot` (a version, or one seen with the current spec made
    current: `Catalog.evolved`) instead of the newest version, when given."""
    target = open_stored(handle, catalog)
    if snapshot is not None:
        target.snapshot = snapshot
    return target


def holding_candidates(
    target: WriteTarget, old: Sequence[PartitionEntry], keys: Sequence[PartitionKey]
) -> tuple[list[PartitionEntry], set[str]]:
    """The entries of `old` that may hold a row of one of `keys`: pruned by `key_filter`, each partition
    judged under its own spec and by its files' statistics. All of `old` when no filter can be built.
    Also the key paths of those the plan judges exact when the filter pins every field of the current
    spec: every row of such a partition routes to one of `keys`, so (having rows) it holds one without
    a read (a day partition under a month key, a bucket of 16 under a bucket of 8 on the same column)."""
    from airflow_partitions.pruning import (  # lazy: loads pyarrow
        PartitionIndex,
        plan_partitions,
    )

    snapshot = target.snapshot
    assert snapshot is not None
    groups = key_filter(target, keys)
    if groups is None:
        return list(old), set()
    try:
        plan = plan_partitions(PartitionIndex.from_snapshot(snapshot, target.schema), groups)
    except (FilterError, PartitionSpecError, CatalogError):
        # A value the filter cannot bind, or an old spec the index cannot bind: read them all (exact
        # either way, only slower).
        return list(old), set()
    chosen = {selected.key_path for selected in plan.selected}
    complete = all(_pinned(t) for t in target.transforms)
    implied = {selected.key_path for selected in plan.selected if selected.exact} if complete else set()
    return [entry for entry in old if entry.key_path in chosen], implied


def _pinned(transform: Any) -> bool:
    """Whether `key_filter` pins this field of the current spec (one source column, NULL kept apart)."""
    return len(transform.source_columns) == 1 and bool(transform.null_preserving)


def key_filter(target: WriteTarget, keys: Sequence[PartitionKey]) -> list[list[tuple[str, str, Any]]] | None:
    """A DNF filter on the source columns true for every row routing to one of `keys` (one group per
    key); None when no field of the current spec can be expressed (one source column, NULL kept apart)."""
    snapshot = target.snapshot
    assert snapshot is not None
    transforms = target.transforms
    usable = [n for n, t in enumerate(transforms) if _pinned(t)]
    if not usable:
        return None
    others = [
        plain_transform(f.canonical)
        for spec_id, spec in snapshot.specs.items()
        if spec_id != target.spec_info.spec_id
        for f in spec.fields
    ]
    old_buckets = [t for t in others if isinstance(t, BucketTransform)]  # (None: not a plain built-in)
    groups: list[list[tuple[str, str, Any]]] = []
    for key in keys:
        group: list[tuple[str, str, Any]] = []
        for position in usable:
            transform, value = transforms[position], key.values[position]
            column = transform.source_columns[0]
            if value is None:
                group.append((column, "is", None))
                continue
            group.append((transform.canonical, "=", value))
            if isinstance(transform, BucketTransform):
                group.extend(_bucket_pins(transform, value, old_buckets))
        groups.append(group)
    return groups


def _bucket_pins(
    transform: BucketTransform, bucket: Any, old: Sequence[BucketTransform]
) -> list[tuple[str, str, Any]]:
    """`bucket(N, c) IN (...)` for each old bucket field on the same column: a row in bucket `bucket` of
    `bucket(M, c)` has hash h with h mod M = bucket, so h mod gcd(M, N) = bucket mod gcd(M, N), which
    leaves N / gcd(M, N) of the N old buckets."""
    pins: list[tuple[str, str, Any]] = []
    if not isinstance(bucket, int):
        return pins
    for other in old:
        if other.source_columns != transform.source_columns or other.num_buckets == transform.num_buckets:
            continue
        pins.append(
            (other.canonical, "in", buckets_sharing_hash(other.num_buckets, transform.num_buckets, bucket))
        )
    return pins


def buckets_sharing_hash(count: int, other_count: int, bucket: int) -> list[int]:
    """The buckets of `bucket(count, c)` a row in bucket `bucket` of `bucket(other_count, c)` (same column)
    can fall in: its hash h has h mod other_count = bucket, so h mod gcd = bucket mod gcd."""
    step = math.gcd(count, other_count)
    return [b for b in range(count) if b % step == bucket % step]


@dataclass
class RefreshMoves:
    """The old partitions a refresh's commit moves, and the entries they leave in the current layout."""

    upserts: list[PartitionEntry] = field(default_factory=list)  # current-layout partitions gaining rows
    removes: list[str] = field(default_factory=list)  # the old partitions (key paths in the base)
    counts: dict[str, int] = field(default_factory=dict)  # recorded as the commit's `migrated`


def moves_for_refresh(
    handle: DatasetHandle,
    catalog: Catalog,
    base_version: int | None,
    old_paths: Collection[str],
    *,
    superseded: Collection[str],
    appended: Mapping[str, PartitionEntry],
    changed_keys: pa.Table | None = None,
    base: Snapshot | None = None,
) -> RefreshMoves:
    """The changes moving the old partitions `old_paths` (of `base_version`) into the current layout in
    a refresh's commit. Rows routing to a `superseded` partition (one the refresh rewrites whole from the
    source, or removes) are dropped with their old partition: the refresh holds them as the source has
    them. Every other row is appended to the current partition of its key: to its entry in the base, or,
    for a partition the refresh appends to or merges changes into (`appended`: its new entry), to that
    entry. `changed_keys` (a changes refresh: the primary keys it upserted or deleted): moved rows of those
    keys are dropped first, wherever they route (the merge placed their new rows, or deleted them).
    `base`: the version `base_version` as the plan saw it, when that was not the stored version
    (`Catalog.evolved`, the first refresh after a `partition_by` change).

    Checked before anything is published (`ConservationError`): rows read from each old partition == rows
    its entry records; rows read == rows routed (superseded + appended); per partition gaining rows, rows
    routed to it == rows added to its files."""

    target = stored_at(handle, catalog, base)
    if base is None and target.base_version != base_version:
        target.snapshot = catalog.snapshot(base_version) if base_version is not None else None
    snapshot = target.snapshot
    absent = [path for path in old_paths if snapshot is None or path not in snapshot.partitions]
    if absent:
        raise RefreshError(
            f"dataset {handle.dataset.name!r}: the plan moves old-layout partitions {absent[:5]} that "
            f"version {base_version} does not hold; plan again"
        )
    assert snapshot is not None
    batch = [snapshot.partitions[path] for path in old_paths]
    changes, rows_in, added = moved_changes(target, batch)
    rows_moved = sum(entry.rows for entry in batch)
    check_moved_rows(handle.dataset.name, rows_moved, rows_in.num_rows, added)
    kept: list[PartitionChange] = []
    dropped: dict[str, int] = {}
    changed_rows = 0
    keys = list(handle.dataset.acceleration.primary_key)
    for change in changes:
        if changed_keys is not None and not change.drop and change.added is not None and keys:
            removal = delete_rows_by_key(change.added, changed_keys, keys)
            changed_rows += removal.removed
            change = replace(change, added=removal.table)
        if not change.drop and change.key_path in superseded:
            dropped[change.key_path] = change.rows_added
            continue
        merged = appended.get(change.key_path) if not change.drop else None
        if merged is not None:
            change = PartitionChange(
                change.key, change.key_path, merged, kept=list(merged.files), added=change.added
            )
        kept.append(change)
    rows_appended = sum(change.rows_added for change in kept)
    accounted = rows_appended + sum(dropped.values()) + changed_rows
    if accounted != rows_moved:
        raise ConservationError(
            handle.dataset.name,
            {"[old layout -> new layout]": (rows_moved, accounted)},
            expected="rows of the old partitions moved",
            actual="rows superseded by the refresh (or of keys it changed) + rows appended to partitions",
            hint="Moving the old partitions would lose or duplicate rows; nothing was published.",
        )
    builder = CommitBuilder(catalog, "refresh", base_version, target.spec_info)
    prepare_changes(
        builder, target, WriteOperation.REPARTITION, kept, rows_in=rows_appended, keep_fingerprints=False
    )
    return RefreshMoves(
        upserts=list(builder.upserts),
        removes=list(builder.removes),
        counts={
            "partitions": len(batch),
            "rows": rows_moved,
            "superseded": sum(dropped.values()) + changed_rows,
            "changed_keys": changed_rows,
            "appended": rows_appended,
            "appended_partitions": sum(1 for change in kept if not change.drop),
        },
    )
