"""Re-export (documented import path `airflow_partitions.s3.S3Settings`); defined in `objectstore`."""

from airflow_partitions.objectstore.settings import S3Settings as S3Settings
