"""Trigger forms and connection forms that refuse mistakes: unknown conf keys, malformed partition keys,
runs started by unpausing, and the connection form Airflow builds from the provider info."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow_e2e.sample import install_example_dag, sample_spec, write_sales

from airflow_partitions.exceptions import DiscoveryError, RunConfError
from airflow_partitions.keys import PartitionKey, key_text_problem
from airflow_partitions.operators.run_conf import RUN_PARAM_SCHEMAS, check_conf_keys

NAMES = ("region", "day")


# --- conf keys ------------------------------------------------------------------------------------


def test_an_unknown_conf_key_is_refused_with_a_suggestion_and_the_valid_keys() -> None:
    with pytest.raises(RunConfError) as caught:
        check_conf_keys({"wher": "region = 'EU'", "full_refresh": True}, RUN_PARAM_SCHEMAS)
    message = str(caught.value)
    assert "'wher' (did you mean 'where'?)" in message
    assert "valid keys: full_refresh, partitions, snapshot, where" in message


def test_a_key_far_from_every_valid_one_gets_no_guess_and_known_keys_pass() -> None:
    with pytest.raises(RunConfError) as caught:
        check_conf_keys({"zzz": 1, "full_refresh": True}, RUN_PARAM_SCHEMAS)
    assert "'zzz'" in str(caught.value)
    assert "did you mean" not in str(caught.value)
    check_conf_keys(
        {"where": None, "partitions": None, "full_refresh": False, "snapshot": True}, RUN_PARAM_SCHEMAS
    )
    check_conf_keys({"owner_team": "x"}, {*RUN_PARAM_SCHEMAS, "owner_team"})  # a param the DAG declares


# --- partition keys -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        PartitionKey(("EU/West=1%", None)).path(NAMES),  # canonical: escaped `/`, `=`, `%`; NULL
        "region=EU/day=2026-01-01T00%3A00%3A00",
        "region=EU/West/day=2026-01-01T00:00:00",  # readable: `/` inside a value
        "/region=EU/day=2026-01-01/",
        "EU|2026-01-01T00:00:00",  # Airflow's composite key: one value per field
        "EU/West=1%25|%NULL",
    ],
)
def test_keys_of_the_dataset_shape_pass(text: str) -> None:
    assert key_text_problem(text, NAMES) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("day=2026-01-01/region=EU", "must start with `region=`"),
        ("bucket=7", "must start with `region=`"),
        ("region=EU", "gives 1 of the 2 partition fields (region, day), missing day"),
        ("region=EU/dya=2026-01-01", "'dya' is not a partition field"),
        ("EU|2026-01-01|x", "or be Airflow's partition key (2 value(s) joined by `|`)"),
    ],
)
def test_keys_of_another_shape_are_refused_naming_the_fields(text: str, expected: str) -> None:
    problem = key_text_problem(text, NAMES)
    assert problem is not None
    assert expected in problem
    assert "region=<value>/day=<value>" in problem


def test_the_partitions_param_shows_the_dataset_key_format_and_its_pattern_checks_it(tmp_path: Path) -> None:
    import jsonschema

    from airflow_partitions.operators.run_conf import partitions_schema
    from airflow_partitions.spec import parse_spec

    project = parse_spec(
        "accelerator_dir: acc\ndatasets:\n  - name: sales\n    from: file:sales/\n"
        "    params: {file_format: parquet}\n    schema: {region: string, ts: 'timestamp[us]', n: int64}\n"
        "    acceleration:\n      engine: parquet\n      partition_by:\n"
        "        - region: region\n        - day: \"date_trunc('day', ts)\"\n",
        base_dir=tmp_path,
        check_types=False,
    )
    schema = partitions_schema(project.dataset("sales"))
    assert "`region=<value>/day=<value>`" in schema["description"]
    assert "`region=EU/day=2026-01-01T00%3A00%3A00`" in schema["description"]
    assert "`region=EU/day=2026-01-01T00:00:00`" in schema["description"], "the readable form too"
    assert "`EU|2026-01-01T00:00:00`" in schema["description"], "and Airflow's composite key"
    jsonschema.validate(
        ["region=EU/day=2026-01-01T00%3A00%3A00", "region=a/b/day=x", "EU|2026-01-01"], schema
    )
    for wrong in (["day=2026-01-01/region=EU"], ["region=EU"], ["bucket=7"], ["EU|2026|x"]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, schema)


# --- runs through Airflow -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def refresh_dags(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    """`refresh_sales` (snapshot bootstrap first) and `refresh_sales_plain` (discovery first)."""
    from airflow_e2e.metadata_db import in_process_metadata_db

    root = tmp_path_factory.mktemp("forms")
    write_sales(root / "sales", rows=30, days=2)
    install_example_dag(
        root / "dags",
        sample_spec(
            accelerator_dir=root / "acc",
            sales_dir=root / "sales",
            snapshot_location="s3://forms-snapshots/accel",
            sales_schedule="@hourly",
        ),
    )
    plain_spec = root / "plain.yaml"
    plain_spec.write_text(sample_spec(accelerator_dir=root / "acc_plain", sales_dir=root / "sales"))
    (root / "dags" / "plain_dag.py").write_text(
        "from airflow_partitions.dag_factory import build_refresh_dag\n"
        "from airflow_partitions.spec import load_spec\n"
        f"dag = build_refresh_dag(load_spec({str(plain_spec)!r}), 'sales', dag_id='refresh_sales_plain')\n"
    )
    with in_process_metadata_db(str(root / "dags")):
        from airflow.dag_processing.dagbag import DagBag

        bag = DagBag(dag_folder=str(root / "dags"))
        assert bag.import_errors == {}, bag.import_errors
        yield root, bag.dags


def _states(run: Any) -> dict[str, str | None]:
    return {ti.task_id: (str(ti.state) if ti.state else None) for ti in run.get_task_instances()}


@pytest.mark.airflow
@pytest.mark.postgres
@pytest.mark.parametrize(
    ("dag_id", "first_task"), [("refresh_sales_plain", "discover"), ("refresh_sales", "bootstrap_snapshot")]
)
def test_a_misspelt_conf_key_fails_the_first_task_and_nothing_is_written(
    refresh_dags: tuple[Path, dict[str, Any]], capfd: pytest.CaptureFixture[str], dag_id: str, first_task: str
) -> None:
    root, dags = refresh_dags
    # Before the check, `wher` was dropped and this ran a full refresh of every partition.
    run = dags[dag_id].test(run_conf={"wher": "region = 'EU'", "full_refresh": True})
    states = _states(run)
    assert str(run.state) == "failed"
    assert states[first_task] == "failed", "the first task refuses the conf"
    assert states["stage"] == "upstream_failed", "no Spark stage, no partition task"
    assert not (root / "acc").exists(), "no catalog, no stage"
    assert not (root / "acc_plain").exists(), "no catalog, no stage"
    out, err = capfd.readouterr()
    assert "unknown key 'wher' (did you mean 'where'?)" in out + err
    assert "valid keys: full_refresh, partitions, snapshot, where" in out + err


@pytest.mark.airflow
@pytest.mark.postgres
def test_a_partition_key_of_another_shape_is_refused_when_triggered_and_by_discovery(
    refresh_dags: tuple[Path, dict[str, Any]],
) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    from airflow_partitions.operators.run_conf import RefreshRunConf
    from airflow_partitions.refresh.pipeline import plan_refresh
    from airflow_partitions.spec import load_spec

    root, dags = refresh_dags
    conf = {
        "partitions": ["day=2026-01-01/region=EU"],
        "where": None,
        "full_refresh": False,
        "snapshot": True,
    }
    with pytest.raises(ParamValidationError, match="partitions"):
        dags["refresh_sales_plain"].test(run_conf=conf)  # the trigger form / REST API check
    assert not (root / "acc_plain").exists()
    # Keys given as operator arguments skip the form: the discovery task checks them first, and the
    # core's discovery (CLI refreshes) before surveying the source.
    project = load_spec(root / "plain.yaml")
    names = project.dataset("sales").acceleration.partition_names
    with pytest.raises(RunConfError, match="this dataset's keys look like region=<value>/day=<value>"):
        RefreshRunConf(partitions=("day=2026-01-01/region=EU",)).check_partitions("sales", names)
    with pytest.raises(DiscoveryError, match="missing day"):
        plan_refresh(project, project.dataset("sales"), partitions=["region=EU"])


def test_factory_dags_start_no_run_when_unpaused(tmp_path: Path) -> None:
    """No start date, no catchup and a trigger timetable that waits for the next tick: nothing is due."""
    import datetime as dt

    from airflow.sdk import CronTriggerTimetable
    from airflow.timetables.base import TimeRestriction

    from airflow_partitions.dag_factory import build_refresh_dags

    install_example_dag(
        tmp_path / "dags",
        sample_spec(accelerator_dir=tmp_path / "acc", sales_dir=tmp_path / "sales", sales_schedule="@hourly"),
    )
    dag = build_refresh_dags(tmp_path / "dags" / "datasets.yaml")["refresh_sales"]
    assert dag.catchup is False
    assert dag.start_date is None
    assert isinstance(dag.timetable, CronTriggerTimetable)
    # What the scheduler asks when the DAG is unpaused: the first run is the next tick, never one due now.
    from airflow.serialization.encoders import coerce_to_core_timetable

    timetable = coerce_to_core_timetable(dag.timetable)
    before = dt.datetime.now(dt.UTC)
    info = timetable.next_dagrun_info(
        last_automated_data_interval=None, restriction=TimeRestriction(None, None, catchup=False)
    )
    assert info is not None
    assert info.run_after > before, f"unpausing would start a run at once ({info.run_after} <= {before})"
    assert info.run_after - before <= dt.timedelta(hours=1)


# --- connection form ------------------------------------------------------------------------------


def test_providers_manager_shows_our_connection_form() -> None:
    from airflow.providers_manager import ProvidersManager

    manager = ProvidersManager()
    behaviour = manager.field_behaviours["airflow_partitions"]
    assert set(behaviour["hidden_fields"]) >= {"host", "login", "password", "port", "schema"}
    widgets = manager.connection_form_widgets
    for field in ("spec_path", "data_root", "aws_conn_id", "cache_dir", "cache_max_bytes"):
        assert f"extra__airflow_partitions__{field}" in widgets, field
    spec_path = widgets["extra__airflow_partitions__spec_path"]
    assert spec_path.field["schema"]["title"] == "Spec path"
    assert spec_path.field["description"]
    assert (
        manager.providers["airflow-partitions"].data["connection-types"][0]["hook-name"]
        == "Airflow Partitions"
    )


def test_the_providers_page_links_to_the_documentation_url_the_package_declares() -> None:
    import tomllib

    from airflow_partitions.provider_info import DOCUMENTATION_URL, get_provider_info

    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())[
        "project"
    ]
    assert project["urls"]["Documentation"] == DOCUMENTATION_URL
    assert DOCUMENTATION_URL.endswith("/partitions/docs"), "served by the provider's own plugin"
    info = get_provider_info()
    assert info["integrations"][0]["external-doc-url"] == DOCUMENTATION_URL
    assert "pypi.org" not in str(info), "the package is not on PyPI: no link there"


def test_the_documentation_page_renders_the_installed_readme() -> None:
    """What the providers page's documentation link opens: the README the installed package carries."""
    from airflow_partitions.plugins.partitions_api import documentation_html

    page = documentation_html()
    assert "<h2>Quick start</h2>" in page
    assert "<table>" in page, "README tables render as tables"
    assert "<script" not in page.lower(), "raw HTML in the README is not passed through"
