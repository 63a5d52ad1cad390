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
    for decorator in info["task-decorators"]:
        module, _, name = decorator["class-name"].rpartition(".")
        assert callable(getattr(importlib.import_module(module), name)), decorator
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


def test_partitions_page_plugin_is_declared_as_an_airflow_plugins_entry_point() -> None:
    """Airflow loads `airflow.plugins` entry points in every process; provider-info plugins only with
    lazy_load_providers off. The declared object is the plugin, and building it imports no FastAPI."""
    import subprocess
    import sys
    import tomllib
    from pathlib import Path

    from airflow.plugins_manager import AirflowPlugin

    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    target = pyproject["project"]["entry-points"]["airflow.plugins"]["airflow_partitions"]
    module, _, name = target.partition(":")
    plugin = getattr(importlib.import_module(module), name)
    assert issubclass(plugin, AirflowPlugin)
    assert [app["url_prefix"] for app in plugin.fastapi_apps] == ["/partitions"]
    assert {view["destination"] for view in plugin.external_views} == {"nav", "dag"}
    assert "plugins" not in get_provider_info(), "registered once, through the entry point"
    probe = (
        f"import sys, {module}; "
        "print(sorted(m for m in ('fastapi', 'airflow.api_fastapi.core_api.security') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert "airflow.api_fastapi.core_api.security" not in loaded.stdout, "task processes load plugins too"
