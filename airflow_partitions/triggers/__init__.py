"""Triggers of the deferrable sensors (they run in Airflow's triggerer)."""

from __future__ import annotations

from airflow_partitions.triggers.partitions import PartitionFreshnessTrigger, SourceChangeTrigger

__all__ = ["PartitionFreshnessTrigger", "SourceChangeTrigger"]
