"""Chooses where refresh Spark work runs: in-process local Spark, spark-submit, or a Spark Connect server.

The choice follows the connection: none (or `local`) is an in-process local session; a connection of the
Spark provider's type `spark` runs `spark_jobs/refresh_partitions.py` through `spark-submit` (its master:
`local[2]`, `spark://host:7077`, `yarn`, `k8s://...`); type `spark_connect` opens a Spark Connect session
on the server it names. DAGs stay the same in every mode: only the connection changes.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from enum import StrEnum
from functools import cached_property
from pathlib import Path
from typing import Any

from airflow.sdk import BaseHook, conf

from airflow_partitions.exceptions import OrchestrationError
from airflow_partitions.hooks.connections import get_connection

LOCAL = "local"
CONFIG_SECTION = "airflow_partitions"
SPARK_JOB_SCRIPT = "refresh_partitions.py"
APP_NAME = "airflow-partitions-refresh"


class SparkMode(StrEnum):
    """Where Spark work runs; the values are the connection types that select them."""

    LOCAL = "local"
    SUBMIT = "spark"
    CONNECT = "spark_connect"


def configured_spark_conn_id() -> str | None:
    """`[airflow_partitions] spark_conn_id` (env `AIRFLOW__AIRFLOW_PARTITIONS__SPARK_CONN_ID`), if set.

    Lets a deployment move every refresh DAG to a cluster without editing DAG files.
    """
    value = conf.get(CONFIG_SECTION, "spark_conn_id", fallback=None)
    if not isinstance(value, str):
        return None
    return value.strip() or None


def configured_arrow_memory_budget() -> int | None:
    """`[airflow_partitions] arrow_memory_budget` in bytes, if set and AP_ARROW_MEMORY_BUDGET is not (the
    variable wins, as in a CLI call); None leaves the default to `refresh.strategy.arrow_memory_budget`."""
    import os

    from airflow_partitions.refresh.arrow_budget import BUDGET_ENV, parse_bytes  # lazy: loads sqlglot

    if os.environ.get(BUDGET_ENV, "").strip():
        return None
    value = conf.get(CONFIG_SECTION, "arrow_memory_budget", fallback=None)
    if not isinstance(value, str) or not value.strip():
        return None
    return parse_bytes(value, setting="[airflow_partitions] arrow_memory_budget")


def configured_master_timeout() -> float | None:
    """`[airflow_partitions] spark_master_timeout` (env `AIRFLOW__AIRFLOW_PARTITIONS__SPARK_MASTER_TIMEOUT`):
    seconds a refresh waits for its Spark master or Connect server to accept a connection (default 60)."""
    return _configured_seconds("spark_master_timeout", 60)


def configured_executor_timeout() -> float | None:
    """`[airflow_partitions] spark_executor_timeout` (env
    `AIRFLOW__AIRFLOW_PARTITIONS__SPARK_EXECUTOR_TIMEOUT`): seconds a refresh on a cluster master waits for
    its first executor (default 120)."""
    return _configured_seconds("spark_executor_timeout", 120)


def executor_timeout_env() -> dict[str, str]:
    """The executor timeout for a spark-submit driver, which reads no Airflow config: its environment."""
    seconds = configured_executor_timeout()
    return {} if seconds is None else {"AP_SPARK_EXECUTOR_TIMEOUT": f"{seconds:g}"}


def _configured_seconds(option: str, example: int) -> float | None:
    value = conf.get(CONFIG_SECTION, option, fallback=None)
    if value is None or not str(value).strip():
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise OrchestrationError(
            f"[{CONFIG_SECTION}] {option} = {value!r} is not a positive number of seconds; "
            f"set it to e.g. {example}"
        )
    return seconds


def spark_job_path() -> Path:
    """The spark-submit application: `spark_jobs/refresh_partitions.py` (env `AP_SPARK_JOB` overrides)."""
    override = os.environ.get("AP_SPARK_JOB")
    candidates = [Path(override)] if override else []
    package_root = Path(__file__).resolve().parent.parent
    candidates += [
        package_root / "spark_jobs" / SPARK_JOB_SCRIPT,
        package_root.parent / "spark_jobs" / SPARK_JOB_SCRIPT,
    ]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise OrchestrationError(
        f"cannot find the Spark job {SPARK_JOB_SCRIPT} (looked in {', '.join(str(c) for c in candidates)}); "
        "set AP_SPARK_JOB to its path"
    )


def submit_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for `spark-submit`: this interpreter for the driver and workers, its bin dir on PATH.

    The Spark job imports airflow_partitions, so its Python must be the one this package is installed in;
    pip's pyspark puts `spark-submit` next to that interpreter.
    """
    bin_dir = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    env = {
        "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PATH": path if shutil.which("spark-submit") else f"{bin_dir}{os.pathsep}{path}",
    }
    env.update(extra or {})
    return env


def submit_conf() -> dict[str, str]:
    """Spark settings a submitted refresh job needs as much as the local session: UTC, the JDBC jar."""
    from airflow_partitions.refresh.spark_session import local_session_conf  # lazy: loads sqlglot

    wanted = (
        "spark.sql.session.timeZone",
        "spark.driver.extraJavaOptions",
        "spark.executor.extraJavaOptions",
        "spark.sql.execution.arrow.pyspark.enabled",
        "spark.jars",
    )
    settings = local_session_conf()
    return {key: settings[key] for key in wanted if settings.get(key)}


class SparkRefreshHook(BaseHook):
    """The Spark of a refresh: a session (local or Spark Connect) or a spark-submit run, and killing it.

    Building the hook does no I/O; the connection is read when the mode is first needed.
    """

    conn_name_attr = "spark_conn_id"
    default_conn_name = LOCAL
    conn_type = "spark"
    hook_name = "Spark (refresh)"

    def __init__(
        self, spark_conn_id: str | None = None, *, spark_conf: Mapping[str, str] | None = None
    ) -> None:
        super().__init__()
        self.spark_conn_id = spark_conn_id if spark_conn_id is not None else configured_spark_conn_id()
        self.spark_conf = dict(spark_conf or {})
        self._session: Any = None
        self._submit_hook: Any = None

    @cached_property
    def mode(self) -> SparkMode:
        if self.spark_conn_id in (None, "", LOCAL):
            return SparkMode.LOCAL

        conn_type = (get_connection(self.spark_conn_id).conn_type or "").replace("-", "_")
        # An `sc://host:15002` connection URI parses to type "sc": it names a Spark Connect server too.
        conn_type = SparkMode.CONNECT.value if conn_type == "sc" else conn_type
        try:
            return SparkMode(conn_type)
        except ValueError:
            raise OrchestrationError(
                f"connection {self.spark_conn_id!r} has type {conn_type!r}; a refresh runs on a connection "
                f"of type spark (spark-submit) or spark_connect (Spark Connect), or on local in-process "
                f"Spark when spark_conn_id is None or {LOCAL!r}"
            ) from None

    @cached_property
    def connect_url(self) -> str:
        """`sc://host:port/;token=...` of a spark_connect connection."""
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

        return str(SparkConnectHook(conn_id=str(self.spark_conn_id)).get_connection_url())

    def session(self) -> Any:
        """A SparkSession for LOCAL or CONNECT mode (reused for the life of the hook)."""
        if self._session is None:
            from airflow_partitions.refresh.spark_session import (  # lazy: loads sqlglot
                build_connect_session,
                build_local_session,
            )

            timeout = configured_master_timeout()
            if self.mode is SparkMode.LOCAL:
                self._session = build_local_session(
                    app_name="airflow-partitions-refresh",
                    conf=self.spark_conf,
                    reach_timeout=timeout,
                    executor_timeout=configured_executor_timeout(),
                    configured_in="AP_SPARK_MASTER",
                )
            elif self.mode is SparkMode.CONNECT:
                self._session = build_connect_session(
                    self.connect_url,
                    conf=self.spark_conf,
                    reach_timeout=timeout,
                    configured_in=f"connection {self.spark_conn_id!r}",
                )
            else:
                raise OrchestrationError(
                    f"connection {self.spark_conn_id!r} submits Spark jobs; it has no session to hand out"
                )
        return self._session

    def submit(
        self,
        application_args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        conf_overrides: Mapping[str, Any] | None = None,
        name: str = APP_NAME,
    ) -> None:
        """Run the refresh Spark job through the provider's SparkSubmitHook; raises if it fails.

        A `spark://` master must first accept a connection (`SparkUnreachableError` otherwise): Spark's
        own registration retries would take minutes to fail, with a message that does not name it.
        """
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        from airflow_partitions.refresh.spark_session import check_spark_reachable  # lazy: loads sqlglot

        if self.mode is not SparkMode.SUBMIT:
            raise OrchestrationError(f"spark-submit needs a connection of type spark, not {self.mode}")
        self._submit_hook = SparkSubmitHook(
            conn_id=str(self.spark_conn_id),
            conf={**submit_conf(), **self.spark_conf, **(conf_overrides or {})},
            application_args=list(application_args),
            env_vars=submit_environment({**executor_timeout_env(), **(env or {})}),
            name=name,
        )
        # The master exactly as spark-submit will get it (the provider's reading of the connection).
        master = str(getattr(self._submit_hook, "_connection", {}).get("master") or "")
        check_spark_reachable(
            master, timeout=configured_master_timeout(), configured_in=f"connection {self.spark_conn_id!r}"
        )
        try:
            self._submit_hook.submit(application=str(spark_job_path()))
        except Exception as err:
            raise OrchestrationError(f"spark-submit of {SPARK_JOB_SCRIPT} failed: {err}") from err

    def on_kill(self) -> None:
        """Stop the Spark work this hook started: cancel jobs, interrupt Connect, or kill spark-submit."""
        if self._submit_hook is not None:
            self._submit_hook.on_kill()
        if self._session is not None:
            if self.mode is SparkMode.CONNECT:
                self._session.interruptAll()
            else:
                self._session.sparkContext.cancelAllJobs()

    def get_conn(self) -> Any:
        return self.session()
