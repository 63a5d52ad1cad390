"""Builds Spark sessions: an in-process local session by default, Spark Connect or a cluster by config."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

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


def build_local_session(
    *, app_name: str = "airflow-partitions", master: str | None = None, conf: Mapping[str, str] | None = None
) -> Any:
    """A classic in-process SparkSession (`local[*]` unless `master` or AP_SPARK_MASTER says otherwise)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name).master(
        master or os.environ.get("AP_SPARK_MASTER", "local[2]")
    )
    for key, value in {**DEFAULT_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def build_connect_session(remote: str, *, conf: Mapping[str, str] | None = None) -> Any:
    """A Spark Connect client session for `remote` (e.g. `sc://127.0.0.1:15002`)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.remote(remote)
    for key, value in {"spark.sql.session.timeZone": "UTC", **(conf or {})}.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
