"""The one Airflow stack of a test session (`stack` / `client` fixtures in tests/conftest.py), shared by
the end-to-end modules so the suite starts Airflow once.

What it serves: the example DAG file over a spec with `sales` (by region and day), `sales_connect` (a
stage-less DAG on Spark Connect), `ui_sales` (by region, for the Partitions page), `wide_e2e` (1,500
partitions: refreshed in batches, `max_mapped_tasks` is 6 here) and a downstream DAG scheduled on the
`sales` asset, and `page_atlas` (6 regions x 28 days, the Partitions page's overview grid and its
screenshots; only the page's tests write it, in process). Users: `admin`, `viewer` (reads every DAG, may
not trigger) and `outsider` (a viewer from whom `DagScopedSimpleAuthManager` hides the `ui_sales`
refresh DAG).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .auth_manager import HIDDEN_DAGS_ENV
from .sample import install_example_dag, sample_spec, write_sales, write_wide
from .stack import AirflowStack, running_airflow

TESTS_DIR = Path(__file__).resolve().parents[1]

DAG_ID = "refresh_sales"
DOWNSTREAM_DAG_ID = "sales_per_partition"
# A partition-aware consumer: one run per partition key the refresh's asset events carry.
DOWNSTREAM_DAG = f'''\
"""Runs once per refreshed partition of the `sales` acceleration (airflow dag)."""

from airflow.sdk import DAG, Asset, PartitionedAssetTimetable, task

with DAG(
    "{DOWNSTREAM_DAG_ID}",
    schedule=PartitionedAssetTimetable(assets=Asset.ref(name="sales")),
    catchup=False,
):

    @task
    def consume(dag_run=None):
        return dag_run.partition_key

    consume()
'''
CONNECT_CONN_ID = "spark_connect_e2e"
CONNECT_DAG_ID = "refresh_sales_connect_each"
CONNECT_REGIONS = ("a/b", "Zürich", "")
CONNECT_DATASET = """\
  - name: sales_connect
    from: file:{src}/
    params: {{file_format: parquet}}
    acceleration:
      partition_by:
        - region: region
"""
CONNECT_DAG = f'''\
"""sales_connect without a shared stage, on Spark Connect: each partition task runs its own Spark job."""

from airflow_partitions.dag_factory import build_refresh_dag, default_spec_path
from airflow_partitions.spec import load_spec

project = load_spec(default_spec_path(__file__), check_types=False)
dag = build_refresh_dag(
    project, "sales_connect", stage=False, spark_conn_id="{CONNECT_CONN_ID}", dag_id="{CONNECT_DAG_ID}"
)
'''
# The Partitions page's dataset: two regions, one of which a test makes unwritable.
UI_DATASET = "ui_sales"
UI_DAG_ID = f"refresh_{UI_DATASET}"
UI_REGIONS = ("EU", "US")
UI_DATASET_SPEC = """\
  - name: ui_sales
    from: file:{src}/
    freshness: 2h
    params: {{file_format: parquet}}
    acceleration:
      partition_by:
        - region: region
"""
# More partitions than the stack lets one run map (`[airflow_partitions] max_mapped_tasks` below): its
# refresh runs in batches.
WIDE_DATASET = "wide_e2e"
WIDE_DAG_ID = f"refresh_{WIDE_DATASET}"
WIDE_PARTITIONS = 1500
STACK_MAX_MAPPED_TASKS = 6
WIDE_DATASET_SPEC = """\
  - name: wide_e2e
    from: file:{src}/
    params: {{file_format: parquet}}
    acceleration:
      engine: parquet
      partition_by:
        - k: k
"""
# The Partitions page's grid: regions down, days across; its tests refresh it in process into every state.
ATLAS_DATASET = "page_atlas"
ATLAS_DAG_ID = f"refresh_{ATLAS_DATASET}"
ATLAS_REGIONS = ("APAC", "EU", "LATAM", "US", "Zürich", "a/b=c")
ATLAS_DAYS = 28
ATLAS_DATASET_SPEC = """\
  - name: page_atlas
    from: file:{src}/
    freshness: 1d
    params: {{file_format: parquet}}
    acceleration:
      partition_by:
        - region: region
        - day: "date_trunc('day', ts)"
"""
USERS = {"viewer": "viewer", "outsider": "viewer"}
AUTH_MANAGER = "airflow_e2e.auth_manager.DagScopedSimpleAuthManager"


@contextmanager
def shared_stack(root: Path, spark_connect_server: dict[str, Any]) -> Iterator[AirflowStack]:
    """Write the data, spec and DAG files under `root` and run Airflow over them."""
    write_sales(root / "sales", rows=20, days=1, regions=("EU", "US"))
    write_sales(root / "sales_connect", rows=30, days=1, regions=CONNECT_REGIONS)
    write_sales(root / UI_DATASET, rows=20, days=1, regions=UI_REGIONS)
    # Snapshots are covered by the dag.test() suite; here every task is a process of its own, so the
    # DAG is kept to the refresh path to keep the run short.
    spec = sample_spec(accelerator_dir=root / "acc", sales_dir=root / "sales")
    spec += CONNECT_DATASET.format(src=root / "sales_connect")
    spec += UI_DATASET_SPEC.format(src=root / UI_DATASET)
    write_wide(root / WIDE_DATASET, WIDE_PARTITIONS)
    spec += WIDE_DATASET_SPEC.format(src=root / WIDE_DATASET)
    write_sales(
        root / ATLAS_DATASET, rows=3 * len(ATLAS_REGIONS) * ATLAS_DAYS, days=ATLAS_DAYS, regions=ATLAS_REGIONS
    )
    spec += ATLAS_DATASET_SPEC.format(src=root / ATLAS_DATASET)
    install_example_dag(root / "dags", spec)
    (root / "dags" / "sales_downstream.py").write_text(DOWNSTREAM_DAG)
    (root / "dags" / "sales_connect_each.py").write_text(CONNECT_DAG)
    env = {
        f"AIRFLOW_CONN_{CONNECT_CONN_ID.upper()}": json.dumps(
            {
                "conn_type": "spark_connect",
                "host": spark_connect_server["host"],
                "port": spark_connect_server["port"],
            }
        ),
        "AIRFLOW__CORE__AUTH_MANAGER": AUTH_MANAGER,
        "AIRFLOW__AIRFLOW_PARTITIONS__MAX_MAPPED_TASKS": str(STACK_MAX_MAPPED_TASKS),
        HIDDEN_DAGS_ENV: f"outsider:{UI_DAG_ID}",
        # The auth manager lives in tests/airflow_e2e; every component imports it.
        "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")])),
    }
    with running_airflow(
        root / "airflow_home", root / "dags", parallelism=4, preload=True, extra_env=env, users=USERS
    ) as airflow:
        yield airflow
