"""What installing the package gives a user: version ranges whose floors `make compat` installs, the example
DAG and spec inside the wheel, and `airflow-partitions init` writing a DAG folder Airflow parses."""

from __future__ import annotations

import re
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "airflow_partitions"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _requirements() -> dict[str, Requirement]:
    return {Requirement(text).name: Requirement(text) for text in PYPROJECT["project"]["dependencies"]}


def _pins(path: Path) -> dict[str, str]:
    lines = [line.strip() for line in path.read_text().splitlines()]
    return dict(line.split("==", 1) for line in lines if line and not line.startswith("#"))


def test_airflow_and_the_data_libraries_take_ranges_not_pins() -> None:
    requirements = _requirements()
    for name in ("apache-airflow", "pyarrow", "duckdb", "boto3"):
        specifiers = {s.operator for s in requirements[name].specifier}
        assert ">=" in specifiers, f"{name}: {requirements[name]}"
        assert "==" not in specifiers, f"{name}: {requirements[name]}"
    assert requirements["apache-airflow"].specifier.contains("3.9.0"), "every later 3.x"
    assert not requirements["apache-airflow"].specifier.contains("4.0.0")


def test_make_compat_installs_exactly_the_declared_floors() -> None:
    """constraints-lowest.txt is what `make compat` smoke-tests: each pin must be the range's floor."""
    requirements = _requirements()
    lowest = _pins(ROOT / "constraints-lowest.txt")
    for name in ("apache-airflow", "pyarrow", "duckdb", "boto3"):
        floor = next(s.version for s in requirements[name].specifier if s.operator == ">=")
        assert lowest[name] == floor, f"{name}: compat installs {lowest[name]}, pyproject's floor is {floor}"
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^test:.*\bcompat\b", makefile, re.MULTILINE), "`make test` runs the smoke test"
    assert "-c constraints-lowest.txt" in makefile
    assert "-c constraints.txt" in makefile


def test_the_dev_constraints_pin_what_the_ranges_allow() -> None:
    requirements = _requirements()
    pinned = _pins(ROOT / "constraints.txt")
    for name, requirement in requirements.items():
        if name in pinned:
            assert requirement.specifier.contains(pinned[name], prereleases=True), (
                f"constraints.txt pins {name}=={pinned[name]} outside {requirement}"
            )


def test_the_packaged_example_dag_file_is_the_repository_one() -> None:
    assert (PACKAGE / "examples" / "refresh_datasets.py").read_bytes() == (
        ROOT / "dags" / "refresh_datasets.py"
    ).read_bytes(), "airflow_partitions/examples/refresh_datasets.py is a copy of dags/refresh_datasets.py"


@pytest.mark.airflow
def test_init_writes_a_dag_folder_that_airflow_parses(tmp_path: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag

    from airflow_partitions.cli.init import write_example
    from airflow_partitions.cli.main import main
    from airflow_partitions.exceptions import ExampleInitError

    assert main(["init", str(tmp_path / "site"), "--rows", "200"]) == 0
    dags = tmp_path / "site" / "dags"
    assert sorted(p.name for p in dags.iterdir()) == ["datasets.yaml", "refresh_datasets.py"]
    assert sorted(p.name for p in (tmp_path / "site" / "data").iterdir()) == [
        "events",
        "sensor_readings",
        "taxi_trips",
    ]
    bag = DagBag(dag_folder=str(dags))
    assert bag.import_errors == {}, bag.import_errors
    assert set(bag.dag_ids) == {"refresh_taxi_trips", "refresh_events", "refresh_sensor_readings"}
    assert main(["validate", str(dags / "datasets.yaml")]) == 0, "the sources it reads exist"
    with pytest.raises(ExampleInitError, match="--force"):
        write_example(tmp_path / "site", data=False)


@pytest.mark.slow
def test_the_wheel_carries_the_example_and_the_project_urls(built_wheel: Path) -> None:
    wheel = built_wheel
    archive = zipfile.ZipFile(wheel)
    names = set(archive.namelist())
    assert {
        "airflow_partitions/examples/refresh_datasets.py",
        "airflow_partitions/examples/datasets.yaml",
    } <= names
    assert "airflow_partitions/cli/init.py" in names
    metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    from airflow_partitions.provider_info import DOCUMENTATION_URL

    assert f"Project-URL: Documentation, {DOCUMENTATION_URL}" in metadata
    assert "Requires-Dist: apache-airflow<4,>=3.3.0" in metadata
