"""An unreachable Spark master or Spark Connect server is a clear error at once, on every path.

Without the check, Spark's own registration retries take about two minutes to fail with "Cannot call
methods on a stopped SparkContext", and a Connect client retries longer still. These run without a JVM:
the check comes before any Spark process starts. (`tests/test_spark_cluster.py` runs the refresh DAG
against an unreachable master and a real cluster.)
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest

from airflow_partitions.exceptions import OrchestrationError, RefreshError, SparkUnreachableError
from airflow_partitions.hooks.spark_refresh import SparkRefreshHook
from airflow_partitions.refresh.spark_session import (
    build_connect_session,
    build_local_session,
    check_spark_reachable,
    spark_endpoints,
)


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port bound but not listening: connections are refused, and nothing else can take it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


@pytest.fixture
def listening_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@pytest.mark.parametrize(
    ("url", "endpoints"),
    [
        ("spark://master:7078", [("master", 7078)]),
        ("spark://master", [("master", 7077)]),
        ("spark://m1:7077,m2:7078", [("m1", 7077), ("m2", 7078)]),
        ("spark://[::1]:7077", [("::1", 7077)]),
        ("SPARK://Master:1", [("master", 1)]),
        ("sc://connect", [("connect", 15002)]),
        ("sc://connect:443/;token=abc;use_ssl=true", [("connect", 443)]),
        ("local[2]", []),
        ("local", []),
        ("yarn", []),
        ("k8s://https://api:6443", []),
    ],
)
def test_endpoints_of_master_and_connect_urls(url: str, endpoints: list[tuple[str, int]]) -> None:
    assert spark_endpoints(url) == endpoints


def test_a_url_without_a_host_is_refused() -> None:
    with pytest.raises(SparkUnreachableError, match=r"names no host:port .* spark://HOST:7077"):
        spark_endpoints("spark://")


def test_a_listening_master_passes_and_ha_needs_only_one(closed_port: int, listening_port: int) -> None:
    check_spark_reachable(f"spark://127.0.0.1:{listening_port}")
    check_spark_reachable(f"spark://127.0.0.1:{closed_port},127.0.0.1:{listening_port}")
    check_spark_reachable("local[2]")


def test_unreachable_master_names_url_source_and_fix(closed_port: int) -> None:
    master = f"spark://127.0.0.1:{closed_port}"
    with pytest.raises(SparkUnreachableError) as caught:
        build_local_session(master=master, configured_in="--master")
    err = caught.value
    assert isinstance(err, RefreshError)
    assert isinstance(err, OrchestrationError)
    assert err.url == master
    message = str(err)
    assert message.startswith(
        f"cannot reach the Spark master {master} (from --master): 127.0.0.1:{closed_port}: "
    )
    assert "spark-class org.apache.spark.deploy.master.Master" in message, "says how to start one"
    assert "spark_master_timeout" in message
    assert "AP_SPARK_MASTER_TIMEOUT" in message


def test_unreachable_connect_server_hides_its_token(closed_port: int) -> None:
    with pytest.raises(SparkUnreachableError) as caught:
        build_connect_session(f"sc://127.0.0.1:{closed_port}/;token=s3cr3t;user_id=u", reach_timeout=3)
    message = str(caught.value)
    assert f"cannot reach the Spark Connect server sc://127.0.0.1:{closed_port}: " in message
    assert "SparkConnectServer" in message
    assert "s3cr3t" not in message
    assert "s3cr3t" not in caught.value.url
    assert caught.value.timeout == 3


def test_timeout_setting_is_checked(monkeypatch: pytest.MonkeyPatch, closed_port: int) -> None:
    monkeypatch.setenv("AP_SPARK_MASTER_TIMEOUT", "soon")
    with pytest.raises(
        SparkUnreachableError, match="AP_SPARK_MASTER_TIMEOUT='soon' is not a positive number"
    ):
        check_spark_reachable(f"spark://127.0.0.1:{closed_port}")
    monkeypatch.setenv("AP_SPARK_MASTER_TIMEOUT", "7")
    with pytest.raises(SparkUnreachableError) as caught:
        check_spark_reachable(f"spark://127.0.0.1:{closed_port}")
    assert caught.value.timeout == 7


def test_hook_checks_each_mode_before_starting_spark(
    monkeypatch: pytest.MonkeyPatch, closed_port: int
) -> None:
    """spark-submit (the master as the provider resolves it), Spark Connect and in-process sessions."""
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_NOWHERE", f"spark://127.0.0.1:{closed_port}?deploy-mode=client")
    monkeypatch.setenv(
        "AIRFLOW_CONN_SC_NOWHERE",
        json.dumps(
            {"conn_type": "spark_connect", "host": "127.0.0.1", "port": closed_port, "password": "tok3n"}
        ),
    )
    monkeypatch.setenv("AIRFLOW__AIRFLOW_PARTITIONS__SPARK_MASTER_TIMEOUT", "5")

    with pytest.raises(SparkUnreachableError) as caught:
        SparkRefreshHook("spark_nowhere").submit(["stage"])
    assert f"Spark master spark://127.0.0.1:{closed_port} (from connection 'spark_nowhere')" in str(
        caught.value
    )
    assert caught.value.timeout == 5

    with pytest.raises(SparkUnreachableError) as caught:
        SparkRefreshHook("sc_nowhere").session()
    assert f"Spark Connect server sc://127.0.0.1:{closed_port} (from connection 'sc_nowhere')" in str(
        caught.value
    )
    assert "tok3n" not in str(caught.value)

    monkeypatch.setenv("AP_SPARK_MASTER", f"spark://127.0.0.1:{closed_port}")
    with pytest.raises(SparkUnreachableError, match=r"\(from AP_SPARK_MASTER\)"):
        SparkRefreshHook("local").session()

    monkeypatch.setenv("AIRFLOW__AIRFLOW_PARTITIONS__SPARK_MASTER_TIMEOUT", "-1")
    with pytest.raises(OrchestrationError, match="spark_master_timeout = '-1' is not a positive number"):
        SparkRefreshHook("spark_nowhere").submit(["stage"])


NO_EXECUTOR_SCRIPT = """
import json, sys, time
from airflow_partitions.exceptions import SparkNoExecutorsError
from airflow_partitions.refresh.spark_session import build_local_session

started = time.monotonic()
try:
    build_local_session(master=sys.argv[1], executor_timeout=4, configured_in="AP_SPARK_MASTER",
                        conf={"spark.executor.memory": "512m"})
except SparkNoExecutorsError as err:
    print(json.dumps({"type": type(err).__name__, "message": str(err), "url": err.url,
                      "timeout": err.timeout, "seconds": time.monotonic() - started}))
else:
    print(json.dumps({"type": None}))
"""


@pytest.mark.spark
def test_a_master_without_free_workers_fails_in_bounded_time(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A real standalone master with no worker accepts the application and would hold it forever
    ("Initial job has not accepted any resources"); the session gives up after the executor timeout,
    names the master and the fix, and stops its application so the master holds nothing."""
    import subprocess
    import sys

    from airflow_e2e.spark_cluster import running_spark_cluster

    with running_spark_cluster(tmp_path_factory.mktemp("no-workers"), workers=0) as cluster:
        done = subprocess.run(
            [sys.executable, "-c", NO_EXECUTOR_SCRIPT, cluster.master_url],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        outcome = json.loads(done.stdout.strip().splitlines()[-1])
        assert outcome["type"] == "SparkNoExecutorsError", done.stderr[-3000:]
        message = outcome["message"]
        assert message.startswith(f"the Spark master {cluster.master_url} (from AP_SPARK_MASTER) accepted ")
        assert "gave it no executor within 4 s. Nothing was run." in message
        assert "512m of memory" in message, "says what each executor asks for"
        assert f"spark-class org.apache.spark.deploy.worker.Worker {cluster.master_url}" in message
        assert "spark_executor_timeout" in message
        assert "AP_SPARK_EXECUTOR_TIMEOUT" in message
        assert outcome["url"] == cluster.master_url
        assert outcome["timeout"] == 4
        # The application was stopped: the master lists it as completed, none as active.
        state = cluster.state()
        assert state.get("activeapps") == [], state.get("activeapps")
        assert len(state.get("completedapps", [])) == 1


def test_executor_timeout_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_partitions.hooks.spark_refresh import configured_executor_timeout, executor_timeout_env
    from airflow_partitions.refresh.spark_session import executor_timeout_default

    monkeypatch.setenv("AP_SPARK_EXECUTOR_TIMEOUT", "0")
    with pytest.raises(SparkUnreachableError, match="AP_SPARK_EXECUTOR_TIMEOUT='0' is not a positive number"):
        executor_timeout_default()
    monkeypatch.setenv("AP_SPARK_EXECUTOR_TIMEOUT", "30")
    assert executor_timeout_default() == 30
    monkeypatch.setenv("AIRFLOW__AIRFLOW_PARTITIONS__SPARK_EXECUTOR_TIMEOUT", "45")
    assert configured_executor_timeout() == 45
    # A spark-submit driver reads no Airflow config: the setting travels in its environment.
    assert executor_timeout_env() == {"AP_SPARK_EXECUTOR_TIMEOUT": "45"}
    monkeypatch.setenv("AIRFLOW__AIRFLOW_PARTITIONS__SPARK_EXECUTOR_TIMEOUT", "never")
    with pytest.raises(OrchestrationError, match="spark_executor_timeout = 'never' is not a positive number"):
        configured_executor_timeout()
