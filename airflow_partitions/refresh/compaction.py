"""Compaction: merge a partition's small files into target-size files, all partitions in one atomic commit.

Partitions that many refreshes or writes appended to end up holding many small files, and every read opens
each of them. `plan_compaction` picks, per partition of one catalog version, the files smaller than the
target (a partition is compacted only when it has two or more of them); `run_compaction` reads them, writes
them back through the dataset's storage engine (so Parquet rows are sorted by `sort_by` again and cut into
`row_group_rows`-row groups, and every file's statistics are computed from the rows written), counts the
rows of the new files from disk, and publishes every compacted partition in one `Catalog.commit`
(operation `compact`) based on the planned version.

Nothing is rewritten from unchecked bytes: every merged file is checked in full against the catalog
(`storage.integrity.check_files`) first, and a damaged one refuses the compaction with a `StorageError`
naming the file and the repair (nothing published; the file stays for the repair to replace).

Under an `s3://` accelerator_dir (the catalog then has a `data_store`) the merged files are fetched from
S3 into private local scratch (each checked against its recorded size and SHA-256), written and counted
back there, uploaded under their write-once names and read back before the commit references them; the
scratch is removed afterwards. The catalog's store carries the S3 settings it was opened with, so files
and catalog are reached with the same ones.

Nothing of the data changes: each partition must hold as many rows after as before (else
`ConservationError`, nothing published). A refresh or write that touched one of the partitions after the
planned version makes the commit fail with `CommitConflictError`: the old files stay referenced, and the
new ones are unreferenced leftovers that vacuum removes.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_partitions.exceptions import CompactionError, ConservationError
from airflow_partitions.objectstore import LocalStore
from airflow_partitions.storage import get_storage
from airflow_partitions.storage.integrity import check_files
from airflow_partitions.storage.remote import fetch_partition_files
from airflow_partitions.table import open_handle
from airflow_partitions.table.partition_writer import PartitionWriter
from airflow_partitions.table.publish import CommitBuilder

if TYPE_CHECKING:
    from airflow_partitions.catalog import Catalog, PartitionEntry, Snapshot
    from airflow_partitions.objectstore import ObjectStore
    from airflow_partitions.spec.model import DatasetSpec, ProjectSpec
    from airflow_partitions.storage import DataFile, PartitionStorage

DEFAULT_TARGET_FILE_BYTES = 128 * 1024 * 1024
COMPACT_OPERATION = "compact"

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class PartitionCompaction:
    """One partition to compact: the small files merged, the files kept as they are, and the outcome."""

    key_path: str
    merged: tuple[DataFile, ...]
    kept: tuple[DataFile, ...]
    rows: int
    bytes_before: int
    files_after: int | None = None
    bytes_after: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "key_path": self.key_path,
            "files_before": len(self.merged) + len(self.kept),
            "files_merged": len(self.merged),
            "files_after": self.files_after,
            "rows": self.rows,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
        }


@dataclass(frozen=True, slots=True)
class CompactionPlan:
    """What a compaction of one catalog version would merge (`partitions`), and how many it looked at."""

    dataset: str
    base_version: int | None
    target_file_bytes: int
    target_rows: int | None
    partitions: tuple[PartitionCompaction, ...]
    examined: int

    def to_json(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "base_version": self.base_version,
            "target_file_bytes": self.target_file_bytes,
            "target_rows": self.target_rows,
            "partitions_examined": self.examined,
            "partitions": [p.to_json() for p in self.partitions],
        }


@dataclass(frozen=True, slots=True)
class CompactionReport:
    """The outcome: the committed version (None for a dry run or nothing to do) and each partition's files."""

    dataset: str
    dry_run: bool
    base_version: int | None
    version: int | None
    partitions: tuple[PartitionCompaction, ...]
    examined: int
    elapsed_s: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def files_before(self) -> int:
        return sum(len(p.merged) + len(p.kept) for p in self.partitions)

    @property
    def files_after(self) -> int | None:
        if any(p.files_after is None for p in self.partitions):
            return None
        return sum(p.files_after or 0 for p in self.partitions)

    def to_json(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "dry_run": self.dry_run,
            "base_version": self.base_version,
            "version": self.version,
            "partitions_examined": self.examined,
            "partitions_compacted": 0 if self.dry_run else len(self.partitions),
            "files_before": self.files_before,
            "files_after": self.files_after,
            "rows": sum(p.rows for p in self.partitions),
            "elapsed_s": round(self.elapsed_s, 3),
            "notes": list(self.notes),
            "partitions": [p.to_json() for p in self.partitions],
        }


def plan_compaction(
    project: ProjectSpec,
    dataset: DatasetSpec,
    *,
    target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES,
    target_rows: int | None = None,
    partitions: Sequence[str] | None = None,
    where: str | None = None,
    catalog: Catalog | None = None,
) -> CompactionPlan:
    """The partitions of the newest catalog version holding two or more files smaller than the target.

    A file is small when it has fewer than `target_file_bytes` bytes (and, with `target_rows`, fewer rows
    than that). `partitions` (canonical key paths) or `where` (SQL over the dataset's columns, pruned as a
    read would be) narrow which partitions are looked at.
    """
    _check_targets(target_file_bytes, target_rows)
    catalog = catalog or open_handle(project, dataset).catalog
    snapshot = catalog.latest()
    if snapshot is None:
        return CompactionPlan(dataset.name, None, target_file_bytes, target_rows, (), 0)
    spec_id = dataset.acceleration.partition_spec_id
    if snapshot.partition_spec.spec_id != spec_id:
        raise CompactionError(
            f"dataset {dataset.name!r}: partition_by in the spec differs from the one catalog version "
            f"{snapshot.version} was written with; run a refresh first (it rebuilds every partition under "
            "the new partition_by), then compact"
        )
    with _files_root(project, dataset, catalog) as (root, remote):
        entries = _selected_entries(dataset, snapshot, catalog, root, remote, partitions, where)
    planned = []
    for entry in entries:
        small = [f for f in entry.files if _is_small(f, target_file_bytes, target_rows)]
        if len(small) < 2:
            continue
        kept = tuple(f for f in entry.files if f not in small)
        planned.append(
            PartitionCompaction(
                key_path=entry.key_path,
                merged=tuple(small),
                kept=kept,
                rows=entry.rows,
                bytes_before=entry.bytes,
            )
        )
    return CompactionPlan(
        dataset.name, snapshot.version, target_file_bytes, target_rows, tuple(planned), len(entries)
    )


def run_compaction(
    project: ProjectSpec,
    dataset: DatasetSpec,
    plan: CompactionPlan,
    *,
    catalog: Catalog | None = None,
    progress: Progress | None = None,
) -> CompactionReport:
    """Merge the planned files of every planned partition and publish them all in one commit.

    Raises `ConservationError` (nothing published) when a partition's new files do not hold its rows, and
    `CommitConflictError` when a commit after `plan.base_version` touched a compacted partition.
    """
    started = time.monotonic()
    if plan.dataset != dataset.name:
        raise CompactionError(f"compaction plan for {plan.dataset!r} given to dataset {dataset.name!r}")
    if not plan.partitions:
        return CompactionReport(
            dataset.name, False, plan.base_version, None, (), plan.examined, time.monotonic() - started
        )
    catalog = catalog or open_handle(project, dataset).catalog
    assert plan.base_version is not None  # a plan with partitions was made from a version
    snapshot = catalog.snapshot(plan.base_version)
    storage = catalog.storage or _storage(dataset)
    entries: list[PartitionEntry] = []
    done: list[PartitionCompaction] = []
    mismatched: dict[str, tuple[int | None, int]] = {}
    with _files_root(project, dataset, catalog) as (root, remote):
        for position, item in enumerate(plan.partitions, start=1):
            entry = snapshot.partitions[item.key_path]
            merged_rows = sum(f.rows for f in item.merged)
            if remote is not None:
                fetch_partition_files(remote, root, item.merged)
            # Every byte checked against the catalog before any is rewritten: rewriting damaged rows would
            # give them a new file with a matching checksum (and vacuum would then delete the evidence).
            check_files(storage, root, item.merged, dataset=dataset.name)
            table = storage.read(root, item.merged)
            if table.num_rows != merged_rows:  # the rows read back differ from the catalog's
                mismatched[item.key_path] = (merged_rows, table.num_rows)
                continue
            engine = _writer(dataset, storage, table.num_rows, sum(f.bytes for f in item.merged), plan)
            writer = PartitionWriter(engine, remote or LocalStore(root), root, dataset.name)
            try:
                # A partition of an older layout (a re-partitioning in progress) keeps its key path; its
                # files go where files of that layout are written.
                written = writer.write(entry.key_path, table, expected=merged_rows)
            except ConservationError as err:
                mismatched.update(err.partitions)
                continue
            published = writer.publish(written.files)
            new_entry = entry.with_files((*item.kept, *published))
            if new_entry.rows != entry.rows:
                mismatched[item.key_path] = (entry.rows, new_entry.rows)
                continue
            entries.append(new_entry)
            done.append(
                PartitionCompaction(
                    key_path=item.key_path,
                    merged=item.merged,
                    kept=item.kept,
                    rows=entry.rows,
                    bytes_before=entry.bytes,
                    files_after=len(new_entry.files),
                    bytes_after=new_entry.bytes,
                )
            )
            if progress is not None:
                progress(
                    f"[{position}/{len(plan.partitions)}] {item.key_path}: {len(entry.files)} -> "
                    f"{len(new_entry.files)} file(s), {entry.rows} row(s)"
                )
    if mismatched:
        raise ConservationError(
            dataset.name,
            mismatched,
            expected="rows in the partition's files before compaction",
            actual="rows in its compacted files",
            hint="The new files are unreferenced and vacuum removes them.",
        )
    builder = CommitBuilder(catalog, COMPACT_OPERATION, plan.base_version, snapshot.partition_spec)
    builder.add(entries)
    rows = sum(e.rows for e in entries)
    builder.count({"partitions_checked": len(entries), "routed": rows, "written": rows, "source_rows": None})
    version = builder.commit()
    return CompactionReport(
        dataset.name,
        False,
        plan.base_version,
        version,
        tuple(done),
        plan.examined,
        time.monotonic() - started,
    )


def compact_dataset(
    project: ProjectSpec,
    dataset: DatasetSpec,
    *,
    target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES,
    target_rows: int | None = None,
    partitions: Sequence[str] | None = None,
    where: str | None = None,
    dry_run: bool = False,
    catalog: Catalog | None = None,
    progress: Progress | None = None,
) -> CompactionReport:
    """Plan and run a compaction of the newest version (see `plan_compaction` / `run_compaction`);
    `dry_run` reports what would be merged and writes nothing."""
    started = time.monotonic()
    catalog = catalog or open_handle(project, dataset).catalog
    plan = plan_compaction(
        project,
        dataset,
        target_file_bytes=target_file_bytes,
        target_rows=target_rows,
        partitions=partitions,
        where=where,
        catalog=catalog,
    )
    if dry_run:
        return CompactionReport(
            dataset.name,
            True,
            plan.base_version,
            None,
            plan.partitions,
            plan.examined,
            time.monotonic() - started,
        )
    return run_compaction(project, dataset, plan, catalog=catalog, progress=progress)


def parse_size(text: str) -> int:
    """`128MB`, `1.5GiB`, `64k`, `1000000` -> bytes (decimal and binary units alike are powers of 1024,
    as file sizes are usually meant); a clear error otherwise."""
    units = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    compact = text.strip().lower().replace(" ", "")
    number = compact.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = compact[len(number) :].removesuffix("ib").removesuffix("b")
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in units or value <= 0:
        raise CompactionError(
            f"invalid size {text!r}: use a positive number and a unit (B, KB, MB, GB, TB), e.g. 128MB"
        )
    return max(1, int(value * units[unit]))


# --- helpers ------------------------------------------------------------------------------------------


def _check_targets(target_file_bytes: int, target_rows: int | None) -> None:
    for name, value in (("target_file_bytes", target_file_bytes), ("target_rows", target_rows)):
        if value is None and name == "target_rows":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CompactionError(f"{name} must be a positive integer, got {value!r}")


def _is_small(file: DataFile, target_file_bytes: int, target_rows: int | None) -> bool:
    return file.bytes < target_file_bytes and (target_rows is None or file.rows < target_rows)


@contextlib.contextmanager
def _files_root(
    project: ProjectSpec, dataset: DatasetSpec, catalog: Catalog
) -> Iterator[tuple[Path, ObjectStore | None]]:
    """Where compaction reads and writes files, and the store they live in when that is S3.

    Locally: the dataset's data directory, no store. Under an `s3://` accelerator_dir: a private scratch
    directory (removed afterwards) and the catalog's data store, which holds the S3 settings the catalog
    was opened with.
    """
    remote: ObjectStore | None = getattr(catalog, "data_store", None)
    if remote is None:
        yield Path(catalog.data_root or open_handle(project, dataset).local_root), None
        return
    scratch = open_handle(project, dataset).scratch(f"compact-{dataset.name}")
    try:
        yield scratch, remote
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _selected_entries(
    dataset: DatasetSpec,
    snapshot: Snapshot,
    catalog: Catalog,
    root: Path,
    remote: ObjectStore | None,
    partitions: Sequence[str] | None,
    where: str | None,
) -> list[PartitionEntry]:
    entries = snapshot.partitions
    if partitions is not None:
        wanted = [p.strip().strip("/") for p in partitions]
        unknown = [p for p in wanted if p not in entries]
        if unknown:
            sample = ", ".join(list(entries)[:5]) or "(none)"
            raise CompactionError(
                f"dataset {dataset.name!r} has no partition {', '.join(repr(u) for u in unknown)} in catalog "
                f"version {snapshot.version}; give canonical key paths such as {sample}"
            )
        chosen = [entries[p] for p in dict.fromkeys(wanted)]
    else:
        chosen = [entries[p] for p in entries]
    if where is None:
        return chosen
    from airflow_partitions.pruning import (  # lazy: pyarrow; Airflow tasks import refresh/ light
        PartitionIndex,
        plan_partitions,
    )

    with_files = [e for e in chosen if e.files]
    if not with_files:
        return []
    storage = catalog.storage or _storage(dataset)
    if remote is not None:
        fetch_partition_files(remote, root, with_files[0].files[:1])
    schema = storage.file_schema(root, with_files[0].files[0])
    pruned = plan_partitions(PartitionIndex.from_snapshot(snapshot, schema), where, dataset=dataset.name)
    selected = {s.key_path for s in pruned.selected}
    return [e for e in chosen if e.key_path in selected]


def _storage(dataset: DatasetSpec) -> PartitionStorage:

    return get_storage(dataset.acceleration)


def _writer(
    dataset: DatasetSpec, storage: PartitionStorage, rows: int, data_bytes: int, plan: CompactionPlan
) -> PartitionStorage:
    """The dataset's storage engine, cutting files at the target: rows per file from the target rows, or
    from the target bytes at the merged files' bytes per row (whichever is smaller; the spec's
    `max_rows_per_file` too)."""

    limits = [plan.target_rows] if plan.target_rows is not None else []
    if rows and data_bytes:
        limits.append(max(1, int(plan.target_file_bytes * rows / data_bytes)))
    if storage.max_rows_per_file is not None:
        limits.append(storage.max_rows_per_file)
    if not limits:
        return storage
    return get_storage(dataset.acceleration, max_rows_per_file=min(limits))
