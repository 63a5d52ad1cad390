"""Airflow local settings: preload what refresh tasks import, so forked task processes start with it.

Copied to `$AIRFLOW_HOME/config/airflow_local_settings.py` by the Dockerfile. LocalExecutor and Celery
workers fork task processes from a long-lived Airflow process; importing pyarrow, DuckDB, sqlglot and
the operators once there saves every mapped partition task their import time.
"""

from airflow_partitions.dag_factory import preload_task_modules

preload_task_modules()
