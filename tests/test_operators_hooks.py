"""Hooks of the Airflow layer: Airflow connections turned into S3 settings, Postgres URLs, Spark modes."""

from __future__ import annotations

import json

import pytest

from airflow_partitions.exceptions import OrchestrationError, RefreshError
from airflow_partitions.hooks.connections import postgres_url, resolve_postgres_connection
from airflow_partitions.hooks.snapshot_storage import SnapshotStorageHook
from airflow_partitions.hooks.spark_refresh import SparkMode, SparkRefreshHook, submit_environment
from airflow_partitions.operators.commit import MAX_ASSET_PARTITION_KEY, asset_partition_key
from airflow_partitions.refresh.job_files import build_stage_job_args

pytestmark = pytest.mark.airflow


def test_s3_settings_from_an_aws_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_MINIO",
        json.dumps(
            {
                "conn_type": "aws",
                "login": "minio",
                "password": "minio12345",
                "extra": {
                    "endpoint_url": "http://minio:9000",
                    "region_name": "eu-west-1",
                    "addressing_style": "path",
                },
            }
        ),
    )
    hook = SnapshotStorageHook(aws_conn_id="minio")
    assert hook.s3_settings == {
        "aws_access_key_id": "minio",
        "aws_secret_access_key": "minio12345",
        "endpoint_url": "http://minio:9000",
        "region_name": "eu-west-1",
        "addressing_style": "path",
    }
    from airflow_partitions.snapshots import S3Settings

    settings = S3Settings.from_mapping(hook.s3_settings)
    assert settings.endpoint_url == "http://minio:9000", "the core accepts what the hook resolves"


def test_missing_default_connection_falls_back_to_the_credential_chain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_AWS_DEFAULT", raising=False)
    monkeypatch.delenv("AIRFLOW__AIRFLOW_PARTITIONS__AWS_CONN_ID", raising=False)
    assert SnapshotStorageHook().s3_settings == {}, "aws_default absent: boto3's default chain"
    with pytest.raises(OrchestrationError, match="'not_there' is not defined"):
        _ = SnapshotStorageHook(aws_conn_id="not_there").s3_settings


def test_configured_connection_id_must_exist(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__AIRFLOW_PARTITIONS__AWS_CONN_ID", "snapshots_store")
    hook = SnapshotStorageHook()
    assert hook.aws_conn_id == "snapshots_store"
    with pytest.raises(OrchestrationError, match="snapshots_store"):
        _ = hook.s3_settings


def test_half_credentials_are_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_HALF", json.dumps({"conn_type": "aws", "login": "key-only"}))
    with pytest.raises(OrchestrationError, match="access key id without a secret key"):
        _ = SnapshotStorageHook(aws_conn_id="half").s3_settings


def test_postgres_url_from_a_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_WAREHOUSE",
        json.dumps(
            {
                "conn_type": "postgres",
                "host": "db.internal",
                "port": 5433,
                "login": "etl user",
                "password": "p@ss:word",
                "schema": "analytics",
                "extra": {"sslmode": "require"},
            }
        ),
    )
    assert resolve_postgres_connection("warehouse") == (
        "postgresql://etl%20user:p%40ss%3Aword@db.internal:5433/analytics?sslmode=require"
    )


def test_postgres_url_rejects_other_connection_types(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk import Connection

    with pytest.raises(OrchestrationError, match="type 'aws'"):
        postgres_url(Connection(conn_id="x", conn_type="aws", host="h"))
    with pytest.raises(OrchestrationError, match="has no host"):
        postgres_url(Connection(conn_id="x", conn_type="postgres"))


@pytest.mark.parametrize(
    ("conn", "mode"),
    [
        (None, SparkMode.LOCAL),
        ("local", SparkMode.LOCAL),
        ("spark_cluster", SparkMode.SUBMIT),
        ("spark_connect_server", SparkMode.CONNECT),
        ("sc_uri", SparkMode.CONNECT),
    ],
)
def test_spark_mode_follows_the_connection_type(
    conn: str | None, mode: SparkMode, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AIRFLOW__AIRFLOW_PARTITIONS__SPARK_CONN_ID", raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CLUSTER", "spark://spark-master:7077?deploy-mode=client")
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_CONNECT_SERVER",
        json.dumps({"conn_type": "spark_connect", "host": "h", "port": 15002}),
    )
    monkeypatch.setenv("AIRFLOW_CONN_SC_URI", "sc://spark-connect:15002")
    assert SparkRefreshHook(spark_conn_id=conn).mode is mode


def test_spark_connect_url_and_config_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_CONNECT",
        json.dumps({"conn_type": "spark_connect", "host": "spark", "port": 15002, "password": "tok"}),
    )
    monkeypatch.setenv("AIRFLOW__AIRFLOW_PARTITIONS__SPARK_CONN_ID", "connect")
    hook = SparkRefreshHook()
    assert hook.spark_conn_id == "connect", (
        "[airflow_partitions] spark_conn_id moves DAGs without editing them"
    )
    assert hook.mode is SparkMode.CONNECT
    assert hook.connect_url == "sc://spark:15002/;token=tok"


def test_unsupported_connection_type_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_NOT_SPARK", json.dumps({"conn_type": "postgres", "host": "h"}))
    with pytest.raises(OrchestrationError, match=r"type spark .* or spark_connect"):
        _ = SparkRefreshHook(spark_conn_id="not_spark").mode


def test_stage_job_arguments_match_the_spark_job_parser() -> None:
    import runpy

    from airflow_partitions.hooks.spark_refresh import spark_job_path

    # The file spark-submit is given, as the hook finds it.
    job = runpy.run_path(str(spark_job_path()))
    args = build_stage_job_args(
        spec_path="/s/spec.yaml",
        dataset="sales",
        plan_file="/t/plan.json",
        location="/stage/x",
        output_file="/t/o.json",
    )
    parsed = job["build_parser"]().parse_args(args)
    assert (parsed.command, parsed.spec, parsed.dataset, parsed.plan, parsed.location, parsed.output) == (
        "stage",
        "/s/spec.yaml",
        "sales",
        "/t/plan.json",
        "/stage/x",
        "/t/o.json",
    )


def test_submit_environment_uses_this_interpreter() -> None:
    import sys

    env = submit_environment({"AIRFLOW_CONN_X": "postgresql://h/db"})
    assert env["PYSPARK_DRIVER_PYTHON"] == sys.executable
    assert env["AIRFLOW_CONN_X"] == "postgresql://h/db"
    import shutil

    assert shutil.which("spark-submit", path=env["PATH"]), "spark-submit is reachable on the job's PATH"


def test_s3_settings_reach_a_submitted_job_through_its_environment_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A spark-submit job on an s3:// accelerator_dir gets the connection's settings in its environment
    (its executors upload the partition files); where the provider turns the environment into `--conf`
    entries (YARN), the command it logs shows no credential."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    from airflow_partitions.objectstore.settings import S3Settings
    from airflow_partitions.refresh.job_files import (
        S3_SETTINGS_ENV,
        s3_settings_environment,
        s3_settings_from_environment,
    )

    settings = S3Settings(
        endpoint_url="http://127.0.0.1:9000",
        region_name="eu-west-1",
        aws_access_key_id="AKIAEXAMPLE",
        aws_secret_access_key="wJal/rXUt+nF=EMI%K7MDENG",
        addressing_style="path",
    )
    env = s3_settings_environment(settings)
    monkeypatch.setenv(S3_SETTINGS_ENV, env[S3_SETTINGS_ENV])
    assert s3_settings_from_environment() == settings, "the job rebuilds exactly the same settings"
    monkeypatch.delenv(S3_SETTINGS_ENV)
    assert s3_settings_from_environment() is None
    monkeypatch.setenv(S3_SETTINGS_ENV, "{not json")
    with pytest.raises(RefreshError, match="is not JSON"):
        s3_settings_from_environment()

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_YARN", "spark://yarn?deploy-mode=cluster")
    hook = SparkSubmitHook(conn_id="spark_yarn", env_vars=submit_environment(env))
    command = hook._mask_cmd(hook._build_spark_submit_command("job.py"))
    assert f"spark.yarn.appMasterEnv.{S3_SETTINGS_ENV}=" in command
    assert "wJal" not in command, command
    assert "AKIAEXAMPLE" not in command, command


def test_asset_partition_keys_fit_airflow_and_stay_distinct() -> None:
    import datetime as dt

    from airflow_partitions.keys import PartitionKey

    short = PartitionKey(("EU", dt.datetime(2026, 1, 1)))
    assert asset_partition_key(short) == "EU|2026-01-01T00:00:00", "Airflow's composite-key convention"
    long_a = PartitionKey(("a/" * 100 + "x", "|" * 50))
    long_b = PartitionKey(("a/" * 100 + "y", "|" * 50))
    key_a, key_b = asset_partition_key(long_a), asset_partition_key(long_b)
    assert len(key_a) <= MAX_ASSET_PARTITION_KEY
    assert key_a != key_b, "different keys never collapse into one event"
    assert "%H" in key_a
    prefix = key_a.split("%H")[0]
    assert ("a/" * 100 + "x|" + "%7C" * 50).startswith(prefix), "a readable prefix of the whole key"
    assert not prefix.endswith(("%", "%7")), "the prefix never ends inside an escape"


def test_preload_imports_what_refresh_tasks_need() -> None:
    import sys

    from airflow_partitions.dag_factory import TASK_PRELOAD_MODULES, preload_task_modules

    preload_task_modules()
    assert all(module in sys.modules for module in TASK_PRELOAD_MODULES)
