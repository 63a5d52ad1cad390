"""What a pip-installed deployment gets: the wheel carries the Spark application spark-submit runs."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from airflow_partitions.hooks.spark_refresh import spark_job_path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "airflow_partitions"


def test_spark_job_is_found_inside_the_package() -> None:
    # The hook must not depend on the repository checkout: the package's own copy comes first.
    assert spark_job_path() == PACKAGE / "spark_jobs" / "refresh_partitions.py"


def test_spark_job_script_directory_holds_nothing_that_could_shadow_a_module() -> None:
    # spark-submit puts the script's directory first on sys.path.
    assert {p.name for p in (PACKAGE / "spark_jobs").iterdir() if p.name != "__pycache__"} == {
        "__init__.py",
        "refresh_partitions.py",
    }


@pytest.mark.slow
def test_wheel_ships_the_spark_job_and_type_marker(built_wheel: Path) -> None:
    wheel = built_wheel
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "airflow_partitions/spark_jobs/refresh_partitions.py" in names
    assert "airflow_partitions/py.typed" in names
    assert not any(name.startswith(("tests/", "benchmarks/", "dags/")) for name in names)
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "apache_airflow_provider" in text
    assert "airflow-partitions" in text
