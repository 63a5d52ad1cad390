"""Builds Spark sessions: an in-process local session by default, Spark Connect or a cluster by config."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from airflow_partitions.exceptions import SparkNoExecutorsError, SparkUnreachableError

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


# How long a refresh waits for a Spark master / Connect server to accept a TCP connection before it
# gives up (AP_SPARK_MASTER_TIMEOUT, or `[airflow_partitions] spark_master_timeout` in Airflow). Without
# this check an unreachable standalone master costs Spark's own three 20 s registration attempts plus
# the context's start and stop (about two minutes here) and ends in "Cannot call methods on a stopped
# SparkContext"; a Connect client retries for longer still.
DEFAULT_REACH_TIMEOUT = 60.0
# How long a session on a cluster master waits for its first executor (AP_SPARK_EXECUTOR_TIMEOUT, or
# `[airflow_partitions] spark_executor_timeout`). A master that answers but has no worker with free cores and
# memory accepts the application and then waits forever ("Initial job has not accepted any resources").
DEFAULT_EXECUTOR_TIMEOUT = 120.0
STANDALONE_MASTER_PORT = 7077
CONNECT_SERVER_PORT = 15002

# Settings a caller cannot override: partition values must be computed in UTC everywhere.
PINNED_CONF: dict[str, str] = {"spark.sql.session.timeZone": "UTC"}


def local_session_conf(conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """The local session's settings: defaults, the JDBC driver jar, this interpreter for Python workers."""
    settings = dict(DEFAULT_CONF)
    jars = os.environ.get("AP_SPARK_JARS") or (str(POSTGRES_JDBC_JAR) if POSTGRES_JDBC_JAR.exists() else "")
    if jars:
        settings["spark.jars"] = jars
    # Python workers (the executors' writers, the bucket UDF of strings) must import this package: run
    # them on this interpreter.
    settings["spark.pyspark.python"] = os.environ.get("PYSPARK_PYTHON", sys.executable)
    settings["spark.pyspark.driver.python"] = sys.executable
    settings.update(conf or {})
    settings.update(PINNED_CONF)
    return settings


def build_local_session(
    *,
    app_name: str = "airflow-partitions",
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    reach_timeout: float | None = None,
    executor_timeout: float | None = None,
    configured_in: str | None = None,
) -> Any:
    """A classic in-process SparkSession (`local[2]` unless `master` or AP_SPARK_MASTER says otherwise).

    A `spark://` master must accept a connection within `reach_timeout` seconds, else
    `SparkUnreachableError` (`configured_in` says where its URL came from, for the message); on a cluster
    master the session must then get an executor within `executor_timeout` seconds, else
    `SparkNoExecutorsError` (see `wait_for_executors`).
    """
    from pyspark.sql import SparkSession

    master = master or os.environ.get("AP_SPARK_MASTER", "local[2]")
    check_spark_reachable(master, timeout=reach_timeout, configured_in=configured_in)
    # PySpark picks the worker interpreter from this variable (not from the conf) when the context starts.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name).master(master)
    for key, value in local_session_conf(conf).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    wait_for_executors(session, timeout=executor_timeout, configured_in=configured_in)
    return session


def build_connect_session(
    remote: str,
    *,
    conf: Mapping[str, str] | None = None,
    reach_timeout: float | None = None,
    configured_in: str | None = None,
) -> Any:
    """A Spark Connect client session for `remote` (e.g. `sc://127.0.0.1:15002`).

    The server must accept a connection within `reach_timeout` seconds, else `SparkUnreachableError`.
    """
    from pyspark.sql import SparkSession

    check_spark_reachable(remote, timeout=reach_timeout, configured_in=configured_in)
    builder = SparkSession.builder.remote(remote)
    for key, value in {**(conf or {}), **PINNED_CONF}.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def build_submitted_session(*, conf: Mapping[str, str] | None = None) -> Any:
    """The session of a `spark-submit`ted job: master and resources come from spark-submit, UTC enforced."""
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    # spark-submit handed the master to this driver's JVM; check it before the context tries to register.
    check_spark_reachable(SparkConf().get("spark.master", ""), configured_in="spark-submit --master")
    session = SparkSession.builder.getOrCreate()
    wait_for_executors(session, configured_in="spark-submit --master")
    for key, value in {**(conf or {}), **PINNED_CONF}.items():
        session.conf.set(key, value)
    return session


def executor_timeout_default() -> float:
    """Seconds a cluster session waits for its first executor: AP_SPARK_EXECUTOR_TIMEOUT, else 120."""
    return _positive_seconds("AP_SPARK_EXECUTOR_TIMEOUT", DEFAULT_EXECUTOR_TIMEOUT)


def registered_executors(session: Any) -> int:
    """Executors registered with a classic session's driver (the driver itself not counted)."""
    status = session.sparkContext._jsc.sc().getExecutorMemoryStatus()
    return max(0, int(status.size()) - 1)


def wait_for_executors(
    session: Any, *, timeout: float | None = None, configured_in: str | None = None
) -> None:
    """Return once a classic session on a cluster master has an executor; raise `SparkNoExecutorsError`
    (after stopping the session, so the master frees the application) when none registers within `timeout`
    seconds (default `executor_timeout_default()`).

    Local masters (`local[*]`) have no executors to wait for; with dynamic allocation executors are only
    requested once a job runs, so nothing is checked then.
    """
    context = session.sparkContext
    master = str(context.master)
    if master.startswith("local"):
        return
    conf = context.getConf()
    if conf.get("spark.dynamicAllocation.enabled", "false").strip().lower() == "true":
        return
    limit = executor_timeout_default() if timeout is None else timeout
    deadline = time.monotonic() + limit
    while registered_executors(session) == 0:
        if time.monotonic() >= deadline:
            break
        time.sleep(0.25)
    else:
        return
    cores = conf.get("spark.executor.cores", None) or "all of a worker's (standalone default)"
    memory = conf.get("spark.executor.memory", "1g")
    application = context.applicationId
    where = f" (from {configured_in})" if configured_in else ""
    context.stop()
    raise SparkNoExecutorsError(
        f"the Spark master {master}{where} accepted application {application} but gave it no executor "
        f"within {limit:g} s. Nothing was run. The master has no worker with free resources for it: "
        f"each executor asks for {memory} of memory and {cores} cores. To fix it, start a worker "
        f"(spark-class org.apache.spark.deploy.worker.Worker {master}), free the cores other applications "
        "hold, or ask for less (spark.executor.memory / spark.executor.cores in the connection's extras); "
        "if the cluster is only slow to grant them, raise the timeout ([airflow_partitions] "
        "spark_executor_timeout or AP_SPARK_EXECUTOR_TIMEOUT, in seconds).",
        url=master,
        timeout=limit,
    )


def describe_session(session: Any) -> str:
    """Where a session runs its work: "spark_connect" for a Spark Connect client, else the master URL."""
    if type(session).__module__.startswith("pyspark.sql.connect"):
        return "spark_connect"
    return str(session.sparkContext.master)


def reach_timeout_default() -> float:
    """Seconds to wait for a master / Connect server: AP_SPARK_MASTER_TIMEOUT, else 60."""
    return _positive_seconds("AP_SPARK_MASTER_TIMEOUT", DEFAULT_REACH_TIMEOUT)


def _positive_seconds(variable: str, default: float) -> float:
    text = os.environ.get(variable, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise SparkUnreachableError(
            f"{variable}={text!r} is not a positive number of seconds; set it to e.g. {default:g}",
            url="",
            timeout=default,
        )
    return value


def spark_endpoints(url: str) -> list[tuple[str, int]]:
    """The (host, port) pairs a `spark://` master (HA: `spark://h1:7077,h2:7077`) or an `sc://` Spark
    Connect URL connects to; empty for masters reached some other way (`local[*]`, `yarn`, `k8s://`)."""
    scheme, separator, rest = url.strip().partition("://")
    scheme = scheme.lower()
    if not separator or scheme not in ("spark", "sc"):
        return []
    authority = rest.split("/", 1)[0].split(";", 1)[0]
    default_port = STANDALONE_MASTER_PORT if scheme == "spark" else CONNECT_SERVER_PORT
    items = authority.split(",") if scheme == "spark" else [authority]
    endpoints = []
    for item in items:
        try:
            parts = urlsplit(f"//{item.strip()}")
            host, port = parts.hostname, parts.port
        except ValueError:
            host, port = None, None
        if not host:
            raise SparkUnreachableError(
                f"{_shown_url(url)!r} names no host:port to connect to; write it as "
                f"{scheme}://HOST:{default_port}",
                url=_shown_url(url),
                timeout=0.0,
            )
        endpoints.append((host, port or default_port))
    return endpoints


def _shown_url(url: str) -> str:
    """The URL without what may be a secret: a Spark Connect URL's `;token=...` parameters and path."""
    scheme, separator, rest = url.strip().partition("://")
    if scheme.lower() != "sc" or not separator:
        return url.strip()
    return f"{scheme}://{rest.split('/', 1)[0].split(';', 1)[0]}"


def check_spark_reachable(
    url: str, *, timeout: float | None = None, configured_in: str | None = None
) -> None:
    """Raise `SparkUnreachableError` unless the master / Connect server of `url` accepts a TCP connection
    within `timeout` seconds (default `reach_timeout_default()`); other masters are not checked.

    A master that is down is then a clear error at once, not minutes of Spark's own retries.
    """
    endpoints = spark_endpoints(url)
    if not endpoints:
        return
    limit = reach_timeout_default() if timeout is None else timeout
    deadline = time.monotonic() + limit
    problems = []
    for host, port in endpoints:
        try:
            with socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic())):
                return
        except TimeoutError:
            problems.append(f"{host}:{port}: no answer within {limit:g} s")
        except OSError as err:
            problems.append(f"{host}:{port}: {err.strerror or err}")
    shown = _shown_url(url)
    where = f" (from {configured_in})" if configured_in else ""
    if shown.lower().startswith("sc://"):
        what = "Spark Connect server"
        fix = (
            "start the server (spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer "
            "--master ... --conf spark.connect.grpc.binding.port=PORT) or correct the host and port of the "
            "spark_connect connection"
        )
    else:
        what = "Spark master"
        fix = (
            "start the master (spark-class org.apache.spark.deploy.master.Master --host HOST --port PORT) "
            "and its workers, or correct the master URL (spark://HOST:PORT; a `spark` connection's host "
            "and port)"
        )
    raise SparkUnreachableError(
        f"cannot reach the {what} {shown}{where}: {'; '.join(problems)}. Nothing was run. To fix it, {fix}; "
        "if it is up but slow to answer, raise the timeout ([airflow_partitions] spark_master_timeout or "
        "AP_SPARK_MASTER_TIMEOUT, in seconds).",
        url=shown,
        timeout=limit,
    )
