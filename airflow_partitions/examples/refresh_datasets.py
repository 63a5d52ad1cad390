"""Airflow DAG file: one refresh DAG per dataset of `datasets.yaml` (or of $AIRFLOW_PARTITIONS_SPEC).

Each DAG is `discover → stage → per partition [refresh → snapshot upload] → commit`, scheduled by the
dataset's `refresh.schedule` and triggerable from the UI with the `partitions`, `where`, `full_refresh`
and `snapshot` params. Spark runs in-process unless `[airflow_partitions] spark_conn_id` names a `spark`
(spark-submit) or `spark_connect` connection; snapshots use `[airflow_partitions] aws_conn_id`
(default `aws_default`).
"""

from __future__ import annotations

from airflow_partitions.dag_factory import build_refresh_dags, default_spec_path

globals().update(build_refresh_dags(default_spec_path(__file__)))
