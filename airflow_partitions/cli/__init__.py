"""The `airflow-partitions` command line."""
