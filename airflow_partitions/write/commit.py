"""Append, upsert and delete as one atomic catalog commit each: plan the partitions a write touches,
write their new files, check conservation, publish.

A write reads the newest catalog version (its base), routes the rows with the dataset's transforms, and
for every partition it touches computes the files the partition keeps and the rows it gets newly written:

* append: the partition keeps every file and gains a new one with its routed rows;
* upsert: files that may hold one of the incoming keys (by their statistics, then by reading the key
  columns) are rewritten without those rows, the partition's routed rows are added, so a row whose
  partition value changed leaves its old partition and lands in its new one;
* delete: the filter is planned with `plan_partitions`; files it selects exactly are dropped, files it
  selects inexactly are rewritten without the matching rows, a partition left empty is removed.

New files get new names and nothing points at them until the commit. Before it, every touched partition
is checked: rows in its new files (counted back from the files) + rows of the files it keeps == its rows
before - rows removed + rows added; and the rows added over all partitions == the rows given. A mismatch
raises `ConservationError` and publishes nothing. The commit (`Catalog.commit`, OCC by partition) conflicts
with a commit made since the base that touched one of the same partitions (`CommitConflictError`: write
again); commits of other partitions are rebased onto. Files of a write that did not commit are orphans
vacuum removes.
"""

from __future__ import annotations

import datetime as dt
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_partitions.catalog import partition_spec_info
from airflow_partitions.catalog.model import PartitionEntry, RowCertificate, split_key_path
from airflow_partitions.exceptions import (
    CommitConflictError,
    ConservationError,
    FilterError,
    WriteError,
    WriteSchemaError,
)
from airflow_partitions.keys import PartitionKey
from airflow_partitions.objectstore import LocalStore
from airflow_partitions.sources import open_dataset_source
from airflow_partitions.spec.renames import renames_of
from airflow_partitions.storage.remote import fetch_partition_files
from airflow_partitions.table.partition_writer import PartitionWriter
from airflow_partitions.table.publish import CommitBuilder, new_commit_id
from airflow_partitions.write.merge import (
    check_key_columns,
    check_unique_keys,
    key_bounds,
    key_match_mask,
    may_hold_keys,
    remove_keys,
)
from airflow_partitions.write.routing import route_to_paths
from airflow_partitions.write.row_hash import certify_rows
from airflow_partitions.write.rows import RowsFile, arrow_rows, conform_rows, read_rows_file

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_partitions.catalog import Catalog, PartitionSpecInfo, Snapshot
    from airflow_partitions.catalog.state import CommitRecord
    from airflow_partitions.objectstore import ObjectStore
    from airflow_partitions.pruning import FilterInput
    from airflow_partitions.spec.model import DatasetSpec, ProjectSpec
    from airflow_partitions.storage import DataFile, PartitionStorage
    from airflow_partitions.table import DatasetHandle
    from airflow_partitions.transforms import Transform


# Partition files written at once by one write.
WRITE_WORKERS = 4


class WriteOperation(StrEnum):
    """What a write does; recorded as the catalog version's operation."""

    APPEND = "append"
    UPSERT = "upsert"
    DELETE = "delete"
    REPARTITION = "repartition"


@dataclass(frozen=True)
class WriteResult:
    """What one write committed (`version` None: it changed nothing, e.g. a delete that matched no row)."""

    dataset: str
    operation: WriteOperation
    version: int | None
    base_version: int | None
    partitions: tuple[str, ...]  # partitions the commit wrote (new or changed)
    removed_partitions: tuple[str, ...]  # partitions the commit removed (left empty)
    rows_in: int  # rows given to the write (0 for a delete)
    rows_added: int
    rows_removed: int  # rows replaced by an upsert or deleted
    files_written: int
    elapsed_s: float = 0.0
    commit_id: str | None = None
    # The commit id was already published (an earlier try of this write, e.g. an Airflow task retry after
    # a lost response): `version` is that commit's, and nothing was written again.
    already_committed: bool = False

    @property
    def partitions_touched(self) -> int:
        return len(self.partitions) + len(self.removed_partitions)

    def to_json(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "operation": str(self.operation),
            "version": self.version,
            "base_version": self.base_version,
            "partitions": list(self.partitions),
            "removed_partitions": list(self.removed_partitions),
            "rows_in": self.rows_in,
            "rows_added": self.rows_added,
            "rows_removed": self.rows_removed,
            "files_written": self.files_written,
            "elapsed_s": round(self.elapsed_s, 6),
            "commit_id": self.commit_id,
            "already_committed": self.already_committed,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WriteResult:
        try:
            return cls(
                dataset=str(data["dataset"]),
                operation=WriteOperation(data["operation"]),
                version=None if data["version"] is None else int(data["version"]),
                base_version=None if data["base_version"] is None else int(data["base_version"]),
                partitions=tuple(data["partitions"]),
                removed_partitions=tuple(data["removed_partitions"]),
                rows_in=int(data["rows_in"]),
                rows_added=int(data["rows_added"]),
                rows_removed=int(data["rows_removed"]),
                files_written=int(data["files_written"]),
                elapsed_s=float(data.get("elapsed_s", 0.0)),
                commit_id=data.get("commit_id"),
                already_committed=bool(data.get("already_committed", False)),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise WriteError(f"malformed write result: {err}") from err

    def describe(self) -> str:
        if self.version is None:
            return f"{self.dataset}: {self.operation} changed nothing (no version committed)"
        if self.already_committed:
            return (
                f"{self.dataset}: {self.operation} {self.commit_id} was already committed as version "
                f"{self.version}; nothing was written again"
            )
        return (
            f"{self.dataset}: {self.operation} committed version {self.version}: +{self.rows_added} / "
            f"-{self.rows_removed} rows in {len(self.partitions)} partition(s), "
            f"{len(self.removed_partitions)} removed, {self.files_written} file(s) written"
        )


@dataclass
class WriteTarget:
    """A dataset opened for one write: its newest version (the base), schema, transforms and storage."""

    project: ProjectSpec
    dataset: DatasetSpec  # bound to `schema`
    catalog: Catalog
    storage: PartitionStorage
    root: Path
    schema: pa.Schema
    snapshot: Snapshot | None
    spec_info: PartitionSpecInfo
    # The partition files on S3 (`accelerator_dir: s3://...`): `root` is then private local scratch, where
    # files to rewrite are copied and new files are written, counted and uploaded from.
    remote: ObjectStore | None = None

    def local(self, files: Sequence[DataFile]) -> Sequence[DataFile]:
        """`files`, readable under `root` (copied from S3 first, checked, when the files live there)."""
        if self.remote is not None:
            fetch_partition_files(self.remote, self.root, files)
        return files

    @property
    def writer(self) -> PartitionWriter:
        """Writes the new files under `root`, into the data store (uploaded when it is S3)."""
        store = self.remote if self.remote is not None else LocalStore(self.root)
        return PartitionWriter(self.storage, store, self.root, self.dataset.name)

    def read(self, files: Sequence[DataFile], columns: Sequence[str] | None = None) -> pa.Table:
        """`files`' rows (`columns` only, when given) in the dataset's schema."""
        return self.storage.read(
            self.root, self.local(files), columns=list(columns) if columns else None, schema=self.schema
        )

    @property
    def base_version(self) -> int | None:
        return self.snapshot.version if self.snapshot is not None else None

    @property
    def transforms(self) -> list[Transform]:
        return [f.transform for f in self.dataset.acceleration.partition_by]

    @property
    def names(self) -> tuple[str, ...]:
        return self.dataset.acceleration.partition_names

    def entry(self, key_path: str) -> PartitionEntry | None:
        if self.snapshot is None or key_path not in self.snapshot.partitions:
            return None
        return self.snapshot.partitions[key_path]


def open_write_target(
    handle: DatasetHandle,
    *,
    catalog: Catalog | None = None,
    schema: pa.Schema | None = None,
) -> WriteTarget:
    """Open the handle's dataset for a write: the newest catalog version and the schema rows must have.

    The schema is the acceleration's (a file of its most recently written partition), else the spec's
    `schema:` block, else the source's: writes never change the schema of a version.
    """
    project, dataset = handle.project, handle.dataset
    catalog = catalog or handle.catalog
    storage = catalog.storage or handle.storage
    # The catalog's data store is set when the files live on S3: they are then rewritten in scratch.
    remote = getattr(catalog, "data_store", None)
    root = handle.scratch("write") if remote is not None else Path(catalog.data_root or handle.local_root)
    snapshot = catalog.latest()
    if schema is None:
        schema = acceleration_schema(dataset, snapshot, storage, root, remote)
    bound = dataset.bind(schema)
    target = WriteTarget(
        project=project,
        dataset=bound,
        catalog=catalog,
        storage=storage,
        root=root,
        schema=schema,
        snapshot=snapshot,
        spec_info=partition_spec_info(bound),
        remote=remote,
    )
    if remote is not None:
        import shutil
        import weakref

        weakref.finalize(target, shutil.rmtree, root, True)  # the scratch goes with the target
    return target


def acceleration_schema(
    dataset: DatasetSpec,
    snapshot: Snapshot | None,
    storage: PartitionStorage,
    root: Path,
    remote: ObjectStore | None = None,
) -> pa.Schema:
    """The schema of the newest written partition's first file; else the declared or the source schema."""
    import pyarrow.compute as pc

    if snapshot is not None and snapshot.partition_count:
        table = snapshot.table
        newest = int(pc.index(table.column("refreshed_at"), pc.max(table.column("refreshed_at"))).as_py())
        for position in [newest, *range(min(table.num_rows, 64))]:
            files = snapshot.partitions[table.column("key_path")[position].as_py()].files
            if files:
                if remote is not None:
                    fetch_partition_files(remote, root, files[:1])
                return storage.file_schema(root, files[0])
    declared = dataset.bound_schema or dataset.declared_schema()
    if declared is not None:
        return declared

    return open_dataset_source(dataset).schema()


# --- one partition's change -----------------------------------------------------------------------


@dataclass
class PartitionChange:
    """What a write does to one partition: files it keeps, rows it rewrites or adds, rows it drops."""

    key: PartitionKey
    key_path: str
    before: PartitionEntry | None
    kept: list[DataFile] = field(default_factory=list)
    rewritten: list[pa.Table] = field(default_factory=list)  # surviving rows of rewritten files
    added: pa.Table | None = None
    removed: int = 0  # existing rows dropped (replaced or deleted)
    drop: bool = False  # the partition goes, even when it holds no rows (a re-partitioning moved it)

    @property
    def rows_added(self) -> int:
        return self.added.num_rows if self.added is not None else 0

    @property
    def changes_anything(self) -> bool:
        kept_all = self.before is None or len(self.kept) == len(self.before.files)
        return self.drop or self.rows_added > 0 or self.removed > 0 or not kept_all


def _write_change(target: WriteTarget, change: PartitionChange) -> tuple[list[DataFile], int]:
    """Write the change's new file(s); their rows counted back from the files. Nothing is published."""
    import pyarrow as pa

    parts = [t for t in change.rewritten if t.num_rows]
    if change.added is not None and change.added.num_rows:
        parts.append(change.added)
    if not parts:
        return [], 0
    rows = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
    written = target.writer.write(change.key_path, rows, advice="Check the disk, then write again.")
    return written.files, written.rows


def _written_certificate(change: PartitionChange) -> RowCertificate | None:
    """The partition's certificate after the write: the new rows' plus the kept files' (known when the
    partition keeps all its files, as an append does, or none); None when kept files lost rows."""
    import pyarrow as pa

    parts = [t for t in change.rewritten if t.num_rows]
    if change.added is not None and change.added.num_rows:
        parts.append(change.added)
    new = certify_rows(pa.concat_tables(parts) if len(parts) > 1 else parts[0]) if parts else None
    if not change.kept:
        return new
    before = change.before
    if before is None or before.certificate is None:
        return None
    if sorted(f.path for f in change.kept) != sorted(f.path for f in before.files):
        return None
    return before.certificate.plus(new) if new is not None else before.certificate


def commit_changes(
    target: WriteTarget,
    operation: WriteOperation,
    changes: Sequence[PartitionChange],
    *,
    rows_in: int,
    commit_id: str | None = None,
    keep_fingerprints: bool = True,
    started: float | None = None,
    claim: KeyClaim | None = None,
    switch_from: Snapshot | None = None,
) -> WriteResult:
    """Write, check and publish `changes` in one catalog commit based on `target.snapshot`.

    `switch_from`: `target.snapshot` is this stored version seen with the target's spec current
    (`Catalog.evolved`); the commit makes that switch too (`CommitBuilder.fold_switch`).

    `keep_fingerprints`: a changed partition keeps the source fingerprint it had (the source did not
    change: the next refresh leaves it alone unless its source changes); False records none, so the next
    refresh rebuilds those partitions from the source (write-through). `claim` (an upsert's keys): the
    commit rebases onto a concurrent commit only if no partition it changed holds one of the keys.
    """
    started = time.monotonic() if started is None else started
    earlier = committed_earlier(target, operation, commit_id, started)
    if earlier is not None:
        return earlier
    commit_id = commit_id or new_commit_id(str(operation))
    builder = CommitBuilder(target.catalog, str(operation), target.base_version, target.spec_info, commit_id)
    added_total, removed_total, written_files = prepare_changes(
        builder, target, operation, changes, rows_in=rows_in, keep_fingerprints=keep_fingerprints
    )
    upserts, removes = list(builder.upserts), list(builder.removes)
    if switch_from is not None:
        builder.fold_switch(switch_from)
    version = None
    if not builder.empty:
        version = builder.commit(
            check_intervening=claim.checker(target, builder.touched) if claim is not None else None,
            evolve=switch_from is not None,
        )
    return WriteResult(
        dataset=target.dataset.name,
        operation=operation,
        version=version,
        base_version=target.base_version,
        partitions=tuple(e.key_path for e in upserts),
        removed_partitions=tuple(removes),
        rows_in=rows_in,
        rows_added=added_total,
        rows_removed=removed_total,
        files_written=written_files,
        elapsed_s=time.monotonic() - started,
        commit_id=commit_id if version is not None else None,
    )


Pending = tuple[PartitionChange, list["DataFile"], int]  # a change, its new files, rows counted in them


def prepare_changes(
    builder: CommitBuilder,
    target: WriteTarget,
    operation: WriteOperation,
    changes: Sequence[PartitionChange],
    *,
    rows_in: int,
    keep_fingerprints: bool,
) -> tuple[int, int, int]:
    """Write `changes`' new files, check them (`_check_changes`: `ConservationError`, nothing published)
    and add their entries and removals to `builder`, with the row counts; nothing is committed.
    (rows added, rows removed, files written)."""
    active = [change for change in changes if change.changes_anything]
    # Partitions are written side by side (encoding and fsync release the GIL), as finalize does.
    workers = max(1, min(WRITE_WORKERS, len(active), os.cpu_count() or 2))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        outcomes = list(pool.map(lambda change: _write_change(target, change), active))
    pending = [(change, files, written) for change, (files, written) in zip(active, outcomes, strict=True)]
    added_total, removed_total = _check_changes(target, operation, pending, rows_in)
    written_files = _add_entries(builder, target, pending, keep_fingerprints)
    builder.count(
        {
            "partitions_checked": len(pending),
            "routed": rows_in,
            "written": sum(w for _, _, w in pending),
            "source_rows": None,
            "rows_in": rows_in,
            "added": added_total,
            "removed": removed_total,
        }
    )
    return added_total, removed_total, written_files


def _check_changes(
    target: WriteTarget, operation: WriteOperation, pending: Sequence[Pending], rows_in: int
) -> tuple[int, int]:
    """Every changed partition's rows after = rows before - removed + added (its kept files' rows plus
    the rows counted in its new files), and the rows added = the rows given; (added, removed) in total.
    Else `ConservationError`: nothing is published."""
    differing: dict[str, tuple[int | None, int]] = {}
    added_total = removed_total = 0
    for change, _files, written in pending:
        before_rows = change.before.rows if change.before is not None else 0
        kept_rows = sum(f.rows for f in change.kept)
        expected = before_rows - change.removed + change.rows_added
        if kept_rows + written != expected:
            differing[change.key_path] = (expected, kept_rows + written)
        added_total += change.rows_added
        removed_total += change.removed
    if differing:
        raise ConservationError(
            target.dataset.name,
            differing,
            expected="rows before - rows removed + rows added",
            actual="rows in the partition's files after the write",
            hint="The write planned inconsistent changes; nothing was published.",
        )
    if operation is not WriteOperation.DELETE and added_total != rows_in:
        raise ConservationError(
            target.dataset.name,
            {"[all written partitions]": (rows_in, added_total)},
            expected="rows given to the write",
            actual="rows added to partitions",
            hint="Routing lost or duplicated rows; nothing was published.",
        )
    return added_total, removed_total


def _add_entries(
    builder: CommitBuilder, target: WriteTarget, pending: Sequence[Pending], keep_fingerprints: bool
) -> int:
    """Each changed partition's new entry (kept files + its published new ones), or its removal when it
    is left without files; the number of new files."""
    now = dt.datetime.now(dt.UTC)
    written_files = 0
    for change, files, _written in pending:
        published = target.writer.publish(files)
        written_files += len(published)
        all_files = [*change.kept, *published]
        if not all_files:
            if change.before is not None:
                builder.remove(change.key_path)
            continue
        fingerprint = change.before.source_fingerprint if change.before is not None else None
        builder.add(
            PartitionEntry(
                key=change.key,
                key_path=change.key_path,
                # A partition of an older layout (a re-partitioning in progress) keeps its spec: its
                # surviving rows still belong to its key there.
                spec_id=change.before.spec_id if change.before is not None else target.spec_info.spec_id,
                files=tuple(all_files),
                rows=sum(f.rows for f in all_files),
                bytes=sum(f.bytes for f in all_files),
                source_fingerprint=fingerprint if keep_fingerprints else None,
                refreshed_at=now,
                certificate=_written_certificate(change),
            )
        )
    return written_files


@dataclass(frozen=True)
class KeyClaim:
    """The keys an upsert writes, each to be on one row after it: OCC on the key space.

    An upsert planned from its base removes each key from every partition that held it there. A commit
    made since (a concurrent upsert or refresh) may have put one of the keys into a partition this upsert
    does not touch: rebasing onto it would leave the key on two rows. `checker` refuses that rebase with
    `CommitConflictError` (write again: planned from the new head, the upsert replaces that row).
    """

    rows: pa.Table  # the incoming rows' key columns
    keys: tuple[str, ...]

    def checker(self, target: WriteTarget, touched: set[str]) -> Callable[[CommitRecord], None]:
        """The check `Catalog.commit` runs on each commit it rebases onto."""
        bounds = key_bounds(self.rows, self.keys)

        def check(record: CommitRecord) -> None:
            for raw in record.upserts:
                key_path = str(raw["key_path"])
                if key_path in touched:  # the catalog refuses an overlap already
                    continue
                entry = PartitionEntry.from_json(raw)
                before = target.entry(key_path)
                # Files the base had were searched when the upsert was planned; only newer ones may hold
                # a key now.
                known = {f.path for f in before.files} if before is not None else set()
                fresh = [f for f in entry.files if f.path not in known and may_hold_keys(f, bounds)]
                if not fresh:
                    continue
                held = target.storage.read(
                    target.root, target.local(fresh), columns=list(self.keys), schema=target.schema
                )
                found = key_match_mask(held, self.rows, self.keys)
                if found.true_count:
                    shown = held.filter(found).slice(0, 3).to_pylist()
                    raise CommitConflictError(
                        f"dataset {target.dataset.name!r}: partition {key_path} gained key(s) of this upsert "
                        f"({', '.join(map(str, shown))}) in version {record.version} ({record.operation}) "
                        f"after base version {target.base_version}; committing would leave a key on two "
                        "rows. Nothing was published: upsert again (planned from the newest version, it "
                        "replaces those rows)",
                        partitions=(key_path,),
                        version=record.version,
                    )

        return check


def committed_earlier(
    target: WriteTarget, operation: WriteOperation, commit_id: str | None, started: float
) -> WriteResult | None:
    """The result of the commit `commit_id` if the base already holds it (a retried write whose first
    attempt was published): nothing is then written again. `None` when it must be written."""
    if commit_id is None or target.snapshot is None:
        return None
    version = target.snapshot.commit_ids.get(commit_id)
    if version is None:
        return None
    return WriteResult(
        dataset=target.dataset.name,
        operation=operation,
        version=version,
        base_version=target.base_version,
        partitions=(),
        removed_partitions=(),
        rows_in=0,
        rows_added=0,
        rows_removed=0,
        files_written=0,
        elapsed_s=time.monotonic() - started,
        commit_id=commit_id,
        already_committed=True,
    )


# --- the three writes -----------------------------------------------------------------------------


def prepare_rows(target: WriteTarget, data: Any) -> pa.Table:
    """The write's rows as an Arrow table of the dataset's schema (or `WriteSchemaError`); a `RowsFile`
    is read with the dataset's column types. Rows name renamed columns by their current names
    (`spec.renames`); they are stored under the old ones."""
    renames = renames_of(target.dataset)
    if isinstance(data, RowsFile):
        table = read_rows_file(data, renames.to_current(target.schema))
    else:
        table = arrow_rows(data)
    if renames:
        stale = [old for old, _ in renames.pairs if old in table.column_names]
        if stale:
            raise WriteSchemaError(
                f"dataset {target.dataset.name!r}: the rows name column(s) {stale} by their old name(s); "
                f"the dataset's renamed_columns call them {[renames.current(c) for c in stale]}"
            )
        table = renames.to_stored(table)
    return conform_rows(table, target.schema, dataset=target.dataset.name)


def append(
    handle: DatasetHandle,
    data: Any,
    *,
    catalog: Catalog | None = None,
    commit_id: str | None = None,
    keep_fingerprints: bool = True,
) -> WriteResult:
    """Add `data`'s rows to the partitions they route to (new partitions included) in one commit."""
    started = time.monotonic()
    target = open_write_target(handle, catalog=catalog)
    rows = prepare_rows(target, data)
    return commit_changes(
        target,
        WriteOperation.APPEND,
        append_changes(target, rows),
        rows_in=rows.num_rows,
        commit_id=commit_id,
        keep_fingerprints=keep_fingerprints,
        started=started,
    )


def append_changes(target: WriteTarget, rows: pa.Table) -> list[PartitionChange]:
    """Each routed partition keeps its files and gains the rows routed to it."""
    changes = []
    for key_path, (key, routed) in route_to_paths(
        rows, target.transforms, target.names, dataset=target.dataset.name
    ).items():
        before = target.entry(key_path)
        kept = list(before.files) if before is not None else []
        changes.append(PartitionChange(key, key_path, before, kept=kept, added=routed))
    return changes


def resolve_keys(target: WriteTarget, keys: Sequence[str] | None, *, what: str) -> tuple[str, ...]:
    """The key columns of an upsert / delete by key: `keys`, else the spec's `acceleration.primary_key`."""
    renames = renames_of(target.dataset)
    chosen = tuple(renames.stored_names(keys)) if keys else target.dataset.acceleration.primary_key
    return check_key_columns(target.schema, chosen, what=what)


def upsert(
    handle: DatasetHandle,
    data: Any,
    *,
    keys: Sequence[str] | None = None,
    catalog: Catalog | None = None,
    commit_id: str | None = None,
    keep_fingerprints: bool = True,
) -> WriteResult:
    """Insert `data`'s rows, replacing existing rows with the same key (NULL-safe), in one commit.

    `keys`: the key columns (default `acceleration.primary_key`; neither is a `WriteKeyError`).
    A key may appear once in `data`. A row whose partition value changed moves to its new partition.
    """
    started = time.monotonic()
    target = open_write_target(handle, catalog=catalog)
    key_columns = resolve_keys(target, keys, what="upsert")
    rows = prepare_rows(target, data)
    check_unique_keys(rows, key_columns)
    return commit_changes(
        target,
        WriteOperation.UPSERT,
        upsert_changes(target, rows, key_columns),
        rows_in=rows.num_rows,
        commit_id=commit_id,
        keep_fingerprints=keep_fingerprints,
        started=started,
        claim=KeyClaim(rows.select(list(key_columns)), key_columns),
    )


def upsert_changes(target: WriteTarget, rows: pa.Table, keys: Sequence[str]) -> list[PartitionChange]:
    """Partitions losing rows whose key is in `rows` (files rewritten) and gaining the rows routed there."""
    routed = route_to_paths(rows, target.transforms, target.names, dataset=target.dataset.name)
    incoming_keys = rows.select(list(keys))
    # When every partition field is computed from key columns, a key decides its partition: the old row
    # of a key can only be where the new one goes. Otherwise any partition may hold it.
    key_decides = all(c in keys for t in target.transforms for c in t.source_columns)
    candidates: list[str] = []
    if target.snapshot is not None:
        if key_decides:
            candidates = [p for p in routed if p in target.snapshot.partitions]
            if target.snapshot.other_layout(target.spec_info.spec_id)[0]:
                # A re-partitioning in progress: the old row of a key may still be in a partition of
                # an older layout, where the new key does not route.
                candidates += [p for p in target.snapshot.partitions if split_key_path(p)[0] is not None]
        else:
            candidates = list(target.snapshot.partitions.keys())
    changes: dict[str, PartitionChange] = {}
    for key_path in candidates:
        before = target.entry(key_path)
        assert before is not None
        # Where the keys decide the partition, a routed partition's files likely hold some: read them
        # whole once. Elsewhere read the key columns first, and the whole file only on a match.
        removal = remove_keys(
            before.files, target.read, keys, incoming_keys, keep_untouched=True, probe_keys=not key_decides
        )
        change = PartitionChange(before.key, key_path, before, kept=removal.kept, removed=removal.removed)
        if removal.survivors is not None:
            change.rewritten.append(removal.survivors)
        changes[key_path] = change
    for key_path, (key, partition_rows) in routed.items():
        if key_path not in changes:
            before = target.entry(key_path)
            kept = list(before.files) if before is not None else []
            changes[key_path] = PartitionChange(key, key_path, before, kept=kept)
        changes[key_path].added = partition_rows
    return list(changes.values())


def delete(
    handle: DatasetHandle,
    where: FilterInput,
    *,
    catalog: Catalog | None = None,
    commit_id: str | None = None,
    keep_fingerprints: bool = True,
) -> WriteResult:
    """Delete the rows matching `where` (SQL WHERE text or DNF, as reads take it) in one commit.

    A row where `where` is NULL is kept (SQL `DELETE`). Only partitions the filter can match are read;
    a partition left empty is removed from the version.
    """
    if where is None or (isinstance(where, str) and not where.strip()) or where == []:
        raise WriteError(
            "delete needs a filter (where=...); to empty the dataset pass where='TRUE' explicitly"
        )
    started = time.monotonic()
    target = open_write_target(handle, catalog=catalog)
    renames = renames_of(target.dataset)
    if renames:
        from airflow_partitions.pruning.expressions import renamed_columns  # lazy: loads pyarrow
        from airflow_partitions.pruning.filters import bind_filter  # lazy: loads pyarrow

        where = renamed_columns(bind_filter(where, renames.to_current(target.schema)), renames.stored)
    return commit_changes(
        target,
        WriteOperation.DELETE,
        delete_changes(target, where),
        rows_in=0,
        commit_id=commit_id,
        keep_fingerprints=keep_fingerprints,
        started=started,
    )


def delete_changes(target: WriteTarget, where: FilterInput) -> list[PartitionChange]:
    """Per partition the filter selects: exact files dropped, inexact ones rewritten without matches."""
    from airflow_partitions.pruning import (  # lazy: pyarrow; tasks import write/ light
        PartitionIndex,
        plan_partitions,
    )

    if target.snapshot is None:
        return []
    # Planned even over no partition, so a filter naming an unknown column is an error either way.
    plan = plan_partitions(
        PartitionIndex.from_snapshot(target.snapshot, target.schema), where, dataset=target.dataset.name
    )
    predicate_sql = plan.predicate.sql()
    changes = []
    for selected in plan.selected:
        before = target.entry(selected.key_path)
        assert before is not None
        chosen = set(selected.files)
        change = PartitionChange(before.key, selected.key_path, before)
        change.kept = [f for f in before.files if f not in chosen]
        inexact = [f for f, exact in zip(selected.files, selected.exact_files, strict=True) if not exact]
        change.removed = sum(
            f.rows for f, exact in zip(selected.files, selected.exact_files, strict=True) if exact
        )
        if inexact:
            existing = target.storage.read(target.root, target.local(inexact), schema=target.schema)
            doomed = matching_rows(existing, predicate_sql)
            if doomed.true_count == 0:
                change.kept.extend(inexact)
            else:
                import pyarrow.compute as pc

                change.rewritten.append(existing.filter(pc.invert(doomed)))
                change.removed += doomed.true_count
        changes.append(change)
    return changes


DELETE_LIMITS_HINT = "delete fewer rows at a time, or with a filter that needs less memory or time"


def matching_rows(table: pa.Table, predicate_sql: str) -> pa.BooleanArray:
    """Per row of `table`: is `predicate_sql` (a bound filter's DuckDB SQL) TRUE? (NULL counts as not.)"""
    import duckdb
    import numpy as np
    import pyarrow as pa

    from airflow_partitions.pruning.limits import (  # lazy: pyarrow; tasks import write/ light
        run_bounded,
    )
    from airflow_partitions.read.query import (  # lazy: pyarrow; tasks import write/ light
        QueryLimits,
        needs_partition_functions,
        new_duckdb_connection,
    )

    row_column = "__ap_row"
    numbered = table.append_column(row_column, pa.array(np.arange(table.num_rows, dtype=np.int64)))
    connection = new_duckdb_connection(functions=needs_partition_functions(predicate_sql))
    # A delete filter runs under a query's default limits: time, DuckDB's memory and the address space.
    limits = QueryLimits()
    connection.execute(f"SET memory_limit = '{limits.memory}'")
    try:
        view = f"ap_delete_{uuid.uuid4().hex[:12]}"
        connection.register(view, numbered)
        try:
            query = f'SELECT "{row_column}" FROM {view} WHERE {predicate_sql}'
            with limits.budget(DELETE_LIMITS_HINT):
                found = run_bounded(
                    connection, lambda: connection.sql(query).to_arrow_table(), memory=limits.memory
                )
        except duckdb.Error as err:
            raise FilterError(f"cannot evaluate the delete filter on the partition rows: {err}") from err
    finally:
        connection.close()
    mask = np.zeros(table.num_rows, dtype=bool)
    mask[found.column(0).to_numpy()] = True
    return pa.array(mask, pa.bool_())
