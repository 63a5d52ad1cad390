"""`airflow-partitions backfill`: partition selection, dry runs, argument errors, local runs, Airflow CLI.

Triggering through a real Airflow REST API is covered end to end in test_e2e_airflow.py.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from airflow_e2e.sample import install_example_dag, sample_spec, write_sales
from airflow_e2e.stack import free_port

from airflow_partitions.cli.backfill import ARGUMENTS, AirflowApiClient, airflow_cli_commands
from airflow_partitions.cli.main import main
from airflow_partitions.exceptions import AirflowApiError

pytestmark = pytest.mark.airflow

EU_KEYS = ["region=EU/day=2026-01-01T00%3A00%3A00", "region=EU/day=2026-01-02T00%3A00%3A00"]


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    write_sales(tmp_path / "sales", rows=60, days=2)
    return install_example_dag(
        tmp_path / "dags", sample_spec(accelerator_dir=tmp_path / "acc", sales_dir=tmp_path / "sales")
    )


def test_dry_run_lists_the_partitions_a_filter_selects(
    spec: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["backfill", str(spec), "sales", "--where", "region = 'EU'", "--dry-run", "--json"])
    report = _json_document(capsys.readouterr().out)
    assert code == 0
    assert [p["key_path"] for p in report["partitions"]] == EU_KEYS
    assert report["discovered"] == 6
    assert report["dag_id"] == "refresh_sales"
    assert report["conf"] == {"partitions": EU_KEYS, "where": None, "full_refresh": True, "snapshot": True}, (
        "the conf the UI's trigger form would send for these partitions"
    )


def test_dry_run_text_and_explicit_partitions(spec: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["backfill", str(spec), "sales", "--partitions", EU_KEYS[1], "--dry-run", "--no-snapshot"])
    out = capsys.readouterr().out
    assert code == 0
    assert "1 of 6 partition(s) selected" in out
    assert EU_KEYS[1] in out
    assert EU_KEYS[0] not in out


def test_nothing_selected_exits_3(spec: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["backfill", str(spec), "sales", "--where", "region = 'MARS'", "--dry-run"])
    assert code == 3
    assert "nothing to backfill" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--where", "region = 'EU'", "--partitions", "x"], "--where or --partitions, not both"),
        (["--where", "region = 'EU'"], "no Airflow URL"),
        (
            ["--where", "region = 'EU'", "--airflow-url", "http://127.0.0.1:1"],
            "no credentials for the Airflow API",
        ),
        (
            ["--where", "region = 'EU'", "--airflow-url", "localhost:8080", "--token", "t"],
            "must start with http",
        ),
        (["--local", "--airflow-url", "http://x", "--where", "region = 'EU'"], "--local runs the DAG"),
        (["--where", "nope = 1", "--dry-run"], "nope"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(
    spec: Path,
    extra: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("URL", "TOKEN", "USERNAME", "PASSWORD"):
        monkeypatch.delenv(f"AIRFLOW_PARTITIONS_API_{name}", raising=False)
    assert main(["backfill", str(spec), "sales", *extra]) == 2
    assert message in capsys.readouterr().err


def test_unreachable_airflow_is_a_clear_error(spec: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code = main(
        ["backfill", str(spec), "sales", "--where", "region = 'EU'", "--airflow-url", url, "--token", "t"]
    )
    assert code == 2
    assert f"cannot reach the Airflow API at {url}" in capsys.readouterr().err


def test_username_password_are_exchanged_for_a_token_only_when_needed() -> None:
    client = AirflowApiClient("http://127.0.0.1:1", token="abc")
    assert client.token() == "abc", "a given token is used as is, without calling /auth/token"
    with pytest.raises(AirflowApiError, match="no credentials"):
        AirflowApiClient("http://127.0.0.1:1", username="admin")


def test_airflow_cli_registration_parses_the_same_arguments() -> None:
    from airflow.cli.cli_parser import _add_command

    (group,) = airflow_cli_commands()
    assert group.name == "partitions"
    assert [c.name for c in group.subcommands] == ["backfill"]
    parser = argparse.ArgumentParser(prog="airflow")
    _add_command(parser.add_subparsers(dest="subcommand"), group)
    args = parser.parse_args(
        ["partitions", "backfill", "spec.yaml", "sales", "--where", "region = 'EU'", "--dry-run", "--wait"]
    )
    assert (args.spec, args.dataset, args.where, args.dry_run, args.wait) == (
        "spec.yaml",
        "sales",
        "region = 'EU'",
        True,
        True,
    )
    assert args.timeout == 3600.0
    assert len(ARGUMENTS) == len({flags for flags, _ in ARGUMENTS})


@pytest.mark.spark
@pytest.mark.slow
def test_local_run_refreshes_only_the_selected_partitions(
    spec: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from airflow_e2e.metadata_db import in_process_metadata_db

    from airflow_partitions.spec import load_spec
    from airflow_partitions.table import open_handle

    with in_process_metadata_db(str(spec.parent)):
        code = main(["backfill", str(spec), "sales", "--where", "region = 'EU'", "--local", "--json"])
    report = _json_document(capsys.readouterr().out)
    assert code == 0, report
    assert report["state"] == "success"
    assert report["result"] == "ran locally"
    project = load_spec(spec)
    snapshot = open_handle(project, project.dataset("sales")).catalog.latest()
    assert sorted(snapshot.partitions) == EU_KEYS, "only the partitions the filter selected were refreshed"


def _json_document(out: str) -> dict[str, object]:
    """The command's JSON report: from its first line that opens an object (task logs may precede it)."""
    start = out.index("\n{\n") + 1 if not out.startswith("{\n") else 0
    document, _ = json.JSONDecoder().raw_decode(out[start:])
    return dict(document)
