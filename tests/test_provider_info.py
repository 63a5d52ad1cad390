"""The provider entry point lists only what exists, and Airflow's provider manager accepts it."""

from __future__ import annotations

import importlib
import importlib.metadata

from airflow_partitions.provider_info import get_provider_info


def test_entry_point_is_registered() -> None:
    points = importlib.metadata.entry_points(group="apache_airflow_provider")
    assert any(p.value == "airflow_partitions.provider_info:get_provider_info" for p in points)


def test_every_listed_module_and_hook_class_imports() -> None:
    info = get_provider_info()
    for section in ("hooks", "operators", "sensors", "triggers"):
        for group in info[section]:
            for module in group["python-modules"]:
                importlib.import_module(module)
    for connection in info["connection-types"]:
        module, _, name = connection["hook-class-name"].rpartition(".")
        hook = getattr(importlib.import_module(module), name)
        assert hook.conn_type == connection["connection-type"]


def test_airflow_providers_manager_loads_the_provider_and_its_connection_type() -> None:
    from airflow.providers_manager import ProvidersManager

    manager = ProvidersManager()
    assert "airflow-partitions" in manager.providers
    assert "airflow_partitions" in manager.hooks


def test_the_airflow_cli_still_builds_with_the_provider_installed() -> None:
    """A provider CLI command clashing with a core one (e.g. `partitions`) breaks every `airflow` call."""
    import subprocess
    import sys
    from pathlib import Path

    airflow_bin = Path(sys.executable).with_name("airflow")
    result = subprocess.run([str(airflow_bin), "version"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
