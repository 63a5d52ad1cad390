"""The preload's refresh DAGs: a process forked after it parses its DAG file without building them again.

Each case runs in a subprocess that preloads (as `airflow_local_settings.py` does), then forks: the fork
stands for a LocalExecutor task process or a DAG processor's parse, the parent for the process that
preloaded (a scheduler, or a CLI call that parses DAG files itself).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from airflow_e2e.sample import REPO_ROOT, install_example_dag, sample_spec

pytestmark = pytest.mark.airflow

# Counts `build_refresh_dag` calls (DAGs built, not taken) and parses a DAG folder like a task runner.
PROBE_HEAD = """\
import json, os, sys
from pathlib import Path
from airflow_partitions import dag_factory
from airflow_partitions.dag_factory import preload_task_modules

preload_task_modules()
built = []
_build = dag_factory.build_refresh_dag
def counting_build(*args, **kwargs):
    dag = _build(*args, **kwargs)
    built.append(dag.dag_id)
    return dag
dag_factory.build_refresh_dag = counting_build

def parse(folder, dag_id=None):
    from airflow.dag_processing.dagbag import DagBag
    if dag_id is None:
        os.environ.pop("_AIRFLOW_PARSING_CONTEXT_DAG_ID", None)
    else:
        os.environ["_AIRFLOW_PARSING_CONTEXT_DAG_ID"] = dag_id
    bag = DagBag(dag_folder=str(folder))
    return bag

def shape(dag):
    from airflow.serialization.serialized_objects import DagSerialization
    data = DagSerialization.serialize_dag(dag)
    for volatile in ("fileloc", "relative_fileloc", "last_loaded"):
        data.pop(volatile, None)
    return json.loads(json.dumps(data, sort_keys=True, default=str))

def in_child(work):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            report = work()
        except BaseException as err:
            report = {"error": repr(err)}
        with os.fdopen(write, "w") as out:
            json.dump(report, out)
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as got:
        text = got.read()
    os.waitpid(pid, 0)
    return json.loads(text)
"""


def run_probe(tmp_path: Path, dags: Path, body: str, **env: str) -> dict[str, Any]:
    script = PROBE_HEAD + textwrap.dedent(body)
    environment = {
        **{k: v for k, v in os.environ.items() if k not in ("AIRFLOW_PARTITIONS_SPEC",)},
        "PYTHONPATH": str(REPO_ROOT),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        **env,
    }
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=environment,
        cwd=tmp_path,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


@pytest.fixture
def dags(tmp_path: Path) -> Path:
    spec = sample_spec(
        accelerator_dir=tmp_path / "acc",
        sales_dir=tmp_path / "sales",
        orders_connection_id="pg_orders",
        snapshot_location="s3://snapshots-bucket/accel",
    )
    install_example_dag(tmp_path / "dags", spec)
    return tmp_path / "dags"


def test_a_forked_task_takes_the_preloaded_dag_and_the_same_shape(tmp_path: Path, dags: Path) -> None:
    """A task process forked after the preload finds its refresh DAG built (the dags folder's
    datasets.yaml is preloaded by default): its parse builds none, and the DAG is the one a parse that
    builds it gives (same tasks, params, schedule, docs, serialized alike). A second parse in the same
    process builds anew, and the preloading process itself always builds."""
    report = run_probe(
        tmp_path,
        dags,
        f"""
        folder = Path({str(dags)!r})
        def task():
            first = parse(folder, "refresh_sales")
            taken = list(built)
            again = parse(folder, "refresh_sales")
            return {{
                "dags": sorted(first.dags), "errors": dict(first.import_errors), "built_first": taken,
                "built_again": built[len(taken):],
                "same_shape": shape(first.dags["refresh_sales"]) == shape(again.dags["refresh_sales"]),
                "tasks": sorted(first.dags["refresh_sales"].task_dict),
            }}
        child = in_child(task)
        parent = parse(folder)
        print(json.dumps({{"child": child, "parent_built": sorted(built), "parent": sorted(parent.dags)}}))
        """,
    )
    child = report["child"]
    assert "error" not in child, child
    assert child["dags"] == ["refresh_sales"]
    assert child["errors"] == {}
    assert child["built_first"] == [], "the forked parse built a DAG the preload had built"
    assert child["built_again"] == ["refresh_sales"], "a second parse in one process must build anew"
    assert child["same_shape"], "the preloaded DAG differs from one built by the parse"
    assert "partition.refresh" in child["tasks"]
    assert "commit" in child["tasks"]
    assert report["parent_built"] == ["refresh_orders", "refresh_sales"]
    assert report["parent"] == ["refresh_orders", "refresh_sales"]


def test_an_edited_spec_or_other_arguments_are_built_anew(tmp_path: Path, dags: Path) -> None:
    """The preloaded DAGs stand only for the spec text and the default arguments they were built with: a
    call with other arguments builds (and leaves them for the default call), and after the spec file
    changes the fork builds the DAGs of the new text."""
    spec = dags / "datasets.yaml"
    report = run_probe(
        tmp_path,
        dags,
        f"""
        spec = Path({str(spec)!r})
        def other_arguments():
            dags = dag_factory.build_refresh_dags(spec, aws_conn_id="other_aws")
            after_other = sorted(built)
            default = dag_factory.build_refresh_dags(spec)
            return {{"other": after_other, "default": built[len(after_other):],
                     "conn": dags["refresh_sales"].get_task("discover").aws_conn_id}}
        def edited():
            spec.write_text(spec.read_text().replace("name: sales", "name: sales2"))
            dags = dag_factory.build_refresh_dags(spec)
            return {{"dags": sorted(dags), "built": sorted(built)}}
        print(json.dumps({{"other": in_child(other_arguments), "edited": in_child(edited)}}))
        """,
    )
    assert report["other"] == {
        "other": ["refresh_orders", "refresh_sales"],
        "default": [],
        "conn": "other_aws",
    }
    assert report["edited"] == {
        "dags": ["refresh_orders", "refresh_sales2"],
        "built": ["refresh_orders", "refresh_sales2"],
    }


def test_a_dag_file_that_keeps_no_globals_still_registers_the_preloaded_dags(
    tmp_path: Path, dags: Path
) -> None:
    """Building a DAG inside `with DAG(...)` registers it with the DAG file being parsed; a preloaded
    DAG handed back must be registered the same way, or a DAG file that does not put the DAGs in its
    globals would lose them in task processes only."""
    (dags / "refresh_datasets.py").write_text(
        "from airflow_partitions.dag_factory import build_refresh_dags, default_spec_path\n\n"
        "build_refresh_dags(default_spec_path(__file__))\n"
    )
    report = run_probe(
        tmp_path,
        dags,
        f"""
        def task():
            bag = parse(Path({str(dags)!r}), "refresh_orders")
            return {{"dags": sorted(bag.dags), "built": list(built)}}
        print(json.dumps(in_child(task)))
        """,
    )
    assert report == {"dags": ["refresh_orders"], "built": []}


def test_a_broken_spec_leaves_the_preload_and_the_parse_error_as_before(tmp_path: Path, dags: Path) -> None:
    """The preload of a spec that does not validate is skipped with a warning (Airflow still starts);
    the DAG file's parse then reports the spec's problems as its import error, as without a preload."""
    (dags / "datasets.yaml").write_text("accelerator_dir: .\ndatasets:\n  - name: broken\n")
    report = run_probe(
        tmp_path,
        dags,
        f"""
        def task():
            bag = parse(Path({str(dags)!r}))
            return {{"dags": sorted(bag.dags), "errors": list(bag.import_errors.values())}}
        print(json.dumps(in_child(task)))
        """,
    )
    assert report["dags"] == []
    assert len(report["errors"]) == 1
    assert "SpecValidationError" in report["errors"][0]


def test_preload_spec_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`[airflow_partitions] preload_specs` first, then $AIRFLOW_PARTITIONS_SPEC, then the DAG folder's
    datasets.yaml when there is one."""
    from airflow_partitions.dag_factory import SPEC_PATH_ENV, preload_spec_paths

    folder = tmp_path / "dags"
    folder.mkdir()
    monkeypatch.setenv("AIRFLOW__CORE__DAGS_FOLDER", str(folder))
    monkeypatch.delenv(SPEC_PATH_ENV, raising=False)
    monkeypatch.delenv("AIRFLOW__AIRFLOW_PARTITIONS__PRELOAD_SPECS", raising=False)
    assert preload_spec_paths() == []
    (folder / "datasets.yaml").write_text("datasets: []\n")
    assert preload_spec_paths() == [folder / "datasets.yaml"]
    monkeypatch.setenv(SPEC_PATH_ENV, str(tmp_path / "elsewhere.yaml"))
    assert preload_spec_paths() == [tmp_path / "elsewhere.yaml"]
    listed = f" {tmp_path / 'a.yaml'} ,, {tmp_path}/b.yaml"
    monkeypatch.setenv("AIRFLOW__AIRFLOW_PARTITIONS__PRELOAD_SPECS", listed)
    assert preload_spec_paths() == [tmp_path / "a.yaml", tmp_path / "b.yaml"]
