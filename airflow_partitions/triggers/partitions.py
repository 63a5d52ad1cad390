"""Triggers behind the deferrable sensors: poll a dataset's source or catalog until the condition holds.

Their arguments are plain JSON (spec path, dataset, filter, ISO times), so they survive `serialize()`
into the metadata database. The checks are blocking (file listings, SQL, catalog reads) and run in a
worker thread through `asyncio.to_thread`, never on the triggerer's event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_partitions.exceptions import AirflowPartitionsError
from airflow_partitions.hooks.connections import aprepare_source_connections


def _error(err: AirflowPartitionsError) -> TriggerEvent:
    return TriggerEvent({"status": "error", "error_type": type(err).__name__, "message": str(err)})


class SourceChangeTrigger(BaseTrigger):
    """Fires once the dataset's source differs from its last committed refresh (within `where`)."""

    def __init__(
        self, *, spec_path: str, dataset: str, where: str | None = None, poll_interval: float = 60.0
    ) -> None:
        super().__init__()
        self.spec_path = spec_path
        self.dataset = dataset
        self.where = where
        self.poll_interval = float(poll_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "spec_path": self.spec_path,
                "dataset": self.dataset,
                "where": self.where,
                "poll_interval": self.poll_interval,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_partitions.refresh.checks import source_changes  # lazy: loads sqlglot

        try:
            await aprepare_source_connections(self.spec_path, self.dataset)
            while True:
                changes = await asyncio.to_thread(source_changes, self.spec_path, self.dataset, self.where)
                if changes.any:
                    yield TriggerEvent({"status": "success", **changes.to_json()})
                    return
                self.log.info(
                    "No change in the source of %s; checking again in %.0fs", self.dataset, self.poll_interval
                )
                await asyncio.sleep(self.poll_interval)
        except AirflowPartitionsError as err:
            yield _error(err)


class PartitionFreshnessTrigger(BaseTrigger):
    """Fires once every partition `where` selects was refreshed at or after `refreshed_after` (ISO time)."""

    def __init__(
        self,
        *,
        spec_path: str,
        dataset: str,
        refreshed_after: str,
        where: str | None = None,
        min_partitions: int = 1,
        poll_interval: float = 60.0,
    ) -> None:
        super().__init__()
        self.spec_path = spec_path
        self.dataset = dataset
        self.refreshed_after = refreshed_after
        self.where = where
        self.min_partitions = int(min_partitions)
        self.poll_interval = float(poll_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "spec_path": self.spec_path,
                "dataset": self.dataset,
                "refreshed_after": self.refreshed_after,
                "where": self.where,
                "min_partitions": self.min_partitions,
                "poll_interval": self.poll_interval,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_partitions.refresh.checks import partition_freshness  # lazy: loads sqlglot

        try:
            while True:
                freshness = await asyncio.to_thread(
                    partition_freshness,
                    self.spec_path,
                    self.dataset,
                    self.refreshed_after,
                    self.where,
                    self.min_partitions,
                )
                if freshness.fresh:
                    yield TriggerEvent({"status": "success", **freshness.to_json()})
                    return
                self.log.info(
                    "%s: %d of %d selected partition(s) older than %s; checking again in %.0fs",
                    self.dataset,
                    len(freshness.stale),
                    freshness.selected,
                    self.refreshed_after,
                    self.poll_interval,
                )
                await asyncio.sleep(self.poll_interval)
        except AirflowPartitionsError as err:
            yield _error(err)
