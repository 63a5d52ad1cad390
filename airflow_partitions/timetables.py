"""The timetable of an unscheduled refresh DAG: triggered runs carry a partition key, and Airflow's trigger
dialog shows its Partition Key field.

Airflow 3.3's `PartitionedAtRuntime` accepts a trigger-time `partition_key` but reports `partitioned:
false`, and the UI shows the Partition Key field only for DAGs whose timetable is `partitioned`. This one is
`PartitionedAtRuntime` that also says `partitioned`: it schedules nothing (`can_be_scheduled` is false,
so the scheduler never asks it for a partition of its own) and resolves no partition date. Airflow finds it
by its import path through the provider's plugin (`plugins.partitions.PartitionsPlugin.timetables`).
"""

from __future__ import annotations

from airflow.timetables.simple import PartitionedAtRuntime


class TriggeredPartitionTimetable(PartitionedAtRuntime):
    """Never scheduled; each triggered run may carry the partition key it refreshes."""

    description: str = "Never, partition key set when triggered"
    partitioned = True
    partitioned_at_runtime = True

    @property
    def summary(self) -> str:
        return "Partition key at trigger"
