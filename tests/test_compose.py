"""Static validation of docker-compose.yaml and the Dockerfile (no Docker engine runs here).

Checks that every service, image, port, volume, command and connection the stack references is
consistent with itself, with the repository and with the code's pins.
"""

from __future__ import annotations

import json
import posixpath
import re
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_TEXT = (ROOT / "docker-compose.yaml").read_text()
COMPOSE = yaml.safe_load(COMPOSE_TEXT)
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
ENTRYPOINT = (ROOT / "deploy" / "entrypoint.sh").read_text()
AIRFLOW_SERVICES = [name for name in SERVICES if name.startswith("airflow-")]


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def test_every_service_has_an_image_and_a_pinned_tag() -> None:
    for name, service in SERVICES.items():
        image = service.get("image")
        assert image, f"service {name} has no image"
        assert ":" in image, f"service {name} image {image} is not pinned to a tag"
        assert not image.endswith(":latest"), f"service {name} uses :latest"


def test_depends_on_names_existing_services_with_known_conditions() -> None:
    for name, service in SERVICES.items():
        depends = service.get("depends_on") or {}
        for dependency, rule in depends.items() if isinstance(depends, dict) else ((d, {}) for d in depends):
            assert dependency in SERVICES, f"{name} depends on unknown service {dependency}"
            condition = (rule or {}).get("condition", "service_started")
            assert condition in {"service_started", "service_healthy", "service_completed_successfully"}
            if condition == "service_healthy":
                assert "healthcheck" in SERVICES[dependency], f"{dependency} needs a healthcheck"


ONE_SHOT_SERVICES = {"airflow-init", "minio-init"}


def test_long_running_services_have_healthchecks() -> None:
    assert SERVICES.keys() >= ONE_SHOT_SERVICES
    for name, service in SERVICES.items():
        if name not in ONE_SHOT_SERVICES:
            assert "healthcheck" in service, f"{name} has no healthcheck"
            assert service["healthcheck"]["test"], f"{name}'s healthcheck runs nothing"


def test_named_volumes_are_declared_and_bind_mounts_exist() -> None:
    declared = set(COMPOSE.get("volumes") or {})
    for name, service in SERVICES.items():
        for volume in service.get("volumes") or []:
            source = volume.split(":", 1)[0]
            if source.startswith((".", "/")):
                path = (ROOT / source).resolve()
                generated = source in {"./.demo"}  # created by `make demo`
                assert generated or path.exists(), f"{name} bind-mounts missing path {source}"
            else:
                assert source in declared, f"{name} uses undeclared volume {source}"


def test_host_ports_are_unique() -> None:
    seen: dict[str, str] = {}
    for name, service in SERVICES.items():
        for port in service.get("ports") or []:
            host = str(port).split(":")[0]
            assert host not in seen, f"host port {host} used by {seen.get(host)} and {name}"
            seen[host] = name


def test_commands_are_handled_by_the_entrypoint() -> None:
    labels = set(re.findall(r"^\s+([a-z-]+)\)", ENTRYPOINT, flags=re.MULTILINE))
    for name, service in SERVICES.items():
        if service.get("image") != "airflow-partitions:local":
            continue
        command = service.get("command")
        assert command, f"{name} runs the project image without a command"
        assert command[0] in labels, f"{name} command {command[0]} not handled by deploy/entrypoint.sh"


@pytest.mark.parametrize("service", AIRFLOW_SERVICES)
def test_airflow_services_share_metadata_db_and_secret(service: str) -> None:
    env = _env(SERVICES[service])
    db = urlparse(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    pg = _env(SERVICES["postgres"])
    assert db.hostname == "postgres"
    assert db.username == pg["POSTGRES_USER"]
    assert db.password == pg["POSTGRES_PASSWORD"]
    assert db.path.lstrip("/") == pg["POSTGRES_DB"]
    assert env["AIRFLOW__API_AUTH__JWT_SECRET"], "components must share one JWT secret"
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"].startswith("http://airflow-apiserver:8080/")


def test_connections_point_at_services_in_the_stack() -> None:
    from airflow.models.connection import Connection

    env = _env(SERVICES["airflow-scheduler"])
    spark = Connection(conn_id="spark_default", uri=env["AIRFLOW_CONN_SPARK_DEFAULT"])
    assert spark.conn_type == "spark"
    # Stages run on the long-lived Connect server (no JVM start per stage task); it and the workers see
    # the stage at the same path as the Airflow tasks that finalize from it.
    assert env["AIRFLOW__AIRFLOW_PARTITIONS__SPARK_CONN_ID"] == "spark_connect_default"
    for node in ("spark-connect", "spark-worker"):
        assert "accelerations:/opt/airflow/.accelerations" in SERVICES[node]["volumes"], node
    assert "accelerations:/opt/airflow/.accelerations" in SERVICES["airflow-scheduler"]["volumes"]
    assert spark.host == "spark-master"
    assert spark.port == 7077
    assert "7077:7077" in SERVICES["spark-master"]["ports"]

    connect = urlparse(env["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"])
    assert connect.scheme == "sc"
    assert connect.hostname == "spark-connect"
    assert connect.port == 15002
    assert "spark.connect.grpc.binding.port=15002" in ENTRYPOINT

    aws = json.loads(env["AIRFLOW_CONN_AWS_DEFAULT"])
    endpoint = urlparse(aws["extra"]["endpoint_url"])
    assert endpoint.hostname == "minio"
    minio_env = _env(SERVICES["minio"])
    assert aws["login"] == minio_env["MINIO_ROOT_USER"]
    assert aws["password"] == minio_env["MINIO_ROOT_PASSWORD"]
    assert f"{endpoint.port}:{endpoint.port}" in SERVICES["minio"]["ports"]


def test_spec_path_is_inside_the_dags_mount_and_exists() -> None:
    env = _env(SERVICES["airflow-scheduler"])
    spec_path = env["AIRFLOW_PARTITIONS_SPEC"]
    assert spec_path.startswith("/opt/airflow/dags/")
    assert (ROOT / "dags" / spec_path.removeprefix("/opt/airflow/dags/")).exists()


def test_dockerfile_pins_match_pyproject_and_copies_exist() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pins = dict(dep.split("==", 1) for dep in pyproject["project"]["dependencies"] if "==" in dep)
    assert f"pyspark=={pins['pyspark']}" in DOCKERFILE
    assert pins["pyspark"] == pins["pyspark-client"], "pyspark and pyspark-client must agree"
    assert "openjdk-17" in DOCKERFILE
    for source in re.findall(r"^COPY\s+(\S+)", DOCKERFILE, flags=re.MULTILINE):
        assert (ROOT / source).exists(), f"Dockerfile copies missing {source}"


def _mounts(name: str) -> dict[str, str]:
    """Container path -> source (named volume or host path) of a service's volumes."""
    mounts: dict[str, str] = {}
    for volume in SERVICES[name].get("volumes") or []:
        source, target = volume.split(":")[:2]
        mounts[target] = source
    return mounts


def _container_path(relative_to: PurePosixPath, value: str) -> PurePosixPath:
    return PurePosixPath(posixpath.normpath(str(relative_to / value)))


def _mounted_from(name: str, path: PurePosixPath) -> str | None:
    """The volume or host path a service sees `path` through (the deepest mount containing it)."""
    best: tuple[int, str] | None = None
    for target, source in _mounts(name).items():
        inside = path == PurePosixPath(target) or PurePosixPath(target) in path.parents
        if inside and (best is None or len(target) > best[0]):
            best = (len(target), source)
    return best[1] if best else None


EXAMPLE_SPEC = yaml.safe_load((ROOT / "dags" / "datasets.yaml").read_text())
SPEC_DIR_IN_CONTAINER = PurePosixPath("/opt/airflow/dags")
# Everything that reads or writes refresh data: Airflow's task runners, and Spark's driver and executors.
DATA_SERVICES = ["airflow-scheduler", "airflow-worker", "spark-master", "spark-worker", "spark-connect"]


def test_spec_accelerator_dir_is_one_volume_shared_by_airflow_and_spark() -> None:
    # Spark executors write the stage under accelerator_dir; finalize tasks read it at the same path.
    accelerator_dir = _container_path(SPEC_DIR_IN_CONTAINER, EXAMPLE_SPEC["accelerator_dir"])
    sources = {name: _mounted_from(name, accelerator_dir) for name in DATA_SERVICES}
    assert set(sources.values()) == {"accelerations"}, sources
    assert "accelerations" in COMPOSE["volumes"]


def test_spec_file_sources_are_visible_to_airflow_and_spark() -> None:
    for dataset in EXAMPLE_SPEC["datasets"]:
        source = dataset["from"]
        if not source.startswith("file:"):
            continue
        path = _container_path(SPEC_DIR_IN_CONTAINER, source.removeprefix("file:").split("*")[0])
        seen = {name: _mounted_from(name, path) for name in DATA_SERVICES}
        assert None not in seen.values(), (dataset["name"], seen)
        assert len(set(seen.values())) == 1, (dataset["name"], seen)


def test_every_connection_the_spec_names_is_provisioned() -> None:
    env = _env(SERVICES["airflow-scheduler"])
    for dataset in EXAMPLE_SPEC["datasets"]:
        conn_id = (dataset.get("params") or {}).get("connection_id")
        if conn_id:
            assert f"AIRFLOW_CONN_{conn_id.upper()}" in env, f"{dataset['name']} needs connection {conn_id}"


def test_connections_resolve_through_the_hooks_that_use_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """The provisioned URIs, read by the real hooks: the master spark-submit gets, the Connect URL, S3."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    from airflow_partitions.hooks.snapshot_storage import SnapshotStorageHook
    from airflow_partitions.hooks.spark_refresh import SparkMode, SparkRefreshHook

    env = _env(SERVICES["airflow-scheduler"])
    for key, value in env.items():
        if key.startswith("AIRFLOW_CONN_"):
            monkeypatch.setenv(key, value)

    submit = SparkSubmitHook(conn_id="spark_default")._resolve_connection()
    assert (
        submit["master"] == _env(SERVICES["spark-worker"])["SPARK_MASTER_URL"] == "spark://spark-master:7077"
    )
    assert submit["deploy_mode"] == "client", "the driver runs in the Airflow task, beside the stage files"
    assert SparkRefreshHook(spark_conn_id="spark_default").mode is SparkMode.SUBMIT

    connect = SparkRefreshHook(spark_conn_id="spark_connect_default")
    assert connect.mode is SparkMode.CONNECT
    assert connect.connect_url.rstrip("/") == "sc://spark-connect:15002"

    settings = SnapshotStorageHook(aws_conn_id="aws_default").s3_settings
    assert settings["endpoint_url"] == "http://minio:9000"
    minio = _env(SERVICES["minio"])
    assert settings["aws_access_key_id"] == minio["MINIO_ROOT_USER"]
    assert settings["aws_secret_access_key"] == minio["MINIO_ROOT_PASSWORD"]
    # The snapshot bucket of the example spec is the one minio-init creates.
    buckets = {
        urlparse(d["acceleration"]["snapshots"]["location"]).netloc
        for d in EXAMPLE_SPEC["datasets"]
        if (d["acceleration"].get("snapshots") or {}).get("location")
    }
    assert buckets
    assert all(f"local/{bucket}" in SERVICES["minio-init"]["entrypoint"] for bucket in buckets)


def test_image_installs_the_drivers_the_stack_configures() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    deploy = " ".join(pyproject["project"]["optional-dependencies"]["deploy"])
    install = re.search(r'uv pip install --system --no-cache (?P<flags>[^"\n]*)"\.\[deploy\]"', DOCKERFILE)
    assert install, "the image installs the package with its deploy extra"
    assert "--compile-bytecode" in install["flags"], "task processes must not recompile Airflow on start"
    env = _env(SERVICES["airflow-scheduler"])
    if env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://"):
        assert "psycopg2" in deploy, "the metadata URL needs psycopg2 in the image"
    assert "CeleryExecutor" in COMPOSE_TEXT, "the celery profile is documented"
    assert "apache-airflow-providers-celery==" in deploy, "CeleryExecutor needs the celery provider"
    assert "redis" in SERVICES
    assert env["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://redis:")


def test_image_installs_the_task_preload_settings() -> None:
    assert "COPY deploy/airflow_local_settings.py /opt/airflow/config/airflow_local_settings.py" in DOCKERFILE
    assert "ENV AIRFLOW_HOME=/opt/airflow" in DOCKERFILE
    text = (ROOT / "deploy" / "airflow_local_settings.py").read_text()
    assert "preload_task_modules()" in text
