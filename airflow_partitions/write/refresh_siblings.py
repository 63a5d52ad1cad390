"""A refresh of selected partitions during a re-partitioning that rewrites, from the source, the sibling
partitions of the old ones holding the selection's rows, instead of reading and moving those old ones.

The move (`write.refresh_moves`) reads each old partition holding rows of the selection, drops its rows of
the selected keys (the refresh rewrites them) and appends the others to their current-layout partitions.
Where a partition's rows are a function of the source, the same end state costs less: the current keys
the old partitions' rows can route to (their siblings: under `bucket(8, id)` -> `bucket(16, id)`, old
bucket 3 holds rows of buckets 3 and 11) join the selection and are rewritten whole from the source in the
refresh's own read, and the old partitions are removed in the same commit without being read. After it,
every sibling holds exactly the source's rows of its key, as a refresh of it would write them.

That holds only when (`plan_siblings` checks each, and says which failed):
- the dataset refreshes in full mode: an append or changes dataset keeps rows the source no longer has, and
  a partition's rows are then not the source's;
- every field of the current `partition_by` is a bucket, so discovery plans every key without asking the
  source (a sibling the source has no row of is written empty, never left to an old partition), and each
  old partition's key bounds the current keys its rows can route to (the same field, or a bucket of the
  same column: a row of old bucket b of N falls in the buckets p of M with p = b mod gcd(M, N));
- the old partitions and the siblings' current partitions hold only rows a refresh wrote whole from the
  source (`PartitionEntry.whole_from_source`: no write, append, merge, move or compaction since), so
  rewriting them from the source loses nothing a write put there;
- the set is closed: every old partition that may hold a row of a sibling (judged by the pruning, each
  under its own spec and by its files' statistics, as the move's search judges them) is one of them.
Otherwise the refresh moves the old partitions as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_partitions.keys import PartitionKey
from airflow_partitions.spec.model import RefreshMode
from airflow_partitions.transforms.bucket import BucketTransform
from airflow_partitions.transforms.parse import plain_transform
from airflow_partitions.write.refresh_moves import buckets_sharing_hash, holding_candidates, stored_at
from airflow_partitions.write.repartition import old_entries

if TYPE_CHECKING:
    from airflow_partitions.catalog import Catalog, PartitionEntry, Snapshot
    from airflow_partitions.table import DatasetHandle
    from airflow_partitions.write.commit import WriteTarget

# More keys than this added to a selection: the move is kept (the closure is a small set of buckets).
MAX_SIBLINGS = 256
# Rounds of widening the selection by the siblings of the old partitions found, then the old partitions
# holding those, before giving up on a closed set.
MAX_ROUNDS = 8


@dataclass(frozen=True)
class SiblingPlan:
    """The verdict for one selection: `siblings` (current keys added to it, rewritten whole from the
    source) and `old` (the old partitions removed unread, key paths in the base) when the refresh may
    rewrite instead of move (`taken`), else `reason`: why the old partitions are moved."""

    taken: bool
    reason: str
    siblings: tuple[PartitionKey, ...] = ()
    old: tuple[str, ...] = ()
    old_rows: int = 0

    def note(self, names: Sequence[str]) -> str:
        """The plan's note: what the refresh does about the old partitions, and why."""
        if not self.taken:
            return (
                "re-partitioning in progress: old partitions holding rows of the selection are moved "
                f"({self.reason})"
            )
        if not self.old:
            return "re-partitioning in progress: no old partition may hold rows of the selection"
        shown = ", ".join(key.path(names) for key in self.siblings[:10])
        more = f" and {len(self.siblings) - 10} more" if len(self.siblings) > 10 else ""
        return (
            f"re-partitioning in progress: {len(self.old)} old partition(s) ({self.old_rows} rows) may hold "
            f"rows of the selection; their sibling partition(s) {shown or '(none)'}{more} are refreshed "
            "from the source with it and the old ones removed unread in the same commit, instead of moved ("
            f"{self.reason})"
        )


def plan_siblings(
    handle: DatasetHandle,
    keys: Sequence[PartitionKey],
    *,
    catalog: Catalog | None = None,
    snapshot: Snapshot | None = None,
) -> SiblingPlan:
    """Whether a refresh of `keys` (current-layout keys) in the catalog version `snapshot` (default: the
    newest; a version seen with the current spec made current: `Catalog.evolved`) may rewrite the sibling
    partitions from the source instead of moving the old partitions (see the module docstring). Reads no
    partition data: the catalog entries, the pruning plan and the keys' arithmetic decide."""
    dataset = handle.dataset
    if dataset.acceleration.refresh.mode is not RefreshMode.FULL:
        return SiblingPlan(
            False,
            f"refresh_mode {dataset.acceleration.refresh.mode}: partitions keep rows the source may lack",
        )
    target = stored_at(handle, catalog, snapshot)
    snapshot = target.snapshot
    if snapshot is None:
        return SiblingPlan(False, "no committed version")
    if not all(isinstance(t, BucketTransform) for t in target.transforms):
        return SiblingPlan(False, "a current partition_by field is not a bucket")
    old = [entry for entry in old_entries(snapshot, target.spec_info.spec_id) if entry.rows]
    wanted = {key.path(target.names): key for key in keys}
    selected = set(wanted)
    held: dict[str, PartitionEntry] = {}
    for _round in range(MAX_ROUNDS):
        candidates, _implied = holding_candidates(target, old, list(wanted.values())) if old else ([], set())
        fresh = [entry for entry in candidates if entry.key_path not in held]
        if not fresh:
            break
        for entry in fresh:
            held[entry.key_path] = entry
            routes = routed_keys(target, snapshot, entry)
            if routes is None:
                return SiblingPlan(
                    False, f"old partition {entry.key_path}'s key does not bound the current keys of its rows"
                )
            for key in routes:
                wanted.setdefault(key.path(target.names), key)
        if len(wanted) - len(selected) > MAX_SIBLINGS:
            return SiblingPlan(
                False, f"its old partitions' rows route to more than {MAX_SIBLINGS} other partitions"
            )
    else:
        return SiblingPlan(False, "no closed set of old partitions and siblings was found")
    unsure = [path for path, entry in held.items() if not entry.whole_from_source]
    if unsure:
        return SiblingPlan(False, f"old partition {unsure[0]} holds rows not written whole from the source")
    siblings = [key for path, key in wanted.items() if path not in selected]
    for key in siblings:
        current = snapshot.partitions.get(key.path(target.names))
        if current is not None and current.rows and not current.whole_from_source:
            return SiblingPlan(
                False, f"partition {key.path(target.names)} holds rows not written whole from the source"
            )
    return SiblingPlan(
        True,
        "full refresh mode, every row of those partitions written whole from the source",
        siblings=tuple(sorted(siblings, key=lambda key: key.path(target.names))),
        old=tuple(sorted(held)),
        old_rows=sum(entry.rows for entry in held.values()),
    )


def routed_keys(target: WriteTarget, snapshot: Snapshot, entry: PartitionEntry) -> list[PartitionKey] | None:
    """Every current key a row of the old partition `entry` can route to, from its key alone; None when a
    current field is bounded by none of its fields (see the module docstring)."""
    import itertools

    spec = snapshot.specs.get(entry.spec_id)
    if spec is None:
        return None
    old_fields = [(plain_transform(f.canonical), f.canonical) for f in spec.fields]
    choices: list[list[Any]] = []
    for transform in target.transforms:
        values = field_values(transform, old_fields, entry.key.values)
        if values is None:
            return None
        choices.append(values)
    return [PartitionKey(tuple(values)) for values in itertools.product(*choices)]


def field_values(
    transform: Any, old_fields: Sequence[tuple[Any, str]], old_key: Sequence[Any]
) -> list[Any] | None:
    """The values one current bucket field can take for a row of an old partition keyed `old_key`."""
    for (_old, canonical), value in zip(old_fields, old_key, strict=True):
        if canonical == transform.canonical:
            return [value]
    for (old, _canonical), value in zip(old_fields, old_key, strict=True):
        if not isinstance(old, BucketTransform) or old.source_columns != transform.source_columns:
            continue
        if value is None:
            return [None]  # the bucket of a NULL value is NULL under any count
        if not isinstance(value, int):
            return None
        return buckets_sharing_hash(transform.num_buckets, old.num_buckets, value)
    return None
