"""The commit builder: every catalog version any operation publishes is assembled and committed here.

A write operation (refresh, append / upsert / delete, compaction, re-partitioning, bootstrap) gathers the
entries it writes and the key paths it removes into a `CommitBuilder`, records the row counts it checked
(`conservation`), and calls `commit`. The builder gives every commit an id (the caller's, for an
idempotent retry, else `<operation>-<random>`), refuses an entry whose row count is not the sum of its
files' (`ConservationError`, nothing published), and is the one caller of `Catalog.commit`
(`tests/test_layering.py` asserts it).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_partitions.catalog import PartitionEntry
from airflow_partitions.exceptions import ConservationError

if TYPE_CHECKING:
    from airflow_partitions.catalog import Catalog, PartitionEntry, PartitionSpecInfo, Snapshot
    from airflow_partitions.catalog.state import CommitRecord


def new_commit_id(operation: str) -> str:
    """A fresh commit id for `operation`: `<operation>-<32 hex digits>`."""
    return f"{operation}-{uuid.uuid4().hex}"


@dataclass
class CommitBuilder:
    """One catalog version in the making: its entries, removals, row counts, id and operation name.

    `base_version` is the version the changes were planned from; `partition_spec` the spec they were
    written under. `commit_id` makes a retry idempotent (the catalog returns the version an earlier attempt
    published); empty, the builder makes a fresh one.
    """

    catalog: Catalog
    operation: str
    base_version: int | None
    partition_spec: PartitionSpecInfo
    commit_id: str = ""
    upserts: list[PartitionEntry] = field(default_factory=list)
    removes: list[str] = field(default_factory=list)
    conservation: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.commit_id:
            self.commit_id = new_commit_id(self.operation)

    def add(self, entries: PartitionEntry | Iterable[PartitionEntry]) -> None:
        """Publish these partition entries (new or replacing the base's)."""

        self.upserts.extend([entries] if isinstance(entries, PartitionEntry) else entries)

    def remove(self, key_paths: str | Iterable[str]) -> None:
        """Remove these partitions from the version."""
        self.removes.extend([key_paths] if isinstance(key_paths, str) else key_paths)

    def count(self, counts: Mapping[str, Any]) -> None:
        """Record row counts the operation checked (kept in the version's header, `VersionInfo`)."""
        self.conservation.update(counts)

    @property
    def touched(self) -> set[str]:
        """Key paths the commit publishes or removes."""
        return {e.key_path for e in self.upserts} | set(self.removes)

    @property
    def empty(self) -> bool:
        return not self.upserts and not self.removes

    def fold_switch(self, base: Snapshot) -> None:
        """Make this commit also switch the current spec to the builder's: its changes were planned on
        `Catalog.evolved(base, spec)` (`base`, the base version, seen with the spec current; old partitions
        under qualified key paths), and become, with the renames `Catalog.evolution_changes` makes, changes
        of `base` itself. Commit it with `evolve=True`: one version, switched and changed, or none.

        A rename the builder overrides (upserts) or drops (removes) is not made; a removal of a path the
        base does not hold (a renamed old partition) drops its rename, and its plain path leaves the base."""
        renames, renamed_away = self.catalog.evolution_changes(base, self.partition_spec)
        mine = {entry.key_path for entry in self.upserts}
        dropped = set(self.removes)
        kept = [entry for entry in renames if entry.key_path not in mine and entry.key_path not in dropped]
        self.upserts = [*kept, *self.upserts]
        published = {entry.key_path for entry in self.upserts}
        leaving = dict.fromkeys([*renamed_away, *self.removes])
        self.removes = [path for path in leaving if path in base.partitions and path not in published]

    def check_entries(self) -> None:
        """Refuse an entry whose rows are not the rows its files record (nothing is published)."""
        differing: dict[str, tuple[int | None, int]] = {
            e.key_path: (e.rows, sum(f.rows for f in e.files))
            for e in self.upserts
            if e.rows != sum(f.rows for f in e.files)
        }
        if differing:
            raise ConservationError(
                self.catalog.dataset,
                differing,
                expected="rows the partition entry records",
                actual="rows its files record",
                hint=f"The {self.operation} built inconsistent catalog entries; run it again.",
            )

    def commit(
        self,
        *,
        replace_all: bool = False,
        evolve: bool = False,
        other_specs: Sequence[PartitionSpecInfo] = (),
        check_intervening: Callable[[CommitRecord], None] | None = None,
    ) -> int:
        """Publish the version (`Catalog.commit`: OCC by partition, rebased onto unrelated commits); its
        number. Raises `CommitConflictError` when a commit since the base touched the same partitions."""
        self.check_entries()
        return self.catalog.commit(
            base_version=self.base_version,
            upserts=self.upserts,
            removes=self.removes,
            partition_spec=self.partition_spec,
            replace_all=replace_all,
            operation=self.operation,
            commit_id=self.commit_id,
            conservation=self.conservation if self.conservation else None,
            check_intervening=check_intervening,
            evolve=evolve,
            other_specs=other_specs,
        )
