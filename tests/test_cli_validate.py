"""`airflow-partitions validate`: exit codes, the error listing, the summary and the JSON form."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from airflow_partitions.cli.main import main

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_SPEC = REPO_ROOT / "dags" / "datasets.yaml"
CLI = REPO_ROOT / ".venv" / "bin" / "airflow-partitions"

BAD_SPEC = """\
datasets:
  - name: taxi_trips
    from: file:data/taxi/
    acceleration:
      engine: duckdb
      mode: memory
      partition_by:
        - year: "date_part('year', ts)"
          month: "date_part('month', ts)"
        - bucket(50, id)
      snapshots: {mode: enabled}
  - name: orders
    from: ftp://orders
    acceleration:
      engine: sqlite
      partition_by: [id]
"""


@pytest.fixture
def bad_spec(tmp_path: Path) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(BAD_SPEC)
    return path


def test_valid_spec_prints_summary_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(EXAMPLE_SPEC)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{EXAMPLE_SPEC}: valid, 4 dataset(s)\n")
    assert f"accelerator_dir: {REPO_ROOT / '.accelerations'}" in out
    for name in ("taxi_trips", "events", "orders", "sensor_readings"):
        assert f"\n{name}\n" in out
    assert f"source      file:{REPO_ROOT / '.demo' / 'taxi_trips'} (parquet)" in out
    assert "source      postgres:public.orders" in out
    assert "engine      duckdb, mode file, partition_mode tables" in out
    assert "engine      arrow, mode memory" in out
    # The field table: name, expression, canonical transform and (with a declared schema) the result type.
    assert "name   expression" in out
    taxi_rows = [line.split() for line in out.splitlines() if line.startswith("    expr0 ")]
    assert len(taxi_rows) == 1, taxi_rows
    assert taxi_rows[0][-1] == "int64", taxi_rows
    year_row = next(line for line in out.splitlines() if line.startswith("    year "))
    assert "date_part('year', ts)" in year_row
    assert year_row.endswith("int32")
    amount_row = next(line for line in out.splitlines() if line.startswith("    amount_band "))
    assert amount_row.endswith("?"), "orders declares no schema, so its result type is unknown"
    assert "refresh     @hourly, change column tpep_dropoff_datetime" in out
    assert "refresh     no schedule (triggered runs only)" in out
    assert "snapshots   disabled" in out


def test_invalid_spec_prints_every_error_and_exits_1(
    bad_spec: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", str(bad_spec)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{bad_spec}: 5 error(s)"
    errors = [line.strip() for line in lines[1:]]
    assert len(errors) == 5, lines
    assert errors[0].startswith("line 6: dataset 'taxi_trips': engine duckdb requires mode: file")
    assert errors[1].startswith("line 8: dataset 'taxi_trips': partition_by[0] is a mapping with 2 entries")
    assert errors[2].startswith("line 11: dataset 'taxi_trips': snapshots mode enabled needs a location")
    assert errors[3].startswith(
        "line 13: dataset 'orders': from 'ftp://orders': unsupported source scheme 'ftp'"
    )
    assert errors[4].startswith(
        "line 15: dataset 'orders': unknown engine 'sqlite'; valid values: parquet, duckdb"
    )


def test_json_output_when_valid(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(EXAMPLE_SPEC), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["valid"] is True
    assert document["path"] == str(EXAMPLE_SPEC)
    by_name = {d["name"]: d for d in document["datasets"]}
    assert set(by_name) == {"taxi_trips", "events", "orders", "sensor_readings"}
    taxi = by_name["taxi_trips"]
    assert taxi["source"]["scheme"] == "file"
    assert taxi["source"]["file_format"] == "parquet"
    fields = taxi["acceleration"]["partition_by"]
    assert [f["name"] for f in fields] == ["expr0"]
    events_fields = by_name["events"]["acceleration"]["partition_by"]
    assert [f["name"] for f in events_fields] == ["region", "year"]
    assert fields[0]["transform"] == "bucket"
    assert fields[0]["source_column"] == "PULocationID"
    assert fields[0]["source_type"] == "int32"
    assert fields[0]["result_type"] == "int64"
    assert len(taxi["acceleration"]["partition_spec_id"]) == 16
    orders = by_name["orders"]
    assert orders["acceleration"]["partition_by"][0]["result_type"] is None
    assert orders["acceleration"]["partition_mode"] == "files"
    assert orders["source"]["params"] == {"connection_id": "postgres_default"}
    assert by_name["events"]["acceleration"]["refresh"]["schedule"] == "*/30 * * * *"


def test_json_output_when_invalid(bad_spec: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(bad_spec), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["valid"] is False
    assert document["path"] == str(bad_spec)
    assert len(document["errors"]) == 5
    assert all(error.startswith("line ") for error in document["errors"])


def test_json_output_keeps_yaml_scalars_printable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(
        textwrap.dedent(
            """
            datasets:
              - name: trips
                from: file:trips/
                params: {since: 2024-01-01}
                acceleration: {partition_by: [id]}
            """
        )
    )
    assert main(["validate", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["datasets"][0]["source"]["params"] == {"since": "2024-01-01"}


def test_missing_file_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(tmp_path / "nope.yaml")]) == 1
    assert f"spec file not found: {tmp_path / 'nope.yaml'}" in capsys.readouterr().out


def test_yaml_syntax_error_exits_1_with_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("datasets:\n  - name: [unclosed\n")
    assert main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert "1 error(s)" in out
    assert "line 3, column 1: YAML syntax error" in out


def test_real_command_line_entry_point(bad_spec: Path) -> None:
    """The installed console script, run as a user would."""
    valid = subprocess.run(
        [str(CLI), "validate", "dags/datasets.yaml"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert valid.returncode == 0, valid.stderr
    assert "valid, 4 dataset(s)" in valid.stdout
    invalid = subprocess.run(
        [str(CLI), "validate", str(bad_spec)], capture_output=True, text=True, timeout=120
    )
    assert invalid.returncode == 1
    assert "5 error(s)" in invalid.stdout
    assert "unknown engine 'sqlite'" in invalid.stdout
    usage = subprocess.run([str(CLI), "validate"], capture_output=True, text=True, timeout=120)
    assert usage.returncode == 2
    assert "SPEC" in usage.stderr
