"""Loading spec files: the typed model, defaults, sources, relative paths and the example spec."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from airflow_partitions.exceptions import DatasetNotFoundError, SpecValidationError
from airflow_partitions.spec import (
    Engine,
    FileFormat,
    Mode,
    PartitionMode,
    SnapshotMode,
    SourceScheme,
    load_spec,
    parse_spec,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_SPEC = REPO_ROOT / "dags" / "datasets.yaml"


def write_spec(directory: Path, text: str, name: str = "datasets.yaml") -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


MINIMAL = """
datasets:
  - name: trips
    from: file:data/trips/
    acceleration:
      partition_by:
        - bucket(8, id)
"""


def test_minimal_spec_gets_documented_defaults(tmp_path: Path) -> None:
    project = load_spec(write_spec(tmp_path, MINIMAL))
    dataset = project.dataset("trips")
    acceleration = dataset.acceleration
    assert project.accelerator_dir == tmp_path / ".accelerations"
    assert acceleration.enabled is True
    assert acceleration.engine is Engine.PARQUET
    assert acceleration.mode is Mode.FILE
    assert acceleration.partition_mode is PartitionMode.FILES
    assert acceleration.params == {}
    assert acceleration.refresh.schedule is None
    assert acceleration.refresh.check_column is None
    assert acceleration.refresh.discovery_timeout_s == 60.0
    assert acceleration.refresh.max_partitions == 10_000
    assert acceleration.snapshots.mode is SnapshotMode.DISABLED
    assert acceleration.snapshots.location is None
    assert dataset.source.file_format is FileFormat.PARQUET
    assert dataset.declared_columns == ()
    assert not dataset.bound


def test_full_spec_reads_every_field(tmp_path: Path) -> None:
    path = write_spec(
        tmp_path,
        """
        accelerator_dir: /var/lib/accel
        datasets:
          - name: taxi_trips
            from: s3://spiceai-demo-datasets/taxi_trips/2024/
            params:
              file_format: parquet
              endpoint_url: http://127.0.0.1:9000
            acceleration:
              enabled: false
              engine: duckdb
              mode: file
              partition_by:
                - bucket(50, PULocationID)
                - day: "date_trunc('day', tpep_pickup_datetime)"
              params:
                partition_mode: tables
                threads: 4
              refresh:
                schedule: "0 */2 * * *"
                check_column: updated_at
                discovery_timeout_s: 12.5
                max_partitions: 20000
              snapshots:
                mode: bootstrap_only
                location: s3://snapshots-bucket/accel/taxi
        """,
    )
    dataset = load_spec(path).dataset("taxi_trips")
    source = dataset.source
    assert source.scheme is SourceScheme.S3
    assert source.location == "spiceai-demo-datasets/taxi_trips/2024/"
    assert source.bucket == "spiceai-demo-datasets"
    assert source.key_prefix == "taxi_trips/2024/"
    assert source.uri == "s3://spiceai-demo-datasets/taxi_trips/2024/"
    assert source.params == {"file_format": "parquet", "endpoint_url": "http://127.0.0.1:9000"}
    acceleration = dataset.acceleration
    assert acceleration.enabled is False
    assert acceleration.engine is Engine.DUCKDB
    assert acceleration.partition_mode is PartitionMode.TABLES
    assert acceleration.params == {"partition_mode": "tables", "threads": 4}
    assert [f.name for f in acceleration.partition_by] == ["expr0", "day"]
    assert acceleration.partition_names == ("expr0", "day")
    assert [f.source_column for f in acceleration.partition_by] == ["PULocationID", "tpep_pickup_datetime"]
    assert acceleration.partition_by[1].expression == "date_trunc('day', tpep_pickup_datetime)"
    assert acceleration.refresh.schedule == "0 */2 * * *"
    assert acceleration.refresh.check_column == "updated_at"
    assert acceleration.refresh.discovery_timeout_s == 12.5
    assert acceleration.refresh.max_partitions == 20_000
    assert acceleration.snapshots.mode is SnapshotMode.BOOTSTRAP_ONLY
    assert acceleration.snapshots.location == "s3://snapshots-bucket/accel/taxi"
    assert load_spec(path).accelerator_dir == Path("/var/lib/accel")


def test_anonymous_fields_are_named_by_position(tmp_path: Path) -> None:
    path = write_spec(
        tmp_path,
        """
        datasets:
          - name: events
            from: file:events/
            acceleration:
              engine: arrow
              partition_by:
                - region: region
                - "date_part('year', ts)"
                - id % 16
        """,
    )
    acceleration = load_spec(path).dataset("events").acceleration
    assert acceleration.partition_names == ("region", "expr1", "expr2")
    assert acceleration.mode is Mode.MEMORY, "arrow defaults to mode memory"


def test_relative_paths_resolve_against_the_spec_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec_dir = tmp_path / "project" / "dags"
    path = write_spec(
        spec_dir,
        """
        accelerator_dir: ../.accelerations
        datasets:
          - name: trips
            from: file:../.demo/trips/*.parquet
            acceleration: {partition_by: [id]}
          - name: absolute
            from: file:/srv/data/absolute
            acceleration: {partition_by: [id]}
          - name: uri_form
            from: file:///srv/data/uri
            acceleration: {partition_by: [id]}
        """,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    project = load_spec(path)
    assert project.path == path.resolve()
    assert project.accelerator_dir == tmp_path / "project" / ".accelerations"
    assert project.dataset("trips").source.location == str(
        tmp_path / "project" / ".demo" / "trips" / "*.parquet"
    )
    assert project.dataset("absolute").source.location == "/srv/data/absolute"
    assert project.dataset("uri_form").source.location == "/srv/data/uri"
    # Loading through a relative path from another working directory gives the same result.
    monkeypatch.chdir(tmp_path / "project")
    assert load_spec("dags/datasets.yaml") == project


def test_parse_spec_resolves_against_given_base_dir(tmp_path: Path) -> None:
    project = parse_spec(MINIMAL, base_dir=tmp_path)
    assert project.path is None
    assert project.dataset("trips").source.location == str(tmp_path / "data" / "trips")


@pytest.mark.parametrize(
    ("from_text", "params", "expected_format"),
    [
        ("file:data/*.parquet", {}, FileFormat.PARQUET),
        ("file:data/part-0.csv", {}, FileFormat.CSV),
        ("file:data/*.jsonl", {}, FileFormat.JSON),
        ("file:data/*.ndjson", {}, FileFormat.JSON),
        ("file:data/dir/", {}, FileFormat.PARQUET),
        ("file:data/dir/", {"file_format": "csv"}, FileFormat.CSV),
        ("s3://bucket-one/x/*.json", {}, FileFormat.JSON),
    ],
)
def test_file_format_from_params_then_suffix_then_parquet(
    tmp_path: Path, from_text: str, params: dict[str, str], expected_format: FileFormat
) -> None:
    params_yaml = f"params: {params}" if params else ""
    text = f"""
datasets:
  - name: d
    from: {from_text}
    {params_yaml}
    acceleration: {{partition_by: [id]}}
"""
    assert parse_spec(text, base_dir=tmp_path).dataset("d").source.file_format is expected_format


@pytest.mark.parametrize(
    ("from_text", "params", "schema", "table", "connection_id", "url"),
    [
        ("postgres:public.orders", {}, "public", "orders", "postgres_default", None),
        ("postgres:orders", {}, "public", "orders", "postgres_default", None),
        ("postgres:Sales.Orders", {"connection_id": "warehouse"}, "sales", "orders", "warehouse", None),
        ('postgres:"Sales"."Big Orders"', {}, "Sales", "Big Orders", "postgres_default", None),
        ("postgres:orders", {"url": "postgresql://u@h/db"}, "public", "orders", None, "postgresql://u@h/db"),
        ('postgres:"odd.name"', {}, "public", "odd.name", "postgres_default", None),
    ],
)
def test_postgres_sources(
    tmp_path: Path,
    from_text: str,
    params: dict[str, str],
    schema: str,
    table: str,
    connection_id: str | None,
    url: str | None,
) -> None:
    path = tmp_path / "spec.yaml"
    import yaml

    path.write_text(
        yaml.safe_dump(
            {
                "datasets": [
                    {
                        "name": "o",
                        "from": from_text,
                        "params": params,
                        "acceleration": {"partition_by": ["id"]},
                    }
                ]
            }
        )
    )
    source = load_spec(path).dataset("o").source
    assert source.scheme is SourceScheme.POSTGRES
    assert source.file_format is None
    assert (source.table_schema, source.table_name) == (schema, table)
    assert source.connection_id == connection_id
    assert source.url == url
    assert source.location == (
        f"public.{from_text[9:]}" if schema == "public" and "public" not in from_text else from_text[9:]
    )
    with pytest.raises(AttributeError, match="s3 sources only"):
        _ = source.bucket


def test_unknown_dataset_lists_the_known_names(tmp_path: Path) -> None:
    project = load_spec(write_spec(tmp_path, MINIMAL))
    with pytest.raises(DatasetNotFoundError) as caught:
        project.dataset("trip")
    message = str(caught.value)
    assert "no dataset 'trip'" in message
    assert "did you mean 'trips'" in message
    assert "known datasets: trips" in message


def test_example_spec_loads_with_one_dataset_per_engine_layout() -> None:
    project = load_spec(EXAMPLE_SPEC)
    assert project.accelerator_dir == REPO_ROOT / ".accelerations"
    layouts = {(d.acceleration.engine, d.acceleration.partition_mode) for d in project.datasets}
    assert layouts == {
        (Engine.PARQUET, PartitionMode.FILES),
        (Engine.DUCKDB, PartitionMode.FILES),
        (Engine.DUCKDB, PartitionMode.TABLES),
        (Engine.ARROW, PartitionMode.FILES),
    }
    for dataset in project.datasets:
        if dataset.source.scheme is SourceScheme.FILE:
            assert dataset.source.location.startswith(str(REPO_ROOT / ".demo")), dataset.name
    transforms = {f.transform.name for d in project.datasets for f in d.partition_by}
    assert {"bucket", "date_trunc", "date_part", "truncate", "identity"} <= transforms
    taxi = project.dataset("taxi_trips")
    assert taxi.bound, "the declared schema binds the fields at load"
    assert [str(f.result_type) for f in taxi.partition_by] == ["int64"]
    sensors = project.dataset("sensor_readings")
    assert [str(f.result_type) for f in sensors.partition_by] == ["int64", "timestamp[us]"]
    events = project.dataset("events")
    assert events.acceleration.partition_names == ("region", "year")
    orders = project.dataset("orders")
    assert orders.source.scheme is SourceScheme.POSTGRES
    assert not orders.bound, "orders declares no schema: bound later against Postgres"


def test_spec_file_not_found_is_a_validation_error(tmp_path: Path) -> None:
    with pytest.raises(SpecValidationError) as caught:
        load_spec(tmp_path / "missing.yaml")
    assert caught.value.errors == [f"spec file not found: {tmp_path / 'missing.yaml'}"]
    assert caught.value.path == str(tmp_path / "missing.yaml")


def test_loaded_params_are_plain_containers(tmp_path: Path) -> None:
    path = write_spec(
        tmp_path,
        """
        datasets:
          - name: d
            from: file:x/
            params: {nested: {a: [1, 2]}}
            acceleration: {partition_by: [id]}
        """,
    )
    params = load_spec(path).dataset("d").source.params
    assert type(params) is dict
    assert type(params["nested"]) is dict
    assert type(params["nested"]["a"]) is list


def test_loading_without_type_checks_still_rejects_unknown_columns_and_skips_pyarrow() -> None:
    import subprocess
    import sys

    text = (
        "accelerator_dir: x\ndatasets:\n  - name: d\n    from: file:/tmp/x\n"
        "    params: {file_format: parquet}\n"
        "    schema: {amount: int64}\n    acceleration:\n      partition_by:\n        - bucket(4, amont)\n"
    )
    script = (
        "import sys\nfrom airflow_partitions.spec.loader import parse_spec\n"
        "from airflow_partitions.exceptions import SpecValidationError\n"
        f"try:\n    parse_spec({text!r}, check_types=False)\nexcept SpecValidationError as err:\n"
        "    print(err.errors[0])\nprint('pyarrow' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    first, loaded = out.strip().splitlines()
    assert "unknown column 'amont'" in first
    assert "did you mean 'amount'" in first
    assert loaded == "False", "check_types=False must not import pyarrow (DAG parse speed)"
