"""Airflow hooks: pruned reads (`partitioned_dataset`), snapshot storage, Spark refresh, connections."""
