"""A real Spark Connect server (its own JVM) on loopback, for tests and benchmarks.

pip's pyspark ships the server classes but not `sbin/start-connect-server.sh`; that script only runs
`spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer`, which is what this does.
"""

from __future__ import annotations

import contextlib
import os
import signal
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
    conf: Mapping[str, str] | None = None,
) -> Iterator[tuple[str, int]]:
    """Start a Spark Connect server; yields `("127.0.0.1", port)` once it accepts connections.

    The server's Python workers (the bucket UDF) run on this interpreter, so they import this package.
    `conf`: more `--conf` settings for the server.
    """
    server, port = start_connect_server(
        log_path, master=master, driver_memory=driver_memory, timeout=timeout, extra_env=extra_env, conf=conf
    )
    try:
        yield "127.0.0.1", port
    finally:
        stop_connect_server(server.pid)


def start_connect_server(
    log_path: Path,
    *,
    master: str = "local[2]",
    driver_memory: str = "1g",
    timeout: float = 120.0,
    extra_env: Mapping[str, str] | None = None,
    conf: Mapping[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], int]:
    """Start a Spark Connect server in a process group of its own and wait until it accepts connections;
    returns the process and its port. Stop it with `stop_connect_server(process.pid)` (from any process)."""
    spark_submit = spark_submit_executable()
    if not spark_submit.exists():
        raise SparkConnectServerError(f"pyspark's spark-submit is not at {spark_submit}; install pyspark")
    port = free_port()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, **(extra_env or {})}
    settings = {
        "spark.connect.grpc.binding.port": str(port),
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
        "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
        **(conf or {}),
    }
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
                *[arg for key, value in settings.items() for arg in ("--conf", f"{key}={value}")],
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
    except BaseException:
        stop_connect_server(server.pid)
        raise
    return server, port


def stop_connect_server(pid: int, *, grace: float = 30.0) -> None:
    """Stop the server started as `pid` (its process group: spark-submit's JVM and its Python workers):
    SIGTERM, then SIGKILL after `grace` seconds. Works from a process that did not start it."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            # Reap it when it is this process's child; otherwise see whether it is still there.
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:
            if not _running(pid):
                return
        time.sleep(0.2)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie waiting for its parent is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
