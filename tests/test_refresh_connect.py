"""The same stage code against a real Spark Connect server (a separate JVM), through the spark-submit job.

A Connect client cannot share a Python process with the classic session of the other tests, so the job
runs as `python spark_jobs/refresh_partitions.py stage --remote sc://...` in a subprocess, exactly as a
deployment without spark-submit would run it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_partitions.refresh import commit_refresh, plan_refresh
from airflow_partitions.spec import load_spec

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    spark_submit = Path(sys.executable).parent / "spark-submit"
    if not spark_submit.exists():
        pytest.skip("pyspark's spark-submit is not next to this interpreter")
    port = _free_port()
    log = tmp_path_factory.mktemp("connect") / "server.log"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    with log.open("w") as handle:
        server = subprocess.Popen(
            [
                str(spark_submit),
                "--class",
                "org.apache.spark.sql.connect.service.SparkConnectServer",
                "--master",
                "local[2]",
                "--driver-memory",
                "1g",
                "--conf",
                f"spark.connect.grpc.binding.port={port}",
                "--conf",
                "spark.ui.enabled=false",
                "--conf",
                "spark.sql.session.timeZone=UTC",
                "spark-internal",
            ],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if server.poll() is not None:
                pytest.fail(f"the Spark Connect server exited: {log.read_text()[-2000:]}")
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.5)
        else:
            pytest.fail("the Spark Connect server did not open its port within 120 s")
        yield f"sc://127.0.0.1:{port}"
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


def test_stage_and_finalize_through_spark_connect(connect_server: str, tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    ids = list(range(40))
    pq.write_table(
        pa.table({"id": pa.array(ids, pa.int64()), "region": [["EU", None, "a/b"][i % 3] for i in ids]}),
        tmp_path / "src" / "part-0.parquet",
    )
    (tmp_path / "spec.yaml").write_text(
        "accelerator_dir: acc\n"
        "datasets:\n"
        "  - name: events\n"
        "    from: file:src\n"
        "    acceleration:\n"
        "      partition_by: [{b: 'bucket(3, id)'}, {region: region}]\n"
    )
    project = load_spec(tmp_path / "spec.yaml")
    dataset = project.dataset("events")
    plan = plan_refresh(project, dataset)
    (tmp_path / "plan.json").write_text(plan.dumps())
    completed = subprocess.run(
        [
            sys.executable,
            str(REPO / "spark_jobs" / "refresh_partitions.py"),
            "stage",
            "--spec",
            str(tmp_path / "spec.yaml"),
            "--dataset",
            "events",
            "--plan",
            str(tmp_path / "plan.json"),
            "--location",
            str(tmp_path / "stage"),
            "--output",
            str(tmp_path / "out.json"),
            "--remote",
            connect_server,
            "--finalize",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    output = json.loads((tmp_path / "out.json").read_text())
    assert output["mode"] == "spark"
    assert sorted(r["key_path"] for r in output["results"]) == sorted(i.key_path for i in plan.items)
    commit = commit_refresh(project, dataset, plan, output["results"], stage=output)
    assert commit.version == 1
    assert commit.rows == 40, "every row routed through Spark Connect reached exactly one partition"
