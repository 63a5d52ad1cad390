"""Airflow provider that keeps partitioned accelerations of source datasets fresh and serves pruned reads."""

from __future__ import annotations

__version__ = "0.1.0"
