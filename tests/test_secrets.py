"""Secrets planted in a spec never come out: not in CLI text or JSON, logs, error messages or any file.

The spec carries a Postgres URL with a password, `aws_secret_access_key`, `aws_session_token` and a
`password` param. Every command a user runs on it (validate, plan, refresh, status; valid and invalid
specs; sources that work and sources that fail) is captured at the file-descriptor level (the Spark JVM
writes there too) with every log record, and every file it leaves (accelerations, catalog, stages) is read
back: none may hold a planted value, whole or in part.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import textwrap
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import pytest

from airflow_partitions.cli.main import main
from airflow_partitions.table import open_handle

# Every piece of every value (between `/`, `+`, `%`) carries the marker `pl4nted`, so a secret printed in
# pieces is caught too. The URL carries the password percent-encoded; the driver receives it decoded.
PG_PASSWORD = "pl4ntedPG%2Fpl4nted-PW"
SECRET_KEY = "pl4ntedSAK/pl4nted+pl4ntedKEY"
SESSION_TOKEN = "pl4nted-SESSION-token"
PARAM_PASSWORD = "pl4nted-param-PASSWORD"
PLANTED = (PG_PASSWORD, SECRET_KEY, SESSION_TOKEN, PARAM_PASSWORD)


def _fragments() -> list[str]:
    """Every planted value in every spelling (as written, decoded, URL- and JSON-encoded), and the marker
    every piece of them carries."""
    forms: set[str] = set()
    for value in PLANTED:
        for spelling in (value, unquote(value), quote(value, safe=""), quote(unquote(value), safe="")):
            forms.add(spelling)
            forms.add(json.dumps(spelling)[1:-1])
    forms.add("pl4nted")
    return sorted(forms, key=len, reverse=True)


FRAGMENTS = _fragments()


def leaked(text: str) -> list[str]:
    return [fragment for fragment in FRAGMENTS if fragment.lower() in text.lower()]


def assert_no_secret(text: str, where: str) -> None:
    found = leaked(text)
    assert not found, f"{where} leaks {found}:\n{text}"


def files_under(roots: Iterable[Path]) -> list[Path]:
    return [Path(d, name) for root in roots for d, _, names in os.walk(root) for name in names]


def assert_no_secret_in_files(*roots: Path) -> int:
    """Read every file under `roots` (and its name); returns how many were checked."""
    files = files_under(roots)
    for path in files:
        assert_no_secret(str(path), "a file name")
        data = path.read_bytes()
        found = [f for f in FRAGMENTS if f.lower().encode() in data.lower()]
        assert not found, f"{path} holds {found}"
    return len(files)


def capture_logs(caplog: pytest.LogCaptureFixture) -> None:
    """Every record of this package, and what any library logs at INFO and above (a deployment's level).

    Below INFO, botocore logs each request's headers, session token included: a library's wire trace,
    which Airflow's secrets masker redacts in task logs once the spec's secrets are registered with it.
    """
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="airflow_partitions")


def pg_url_with_password(database_url: str) -> str:
    user, _, rest = database_url.removeprefix("postgresql://").partition("@")
    return f"postgresql://{user}:{PG_PASSWORD}@{rest}"


def create_orders(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE public.orders (id bigint PRIMARY KEY, placed_at timestamptz NOT NULL, note text)"
        )
        conn.execute("CREATE INDEX orders_placed ON public.orders (placed_at)")
        conn.execute(
            "INSERT INTO public.orders SELECT i, "
            "timestamptz '2026-02-01 00:00+00' + (i % 3) * interval '1 day', 'n' || i "
            "FROM generate_series(0, 29) AS i"
        )


def upload_trips(s3: dict[str, str], bucket: str, tmp_path: Path) -> None:
    import boto3
    import pyarrow as pa
    import pyarrow.parquet as pq

    client: Any = boto3.client("s3", **s3)  # type: ignore[call-overload]
    tmp_path.mkdir(exist_ok=True)
    for region in ("EU", "US"):
        local = tmp_path / f"{region}.parquet"
        pq.write_table(pa.table({"id": pa.array(range(10), pa.int64()), "v": [1.5] * 10}), local)
        client.upload_file(str(local), bucket, f"trips/region={region}/part-0.parquet")


def s3_params(s3: dict[str, str]) -> dict[str, str]:
    return {
        "file_format": "parquet",
        "endpoint_url": s3["endpoint_url"],
        "region_name": s3["region_name"],
        "aws_access_key_id": "testing",
        "aws_secret_access_key": SECRET_KEY,
        "aws_session_token": SESSION_TOKEN,
    }


def write_spec(tmp_path: Path, pg_url: str, s3: dict[str, str], bucket: str) -> Path:
    """Datasets over the same table and objects: pushdown and Spark reads of each, and broken sources."""
    pg = json.dumps({"url": pg_url, "reader": "jdbc", "password": PARAM_PASSWORD})
    missing_db = json.dumps({"url": pg_url.rsplit("/", 1)[0] + "/ap_missing_db", "password": PARAM_PASSWORD})
    files = json.dumps(s3_params(s3))
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        textwrap.dedent(
            f"""\
            accelerator_dir: acc
            datasets:
              - name: orders_by_day
                from: postgres:public.orders
                params: {pg}
                acceleration:
                  partition_by: [{{day: "date_trunc('day', placed_at)"}}]
              - name: orders_by_bucket
                from: postgres:public.orders
                params: {pg}
                acceleration:
                  partition_by: [{{b: "bucket(3, id)"}}]
              - name: trips_by_region
                from: s3://{bucket}/trips/
                params: {files}
                acceleration:
                  partition_by: [region]
              - name: trips_by_bucket
                from: s3://{bucket}/trips/
                params: {files}
                acceleration:
                  partition_by: [{{b: "bucket(3, id)"}}]
              - name: orders_missing_db
                from: postgres:public.orders
                params: {missing_db}
                acceleration:
                  partition_by: [{{b: "bucket(3, id)"}}]
              - name: trips_missing_bucket
                from: s3://ap-missing-{bucket}/trips/
                params: {files}
                acceleration:
                  partition_by: [region]
            """
        )
    )
    return spec


# --- masking --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "from 's3a://AKIAEXAMPLE:pl4nted/SECRET+access-key@bucket/path': unsupported",
        "params.url 'mysql://user:pl4nted-pw@host/db' must start with postgresql://",
        "params.url 'postgresql+psycopg://user:pl4nted-pw@127.0.0.1/db' must start with postgresql://",
        "see postgresql://user:pl4nted@pw@host:5432/db?sslmode=require for details",
        'connecting to "jdbc:postgresql://user:pl4nted-pw@host/db" failed',
    ],
    ids=["s3a-slash", "mysql", "driver-suffix", "at-in-password", "quoted"],
)
def test_url_passwords_are_masked_whatever_the_scheme_and_characters(text: str) -> None:
    from airflow_partitions.spec.masking import mask_secrets, url_password

    masked = mask_secrets(text)
    assert "pl4nted" not in masked, masked
    assert "***@" in masked, "the URL stays readable, only its password goes"
    url = next(word.strip("'\"") for word in text.split() if "://" in word)
    assert url_password(url), "the password is recognised as a secret on its own too"
    assert all("pl4nted" in p for p in url_password(url)), url_password(url)


def test_secret_values_reach_into_lists_and_nested_params() -> None:
    from airflow_partitions.spec.masking import secret_values

    params = {"sources": [{"token": "pl4nted-a"}, "postgresql://u:pl4nted-b@h/db"], "n": 3}
    assert sorted(secret_values(params)) == ["pl4nted-a", "pl4nted-b"]


def test_an_error_quoting_a_loaded_specs_secret_on_its_own_is_printed_masked(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A driver may quote a secret bare, with neither its key nor its URL around it."""
    from airflow_partitions.cli import print_error
    from airflow_partitions.exceptions import SourceError
    from airflow_partitions.spec import load_spec

    spec = tmp_path / "spec.yaml"
    params = json.dumps({"file_format": "parquet", "aws_session_token": SESSION_TOKEN + "-bare"})
    spec.write_text(
        f"datasets:\n  - name: d\n    from: s3://bucket-x/in/\n    params: {params}\n"
        "    acceleration:\n      partition_by: [id]\n"
    )
    load_spec(spec)
    print_error(SourceError(f"the server refused token {SESSION_TOKEN}-bare (expired)"))
    assert capfd.readouterr().err == "error: the server refused token *** (expired)\n"


# --- validate -------------------------------------------------------------------------------------

INVALID_SPEC = f"""\
datasets:
  - name: mysql_url
    from: postgres:public.t
    params: {{url: "mysql://user:{PG_PASSWORD}@host/db", password: {PARAM_PASSWORD}}}
    acceleration:
      partition_by: ["bucket(4, id)"]
  - name: hadoop_keys
    from: "s3a://AKIAEXAMPLE:{SECRET_KEY}@bucket/path/"
    params:
      file_format: parquet
      aws_secret_access_key: "{SECRET_KEY}"
      aws_session_token: {SESSION_TOKEN}
    acceleration:
      partition_by: ["bucket(4, id)"]
  - name: driver_url
    from: postgres:public.t
    params: {{url: "postgresql+psycopg://user:{PG_PASSWORD}@127.0.0.1/db"}}
    acceleration:
      partition_by: ["bucket(4, id)"]
  - name: typo
    from: postgres:public.t
    params: {{url: "postgresql://user:{PG_PASSWORD}@127.0.0.1/db", aws_secret_acess_key: "{SECRET_KEY}"}}
    acceleration:
      partition_by: ["bucket(4, id)", "bucket(4, id)"]
"""


@pytest.mark.parametrize("flags", [[], ["--json"], ["--offline"]], ids=["text", "json", "offline"])
def test_validate_of_an_invalid_spec_names_the_problems_without_the_secrets(
    flags: list[str], tmp_path: Path, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    capture_logs(caplog)
    spec = tmp_path / "invalid.yaml"
    spec.write_text(INVALID_SPEC)
    assert main(["validate", str(spec), *flags]) == 1
    out, err = capfd.readouterr()
    assert_no_secret(out + err + caplog.text, "validate of an invalid spec")
    assert "params.url 'mysql://user:***@host/db' must start with postgresql://" in out
    assert "params.url 'postgresql+psycopg://user:***@127.0.0.1/db' must start with" in out
    assert "from 's3a://AKIAEXAMPLE:***@bucket/path/': unsupported source scheme 's3a'" in out


@pytest.mark.parametrize(
    "command",
    [["refresh", "mysql_url"], ["refresh", "hadoop_keys", "--json"], ["plan", "driver_url"], ["status"]],
    ids=["refresh", "refresh-json", "plan", "status"],
)
def test_commands_refusing_an_invalid_spec_show_no_secret(
    command: list[str],
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    capture_logs(caplog)
    spec = tmp_path / "invalid.yaml"
    spec.write_text(INVALID_SPEC)
    assert main([command[0], str(spec), *command[1:]]) == 2
    out, err = capfd.readouterr()
    assert_no_secret(out + err + caplog.text, " ".join(command))
    assert "params.url 'mysql://user:***@host/db' must start with postgresql://" in err


@pytest.mark.postgres
@pytest.mark.s3
def test_validate_of_a_valid_spec_and_of_unreachable_sources_shows_no_secret(
    pg_database: str,
    s3_server: dict[str, str],
    s3_bucket: str,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    capture_logs(caplog)
    create_orders(pg_database)
    upload_trips(s3_server, s3_bucket, tmp_path)
    spec = write_spec(tmp_path, pg_url_with_password(pg_database), s3_server, s3_bucket)
    assert main(["validate", str(spec)]) == 0
    assert main(["validate", str(spec), "--json"]) == 0
    assert main(["validate", str(spec), "--require-sources"]) == 1
    assert main(["validate", str(spec), "--json", "--require-sources"]) == 1
    out, err = capfd.readouterr()
    assert_no_secret(out + err + caplog.text, "validate")
    assert 'database "ap_missing_db" does not exist' in out, "the reason is kept, only secrets go"
    assert '"aws_secret_access_key": "***"' in out


# --- a URL whose password holds an unencoded `@` or `#` ---------------------------------------------

# The driver reads what follows an unencoded `@` (or, for a URL parser, `#`) as the host and prints it in
# every error: such a URL is refused before anything connects, and says how to encode it.
UNENCODED = {
    "at": ("pl4nted@pl4nted-tail", "'@'", "%40"),
    "hash": ("pl4nted#pl4nted-tail", "'#'", "%23"),
    "both": ("pl4nted@pl4nted#pl4nted-tail", "'@'", "%40"),
}


def unencoded_spec(tmp_path: Path, password: str, database_url: str) -> Path:
    user, _, rest = database_url.removeprefix("postgresql://").partition("@")
    spec = tmp_path / "unencoded.yaml"
    url = f"postgresql://{user}:{password}@{rest}"
    spec.write_text(
        "accelerator_dir: acc\ndatasets:\n  - name: orders\n    from: postgres:public.orders\n"
        f"    params: {json.dumps({'url': url})}\n"
        '    acceleration:\n      partition_by: [{b: "bucket(3, id)"}]\n'
    )
    return spec


@pytest.mark.postgres
@pytest.mark.parametrize("case", sorted(UNENCODED))
def test_a_url_password_with_an_unencoded_at_or_hash_is_flagged_and_never_printed(
    case: str,
    pg_database: str,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    capture_logs(caplog)
    password, character, encoded = UNENCODED[case]
    spec = str(unencoded_spec(tmp_path, password, pg_database))
    assert main(["validate", spec]) == 1
    assert main(["validate", spec, "--json"]) == 1
    out, err = capfd.readouterr()
    assert_no_secret(out + err + caplog.text, "validate")
    assert f"unencoded {character}" in out
    assert "%40" in out
    assert "%23" in out
    for command in (["plan", spec, "orders"], ["plan", spec, "orders", "--json"]):
        assert main(command) == 2, command
    for command in (["refresh", spec, "orders"], ["refresh", spec, "orders", "--json"]):
        assert main(command) == 2, command
    out, err = capfd.readouterr()
    assert_no_secret(out + err + caplog.text, "plan and refresh")
    assert encoded in err


@pytest.mark.postgres
def test_a_connection_url_with_an_unencoded_at_is_refused_without_printing_it(
    pg_database: str,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A URL resolved from a connection id (here `AIRFLOW_CONN_*`) never passes the spec's check."""
    from airflow_partitions.sources import base as sources_base

    # The environment's URL as written: an Airflow test earlier in this process may have installed
    # Airflow's resolver, which parses the URI itself (the last `@` ends the password) and re-encodes it.
    monkeypatch.setattr(sources_base, "_resolver", None)
    capture_logs(caplog)
    user, _, rest = pg_database.removeprefix("postgresql://").partition("@")
    monkeypatch.setenv("AIRFLOW_CONN_AP_UNENCODED", f"postgresql://{user}:pl4nted@pl4nted-tail@{rest}")
    spec = tmp_path / "conn.yaml"
    spec.write_text(
        "accelerator_dir: acc\ndatasets:\n  - name: orders\n    from: postgres:public.orders\n"
        "    params: {connection_id: ap_unencoded}\n"
        '    acceleration:\n      partition_by: [{b: "bucket(3, id)"}]\n'
    )
    assert main(["refresh", str(spec), "orders"]) == 2
    assert main(["validate", str(spec), "--json"]) == 0  # the source is unreadable: a warning
    out, err = capfd.readouterr()
    assert_no_secret(out + err + caplog.text, "refresh through a connection")
    assert "%40" in err
    assert "%40" in out


# --- the stage ------------------------------------------------------------------------------------


@pytest.mark.postgres
def test_a_stage_left_behind_holds_no_secret_and_only_its_owner_reads_it(
    pg_database: str, tmp_path: Path
) -> None:
    from airflow_partitions.exceptions import RefreshError
    from airflow_partitions.refresh import plan_refresh
    from airflow_partitions.refresh.finalize import finalize_partition
    from airflow_partitions.refresh.stage import stage_refresh
    from airflow_partitions.refresh.stage_layout import STAGE_MANIFEST
    from airflow_partitions.spec import load_spec

    create_orders(pg_database)
    spec = tmp_path / "spec.yaml"
    pg = json.dumps({"url": pg_url_with_password(pg_database), "password": PARAM_PASSWORD})
    spec.write_text(
        "accelerator_dir: acc\ndatasets:\n  - name: orders\n    from: postgres:public.orders\n"
        f"    params: {pg}\n    acceleration:\n"
        "      partition_by: [{day: \"date_trunc('day', placed_at)\"}]\n"
    )
    project = load_spec(spec)
    dataset = project.dataset("orders")
    plan = plan_refresh(project, "orders")
    # The stage as a crashed run leaves it: staged, never finalized nor committed.
    stage = stage_refresh(open_handle(project, dataset), plan, strategy="pushdown")
    assert stage.location is not None
    location = Path(stage.location)
    assert_no_secret_in_files(tmp_path / "acc")
    manifest = json.loads((location / STAGE_MANIFEST).read_text())
    assert manifest["source"]["location"] == "public.orders", "the source is named, without its secrets"
    assert stat.S_IMODE((location / STAGE_MANIFEST).stat().st_mode) == 0o600

    # Finalize takes the connection from the spec it loads, not from the stage.
    result = finalize_partition(open_handle(load_spec(spec), dataset), stage, plan.items[0])
    assert result.entry.rows == 10

    # A spec whose source moved since the stage is refused, not read from the new place.
    spec.write_text(spec.read_text().replace(pg_database.rsplit("/", 1)[1], "ap_other_db"))
    moved = load_spec(spec)
    with pytest.raises(RefreshError, match="the spec changed since the stage: stage again") as refused:
        finalize_partition(open_handle(moved, moved.dataset("orders")), stage, plan.items[1])
    assert_no_secret(str(refused.value), "the refusal")


# --- a whole CLI session --------------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.s3
@pytest.mark.spark
def test_refresh_plan_and_status_leave_no_secret_in_output_logs_or_files(
    spark: Any,
    pg_database: str,
    s3_server: dict[str, str],
    s3_bucket: str,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    capture_logs(caplog)
    create_orders(pg_database)
    upload_trips(s3_server, s3_bucket, tmp_path / "upload")
    spec = write_spec(tmp_path, pg_url_with_password(pg_database), s3_server, s3_bucket)
    working = ("orders_by_day", "orders_by_bucket", "trips_by_region", "trips_by_bucket")
    for dataset in working:
        assert main(["refresh", str(spec), dataset, "--json"]) == 0, dataset
        assert main(["refresh", str(spec), dataset, "--full"]) == 0, dataset
        assert main(["plan", str(spec), dataset]) == 0
        assert main(["plan", str(spec), dataset, "--json"]) == 0
    for broken in ("orders_missing_db", "trips_missing_bucket"):
        assert main(["refresh", str(spec), broken]) != 0, broken
        assert main(["refresh", str(spec), broken, "--json"]) != 0, broken
    assert main(["status", str(spec)]) == 0
    assert main(["status", str(spec), "--json"]) == 0
    out, err = capfd.readouterr()
    assert_no_secret(out + err + caplog.text, "refresh, plan and status")
    assert 'database "ap_missing_db" does not exist' in err, "the failure is explained"
    assert '"stage_mode": "pushdown"' in out, "a pushdown stage ran"
    # A Spark stage: executors writing the final files ("written"), or staging rows ("spark").
    assert '"stage_mode": "written"' in out or '"stage_mode": "spark"' in out, "a Spark stage ran"
    checked = assert_no_secret_in_files(tmp_path / "acc")
    assert checked > 10, "the accelerations and catalogs were written and read back"


# --- Airflow task logs ----------------------------------------------------------------------------


@pytest.mark.airflow
@pytest.mark.postgres
@pytest.mark.s3
@pytest.mark.spark
@pytest.mark.slow
def test_dag_runs_log_no_secret(
    spark: Any,
    pg_database: str,
    s3_server: dict[str, str],
    s3_bucket: str,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    from airflow_e2e.metadata_db import in_process_metadata_db
    from airflow_e2e.sample import install_example_dag

    from airflow_partitions.operators.run_conf import RefreshRunConf

    capture_logs(caplog)
    create_orders(pg_database)
    upload_trips(s3_server, s3_bucket, tmp_path / "upload")
    written = write_spec(tmp_path, pg_url_with_password(pg_database), s3_server, s3_bucket)
    text = written.read_text().replace("accelerator_dir: acc", f"accelerator_dir: {tmp_path / 'acc'}")
    install_example_dag(tmp_path / "dags", text)
    with in_process_metadata_db(str(tmp_path / "dags")) as _:
        from airflow.configuration import conf
        from airflow.dag_processing.dagbag import DagBag

        bag = DagBag(dag_folder=str(tmp_path / "dags"))
        assert bag.import_errors == {}, bag.import_errors
        states = {}
        for dataset in ("orders_by_day", "trips_by_bucket", "orders_missing_db"):
            run = bag.dags[f"refresh_{dataset}"].test(run_conf=RefreshRunConf().to_conf())
            states[dataset] = str(run.state)
        log_folder = Path(conf.get("logging", "base_log_folder"))
    assert states == {
        "orders_by_day": "success",
        "trips_by_bucket": "success",
        "orders_missing_db": "failed",
    }, states
    out, err = capfd.readouterr()
    assert_no_secret(out + err + caplog.text, "the DAG runs")
    assert "ap_missing_db" in out + err + caplog.text, "the failed task's error is in the logs"
    # The spec's secrets reached Airflow's masker, which redacts task logs and tracebacks (a private
    # import: the SDK has no public way to ask the masker).
    from airflow.sdk._shared.secrets_masker import redact

    for value in PLANTED:
        assert redact(f"driver said {unquote(value)}") == "driver said ***", value
    assert_no_secret_in_files(tmp_path / "acc", *([log_folder] if log_folder.is_dir() else []))
