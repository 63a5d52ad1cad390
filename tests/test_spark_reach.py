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
