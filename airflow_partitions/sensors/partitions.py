"""Sensors on a partitioned dataset: wait for its source to change, or for its partitions to be fresh.

Both poke once in the worker and, when `deferrable` (default: `[operators] default_deferrable`), hand the
waiting to a trigger in the triggerer instead of holding a worker slot.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue, conf

from airflow_partitions.exceptions import OrchestrationError
from airflow_partitions.hooks.connections import install_connection_resolver, install_secret_masker
from airflow_partitions.triggers.partitions import PartitionFreshnessTrigger, SourceChangeTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context


def _raise_on_error(event: Mapping[str, Any] | None) -> dict[str, Any]:
    if not event:
        raise OrchestrationError("the trigger ended without an event")
    if event.get("status") != "success":
        raise OrchestrationError(
            f"{event.get('error_type', 'error')} while waiting: {event.get('message', 'no message')}"
        )
    return dict(event)


class _DatasetSensor(BaseSensorOperator):
    template_fields: Sequence[str] = ("spec_path", "dataset", "where")

    def __init__(
        self,
        *,
        spec_path: str | os.PathLike[str],
        dataset: str,
        where: str | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.spec_path = os.fspath(spec_path)
        self.dataset = dataset
        self.where = where
        self.deferrable = deferrable

    def remaining_timeout(self) -> dt.timedelta:
        return dt.timedelta(seconds=self.timeout)

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        # Poke once here: when the condition already holds there is nothing to defer.
        result = self.poke(context)
        if result.is_done:
            return result.xcom_value
        self.defer(trigger=self.trigger(), method_name="execute_complete", timeout=self.remaining_timeout())

    def poke(self, context: Context) -> PokeReturnValue:
        raise NotImplementedError

    def trigger(self) -> Any:
        raise NotImplementedError

    def execute_complete(self, context: Context, event: Mapping[str, Any] | None = None) -> dict[str, Any]:
        payload = _raise_on_error(event)
        self.log.info("Condition met for %s: %s", self.dataset, payload)
        return payload


class SourceChangeSensor(_DatasetSensor):
    """Wait until the dataset's source changed since the last committed refresh.

    A change is a new partition, a partition whose source fingerprint differs from the catalog's, or a
    partition gone from the source; `where` limits the check to partitions matching a filter. Returns
    (as XCom) the changed and removed partition keys, e.g. to pass as a refresh run's `partitions`.
    """

    ui_color = "#d4f1e8"

    def __init__(self, *, poke_interval: float = 300.0, **kwargs: Any) -> None:
        super().__init__(poke_interval=poke_interval, **kwargs)

    def poke(self, context: Context) -> PokeReturnValue:
        from airflow_partitions.refresh.checks import source_changes  # lazy: loads sqlglot

        install_connection_resolver()
        install_secret_masker()
        changes = source_changes(self.spec_path, self.dataset, self.where)
        self.log.info(
            "%s: %d changed and %d removed partition(s) since catalog version %s",
            self.dataset,
            len(changes.changed),
            len(changes.removed),
            changes.base_version,
        )
        return PokeReturnValue(is_done=changes.any, xcom_value={"status": "success", **changes.to_json()})

    def trigger(self) -> SourceChangeTrigger:
        return SourceChangeTrigger(
            spec_path=os.path.abspath(self.spec_path),
            dataset=self.dataset,
            where=self.where,
            poll_interval=self.poke_interval,
        )


class PartitionFreshnessSensor(_DatasetSensor):
    """Wait until every partition matching `where` was refreshed at or after `refreshed_after`.

    `refreshed_after` is a datetime or an ISO string, templated (e.g. `"{{ data_interval_end }}"`);
    `min_partitions` is how many partitions the filter must select (so an empty catalog is not "fresh").
    For downstream DAGs that must not read before the refresh they depend on.
    """

    template_fields: Sequence[str] = (*_DatasetSensor.template_fields, "refreshed_after")
    ui_color = "#d4e8f1"

    def __init__(
        self,
        *,
        refreshed_after: dt.datetime | str,
        min_partitions: int = 1,
        poke_interval: float = 60.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poke_interval, **kwargs)
        if min_partitions < 0:
            raise OrchestrationError(f"min_partitions must be >= 0, got {min_partitions}")
        self.refreshed_after = refreshed_after
        self.min_partitions = min_partitions

    def moment(self) -> str:
        from airflow_partitions.catalog.model import format_time  # lazy: loads sqlglot
        from airflow_partitions.refresh.checks import parse_moment  # lazy: loads sqlglot

        return format_time(parse_moment(self.refreshed_after))

    def poke(self, context: Context) -> PokeReturnValue:
        from airflow_partitions.refresh.checks import partition_freshness  # lazy: loads sqlglot

        freshness = partition_freshness(
            self.spec_path, self.dataset, self.moment(), self.where, self.min_partitions
        )
        self.log.info(
            "%s version %s: %d partition(s) selected, %d refreshed before %s",
            self.dataset,
            freshness.version,
            freshness.selected,
            len(freshness.stale),
            freshness.refreshed_after,
        )
        return PokeReturnValue(
            is_done=freshness.fresh, xcom_value={"status": "success", **freshness.to_json()}
        )

    def trigger(self) -> PartitionFreshnessTrigger:
        return PartitionFreshnessTrigger(
            spec_path=os.path.abspath(self.spec_path),
            dataset=self.dataset,
            refreshed_after=self.moment(),
            where=self.where,
            min_partitions=self.min_partitions,
            poll_interval=self.poke_interval,
        )
