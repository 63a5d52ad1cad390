"""Sensors on partitioned datasets: source changed since the last refresh, partitions fresh enough."""

from __future__ import annotations

from airflow_partitions.sensors.partitions import PartitionFreshnessSensor, SourceChangeSensor

__all__ = ["PartitionFreshnessSensor", "SourceChangeSensor"]
