"""The state of every partition of a dataset: fresh, stale, failed, missing or removed (refreshing comes
from Airflow), the one answer `status --partitions`, `refresh --failed` and the UI page share.

- fresh: in the newest catalog version, and the source's fingerprint for it is the one recorded;
- stale: in the catalog, but the source changed since (or partition_by changed: it will be rewritten);
- failed: its last refresh failed (`refresh/failures.py`) and no commit has published it since;
- missing: the source has rows for it, the catalog has not (never refreshed);
- removed: its source rows are gone (the next refresh removes it), or an older retained version held it
  and the newest does not;
- unknown: in the catalog, but the source could not be surveyed (`discovery_error` says why).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from airflow_partitions.catalog.model import format_time
from airflow_partitions.exceptions import AirflowPartitionsError
from airflow_partitions.keys import PartitionKey, partition_label
from airflow_partitions.refresh.failures import FailureStore, PartitionFailure
from airflow_partitions.refresh.pipeline import plan_refresh
from airflow_partitions.refresh.plan import Reason
from airflow_partitions.spec.masking import mask_secrets
from airflow_partitions.table import open_handle

if TYPE_CHECKING:
    from airflow_partitions.catalog import Catalog, PartitionEntry
    from airflow_partitions.sources.base import Source
    from airflow_partitions.spec.model import DatasetSpec, ProjectSpec


class PartitionState(StrEnum):
    FRESH = "fresh"
    STALE = "stale"
    FAILED = "failed"
    REFRESHING = "refreshing"
    MISSING = "missing"
    REMOVED = "removed"
    UNKNOWN = "unknown"


# What "refresh everything that failed or is stale" selects: partitions a refresh can write.
NEEDS_REFRESH = frozenset({PartitionState.FAILED, PartitionState.STALE, PartitionState.MISSING})


@dataclass(frozen=True)
class PartitionStatus:
    """One partition: its state, its newest catalog entry (if any) and its remembered failure (if any)."""

    key_path: str
    key: str
    state: PartitionState
    entry: PartitionEntry | None = None
    failure: PartitionFailure | None = None
    # Why discovery would refresh it (new / changed / respec), when it would.
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        entry = self.entry
        return {
            "key_path": self.key_path,
            "key": self.key,
            "state": str(self.state),
            "reason": self.reason,
            "rows": entry.rows if entry is not None else None,
            "bytes": entry.bytes if entry is not None else None,
            "files": len(entry.files) if entry is not None else None,
            "refreshed_at": format_time(entry.refreshed_at) if entry is not None else None,
            "source_fingerprint": entry.source_fingerprint if entry is not None else None,
            "written_by": entry.written_by.to_json() if entry is not None and entry.written_by else None,
            "failure": self.failure.to_json() if self.failure is not None else None,
        }


@dataclass(frozen=True)
class DatasetPartitionStates:
    """Every partition of one dataset with its state, as of `version` of the catalog."""

    dataset: str
    version: int | None
    partitions: tuple[PartitionStatus, ...]
    # Why the source could not be surveyed (states then say only what the catalog and failures know).
    discovery_error: str | None = None

    def counts(self) -> dict[str, int]:
        counts = {str(state): 0 for state in PartitionState}
        for partition in self.partitions:
            counts[str(partition.state)] += 1
        return counts

    def key_paths(self, states: Iterable[PartitionState]) -> list[str]:
        wanted = set(states)
        return [p.key_path for p in self.partitions if p.state in wanted]

    def with_refreshing(self, key_paths: Iterable[str]) -> DatasetPartitionStates:
        """These states with `key_paths` (partitions a running task is writing now) marked refreshing."""
        running = set(key_paths)
        return replace(
            self,
            partitions=tuple(
                replace(p, state=PartitionState.REFRESHING) if p.key_path in running else p
                for p in self.partitions
            ),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "states": self.counts(),
            "discovery_error": self.discovery_error,
            "partitions": [p.to_json() for p in self.partitions],
        }


def partition_states(
    project: ProjectSpec,
    dataset: DatasetSpec,
    *,
    catalog: Catalog | None = None,
    source: Source | None = None,
) -> DatasetPartitionStates:
    """Survey the source (discovery, no refresh), diff it against the newest version and the failure store."""

    catalog = catalog or open_handle(project, dataset).catalog
    snapshot = catalog.latest()
    failures = FailureStore.for_catalog(catalog).failures()
    names = snapshot.partition_spec.names if snapshot is not None else dataset.acceleration.partition_names
    entries: Mapping[str, PartitionEntry] = dict(snapshot.partitions.items()) if snapshot else {}

    planned: dict[str, tuple[Reason, PartitionKey]] = {}
    gone: set[str] = set()
    discovery_error: str | None = None
    try:
        plan = plan_refresh(project, dataset, source=source, catalog=catalog)
    except AirflowPartitionsError as err:
        discovery_error = mask_secrets(f"{type(err).__name__}: {err}")
    else:
        planned = {item.key_path: (item.reason, item.partition_key) for item in plan.items}
        gone = set(plan.removed)
    # Partitions an older retained version held that the newest no longer does.
    history = catalog.versions() if snapshot is not None else []
    if snapshot is not None and history and history[0].version != snapshot.version:
        older = catalog.snapshot(history[0].version)
        gone |= {path for path in older.partitions if path not in entries}

    statuses: dict[str, PartitionStatus] = {}
    for key_path, entry in entries.items():
        reason = planned.get(key_path, (None, None))[0]
        if discovery_error is not None:
            state = PartitionState.UNKNOWN
        elif key_path in gone:
            state = PartitionState.REMOVED
        elif reason in (Reason.CHANGED, Reason.RESPEC):
            state = PartitionState.STALE
        else:
            state = PartitionState.FRESH
        statuses[key_path] = PartitionStatus(
            key_path,
            partition_label(names, entry.key),
            state,
            entry=entry,
            reason=str(reason) if reason else None,
        )
    for key_path, (reason, key) in planned.items():
        if key_path not in statuses:
            statuses[key_path] = PartitionStatus(
                key_path, partition_label(names, key), PartitionState.MISSING, reason=str(reason)
            )
    for key_path in gone:
        if key_path not in statuses:
            statuses[key_path] = PartitionStatus(key_path, key_path, PartitionState.REMOVED)
    for key_path, failure in failures.items():
        current = statuses.get(key_path)
        if current is None:
            # A failure of a partition discovery no longer plans (or could not survey): still worth showing.
            current = PartitionStatus(key_path, key_path, PartitionState.FAILED)
        statuses[key_path] = replace(current, state=PartitionState.FAILED, failure=failure)
    return DatasetPartitionStates(
        dataset=dataset.name,
        version=snapshot.version if snapshot is not None else None,
        partitions=tuple(statuses[path] for path in sorted(statuses)),
        discovery_error=discovery_error,
    )
