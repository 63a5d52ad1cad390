"""`s3://` source locations; the settings to reach them are `airflow_partitions.s3.S3Settings`."""

from __future__ import annotations

from airflow_partitions.exceptions import SourceError


def split_s3_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/some/key` (or `bucket/some/key`) -> (`bucket`, `some/key`)."""
    rest = uri.removeprefix("s3://").removeprefix("s3a://").lstrip("/")
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise SourceError(f"S3 location {uri!r} names no bucket; write it as s3://bucket/prefix")
    return bucket, key
