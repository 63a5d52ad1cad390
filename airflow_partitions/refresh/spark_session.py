"""Builds Spark sessions: an in-process local session by default, Spark Connect or a cluster by config."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Debian/Ubuntu `libpostgresql-jdbc-java` installs the PostgreSQL JDBC driver here; Postgres sources read
# through it when present (override with AP_SPARK_JARS, a comma-separated list).
POSTGRES_JDBC_JAR = Path("/usr/share/java/postgresql.jar")

# UTC everywhere: partition values computed in Spark must equal those computed in Arrow and Python.
DEFAULT_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.shuffle.partitions": "8",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "4g",
    "spark.sql.sources.partitionOverwriteMode": "dynamic",
    "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
    "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
}


# Settings a caller cannot override: partition values must be computed in UTC everywhere.
PINNED_CONF: dict[str, str] = {"spark.sql.session.timeZone": "UTC"}


def local_session_conf(conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """The local session's settings: defaults, the JDBC driver jar, this interpreter for Python workers."""
    settings = dict(DEFAULT_CONF)
    jars = os.environ.get("AP_SPARK_JARS") or (str(POSTGRES_JDBC_JAR) if POSTGRES_JDBC_JAR.exists() else "")
    if jars:
        settings["spark.jars"] = jars
    # Python UDF workers (the bucket hash) must import this package: run them on this interpreter.
    settings["spark.pyspark.python"] = os.environ.get("PYSPARK_PYTHON", sys.executable)
    settings["spark.pyspark.driver.python"] = sys.executable
    settings.update(conf or {})
    settings.update(PINNED_CONF)
    return settings


def build_local_session(
    *, app_name: str = "airflow-partitions", master: str | None = None, conf: Mapping[str, str] | None = None
) -> Any:
    """A classic in-process SparkSession (`local[*]` unless `master` or AP_SPARK_MASTER says otherwise)."""
    from pyspark.sql import SparkSession

    # PySpark picks the worker interpreter from this variable (not from the conf) when the context starts.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name).master(
        master or os.environ.get("AP_SPARK_MASTER", "local[2]")
    )
    for key, value in local_session_conf(conf).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def build_connect_session(remote: str, *, conf: Mapping[str, str] | None = None) -> Any:
    """A Spark Connect client session for `remote` (e.g. `sc://127.0.0.1:15002`)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.remote(remote)
    for key, value in {**(conf or {}), **PINNED_CONF}.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def build_submitted_session(*, conf: Mapping[str, str] | None = None) -> Any:
    """The session of a `spark-submit`ted job: master and resources come from spark-submit, UTC enforced."""
    from pyspark.sql import SparkSession

    session = SparkSession.builder.getOrCreate()
    for key, value in {**(conf or {}), **PINNED_CONF}.items():
        session.conf.set(key, value)
    return session


def describe_session(session: Any) -> str:
    """Where a session runs its work: "spark_connect" for a Spark Connect client, else the master URL."""
    if type(session).__module__.startswith("pyspark.sql.connect"):
        return "spark_connect"
    return str(session.sparkContext.master)
