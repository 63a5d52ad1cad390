"""`airflow-partitions validate`: exit codes, the error listing, the summary and the JSON form."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

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


# --- checks against the real source schema --------------------------------------------------------

S3_SECRET = "s3cr3t-Value-9fQ"
PG_PASSWORD = "pg-S3cret-77Zq"
SOURCE_KINDS = ("parquet", "csv", "jsonl", "s3_parquet", "postgres")
# What every kind of source below holds: NULLs in every column, hostile strings, timestamps with offsets.
HOSTILE_ROWS: list[dict[str, Any]] = [
    {"id": 1, "score": 1.5, "name": "a/b=c%20", "ts": "2025-02-06T16:11:51+00:00"},
    {"id": None, "score": None, "name": None, "ts": None},
    {"id": 3, "score": -0.25, "name": "Zürich \"q\" 'x'", "ts": "2025-02-06T18:11:51+02:00"},
    {"id": -4, "score": 2.0, "name": "", "ts": "2025-12-31T23:59:59Z"},
]
SOURCE_COLUMNS = "id, score, name, ts"


def _arrow_rows() -> Any:
    import datetime as dt

    import pyarrow as pa

    def ts(text: str | None) -> dt.datetime | None:
        return None if text is None else dt.datetime.fromisoformat(text.replace("Z", "+00:00"))

    return pa.table(
        {
            "id": pa.array([r["id"] for r in HOSTILE_ROWS], pa.int64()),
            "score": pa.array([r["score"] for r in HOSTILE_ROWS], pa.float64()),
            "name": pa.array([r["name"] for r in HOSTILE_ROWS], pa.string()),
            "ts": pa.array([ts(r["ts"]) for r in HOSTILE_ROWS], pa.timestamp("us", "UTC")),
        }
    )


def write_source(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """Write the hostile rows as a real source of `kind`; returns the spec's `from:` and `params:`."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    data = tmp_path / "data"
    data.mkdir()
    if kind == "parquet":
        pq.write_table(_arrow_rows(), data / "scores.parquet")
        return f"file:{data / 'scores.parquet'}", {}
    if kind == "csv":
        pacsv.write_csv(_arrow_rows(), data / "scores.csv")
        return f"file:{data}/*.csv", {"file_format": "csv"}
    if kind == "jsonl":
        lines = [json.dumps(row, ensure_ascii=False) for row in HOSTILE_ROWS]
        (data / "scores.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        return f"file:{data / 'scores.jsonl'}", {}
    if kind == "s3_parquet":
        import boto3

        s3_server = request.getfixturevalue("s3_server")
        bucket = request.getfixturevalue("s3_bucket")
        pq.write_table(_arrow_rows(), data / "scores.parquet")
        boto3.client("s3", **s3_server).upload_file(str(data / "scores.parquet"), bucket, "in/scores.parquet")
        params = {
            "file_format": "parquet",
            "endpoint_url": s3_server["endpoint_url"],
            "region": "us-east-1",
            "aws_access_key_id": "validate-key",
            "aws_secret_access_key": S3_SECRET,
        }
        return f"s3://{bucket}/in/", params
    assert kind == "postgres", kind
    import psycopg

    url = request.getfixturevalue("pg_database")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE public.scores (id bigint, score double precision, name text, ts timestamptz)"
        )
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO public.scores VALUES (%s, %s, %s, %s)",
                [(r["id"], r["score"], r["name"], r["ts"]) for r in HOSTILE_ROWS],
            )
    # The server trusts local connections, so the password is never checked: it is only there to leak.
    with_password = url.replace("postgresql://postgres@", f"postgresql://postgres:{PG_PASSWORD}@")
    return "postgres:public.scores", {"url": with_password}


def write_scores_spec(tmp_path: Path, source: tuple[str, dict[str, Any]], partition_by: list[Any]) -> Path:
    from_uri, params = source
    body = {
        "datasets": [
            {
                "name": "scores",
                "from": from_uri,
                "params": params,
                "acceleration": {"partition_by": partition_by, "refresh": {"discovery_timeout_s": 30}},
            }
        ]
    }
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps(body, indent=2))  # JSON is YAML, and quotes every expression safely
    return path


def line_of(spec: Path, text: str) -> int:
    """The 1-based line of the first line of `spec` containing `text`."""
    return next(n for n, line in enumerate(spec.read_text().splitlines(), 1) if text in line)


def assert_no_secret(text: str) -> None:
    assert S3_SECRET not in text
    assert PG_PASSWORD not in text


@pytest.fixture(params=SOURCE_KINDS)
def scores_source(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    return write_source(request.param, tmp_path, request)


def test_partition_by_a_float_column_is_an_error_against_the_source(
    scores_source: tuple[str, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_scores_spec(tmp_path, scores_source, ["score"])
    assert main(["validate", str(spec)]) == 1
    out = capsys.readouterr().out
    assert_no_secret(out)
    assert out.startswith(f"{spec}: 1 error(s) against the sources\n"), out
    error = next(line.strip() for line in out.splitlines() if "partition_by[0]" in line)
    line = line_of(spec, '"score"')
    assert error.startswith(f"line {line}: dataset 'scores': partition_by[0] \"score\":"), error
    assert "column 'score' (double)" in error
    assert "must be string, integer, boolean, date or timestamp" in error
    assert "columns: id int64, score double, name string, ts " in out, "the dataset's source columns"


def test_unknown_column_is_an_error_naming_the_source_columns(
    scores_source: tuple[str, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_scores_spec(tmp_path, scores_source, ["bucket(10, nope_col)", "bucket(4, id)"])
    assert main(["validate", str(spec), "--json"]) == 1
    out = capsys.readouterr().out
    assert_no_secret(out)
    document = json.loads(out)
    assert document["valid"] is False
    (dataset,) = document["datasets"]
    check = dataset["check"]
    assert check["status"] == "invalid"
    assert check["errors"] == document["errors"]
    (error,) = check["errors"]
    line = line_of(spec, "nope_col")
    assert error.startswith(f"line {line}: dataset 'scores': partition_by[0] \"bucket(10, nope_col)\":"), (
        error
    )
    assert f"unknown column 'nope_col'; columns are {SOURCE_COLUMNS}" in error
    assert list(check["source_schema"]) == SOURCE_COLUMNS.split(", ")
    assert check["source_schema"]["score"] == "double"


def test_a_spec_that_fits_its_source_is_valid(
    scores_source: tuple[str, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_scores_spec(
        tmp_path, scores_source, ["bucket(10, id)", "name", {"day": "date_trunc('day', ts)"}]
    )
    assert main(["validate", str(spec)]) == 0
    out = capsys.readouterr().out
    assert_no_secret(out)
    assert out.startswith(f"{spec}: valid, 1 dataset(s)\n"), out
    assert "checked     against the source schema (4 column(s)): partition fields fit" in out
    assert "warning" not in out
    # Result types come from the real schema now: no `?` left.
    name_row = next(line for line in out.splitlines() if line.startswith("    expr1 "))
    assert name_row.endswith("string"), name_row
    assert UNKNOWN_TYPE_LEGEND not in out


UNKNOWN_TYPE_LEGEND = "? = result type known once the source schema is read"


def test_offline_does_not_open_the_source(
    scores_source: tuple[str, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_scores_spec(tmp_path, scores_source, ["score", "bucket(10, nope_col)"])
    assert main(["validate", str(spec), "--offline"]) == 0, "the offline rules cannot know the columns"
    out = capsys.readouterr().out
    assert_no_secret(out)
    assert out.startswith(f"{spec}: valid, 1 dataset(s)\n"), out
    assert "checked     not against the source (--offline)" in out
    assert UNKNOWN_TYPE_LEGEND in out
    assert main(["validate", str(spec), "--offline", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["datasets"][0]["check"]["status"] == "skipped"


def test_every_problem_of_every_dataset_with_its_line(
    tmp_path: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    from_uri, _ = write_source("parquet", tmp_path, request)
    spec = tmp_path / "two.yaml"
    spec.write_text(
        textwrap.dedent(
            f"""\
            datasets:
              - name: good
                from: {from_uri}
                acceleration:
                  partition_by: ["bucket(4, id)"]
              - name: bad
                from: {from_uri}
                acceleration:
                  partition_by:
                    - score
                    - day: "date_trunc('day', name)"
                  refresh:
                    check_column: nmae
            """
        )
    )
    assert main(["validate", str(spec)]) == 1
    out = capsys.readouterr().out
    errors = [line.strip() for line in out.splitlines() if line.startswith("  line ")]
    assert [e.split(":")[0] for e in errors] == ["line 10", "line 11", "line 13"], out
    assert "column 'name' has type string, but date_trunc accepts date and timestamp" in errors[1]
    assert "refresh.check_column: unknown column 'nmae' (did you mean 'name'?)" in errors[2]
    assert "dataset 'good'" not in out, "a dataset that fits its source is not listed among the errors"


def test_declared_schema_that_differs_from_the_source_is_a_warning(
    tmp_path: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    from_uri, _ = write_source("jsonl", tmp_path, request)
    spec = tmp_path / "declared.yaml"
    spec.write_text(
        textwrap.dedent(
            f"""\
            datasets:
              - name: events
                from: {from_uri}
                schema:
                  id: int64
                  ts: timestamp[us, UTC]
                  region: string
                acceleration:
                  partition_by: ["bucket(4, id)"]
            """
        )
    )
    assert main(["validate", str(spec)]) == 0
    out = capsys.readouterr().out
    assert "2 warning(s):" in out
    assert (
        "dataset 'events': schema.ts declares timestamp[us, tz=UTC], but the source's own schema has" in out
    )
    assert "dataset 'events': schema.region: the source has no column 'region'" in out


def test_unreachable_source_is_a_warning_that_names_it_and_masks_the_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"postgresql://postgres:{PG_PASSWORD}@127.0.0.1:{port}/nowhere"
    spec = write_scores_spec(tmp_path, ("postgres:public.scores", {"url": url}), ["bucket(4, id)"])
    assert main(["validate", str(spec)]) == 0, "an unreachable source is not the spec's fault"
    out = capsys.readouterr().out
    assert_no_secret(out)
    warning = next(line.strip() for line in out.splitlines() if "could not be checked" in line)
    assert warning.startswith("dataset 'scores': source postgres:public.scores could not be checked: "), (
        warning
    )
    assert f"port {port} failed" in warning, "the reason the driver gave"
    assert "Traceback" not in out
    assert "--require-sources makes that an error" in out

    assert main(["validate", str(spec), "--require-sources"]) == 1
    out = capsys.readouterr().out
    assert_no_secret(out)
    assert out.startswith(f"{spec}: 1 error(s) against the sources\n"), out
    assert main(["validate", str(spec), "--json"]) == 0
    out = capsys.readouterr().out
    assert_no_secret(out)
    document = json.loads(out)
    assert document["datasets"][0]["check"]["status"] == "unreachable"
    assert document["datasets"][0]["source"]["params"]["url"] == url.replace(PG_PASSWORD, "***")
    assert document["warnings"] == [warning]


def test_missing_local_files_are_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = write_scores_spec(tmp_path, ("file:not-there/", {}), ["bucket(4, id)"])
    assert main(["validate", str(spec)]) == 0
    out = capsys.readouterr().out
    assert f"source file:{tmp_path / 'not-there'} could not be checked: source path" in out
    assert "does not exist" in out


def test_a_source_that_never_answers_is_cut_off_at_the_discovery_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket
    import time

    with socket.socket() as server:  # accepts connections, never answers
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        spec = tmp_path / "slow.yaml"
        spec.write_text(
            textwrap.dedent(
                f"""\
                datasets:
                  - name: slow
                    from: postgres:public.t
                    params: {{url: "postgresql://postgres:{PG_PASSWORD}@127.0.0.1:{port}/db"}}
                    acceleration:
                      partition_by: ["bucket(4, id)"]
                      refresh: {{discovery_timeout_s: 1.5}}
                """
            )
        )
        started = time.monotonic()
        assert main(["validate", str(spec)]) == 0
        elapsed = time.monotonic() - started
        assert main(["validate", str(spec), "--timeout", "0.5", "--require-sources"]) == 1
    out = capsys.readouterr().out
    assert_no_secret(out)
    assert 1.5 <= elapsed < 10, elapsed
    assert "source postgres:public.t could not be checked: no answer within 1.5 s" in out
    assert "source postgres:public.t could not be checked: no answer within 0.5 s" in out


def test_secrets_in_params_are_masked_in_the_offline_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    params = {
        "file_format": "parquet",
        "endpoint_url": "http://127.0.0.1:9",
        "aws_access_key_id": "validate-key",
        "aws_secret_access_key": S3_SECRET,
    }
    spec = write_scores_spec(tmp_path, ("s3://bucket-x/in/", params), ["bucket(4, id)"])
    assert main(["validate", str(spec), "--offline", "--json"]) == 0
    out = capsys.readouterr().out
    assert_no_secret(out)
    shown = json.loads(out)["datasets"][0]["source"]["params"]
    assert shown == {**params, "aws_access_key_id": "***", "aws_secret_access_key": "***"}


@pytest.mark.parametrize(
    ("source", "refused"),
    [
        (
            ("postgres:public.t", {"url": f"postgresql://u:{PG_PASSWORD}@127.0.0.1:1/db", "reader": "odbc"}),
            "params.reader 'odbc' is not one of auto, jdbc, adbc",
        ),
        (
            ("s3://bucket-x/in/", {"file_format": "parquet", "endpoint_url": "localhost:9000"}),
            "endpoint_url 'localhost:9000' must be an http(s) URL",
        ),
    ],
    ids=["postgres-reader", "s3-endpoint"],
)
def test_source_params_the_connector_refuses_are_errors(
    source: tuple[str, dict[str, Any]], refused: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_scores_spec(tmp_path, source, ["bucket(4, id)"])
    assert main(["validate", str(spec)]) == 1, "no retry fixes a setting: it is the spec's error"
    out = capsys.readouterr().out
    assert_no_secret(out)
    assert out.startswith(f"{spec}: 1 error(s) against the sources\n"), out
    assert f"  dataset 'scores': source {source[0]}: {refused}" in out


def test_masking_hides_url_passwords_and_secret_params_however_spelt() -> None:
    from airflow_partitions.spec.masking import mask_secrets, masked_params, secret_values

    params = {
        "url": "postgresql://alice:p%40ss:w0rd@db.example:5432/app?sslmode=require",
        "aws_secret_access_key": "AbC/123+xyz",
        "nested": {"session_token": "tok-1", "endpoint_url": "http://minio:9000"},
        "connection_id": "warehouse",
    }
    shown = masked_params(params)
    assert shown == {
        "url": "postgresql://alice:***@db.example:5432/app?sslmode=require",
        "aws_secret_access_key": "***",
        "nested": {"session_token": "***", "endpoint_url": "http://minio:9000"},
        "connection_id": "warehouse",
    }
    # A driver message may quote the password decoded, or a secret on its own.
    message = (
        "auth failed for alice with p@ss:w0rd; key AbC/123+xyz; token tok-1; see postgres://bob:hunter2@h/db"
    )
    masked = mask_secrets(message, secret_values(params))
    for secret in ("p@ss:w0rd", "p%40ss:w0rd", "AbC/123+xyz", "tok-1", "hunter2"):
        assert secret not in masked, masked
    assert "postgres://bob:***@h/db" in masked
    assert "alice" in masked, "user names are not secrets"


@pytest.mark.parametrize(
    ("flags", "complaint"),
    [
        (["--offline", "--require-sources"], "give one of the two"),
        (["--timeout", "0"], "--timeout must be a positive number of seconds"),
    ],
)
def test_contradictory_flags_are_usage_errors(
    flags: list[str], complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", str(EXAMPLE_SPEC), *flags]) == 2
    captured = capsys.readouterr()
    assert complaint in captured.err
    assert captured.out == ""
