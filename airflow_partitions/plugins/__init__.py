"""Airflow UI plugins of the provider: the Partitions page (`plugins/partitions.py`)."""
