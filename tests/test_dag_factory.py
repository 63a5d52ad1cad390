"""The DAG factory and the example DAG file: import cleanly, the refresh DAG's shape, params, parse cost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from airflow_e2e.sample import REPO_ROOT, install_example_dag, sample_spec

from airflow_partitions.exceptions import RunConfError, SpecValidationError
from airflow_partitions.operators.run_conf import RUN_PARAM_SCHEMAS, RefreshRunConf

pytestmark = pytest.mark.airflow

HEAVY_MODULES = ("pyspark", "pyarrow", "duckdb", "pandas", "boto3")


def _dagbag(folder: Path) -> object:
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(folder))


@pytest.fixture
def sample_dags(tmp_path: Path) -> Path:
    spec = sample_spec(
        accelerator_dir=tmp_path / "acc",
        sales_dir=tmp_path / "sales",
        snapshot_location="s3://snapshots-bucket/accel",
        sales_schedule="@hourly",
    )
    install_example_dag(tmp_path / "dags", spec)
    return tmp_path / "dags"


def test_example_dag_folder_imports_without_errors() -> None:
    from airflow_partitions.spec import load_spec

    bag = _dagbag(REPO_ROOT / "dags")
    assert bag.import_errors == {}, f"dags/ must import cleanly: {bag.import_errors}"
    project = load_spec(REPO_ROOT / "dags" / "datasets.yaml")
    expected = {f"refresh_{d.name}" for d in project.datasets if d.acceleration.enabled}
    assert set(bag.dag_ids) == expected, "one refresh DAG per enabled dataset of dags/datasets.yaml"


def test_refresh_dag_shape_with_snapshots(sample_dags: Path) -> None:
    bag = _dagbag(sample_dags)
    assert bag.import_errors == {}
    dag = bag.dags["refresh_sales"]
    assert set(dag.task_ids) == {
        "bootstrap_snapshot",
        "discover",
        "stage",
        "partition.refresh",
        "partition.upload_snapshot",
        "commit",
        "publish_snapshot",
    }
    assert dag.get_task("bootstrap_snapshot").downstream_task_ids == {"discover"}
    assert dag.get_task("discover").trigger_rule == "none_failed", (
        "a skipped bootstrap must not skip discovery"
    )
    assert dag.get_task("stage").upstream_task_ids == {"discover"}
    refresh = dag.get_task("partition.refresh")
    assert refresh.upstream_task_ids == {"discover", "stage"}
    assert refresh.map_index_template == "{{ task.partition_label }}", "UI label = readable partition key"
    upload = dag.get_task("partition.upload_snapshot")
    assert upload.upstream_task_ids == {"partition.refresh"}
    assert upload.map_index_template == "{{ task.upload_label }}"
    # One partition's result is labelled by its key path, a batch task's list by count and ends.
    from airflow_partitions.operators import SnapshotUploadOperator

    def upload_label(result: object) -> str:
        spec = str(sample_dags / "datasets.yaml")
        return SnapshotUploadOperator(
            task_id="u", spec_path=spec, dataset="sales", partition_result=result
        ).upload_label

    assert upload_label({"key_path": "region=EU"}) == "region=EU"
    pair = [{"key_path": "region=EU"}, {"key_path": "region=US"}]
    assert upload_label(pair) == "2 partitions: region=EU .. region=US"
    commit = dag.get_task("commit")
    assert commit.upstream_task_ids == {"discover", "stage", "partition.refresh", "partition.upload_snapshot"}
    assert commit.trigger_rule == "none_failed", "skipped partition tasks must not skip a removal commit"
    assert [o.name for o in commit.outlets] == ["sales"]
    assert commit.outlets[0].uri == (sample_dags.parent / "acc" / "sales").resolve().as_uri()
    assert dag.get_task("publish_snapshot").upstream_task_ids == {"commit"}
    assert dag.max_active_runs == 1
    assert dag.catchup is False
    assert "partitions" in dag.doc_md
    assert "region" in dag.doc_md


def test_schedule_comes_from_the_spec(sample_dags: Path) -> None:
    dag = _dagbag(sample_dags).dags["refresh_sales"]
    # A trigger timetable with no start date: unpausing starts no run (tests/test_forms.py).
    assert type(dag.timetable).__name__ == "CronTriggerTimetable"
    assert dag.timetable.expression == "0 * * * *", "@hourly"


def test_snapshot_tasks_only_when_the_mode_uploads(tmp_path: Path) -> None:
    spec = sample_spec(accelerator_dir=tmp_path / "acc", sales_dir=tmp_path / "sales")
    install_example_dag(tmp_path / "dags", spec)
    dag = _dagbag(tmp_path / "dags").dags["refresh_sales"]
    assert set(dag.task_ids) == {"discover", "stage", "partition.refresh", "commit"}, (
        "snapshots disabled: no bootstrap, upload or publish task"
    )
    assert dag.timetable.partitioned_at_runtime, "unscheduled: triggered runs may carry a partition_key"
    assert dag.timetable.partitioned, "so the trigger dialog shows its Partition Key field"
    assert not dag.timetable.can_be_scheduled


def test_spark_settings_and_a_second_stage_less_dag_over_one_dataset(tmp_path: Path) -> None:
    from airflow_partitions.dag_factory import build_refresh_dag, build_refresh_dags
    from airflow_partitions.spec import load_spec

    spec = install_example_dag(
        tmp_path / "dags", sample_spec(accelerator_dir=tmp_path / "acc", sales_dir=tmp_path / "sales")
    )
    conf = {"spark.executor.memory": "8g"}
    staged = build_refresh_dags(spec, spark_conn_id="spark_default", spark_conf=conf)["refresh_sales"]
    for task_id in ("stage", "partition.refresh"):
        task = staged.get_task(task_id)
        assert task.spark_conn_id == "spark_default"
        assert task.spark_conf == conf

    project = load_spec(spec, check_types=False)
    per_partition = build_refresh_dag(project, "sales", stage=False, dag_id="refresh_sales_each")
    assert per_partition.dag_id == "refresh_sales_each"
    assert "stage" not in per_partition.task_ids
    refresh = per_partition.get_task("partition.refresh")
    assert refresh.stage is None, "each partition task stages its own partition"
    assert refresh.plan is not None


def test_params_offer_the_trigger_form_fields(sample_dags: Path) -> None:
    dag = _dagbag(sample_dags).dags["refresh_sales"]
    assert dag.params.dump() == {"partitions": None, "where": None, "full_refresh": False, "snapshot": True}
    schema = {name: dag.params.get_param(name).schema for name in RUN_PARAM_SCHEMAS}
    assert schema["partitions"]["type"] == ["null", "array"]
    assert schema["partitions"]["items"]["type"] == "string"
    assert schema["where"]["type"] == ["null", "string"]
    assert schema["full_refresh"]["type"] == "boolean"
    assert schema["snapshot"]["type"] == "boolean"
    assert all(dag.params.get_param(name).description for name in RUN_PARAM_SCHEMAS)
    # The API validates a run's conf against these schemas before creating the run.
    from airflow.sdk.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError):
        dag.params.get_param("partitions").resolve("region=EU")
    with pytest.raises(ParamValidationError):
        dag.params.get_param("full_refresh").resolve("yes")
    assert dag.params.get_param("partitions").resolve(["region=EU/day=x"]) == ["region=EU/day=x"]


def test_broken_spec_is_reported_as_an_import_error(tmp_path: Path) -> None:
    bad = textwrap.dedent(
        """\
        accelerator_dir: acc
        datasets:
          - name: sales
            from: file:data/
            params: {file_format: parquet}
            acceleration:
              partition_by:
                - bucket(0, id)
        """
    )
    install_example_dag(tmp_path / "dags", bad)
    errors = _dagbag(tmp_path / "dags").import_errors
    assert len(errors) == 1
    (message,) = errors.values()
    assert "SpecValidationError" in message, message
    assert "bucket" in message, message


def test_factory_raises_spec_errors_directly(tmp_path: Path) -> None:
    from airflow_partitions.dag_factory import build_refresh_dags

    (tmp_path / "spec.yaml").write_text("datasets: [{name: x}]\n")
    with pytest.raises(SpecValidationError):
        build_refresh_dags(tmp_path / "spec.yaml")


def test_spec_path_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_partitions.dag_factory import SPEC_PATH_ENV, default_spec_path

    monkeypatch.delenv(SPEC_PATH_ENV, raising=False)
    assert default_spec_path(tmp_path / "dags" / "f.py") == (tmp_path / "dags" / "datasets.yaml").resolve()
    monkeypatch.setenv(SPEC_PATH_ENV, str(tmp_path / "other.yaml"))
    assert default_spec_path(tmp_path / "dags" / "f.py") == tmp_path / "other.yaml"


def test_parsing_the_dag_file_imports_no_heavy_module() -> None:
    """Measured in a fresh interpreter: what parsing dags/ costs beyond `import airflow.sdk`."""
    probe = textwrap.dedent(
        f"""\
        import json, runpy, sys, time
        import airflow.sdk
        started = time.perf_counter()
        found = runpy.run_path({str(REPO_ROOT / "dags" / "refresh_datasets.py")!r})
        elapsed = time.perf_counter() - started
        print(json.dumps({{
            "seconds": elapsed,
            "dags": sorted(k for k in found if k.startswith("refresh_")),
            "heavy": sorted(m for m in {list(HEAVY_MODULES)!r} if m in sys.modules),
        }}))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=180, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"DAG file parse time (after airflow.sdk): {report['seconds']:.3f}s for {len(report['dags'])} DAGs")
    assert report["dags"], "the example DAG file defines DAGs"
    assert report["heavy"] == [], f"parsing dags/ must not import {report['heavy']}"


# --- run options ----------------------------------------------------------------------------------


def test_run_conf_defaults_and_explicit_arguments_win() -> None:
    params = {"partitions": ["a=1"], "where": "a = 1", "full_refresh": True, "snapshot": False}
    assert RefreshRunConf.from_mapping({}) == RefreshRunConf()
    assert RefreshRunConf.from_mapping(params) == RefreshRunConf(("a=1",), "a = 1", True, False)
    explicit = RefreshRunConf.from_mapping(params, partitions=["b=2"], full_refresh=False)
    assert explicit.partitions == ("b=2",)
    assert explicit.full_refresh is False
    assert explicit.where == "a = 1", "arguments left as None fall back to the run's params"


def test_run_conf_normalises_form_input() -> None:
    assert RefreshRunConf.from_mapping({"partitions": "a=1\n\n a=2 \n"}).partitions == ("a=1", "a=2")
    assert RefreshRunConf.from_mapping({"partitions": []}).partitions is None, "an empty list selects nothing"
    assert RefreshRunConf.from_mapping({"where": "   "}).where is None


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"partitions": [""]}, "non-empty canonical partition keys"),
        ({"partitions": 7}, "list of canonical partition keys"),
        ({"where": ["a"]}, "SQL filter string"),
        ({"full_refresh": "yes"}, "true or false"),
        ({"snapshot": 1}, "true or false"),
    ],
)
def test_run_conf_rejects_bad_values(values: dict[str, object], message: str) -> None:
    with pytest.raises(RunConfError, match=message):
        RefreshRunConf.from_mapping(values)


def test_run_conf_round_trips_to_the_conf_the_ui_sends() -> None:
    run = RefreshRunConf(partitions=("a=1",), where=None, full_refresh=True, snapshot=False)
    assert json.loads(json.dumps(run.to_conf())) == run.to_conf()
    assert RefreshRunConf.from_mapping(run.to_conf()) == run


def test_preload_leaves_a_forked_task_nothing_to_import(tmp_path: Path) -> None:
    """A task process forked after `airflow_local_settings.py` parses its DAG file again, loads the spec
    with types and plans or renders its partition: with the preload, none of that imports a module (every
    cold import there is paid again by every mapped partition task)."""
    from airflow_e2e.sample import write_sales

    write_sales(tmp_path / "sales", rows=30, days=2)
    dags = tmp_path / "dags"
    spec = install_example_dag(
        dags,
        sample_spec(
            accelerator_dir=tmp_path / "acc",
            sales_dir=tmp_path / "sales",
            snapshot_location="s3://snapshots-bucket/accel",
        ),
    )
    probe = textwrap.dedent(
        f"""\
        import json, runpy, sys
        import airflow.sdk
        from airflow_partitions.dag_factory import preload_task_modules
        preload_task_modules()
        before = set(sys.modules)
        found = runpy.run_path({str(dags / "refresh_datasets.py")!r})
        from airflow_partitions.operators import SparkPartitionRefreshOperator
        from airflow_partitions.refresh import plan_refresh
        op = SparkPartitionRefreshOperator(
            task_id="refresh", spec_path={str(spec)!r}, dataset="sales", work_item=None
        )
        plan = plan_refresh(op.project, op.dataset_spec)
        op.work_item = plan.items[0].to_json()
        label = op.partition_label
        watched = ("airflow", "airflow_partitions", "sqlglot", "pyarrow", "duckdb", "pandas", "numpy")
        print(json.dumps({{
            "dags": sorted(k for k in found if k.startswith("refresh_")),
            "label": label,
            "imported": sorted(m for m in set(sys.modules) - before if m.split(".")[0] in watched),
        }}))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["dags"] == ["refresh_sales"]
    assert report["label"].startswith("region="), report["label"]
    assert report["imported"] == [], f"imported after the preload: {report['imported']}"


def test_a_task_process_builds_only_its_own_dag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Airflow's task runner parses the DAG file again with its DAG id in the parsing context: the
    file then builds that one refresh DAG, not one per dataset of the spec; without a context (the
    dag-processor) every DAG is built."""
    import runpy

    from airflow.sdk.definitions.context import _AIRFLOW_PARSING_CONTEXT_DAG_ID

    spec = sample_spec(
        accelerator_dir=tmp_path / "acc", sales_dir=tmp_path / "sales", orders_connection_id="pg_orders"
    )
    dag_file = install_example_dag(tmp_path / "dags", spec).with_name("refresh_datasets.py")

    def built() -> list[str]:
        return sorted(k for k, v in runpy.run_path(str(dag_file)).items() if k.startswith("refresh_"))

    monkeypatch.delenv(_AIRFLOW_PARSING_CONTEXT_DAG_ID, raising=False)
    assert built() == ["refresh_orders", "refresh_sales"]
    monkeypatch.setenv(_AIRFLOW_PARSING_CONTEXT_DAG_ID, "refresh_orders")
    assert built() == ["refresh_orders"]
    monkeypatch.setenv(_AIRFLOW_PARSING_CONTEXT_DAG_ID, "some_other_dag")
    assert built() == [], "a task of another DAG in the same file builds none of ours"
