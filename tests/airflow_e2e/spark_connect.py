"""A real Spark Connect server (its own JVM) on loopback, for tests and benchmarks.

pip's pyspark ships the server classes but not `sbin/start-connect-server.sh`; that script only runs
`spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer`, which is what this does.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from .stack import free_port

CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


class SparkConnectServerError(RuntimeError):
    """The Spark Connect server did not start."""


def spark_submit_executable() -> Path:
    """pyspark's `spark-submit`, next to the interpreter running this code (the venv's)."""
    return Path(sys.executable).parent / "spark-submit"


@contextmanager
def running_connect_server(
    log_path: Path,
    *,
    master: str = "local[2]",
    driver_memory: str = "1g",
    timeout: float = 120.0,
    extra_env: Mapping[str, str] | None = None,
) -> Iterator[tuple[str, int]]:
    """Start a Spark Connect server; yields `("127.0.0.1", port)` once it accepts connections.

    The server's Python workers (the bucket UDF) run on this interpreter, so they import this package.
    """
    spark_submit = spark_submit_executable()
    if not spark_submit.exists():
        raise SparkConnectServerError(f"pyspark's spark-submit is not at {spark_submit}; install pyspark")
    port = free_port()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, **(extra_env or {})}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as handle:
        server = subprocess.Popen(
            [
                str(spark_submit),
                "--class",
                CONNECT_SERVER_CLASS,
                "--master",
                master,
                "--driver-memory",
                driver_memory,
                "--conf",
                f"spark.connect.grpc.binding.port={port}",
                "--conf",
                "spark.connect.grpc.binding.address=127.0.0.1",
                "--conf",
                "spark.ui.enabled=false",
                "--conf",
                "spark.sql.session.timeZone=UTC",
                "--conf",
                "spark.driver.extraJavaOptions=-Duser.timezone=UTC",
                "--conf",
                "spark.executor.extraJavaOptions=-Duser.timezone=UTC",
                "spark-internal",
            ],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout
        while True:
            if server.poll() is not None:
                raise SparkConnectServerError(
                    f"the Spark Connect server exited with {server.returncode}: "
                    f"{log_path.read_text()[-2000:]}"
                )
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                raise SparkConnectServerError(
                    f"the Spark Connect server did not open port {port} within {timeout:.0f}s: "
                    f"{log_path.read_text()[-2000:]}"
                )
            time.sleep(0.5)
        yield "127.0.0.1", port
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)
