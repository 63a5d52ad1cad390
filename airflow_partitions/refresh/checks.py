"""The conditions the sensors wait for: has the source changed, are the selected partitions fresh.

A sensor's poke and its trigger both call them. Both return small JSON-ready results; heavy imports happen
inside, so importing this module stays cheap.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from typing import Any

from airflow_partitions.catalog.model import format_time, parse_time
from airflow_partitions.exceptions import OrchestrationError
from airflow_partitions.refresh.pipeline import plan_refresh

# Work-item reasons that mean the source differs from what the catalog holds (not just "asked for").
CHANGE_REASONS = frozenset({"new", "changed", "respec"})
MAX_LISTED = 100


@dataclass(frozen=True)
class SourceChanges:
    """Partitions whose source rows differ from the last commit (new or changed), and vanished ones."""

    dataset: str
    changed: tuple[str, ...]
    removed: tuple[str, ...]
    base_version: int | None

    @property
    def any(self) -> bool:
        return bool(self.changed or self.removed)

    def to_json(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "changed_count": len(self.changed),
            "removed_count": len(self.removed),
            "changed": list(self.changed[:MAX_LISTED]),
            "removed": list(self.removed[:MAX_LISTED]),
            "base_version": self.base_version,
        }


def source_changes(
    spec_path: str | os.PathLike[str], dataset: str, where: str | None = None
) -> SourceChanges:
    """Compare the source with the dataset's last committed version (only partitions in `where`, if set)."""

    plan = plan_refresh(os.fspath(spec_path), dataset, where=where)
    # A where selection forces every selected partition; keep only real differences.
    changed = tuple(item.key_path for item in plan.items if str(item.reason) in CHANGE_REASONS)
    return SourceChanges(dataset, changed, tuple(plan.removed), plan.base_version)


@dataclass(frozen=True)
class Freshness:
    """Whether every partition a filter selects was refreshed at or after a moment."""

    dataset: str
    version: int | None
    refreshed_after: str
    selected: int
    stale: tuple[str, ...]
    min_partitions: int

    @property
    def fresh(self) -> bool:
        return self.version is not None and self.selected >= self.min_partitions and not self.stale

    def to_json(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "version": self.version,
            "refreshed_after": self.refreshed_after,
            "selected": self.selected,
            "stale_count": len(self.stale),
            "stale": list(self.stale[:MAX_LISTED]),
            "fresh": self.fresh,
        }


def parse_moment(value: dt.datetime | str) -> dt.datetime:
    """An aware UTC datetime from a datetime or an ISO 8601 string (naive means UTC)."""
    if isinstance(value, str):
        try:
            value = parse_time(value.strip())
        except ValueError as err:
            raise OrchestrationError(
                f"refreshed_after {value!r} is not an ISO 8601 time such as 2026-01-01T00:00:00+00:00"
            ) from err
    if not isinstance(value, dt.datetime):
        raise OrchestrationError(
            f"refreshed_after must be a datetime or ISO string, got {type(value).__name__}"
        )
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


def partition_freshness(
    spec_path: str | os.PathLike[str],
    dataset: str,
    refreshed_after: dt.datetime | str,
    where: str | None = None,
    min_partitions: int = 1,
) -> Freshness:
    """Check the newest catalog version: are the partitions `where` selects all refreshed since then?"""
    from airflow_partitions.read import (  # lazy: pyarrow; Airflow tasks import refresh/ light
        PartitionedDatasetReader,
    )

    moment = parse_moment(refreshed_after)
    reader = PartitionedDatasetReader(os.fspath(spec_path), dataset)
    snapshot = reader.catalog.latest()
    if snapshot is None:
        return Freshness(dataset, None, format_time(moment), 0, (), min_partitions)
    plan = reader.plan(where, version=snapshot.version)
    stale = tuple(
        chosen.key_path
        for chosen in plan.selected
        if snapshot.partitions[chosen.key_path].refreshed_at.astimezone(dt.UTC) < moment
    )
    return Freshness(
        dataset, snapshot.version, format_time(moment), len(plan.selected), stale, min_partitions
    )
