"""Online re-partitioning: move partitions written under an older `partition_by` into the current one,
a bounded batch per atomic commit, while reads, refreshes and writes go on.

A catalog version may hold partitions of several specs. The first step after a `partition_by` change
makes the new spec current (`Catalog.evolution_changes`: partitions of the old spec move to qualified key
paths, `@<spec id>/<key path>`): it plans on the newest version seen that way (`Catalog.evolved`) and its
own commit makes the switch too (`CommitBuilder.fold_switch`, based on the newest version), as the first
refresh of selected partitions does. Each batch reads the rows
of a few old partitions, routes them with the current transforms (`write.routing.route_rows`), appends them
to the new-layout partitions of their keys (a new file beside the partition's files) and removes the old
partitions, in one commit through `write.commit.commit_changes`. Conservation is checked across the two
layouts before anything is published: rows read back from the old files == rows the old entries record ==
rows routed == rows added, in total and per new partition (`ConservationError`; the files written are then
unreferenced and vacuum removes them). Reverting `partition_by` runs the same steps the other way.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_partitions.catalog.model import split_key_path
from airflow_partitions.exceptions import (
    ConservationError,
    PartitionSpecChangedError,
    SpecValidationError,
    WriteError,
)
from airflow_partitions.table.publish import CommitBuilder
from airflow_partitions.write.commit import PartitionChange, WriteOperation, commit_changes, open_write_target
from airflow_partitions.write.routing import route_to_paths

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.catalog import Catalog, PartitionEntry
    from airflow_partitions.table import DatasetHandle
    from airflow_partitions.write.commit import PartitionChange, WriteTarget

# Old partitions one batch moves when neither --max-partitions nor --max-rows is given.
DEFAULT_BATCH_PARTITIONS = 64


@dataclass(frozen=True)
class RepartitionReport:
    """What one re-partitioning step did (or, in a dry run, would do) and what is left after it."""

    dataset: str
    dry_run: bool
    to_spec: str
    base_version: int | None
    version: int | None  # the batch's commit (None: dry run, or nothing to move)
    started_layout: bool  # this step made the new spec current (in its commit)
    moved: tuple[str, ...]  # old partitions moved (their key paths in the base)
    rows_moved: int
    written: tuple[str, ...]  # new-layout partitions that received rows
    partitions_left: int
    rows_left: int
    elapsed_s: float

    @property
    def done(self) -> bool:
        return self.partitions_left == 0

    def to_json(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "dry_run": self.dry_run,
            "to_spec": self.to_spec,
            "base_version": self.base_version,
            "version": self.version,
            "started_layout": self.started_layout,
            "moved_partitions": list(self.moved),
            "rows_moved": self.rows_moved,
            "written_partitions": list(self.written),
            "partitions_left": self.partitions_left,
            "rows_left": self.rows_left,
            "done": self.done,
            "elapsed_s": round(self.elapsed_s, 6),
        }

    def describe(self) -> str:
        verb = "would move" if self.dry_run else "moved"
        head = f"{self.dataset}: {verb} {len(self.moved)} old partition(s), {self.rows_moved} rows"
        if self.written:
            head += f", into {len(self.written)} partition(s) of spec {self.to_spec}"
        if self.version is not None:
            head += f" (version {self.version})"
        left = (
            "re-partitioning complete: every partition is under the current partition_by"
            if self.done and not self.dry_run
            else f"{self.partitions_left} old partition(s), {self.rows_left} rows left"
        )
        return f"{head}; {left}"


def pick_batch(
    entries: list[PartitionEntry], max_partitions: int | None, max_rows: int | None
) -> list[PartitionEntry]:
    """The old partitions of one batch, in key-path order: at most `max_partitions`, and partitions
    while their rows stay within `max_rows` (always at least one, so a batch never stalls)."""
    if max_partitions is None and max_rows is None:
        max_partitions = DEFAULT_BATCH_PARTITIONS
    chosen: list[PartitionEntry] = []
    rows = 0
    for entry in sorted(entries, key=lambda e: e.key_path):
        if max_partitions is not None and len(chosen) >= max_partitions:
            break
        if max_rows is not None and chosen and rows + entry.rows > max_rows:
            break
        chosen.append(entry)
        rows += entry.rows
    return chosen


def repartition(
    handle: DatasetHandle,
    *,
    max_partitions: int | None = None,
    max_rows: int | None = None,
    dry_run: bool = False,
    catalog: Catalog | None = None,
    commit_id: str | None = None,
    only: Collection[tuple[str, str]] | None = None,
) -> RepartitionReport:
    """Move one batch of partitions written under another spec into the dataset's current partition_by.

    Returns what moved and what is left; a dataset with nothing to move commits nothing. The first call
    after a `partition_by` change also makes the new spec current, in the batch's commit (alone when
    there is nothing to move).
    `only`: move exactly these old partitions, as `(spec id, plain key path)` (`old_partitions_holding`),
    however many they are.
    """

    if max_partitions is not None and max_partitions < 1:
        raise WriteError(f"max_partitions must be at least 1, not {max_partitions}")
    if max_rows is not None and max_rows < 1:
        raise WriteError(f"max_rows must be at least 1, not {max_rows}")
    started = time.monotonic()
    dataset = handle.dataset
    target = open_stored(handle, catalog)
    spec = target.spec_info
    stored = target.snapshot
    # The first step after a change plans on the version seen with the new spec current; its commit
    # makes the switch too (nothing to move: the switch alone).
    switching = stored is not None and stored.partition_spec.spec_id != spec.spec_id
    if stored is not None and switching:
        target.snapshot = target.catalog.evolved(stored, spec)
    snapshot = target.snapshot
    started_layout = switching and not dry_run
    base_version = snapshot.version if snapshot is not None else None
    old = old_entries(snapshot, spec.spec_id) if snapshot is not None else []
    if only is not None:
        wanted = set(only)
        batch = [e for e in old if (e.spec_id, split_key_path(e.key_path)[1]) in wanted]
    else:
        batch = pick_batch(old, max_partitions, max_rows)
    rows_moved = sum(e.rows for e in batch)
    left = (len(old) - len(batch), sum(e.rows for e in old) - rows_moved)

    def report(version: int | None, written: tuple[str, ...]) -> RepartitionReport:
        return RepartitionReport(
            dataset=dataset.name,
            dry_run=dry_run,
            to_spec=spec.spec_id,
            base_version=base_version,
            version=version,
            started_layout=started_layout,
            moved=tuple(e.key_path for e in batch),
            rows_moved=rows_moved,
            written=written,
            partitions_left=left[0] if not dry_run else len(old),
            rows_left=left[1] if not dry_run else sum(e.rows for e in old),
            elapsed_s=time.monotonic() - started,
        )

    if not batch or dry_run:
        if started_layout:
            target.snapshot = stored
            start_layout(target)
            return report(target.catalog.head_version(), ())
        return report(None, ())
    changes, rows_in, added = moved_changes(target, batch)
    check_moved_rows(dataset.name, rows_moved, rows_in.num_rows, added)
    result = commit_changes(
        target,
        WriteOperation.REPARTITION,
        changes,
        rows_in=rows_in.num_rows,
        commit_id=commit_id or f"repartition-{uuid.uuid4().hex}",
        keep_fingerprints=False,
        started=started,
        switch_from=stored if started_layout else None,
    )
    return report(result.version, tuple(sorted(added)))


def start_layout(target: WriteTarget) -> bool:
    """Make the dataset's partition_by the catalog's current spec, when the newest version is under
    another: one commit that moves the old partitions to qualified key paths and changes no row or file
    (`Catalog.evolution_changes`). Whether it committed."""
    snapshot, spec = target.snapshot, target.spec_info
    if snapshot is None or snapshot.partition_spec.spec_id == spec.spec_id:
        return False
    upserts, removes = target.catalog.evolution_changes(snapshot, spec)
    builder = CommitBuilder(target.catalog, "repartition-start", snapshot.version, spec)
    builder.add(upserts)
    builder.remove(removes)
    builder.count({"renamed": len(upserts), "rows": sum(e.rows for e in upserts)})
    builder.commit(evolve=True)
    return True


def moved_changes(
    target: WriteTarget, batch: Sequence[PartitionEntry]
) -> tuple[list[PartitionChange], pa.Table, dict[str, int]]:
    """The changes that move `batch` (old-layout partitions) into the current layout: each old partition
    dropped, its rows (read back and counted against its entry) routed to current partitions, which
    keep their files and gain them. Also the rows read and the rows added per current partition."""
    import pyarrow as pa

    dataset = target.dataset
    changes: list[PartitionChange] = []
    tables = []
    counted: dict[str, tuple[int | None, int]] = {}
    for entry in batch:
        rows = target.read(entry.files)
        if rows.num_rows != entry.rows:
            counted[entry.key_path] = (entry.rows, rows.num_rows)
        tables.append(rows)
        changes.append(PartitionChange(entry.key, entry.key_path, entry, removed=entry.rows, drop=True))
    if counted:
        raise ConservationError(
            dataset.name,
            counted,
            expected="rows the catalog records for the old partition",
            actual="rows read from its files",
            hint="The old partition's files do not hold the rows its entry records; nothing was moved. "
            "Run `airflow-partitions verify` on the dataset, then repartition again.",
        )
    rows_in = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    routed = route_to_paths(rows_in, target.transforms, target.names, dataset=dataset.name)
    added: dict[str, int] = {}
    for key_path, (key, partition_rows) in routed.items():
        before = target.entry(key_path)
        if before is not None and before.spec_id != target.spec_info.spec_id:
            raise WriteError(
                f"dataset {dataset.name!r}: partition {key_path!r} of the current layout is held by an "
                f"entry of spec {before.spec_id}; plan again from the latest version"
            )
        kept = list(before.files) if before is not None else []
        changes.append(PartitionChange(key, key_path, before, kept=kept, added=partition_rows))
        added[key_path] = partition_rows.num_rows
    return changes, rows_in, added


def check_moved_rows(dataset: str, removed: int, read: int, added: Mapping[str, int]) -> None:
    """Rows removed with the old partitions == rows read from them == rows added to new partitions."""
    total = sum(added.values())
    if not removed == read == total:
        raise ConservationError(
            dataset,
            {"[old layout -> new layout]": (removed, total if read == removed else read)},
            expected="rows of the old partitions moved",
            actual="rows added to partitions of the new layout"
            if read == removed
            else "rows read from the old files",
            hint="Re-partitioning would lose or duplicate rows; nothing was published.",
        )


def old_entries(snapshot: Any, spec_id: str) -> list[PartitionEntry]:
    """Entries of `snapshot` written under a spec other than `spec_id`, decoded in one batch."""
    table = snapshot.table
    paths = [
        path
        for path, entry_spec in zip(
            table.column("key_path").to_pylist(), table.column("spec_id").to_pylist(), strict=True
        )
        if entry_spec != spec_id
    ]
    return list(snapshot.partitions.entries_of(paths))


def layout_progress(snapshot: Any, spec_id: str) -> dict[str, Any]:
    """Re-partitioning progress of a version against the spec `spec_id`: partitions and rows left."""
    if snapshot is None:
        return {"in_progress": False, "partitions_left": 0, "rows_left": 0, "total_rows": 0}
    partitions, rows = snapshot.other_layout(spec_id)
    return {
        "in_progress": partitions > 0,
        "current_spec": snapshot.partition_spec.spec_id,
        "target_spec": spec_id,
        "specs_in_use": sorted(snapshot.spec_ids_in_use()),
        "partitions_left": partitions,
        "rows_left": rows,
        "total_rows": snapshot.total_rows,
    }


def open_stored(handle: DatasetHandle, catalog: Catalog | None) -> WriteTarget:
    """The write target, bound to the schema of the rows the acceleration holds.

    Moving rows routes stored rows, so every column the current partition_by reads must be in the
    acceleration's files. A renamed source column is not (it is a spec change whose stored rows carry the
    old name): refused with `PartitionSpecChangedError` naming the rebuild that applies it.
    """

    try:
        return open_write_target(handle, catalog=catalog)
    except SpecValidationError as err:
        dataset = handle.dataset
        raise PartitionSpecChangedError(
            f"dataset {dataset.name!r}: partition_by cannot route the rows the acceleration holds "
            f"({'; '.join(err.errors)}). A re-partitioning moves stored rows, so every column the new "
            "partition_by reads must be in the acceleration's files; after a source column was renamed, "
            "declare the rename in the dataset (`renamed_columns: {old: new}`), which keeps the layout "
            "and rewrites nothing, or rebuild instead: `airflow-partitions refresh SPEC DATASET --full` "
            "rewrites every partition under the new names in one commit"
        ) from err
