"""The same stage code against a real Spark Connect server (a separate JVM), through the spark-submit job.

A Connect client cannot share a Python process with the classic session of the other tests, so the job
runs as `python spark_jobs/refresh_partitions.py stage --remote sc://...` in a subprocess, exactly as a
deployment without spark-submit would run it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_partitions.refresh import PartitionResult, StageResult, commit_refresh, plan_refresh
from airflow_partitions.spec import load_spec
from airflow_partitions.table import open_handle

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent


def test_stage_and_finalize_through_spark_connect(
    spark_connect_server: dict[str, Any], tmp_path: Path
) -> None:
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
            spark_connect_server["url"],
            "--finalize",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    output = json.loads((tmp_path / "out.json").read_text())
    assert output["mode"] == "written", "the executors (Spark Connect) wrote the final files"
    assert sorted(r["key_path"] for r in output["results"]) == sorted(i.key_path for i in plan.items)
    results = [PartitionResult.from_json(r) for r in output["results"]]
    commit = commit_refresh(open_handle(project, dataset), plan, results, stage=StageResult.from_json(output))
    assert commit.version == 1
    assert commit.rows == 40, "every row routed through Spark Connect reached exactly one partition"
